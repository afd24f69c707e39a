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

A vanished sink that was *lagging* (the spool keeps batches of the epoch for it past its
last mark ``m`` and before ``B``) is asked about too, whatever ``m``: each new sink is asked
whether its target holds ``m`` under the vanished name. Held, it is the same target, which
would get the new sink's batches from ``B`` on and never the spooled ones (a sink never seen
starts with the current batch): the run is refused with :class:`RenamedSinkError` naming the
spooled batches, the way back (the old name catches up from the spool) and the ``fanout
ledger skip --release-spooled`` that gives them up. A harmless rewrite does not pass it (the
batches would be missing, not written twice). A new sink the spool keeps batches for is
asked too (a renamed sink not opened at its first run, so not checked then, lags under its
new name); one beside another sink on its target removed unreleased is then refused, its
way on the printed release. One with *no* mark of the epoch (it lagged from the epoch's
first batch on; the ledger may not name it, the spool's index does) for which the spool
keeps batches before ``B`` leaves nothing to ask about: each new sink whose name neither
the ledger nor the spool knows (or the spool keeps batches for only from after that sink's
first: it started after them, as a renamed one would) is refused without a question,
with the same ways on (a sink removed while it lagged and not released, and another
added, is refused too: the printed release is what the start's warning asks for).

Cost: nothing per batch; at a start nothing unless a configured sink has no mark in the
epoch, then one read of the ledger's sink names (two columns), and the questions only
when a sink vanished.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from fanout.contract.batch import txn_app_id
from fanout.contract.locations import shown_location
from fanout.contract.sink import PartlyHeld, Sink, renamed_sink_advice
from fanout.errors import RenamedSinkError, batch_ranges
from fanout.ledger.entry import Ledger
from fanout.ledger.gaps import release_command, status_command
from fanout.observe.secrets import redact
from fanout.steps.holds import NoAnswer, bounded
from fanout.steps.lost_target import target_text

log = logging.getLogger("fanout")

# RenamedSinkError (fanout.RenamedSinkError) stays importable from here, its old home
__all__ = ["RenamedSinkError", "answers_holds_batch_of", "refuse_renamed", "vanished_sinks"]


@dataclass(frozen=True)
class Spooled:
    """What the spool keeps: the ids of the run's epoch's batches it keeps for each sink
    (its index: for a sink no longer configured, those past its last mark are the ones it
    misses; a sink it names is not refused for a vanished sink with no mark of the epoch),
    the spool's location and the ledger as the commands fanout prints name it
    (:func:`fanout.contract.locations.command_location`)."""

    spool: str
    ledger: str
    batches: Mapping[str, Sequence[int]] = field(default_factory=dict)


def answers_holds_batch_of(sink: Sink) -> bool:
    """Whether ``sink``'s type implements :meth:`fanout.Sink.holds_batch_of`."""
    return type(sink).holds_batch_of is not Sink.holds_batch_of


def ledger_sink_names(ledger: Ledger, pipeline: str) -> set[str]:
    """The sinks ``ledger`` names for ``pipeline`` (marks and failures, any epoch):
    one read of two columns for a Delta ledger (:meth:`Ledger.sink_names`)."""
    return set(ledger.sink_names(pipeline))


def vanished_sinks(
    ledger: Ledger,
    pipeline: str,
    epoch: int,
    configured: Collection[str],
    known: Collection[str] | None = None,
) -> dict[str, int | None]:
    """The sinks ``ledger`` names for ``pipeline`` (marks and failures, any epoch) that
    are not in ``configured``, each with its last mark of ``epoch`` (``None``: none).
    ``known``: those names when the caller read them (:func:`ledger_sink_names`)."""
    names = ledger_sink_names(ledger, pipeline) if known is None else known
    gone = sorted(set(names) - set(configured))
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
    spooled: Spooled | None = None,
    unknown: Collection[str] = (),
) -> dict[str, RenamedSinkError]:
    """The refusal of each sink of ``sinks`` (open, configured now) with no mark in
    ``marks`` (of ``epoch``) whose target holds batch ``batch_id`` (the run's first) written
    under the name of a sink the ledger names that ``configured`` does not, one with no
    mark of ``epoch`` or its last at ``batch_id - 1`` or later; or whose target holds the
    last marked batch of such a sink that ``spooled`` keeps later batches of ``epoch`` for
    (it lagged: renamed, the target would never get them); or, a name neither the ledger
    nor ``spooled`` knows, while ``spooled`` keeps batches before ``batch_id`` for such a
    sink with no mark of ``epoch`` (nothing to ask about; one the spool keeps batches for
    only from after that sink's first is such a name too); ``unknown``: names to take as
    ones the ledger does not know (the ledger names them only through this run's own
    failure rows). See the module; empty when none."""
    new = {
        n: s for n, s in sorted(sinks.items()) if marks.get(n) is None and answers_holds_batch_of(s)
    }
    if not new:
        return {}
    known = ledger_sink_names(ledger, pipeline)
    vanished = vanished_sinks(ledger, pipeline, epoch, configured, known)
    kept_for: Mapping[str, Sequence[int]] = {} if spooled is None else spooled.batches
    # a vanished sink with no mark of the epoch the spool keeps batches before batch_id
    # for: it lagged from the epoch's first batch on (the ledger may not even name it)
    unmarked = {
        other: missed
        for other in sorted(set(kept_for) - set(configured))
        if vanished.get(other) is None
        and (missed := sorted(b for b in kept_for[other] if b < batch_id))
    }
    if not vanished and not unmarked:
        return {}
    bounds = timeouts or {}
    refused: dict[str, RenamedSinkError] = {}
    # a vanished sink whose last mark is before batch_id - 1 cannot have written
    # batch_id (its next batch would have failed the run, or it lagged: spooled)
    asked = [o for o, mark in vanished.items() if mark is None or mark + 1 >= batch_id]
    behind: dict[str, tuple[int, list[int]]] = {}  # a vanished sink the spool keeps
    for other, mark in vanished.items():  # batches for past its mark: it lagged
        kept = [] if spooled is None or mark is None else spooled.batches.get(other, ())
        # those before the run's first batch: the new name writes that one and later ones
        missed = sorted(b for b in kept if mark is not None and mark < b < batch_id)
        if mark is not None and missed:
            behind[other] = (mark, missed)
    for name, sink in new.items():
        for other in asked:
            error = _ask(sink, other, pipeline, epoch, batch_id, bounds.get(name))
            if error is not None:
                refused[name] = error
                break
        if name in refused or spooled is None:
            continue
        for other, (mark, missed) in behind.items():
            error = _ask_lagging(sink, other, pipeline, (epoch, batch_id), mark, missed,
                                 spooled, bounds.get(name))  # fmt: skip
            if error is not None:
                refused[name] = error
                break
        if name in refused or spooled is None:
            continue
        own = kept_for.get(name, ())
        for other, missed in unmarked.items():  # nothing of it to ask the target about
            if own and min(own) <= missed[0]:
                continue  # it lags since as early: not 'other' renamed
            if not own and name in known and name not in unknown:
                continue  # a sink the ledger names is no new name
            refused[name] = _unmarked_error(sink, other, pipeline, (epoch, batch_id), missed,
                                            spooled)  # fmt: skip
            break
    return refused


def _unmarked_error(
    sink: Sink,
    other: str,
    pipeline: str,
    key: tuple[int, int],
    missed: Sequence[int],
    spooled: Spooled,
) -> RenamedSinkError:
    """The refusal of ``sink``, a name neither the ledger nor the spool knows, while the
    spool keeps batches ``missed`` for ``other``, a sink no longer configured with no mark
    of the epoch: ``sink`` may be ``other`` renamed while it lagged from the epoch's first
    batch on, and no record of ``other`` in its target can tell. ``key``: the run's first
    batch, ``(epoch, batch id)``."""
    epoch, batch = key
    release = release_command(spooled.ledger, pipeline, other, max(missed), epoch, spooled.spool)
    status = status_command(spooled.ledger, pipeline, spooled.spool)
    target = redact(target_text(sink), sink.secret_values())
    return RenamedSinkError(
        f"the spool at {shown_location(spooled.spool)} keeps batches {batch_ranges(missed)} "
        f"of epoch {epoch} for sink {other!r}, which the pipeline no longer configures and "
        f"which has no mark in the epoch (it lagged from the epoch's first batch on), and "
        f"sink {sink.name!r} is a name neither the ledger nor the spool knows: if "
        f"{sink.name!r} is {other!r} renamed while it lagged, it would start with this batch "
        f"and {target} would never get batches {batch_ranges(missed)}, and fanout cannot "
        f"ask that target (it holds no batch of {other!r} in the epoch). Nothing was "
        f"written. Either rename the sink back to {other!r} and restart: it catches up from "
        f"the spool (rename it once `{status}` no longer lists it behind); "
        f"or, if {other!r} was removed for good (or the target must not get those batches), "
        f"give them up and release them with `{release}` and restart",
        sink=sink.name,
        batch_id=batch,
    )


def _holds_batch_of(
    sink: Sink, other: str, pipeline: str, epoch: int, batch: int, timeout_s: float | None
) -> bool | PartlyHeld | str | NoAnswer | None:
    """``sink``'s :meth:`~fanout.Sink.holds_batch_of` ``other``'s batch ``batch`` of
    ``epoch``, within ``timeout_s`` (:func:`fanout.steps.holds.bounded`): its answer, the
    error it raised (a string, secrets redacted: cannot tell) or :class:`NoAnswer`."""

    def ask() -> bool | PartlyHeld | str | None:
        try:
            return sink.holds_batch_of(other, pipeline, epoch, batch)
        except Exception as exc:  # records it cannot read: cannot tell
            return redact(f"{type(exc).__name__}: {exc}", sink.secret_values())

    return bounded(sink, pipeline, ask, timeout_s, hook="holds-batch-of")


def _ask_lagging(
    sink: Sink,
    other: str,
    pipeline: str,
    key: tuple[int, int],
    mark: int,
    missed: Sequence[int],
    spooled: Spooled,
    timeout_s: float | None,
) -> RenamedSinkError | None:
    """Refuse ``sink`` when its target holds batch ``mark``, the last marked batch of
    ``other``, a sink no longer configured for which the spool keeps batches ``missed``:
    ``sink`` is ``other`` renamed while it lagged, and would never get them. ``key``: the
    run's first batch, ``(epoch, batch id)``."""
    epoch, batch = key
    release = release_command(spooled.ledger, pipeline, other, max(missed), epoch, spooled.spool)
    status = status_command(spooled.ledger, pipeline, spooled.spool)
    kept = (
        f"the spool at {shown_location(spooled.spool)} keeps batches {batch_ranges(missed)} "
        f"of epoch {epoch} for sink {other!r}"
    )
    question = (
        f"whether its target holds batch {mark} of epoch {epoch} written by sink {other!r}, "
        f"which the pipeline no longer configures and {kept}"
    )

    answer = _holds_batch_of(sink, other, pipeline, epoch, mark, timeout_s)
    if isinstance(answer, NoAnswer) or isinstance(answer, str) or answer is None:
        why = "" if isinstance(answer, NoAnswer) or answer is None else f": {answer}"
        within = (
            f" within its write_timeout_s={timeout_s:g} s" if isinstance(answer, NoAnswer) else ""
        )
        log.warning(
            "pipeline %s, sink %s: cannot tell%s %s%s. If %r is %r renamed while it lagged, "
            "its target never gets those batches: rename it back to %r (it catches up from "
            "the spool) or give them up with `%s`",
            pipeline, sink.name, within, question, why, sink.name, other, other, release,
        )  # fmt: skip
        return None
    if answer is False:
        return None
    target = redact(target_text(sink), sink.secret_values())
    held = _held_text(sink, other, pipeline, epoch, mark, answer, target)
    return RenamedSinkError(
        f"{held}; {kept}, which "
        f"lagged: {sink.name!r} is {other!r} renamed while it lagged, and would start with "
        f"this batch, so that target would never get batches {batch_ranges(missed)}. "
        "Nothing was written. Either rename the sink back to "
        f"{other!r} and restart: it catches up from the spool (rename it once "
        f"`{status}` no longer lists it behind); or, if the target must not get "
        "those batches (or you write them there yourself), give them up and release them "
        f"with `{release}` and restart",
        sink=sink.name,
        batch_id=batch,
    )


def _ask(
    sink: Sink, other: str, pipeline: str, epoch: int, batch: int, timeout_s: float | None
) -> RenamedSinkError | None:
    question = (
        f"whether its target holds batch {batch} of epoch {epoch} written by sink {other!r}, "
        "which the pipeline no longer configures"
    )

    answer = _holds_batch_of(sink, other, pipeline, epoch, batch, timeout_s)
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
    held = _held_text(sink, other, pipeline, epoch, batch, answer, target)
    harmless = sink.harmless_rewrite()
    if harmless:
        log.warning("pipeline %s, sink %s: %s; %s, so writing the batch again is harmless: "
                    "writing it", pipeline, sink.name, held, harmless)  # fmt: skip
        return None
    remove = (
        f"remove batch {batch} of {other!r} from the target the way this check passes over "
        "(for a Delta table: RESTORE it to the version before the batch's commit, or, when "
        "that commit created the table, version 0, delete the table; only while that commit "
        "is the table's newest: later ones, other sinks' marked batches, would go with it; "
        "deleting the batch's rows is no way on, the table still records the batch and this "
        "check refuses again)"
        if sink.batch_removable
        else None
    )
    return RenamedSinkError(
        f"{held}. " + renamed_sink_advice(target, sink.name, other, batch, remove),
        sink=sink.name,
        batch_id=batch,
    )


def _held_text(
    sink: Sink,
    other: str,
    pipeline: str,
    epoch: int,
    batch: int,
    answer: bool | PartlyHeld,
    target: str,
) -> str:
    """What ``sink``'s ``target`` (redacted) answered when asked whether it holds batch
    ``batch`` of epoch ``epoch`` written by ``other``: held, whole or in part."""
    part = "" if answer is True else " (part of it: some of its partitions)"
    return (
        f"{target} holds batch {batch} of sink {other!r}{part} (epoch {epoch}, its records "
        f"keyed {txn_app_id(pipeline, other, epoch)!r}), a sink the pipeline no longer "
        f"configures, and sink {sink.name!r} has no mark in the epoch"
    )


def refuse_renamed_at_reset(
    pipeline: str,
    epoch: int,
    ledger: Ledger,
    configured: Collection[str],
    sinks: Mapping[str, Sink],
    timeouts: Mapping[str, float] | None = None,
    spooled: Spooled | None = None,
) -> RenamedSinkError | None:
    """Before a new epoch replaces ``epoch``: the refusal of the first sink of ``sinks``
    (open, configured now) with no mark in ``epoch`` whose target holds, written under the
    name of a sink the ledger names that ``configured`` does not, the batch after that
    sink's last mark of ``epoch`` (its first batch when it has none): a sink renamed
    between a crash after its write and the reset. The new epoch resumes after the last
    marked batch, so it would write that batch's rows there again, under the new name;
    the epoch start's own question (:mod:`fanout.steps.unmarked`) asks each sink under its
    own name, which wrote nothing. Or, ``spooled`` (what the spool keeps of ``epoch``)
    keeping batches for a sink no longer configured, the refusal :func:`refuse_renamed`
    gives a sink renamed while it lagged, asked as of the batch after the last of them:
    the new epoch's sinks never get them. ``None`` when none holds it. Only at an epoch
    start: one read of the sinks' marks, and of the ledger's sink names when one has none."""
    marks = ledger.last_committed(pipeline, sorted(sinks), epoch)
    new = {n: s for n, s in sinks.items() if marks.get(n) is None}
    if not new:
        return None
    vanished = vanished_sinks(ledger, pipeline, epoch, configured)
    first = ledger.epoch_start(pipeline, epoch) or 0
    for batch in sorted({first if mark is None else mark + 1 for mark in vanished.values()}):
        refused = refuse_renamed(pipeline, epoch, batch, ledger, configured, new, marks, timeouts)
        if refused:
            return refused[min(refused)]
    kept: Mapping[str, Sequence[int]] = {} if spooled is None else spooled.batches
    missed = [b for other in set(kept) - set(configured) for b in kept[other]]
    if missed:
        after = max(missed) + 1
        refused = refuse_renamed(
            pipeline, epoch, after, ledger, configured, new, marks, timeouts, spooled
        )
        if refused:
            return refused[min(refused)]
    return None
