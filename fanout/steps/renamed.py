"""At a run's first batch: a sink renamed between a crash and its replay.

A sink's name keys its records (its ledger marks, a Delta app transaction, PostgreSQL
progress marks, Kafka marker groups). Killed after sink ``old`` committed batch ``N`` and
before its ledger mark, then restarted with ``old`` renamed to ``new`` (same target),
``new`` has no mark and no record: it would write ``N`` again (an append then holds it
twice). The ledger cannot tell that from a clean rename (the vanished sink's last mark is
``N - 1`` in both); the target can: :meth:`fanout.Sink.holds_batch_of`.

So once per run, before its first batch writes, only when both are there: the open sinks
configured now with no mark in the epoch ("new"), and the sinks the ledger names for the
pipeline that are no longer configured ("vanished"), each new sink is asked whether its
target holds the batch it would write, the run's first batch ``B``, written under the
vanished name (a replay brings back the batch the vanished sink committed: its last mark
``m`` of the epoch is ``B - 1``, or ``B`` when the driver died after the marks and before
Spark's commit). Not about a vanished sink whose last mark is before ``B - 1``: it wrote
nothing after it (a failed batch failed the run, or it lagged and the batch was spooled),
and an old batch it committed and never marked is not ``B``. Held (whole or part)
refuses the run with :class:`RenamedSinkError` (as a :class:`fanout.BatchFailedError` of
the new sink), nothing written; unless the new sink's
:meth:`~fanout.Sink.harmless_rewrite` says writing it again is harmless (a
warning). ``None`` (cannot tell, an error, no answer within
``write_timeout_s``): a warning. A target the vanished sink never wrote answers ``False``,
so its type does not matter.

Cost: nothing per batch; at a start nothing unless a configured sink has no mark in the
epoch, then one read of the ledger's sink names (two columns), and the questions only
when a sink vanished.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping

from fanout.contract.batch import txn_app_id
from fanout.contract.sink import PartlyHeld, Sink, renamed_sink_advice
from fanout.errors import RenamedSinkError
from fanout.ledger.entry import Ledger
from fanout.observe.secrets import redact
from fanout.steps.holds import NoAnswer, bounded
from fanout.steps.lost_target import target_text

log = logging.getLogger("fanout")

# RenamedSinkError (fanout.RenamedSinkError) stays importable from here, its old home
__all__ = ["RenamedSinkError", "answers_holds_batch_of", "refuse_renamed", "vanished_sinks"]


def answers_holds_batch_of(sink: Sink) -> bool:
    """Whether ``sink``'s type implements :meth:`fanout.Sink.holds_batch_of`."""
    return type(sink).holds_batch_of is not Sink.holds_batch_of


def vanished_sinks(
    ledger: Ledger, pipeline: str, epoch: int, configured: Collection[str]
) -> dict[str, int | None]:
    """The sinks ``ledger`` names for ``pipeline`` (marks and failures, any epoch) that
    are not in ``configured``, each with its last mark of ``epoch`` (``None``: none)."""
    gone = sorted(set(ledger.sink_names(pipeline)) - set(configured))
    return dict(ledger.last_committed(pipeline, gone, epoch)) if gone else {}


def refuse_renamed(
    pipeline: str,
    epoch: int,
    batch_id: int,
    ledger: Ledger,
    configured: Collection[str],
    sinks: Mapping[str, Sink],
    marks: Mapping[str, int | None],
    timeouts: Mapping[str, float] | None = None,
) -> dict[str, RenamedSinkError]:
    """The refusal of each sink of ``sinks`` (open, configured now) with no mark in
    ``marks`` (of ``epoch``) whose target holds batch ``batch_id`` (the run's first) written
    under the name of a sink the ledger names that ``configured`` does not, one with no
    mark of ``epoch`` or its last at ``batch_id - 1`` or later (see the module); empty when
    none."""
    new = {
        n: s for n, s in sorted(sinks.items()) if marks.get(n) is None and answers_holds_batch_of(s)
    }
    if not new:
        return {}
    vanished = vanished_sinks(ledger, pipeline, epoch, configured)
    if not vanished:
        return {}
    bounds = timeouts or {}
    refused: dict[str, RenamedSinkError] = {}
    # a vanished sink whose last mark is before batch_id - 1 cannot have written
    # batch_id (its next batch would have failed the run, or it lagged: spooled)
    asked = [o for o, mark in vanished.items() if mark is None or mark + 1 >= batch_id]
    for name, sink in new.items():
        for other in asked:
            error = _ask(sink, other, pipeline, epoch, batch_id, bounds.get(name))
            if error is not None:
                refused[name] = error
                break
    return refused


def _ask(
    sink: Sink, other: str, pipeline: str, epoch: int, batch: int, timeout_s: float | None
) -> RenamedSinkError | None:
    question = (
        f"whether its target holds batch {batch} of epoch {epoch} written by sink {other!r}, "
        "which the pipeline no longer configures"
    )

    def ask() -> bool | PartlyHeld | str | None:
        try:
            return sink.holds_batch_of(other, pipeline, epoch, batch)
        except Exception as exc:  # records it cannot read: cannot tell
            return redact(f"{type(exc).__name__}: {exc}", sink.secret_values())

    answer = bounded(sink, pipeline, ask, timeout_s, hook="holds-batch-of")
    if isinstance(answer, NoAnswer):
        log.warning("pipeline %s, sink %s: cannot tell within its write_timeout_s=%g s %s",
                    pipeline, sink.name, timeout_s, question)  # fmt: skip
        return None
    if isinstance(answer, str) or answer is None:
        why = "" if answer is None else f": {answer}"
        log.warning(
            "pipeline %s, sink %s: cannot tell %s%s. If %r is %r renamed after it wrote "
            "that batch and before its ledger mark, this run writes the batch there again",
            pipeline, sink.name, question, why, sink.name, other,
        )  # fmt: skip
        return None
    if answer is False:
        return None
    target = redact(target_text(sink), sink.secret_values())
    part = "" if answer is True else " (part of it: some of its partitions)"
    held = (
        f"{target} holds batch {batch} of sink {other!r}{part} (epoch {epoch}, its records "
        f"keyed {txn_app_id(pipeline, other, epoch)!r}), a sink the pipeline no longer "
        f"configures, and sink {sink.name!r} has no mark in the epoch"
    )
    harmless = sink.harmless_rewrite()
    if harmless:
        log.warning("pipeline %s, sink %s: %s; %s, so writing the batch again is harmless: "
                    "writing it", pipeline, sink.name, held, harmless)  # fmt: skip
        return None
    remove = (
        f"remove batch {batch} from the target (the sink's way for its target: a Delta "
        "table's RESTORE to before its commit, deleting its rows from the table)"
        if sink.batch_removable
        else None
    )
    return RenamedSinkError(
        f"{held}. " + renamed_sink_advice(target, sink.name, other, batch, remove),
        sink=sink.name,
        batch_id=batch,
    )
