"""``fanout ledger lift-fence``: lift the fences a new epoch's start left on the sinks of a
pipeline file when that start was refused or killed before the ledger recorded it
(docs/architecture.md §5; :meth:`fanout.Sink.lift_epoch_fence`), so the replaced epoch's
checkpoint can run again and complete the batch a sink holds part of.

A start fences each sink that fences (:func:`fanout.steps.unmarked.fences`) before it asks
about the replaced epoch's batch, and lifts the fences itself when it is refused
(:func:`fanout.steps.unmarked.lift_fences`); a start killed between its fences and its
start row, or one whose lift failed, leaves them, and every write of the replaced epoch is
then refused. The command lifts them as the refused start would have: refused when the
ledger records that the epoch started (its query relies on the fences: a lift would let
the replaced query write its batch beside it), or when the epoch is not the one after the
pipeline's current epoch (no start of it can have fenced).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fanout.contract.sink import Sink, SinkContext
from fanout.errors import ConfigurationError, FanoutError
from fanout.ledger.entry import ledger_location
from fanout.observe.secrets import redact

if TYPE_CHECKING:
    from fanout.ledger.delta import DeltaLedger


def check_epoch(ledger: DeltaLedger, pipeline: str, epoch: int) -> None:
    """Refuse a lift of the fences ``epoch``'s start made unless the ledger shows that
    start never happened: ``epoch`` is the one after the pipeline's current epoch and has
    no start row. :class:`fanout.ConfigurationError` (exit 2) otherwise, saying why."""
    current = ledger.current_epoch(pipeline)
    if epoch <= current or ledger.epoch_start(pipeline, epoch) is not None:
        raise ConfigurationError(
            f"pipeline {pipeline!r}: --epoch {epoch}: the ledger records that epoch "
            f"{epoch} started (the pipeline's epoch is {current}): its query relies on the "
            f"fences closing the epochs before it, and a lift would let a replaced query "
            f"write its batch beside it (the batch's rows twice). Nothing lifted. An "
            f"earlier epoch's checkpoint cannot complete its batch any more: epoch "
            f"{current}'s query writes it"
        )
    if epoch != current + 1:
        raise ConfigurationError(
            f"pipeline {pipeline!r}: --epoch {epoch}: the pipeline's epoch is {current}, "
            f"so only a start of epoch {current + 1} can have fenced its sinks (the "
            "refusal of the replaced epoch's write names the epoch); nothing lifted"
        )


def fencing_sinks(config: Any, names: Sequence[str]) -> list[Sink]:
    """The sinks of the pipeline file ``config`` to lift, built (not opened): those
    ``names`` gives (each refused when the file has no sink of that name, or it does not
    fence), else every sink of the file that fences."""
    from fanout.app.recover_sinks import built_sink
    from fanout.steps.unmarked import fences

    configured = {str(options["name"]): options for options in config.sinks}
    unknown = [name for name in names if name not in configured]
    if unknown:
        raise ConfigurationError(
            f"--sink {', '.join(unknown)}: no sink of that name in the pipeline file "
            f"({', '.join(configured)}); check the name"
        )
    chosen = list(names) or list(configured)
    sinks = [built_sink(configured[name], config.plugins)[0] for name in chosen]
    unfenced = [s for s in sinks if not fences(s)] if names else []
    if unfenced:
        said = ", ".join(f"{s.name!r} ({type(s).__name__})" for s in unfenced)
        raise ConfigurationError(
            f"--sink: sink {said} does not fence epochs (its type has no "
            "fence_earlier_epochs): there is no fence of it to lift"
        )
    return [s for s in sinks if fences(s)]


def lift(config: Any, ledger: DeltaLedger, sinks: Sequence[Sink], epoch: int) -> list[str]:
    """Open each of ``sinks`` for the pipeline ``config`` (as a run opens it) and lift the
    fence closing epoch ``epoch - 1`` (:meth:`fanout.Sink.lift_epoch_fence`, idempotent: a
    sink without one changes nothing). The lines to print, one a sink; a
    :class:`fanout.FanoutError` naming each sink that could not be opened or lifted, after
    the others were lifted."""
    from fanout.deadletters.moved import checked
    from fanout.deadletters.target import resolve_target
    from fanout.hooks.registry import load_registry

    registry = load_registry(config.plugins)
    location = ledger_location(ledger)
    lifted: list[str] = []
    failed: list[str] = []
    for sink in sinks:
        try:
            dead_letters = checked(resolve_target(sink, registry.dead_letter_kinds()))
            sink.open(SinkContext(config.name, None, dead_letters, ledger=location))
            try:
                sink.lift_epoch_fence(config.name, epoch)
            finally:
                sink.close()
        except Exception as exc:
            text = redact(str(exc), sink.secret_values())
            failed.append(f"sink {sink.name!r}: {type(exc).__name__}: {text}")
            continue
        lifted.append(  # the hook does not say whether there was a fence: a lift is idempotent
            f"pipeline {config.name!r}, sink {sink.name!r}: epoch {epoch - 1} open to its "
            f"writes again (the fence epoch {epoch}'s start left there lifted, if there was one)"
        )
    if failed:
        raise FanoutError(
            f"pipeline {config.name!r}: the fence epoch {epoch}'s start left on epoch "
            f"{epoch - 1} could not be lifted: "
            + "; ".join(failed)
            + (f" (lifted: {'; '.join(lifted)})" if lifted else "")
            + ". Run the command again once the sink's target can be reached"
        )
    return lifted
