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

Nothing records a running query, so the command cannot tell a start killed between its
fences and its start row from one still running there (:data:`STOP_FIRST`). It refuses
while the file's checkpoint shows a batch just planned and not committed
(:func:`refuse_running_checkpoint`: such a start fences in its first batch), warns when
the ledger's newest mark says the pipeline looks running, and asks the ledger again after
its lifts: a start recorded meanwhile has its fences made again (:func:`fence_again`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from fanout.app.activity import WINDOW_FLOOR_S, duration
from fanout.contract.locations import local_path
from fanout.contract.sink import Sink, SinkContext
from fanout.errors import ConfigurationError, FanoutError, SinkUnreachableError
from fanout.ledger.entry import ledger_location
from fanout.observe.secrets import redact

if TYPE_CHECKING:
    from fanout.ledger.delta import DeltaLedger


def check_epoch(ledger: DeltaLedger, pipeline: str, epoch: int) -> None:
    """Refuse a lift of the fences ``epoch``'s start made unless the ledger shows that
    start never happened: ``epoch`` is the one after the pipeline's current epoch and has
    no start row. :class:`fanout.ConfigurationError` (exit 2) otherwise, saying why."""
    current = ledger.current_epoch(pipeline)
    if started(ledger, pipeline, epoch):
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


STOP_FIRST = (
    "the command cannot tell a start killed between its fences and its ledger row from one "
    "still running there (nothing records a running query): lifted under a start still "
    "running, the replaced query would write its batch beside the new epoch's (its rows "
    "twice). Stop every query of the pipeline first, the new checkpoint's too"
)
"""The risk ``fanout ledger lift-fence`` runs, said in its refusals and warnings."""


def planned_batch(checkpoint: str, now: float | None = None) -> tuple[int, float] | None:
    """The batch a query on the local checkpoint ``checkpoint`` planned and has not
    committed (its newest ``offsets/N`` without ``commits/N``), with how long ago it was
    planned, when that is less than :data:`fanout.app.activity.WINDOW_FLOOR_S`: a query may
    be running on it (a new epoch's start fences in its first batch, between the two
    files). ``None`` otherwise, and for a checkpoint not on a local filesystem."""
    local = local_path(checkpoint)
    if local is None:
        return None
    from fanout.steps.context import latest_batch_id

    try:
        newest = latest_batch_id(local, "offsets")
        committed = latest_batch_id(local, "commits")
    except OSError:
        return None
    if newest is None or (committed is not None and committed >= newest):
        return None
    try:
        planned = os.stat(os.path.join(local, "offsets", str(newest))).st_mtime
    except OSError:
        return None
    age = (time.time() if now is None else now) - planned
    return (newest, age) if age < WINDOW_FLOOR_S else None


def refuse_running_checkpoint(config: Any, path: str) -> None:
    """Refuse (:class:`fanout.ConfigurationError`, exit 2, nothing lifted) a lift while the
    pipeline file ``path``'s checkpoint shows a batch planned in the last
    :data:`fanout.app.activity.WINDOW_FLOOR_S` and not committed (:func:`planned_batch`):
    what a new epoch's start in progress leaves there, between its fences and its ledger
    row."""
    planned = planned_batch(config.checkpoint)
    if planned is None:
        return
    batch, age = planned
    raise ConfigurationError(
        f"pipeline {config.name!r}: pipeline.checkpoint {config.checkpoint!r} of {path}: "
        f"batch {batch} was planned {duration(age)} ago and is not committed: a query may "
        f"be running on it, a new epoch's start between its fences and its ledger row "
        f"perhaps; {STOP_FIRST}. Nothing lifted. Run this again once every query of the "
        f"pipeline is stopped (a batch planned {duration(WINDOW_FLOOR_S)} ago or more is "
        "taken for a query killed)"
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


def lift(
    config: Any, ledger: DeltaLedger, sinks: Sequence[Sink], epoch: int
) -> tuple[list[str], bool]:
    """Open each of ``sinks`` for the pipeline ``config`` and lift the fence closing epoch
    ``epoch - 1`` (:meth:`fanout.Sink.lift_epoch_fence`, idempotent: a sink without one
    changes nothing). A sink whose type declares ``read_only_check`` is opened as ``fanout
    validate`` opens it (``checking``): it creates nothing, so a target dropped since is
    not made again empty, which would hide its loss from the next run's lost-target check;
    what a run's open would have created is said. Another is opened as a run opens it.
    The lines to print, one a sink, saying whether there was a fence (the hook's answer),
    and whether any sink may have had one (not every answer "none there");
    a :class:`fanout.FanoutError` naming each sink that could not be opened or lifted,
    after the others were lifted (a :class:`fanout.ConfigurationError`, exit 2, when each
    failed for its configuration, a login refused, not a server down)."""
    lifted: list[str] = []
    answers: list[bool | None] = []
    failed: list[str] = []
    misconfigured = True  # every failure a configuration error (exit 2), not a server down
    for sink in sinks:
        try:
            with _opened(config, ledger, sink) as context:
                there = sink.lift_epoch_fence(config.name, epoch)
        except Exception as exc:
            text = redact(str(exc), sink.secret_values())
            failed.append(f"sink {sink.name!r}: {type(exc).__name__}: {text}")
            misconfigured &= isinstance(exc, ConfigurationError) and not isinstance(
                exc, SinkUnreachableError
            )
            continue
        answers.append(there)
        lifted.append(_lifted_line(config.name, sink.name, epoch, there, context.changes))
    if started(ledger, config.name, epoch):
        fence_again(config, ledger, sinks, epoch)
    if failed:
        error = ConfigurationError if misconfigured else FanoutError
        raise error(
            f"pipeline {config.name!r}: the fence epoch {epoch}'s start left on epoch "
            f"{epoch - 1} could not be lifted: "
            + "; ".join(failed)
            + (f" (done: {'; '.join(lifted)})" if lifted else "")
            + ". Run the command again once the sink's target can be reached"
        )
    return lifted, any(there is not False for there in answers)


@contextmanager
def _opened(config: Any, ledger: DeltaLedger, sink: Sink) -> Iterator[SinkContext]:
    """``sink`` opened for the pipeline ``config`` as :func:`lift` opens it (as ``fanout
    validate`` does when its type declares ``read_only_check``), closed after the block;
    its context (what a run's open would create, in ``changes``)."""
    from fanout.deadletters.moved import checked
    from fanout.deadletters.target import resolve_target
    from fanout.hooks.registry import load_registry

    kinds = load_registry(config.plugins).dead_letter_kinds()
    context = SinkContext(config.name, None, checked(resolve_target(sink, kinds)),
                          ledger=ledger_location(ledger),
                          checking=type(sink).read_only_check)  # fmt: skip
    sink.open(context)
    try:
        yield context
    finally:
        sink.close()


def started(ledger: DeltaLedger, pipeline: str, epoch: int) -> bool:
    """Whether the ledger records that ``epoch`` of ``pipeline`` started (or a later one)."""
    return (
        ledger.current_epoch(pipeline) >= epoch or ledger.epoch_start(pipeline, epoch) is not None
    )


def fence_again(config: Any, ledger: DeltaLedger, sinks: Sequence[Sink], epoch: int) -> None:
    """Epoch ``epoch`` started while :func:`lift` lifted its fences (its start was still
    running, between its fences and its ledger row): close the epochs before it again on
    each of ``sinks`` (:meth:`fanout.Sink.fence_earlier_epochs`, idempotent), and raise a
    :class:`fanout.FanoutError` saying so, and what a write of the replaced query may have
    done in between."""
    done: list[str] = []
    failed: list[str] = []
    for sink in sinks:
        try:
            with _opened(config, ledger, sink):
                sink.fence_earlier_epochs(config.name, epoch)
        except Exception as exc:
            text = redact(str(exc), sink.secret_values())
            failed.append(f"sink {sink.name!r} ({type(exc).__name__}: {text})")
            continue
        done.append(repr(sink.name))
    raise FanoutError(
        f"pipeline {config.name!r}: epoch {epoch} started while this command lifted its "
        f"start's fences (that start was still running): "
        + (f"closed epoch {epoch - 1} again on sink {', '.join(done)}" if done else "")
        + ("; " if done and failed else "")
        + (
            f"could NOT close it again on {', '.join(failed)}: run `fanout run` on the new "
            "checkpoint again, whose start fences it"
            if failed
            else ""
        )
        + f". A batch of epoch {epoch - 1}'s query written in between may be in a sink "
        f"twice (epoch {epoch - 1}'s batch after its last mark, which epoch {epoch} "
        "writes again). Stop every query of the pipeline before lifting a fence"
    )


def _lifted_line(
    pipeline: str, sink: str, epoch: int, there: bool | None, changes: Sequence[str]
) -> str:
    """What was done to ``sink``: ``there``, the hook's answer (whether there was a fence);
    ``changes``, what a run's open would have made that is not there (made by none)."""
    where = f"pipeline {pipeline!r}, sink {sink!r}: "
    fence = f"the fence epoch {epoch}'s start left on epoch {epoch - 1}"
    if there is None:
        done = (
            f"epoch {epoch - 1} open to its writes again ({fence} lifted; the sink does "
            "not tell whether there was one)"
        )
    elif there:
        done = f"{fence} lifted: epoch {epoch - 1} open to its writes again"
    else:
        done = f"no fence of epoch {epoch}'s start there: nothing lifted"
    if changes:
        done += "; not there, and not made by this command: " + "; ".join(changes)
    return where + done
