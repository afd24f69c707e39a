"""At a run's first batch: does each sink's target still hold its last marked batch?

The ledger records every batch each sink completed. A target deleted or replaced behind
fanout's back (a Delta table removed, a PostgreSQL table dropped, a Kafka topic deleted)
and created again empty (``create_table``, ``create_topic``, the Delta sink's own create)
loses those batches silently: the ledger and ``fanout status`` still count them, and the
run writes on. So before a run writes anything, each open sink with a mark in the current
epoch is asked :meth:`fanout.Sink.holds_batch` about that mark, once per run (never on the
per-batch path), one with none there about its last mark of the newest earlier epoch that
holds one (:func:`earlier_marks`: a checkpoint reset's first run, asked before the
reset's new epoch starts, so a refused reset leaves the ledger and the sinks as they were:
``TargetChecks.refuse_unmarked``), and a lagging sink
that could not be opened at the start is asked once it is (before its first write).
Unless that says ``False`` (or does not answer within the sink's ``write_timeout_s``), a
sink implementing
:meth:`fanout.Sink.target_replaced` is asked too, bounded the same way, whether its target
is still the one the batch was written to: a reason counts as ``False`` (the refusal quotes
it), no answer (``None``, raised, timed out: logged) leaves ``holds_batch``'s. A definite
``False`` refuses the run with
:class:`fanout.TargetLostError`; that of a sink with ``on_failure="lag"`` is returned
instead: the sink lags with it for the rest of the run (never written), and the other sinks
go on. ``None`` (cannot tell) and :class:`fanout.PartlyHeld` pass, as before.

A mark need not be a batch the target holds: an empty batch, or one whose every row went
to the dead letters, commits nothing there, and a ``fanout ledger skip`` mark writes
nothing. So a ``False`` about the mark is checked once more against the sink's last mark
that wrote rows (a scan of the epoch's marks, only on this path); a sink with none passes.
A lost mark (recorded at a new epoch's refused start) whose copy the operator removed, as
that refusal offers, while another sink's mark is before it, passes to the mark before it:
the new epoch writes that batch again (:func:`written_marks`).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator, Mapping

from fanout.contract.sink import PartlyHeld, Sink
from fanout.errors import SinkRecordsGoneError, TargetLostError, shell_word
from fanout.ledger.entry import Ledger, ledger_location, refused_query
from fanout.ledger.gaps import is_skip
from fanout.observe.secrets import redact
from fanout.steps.holds import (
    CannotTell,
    NoAnswer,
    answers_target_replaced,
    bounded,
    gone_reason,
    holds_answer,
    replaced_reason,
)

log = logging.getLogger("fanout")

TARGET_OPTIONS = ("path", "table", "topic")
"""The attributes naming a built-in sink's target, the first one set wins."""


def earlier_marks(
    ledger: Ledger, pipeline: str, sinks: Collection[str], epoch: int
) -> Iterator[tuple[int, dict[str, int]]]:
    """For ``sinks`` without a mark in ``epoch``: each epoch before it, newest first, with
    the last mark of each of them whose newest mark it holds, until every one is found (one
    ledger lookup per epoch walked; none for an empty ``sinks``). A checkpoint reset's new
    epoch has no mark yet, nor has a sink lagging since before the reset: their target
    holds their last mark of the replaced epoch or is lost, and asked only about the
    current epoch's marks they were never asked (a dropped table was created again empty by
    the new epoch's first write, or the catch-up's of the spooled batches, the loss silent:
    docs/architecture.md §5)."""
    left = set(sinks)
    for before in range(epoch - 1, -1, -1):
        if not left:
            return
        marks = ledger.last_committed(pipeline, sorted(left), before)
        found = {name: mark for name, mark in marks.items() if mark is not None}
        if found:
            left -= set(found)
            yield before, found


def refuse_lost_targets(
    pipeline: str,
    epoch: int,
    ledger: Ledger,
    sinks: Mapping[str, Sink],
    marks: Mapping[str, int | None],
    accepted: Collection[str] = (),
    timeouts: Mapping[str, float] | None = None,
    pipeline_file: str | None = None,
    lags: Collection[str] = (),
    query_id: str | None = None,
    configured: Collection[str] | None = None,
    reset_to: int | None = None,
) -> dict[str, TargetLostError]:
    """Raise :class:`fanout.TargetLostError` for the first sink of ``sinks`` (open, with a
    mark in ``marks``, of ``epoch``) whose target, by its own records, no longer holds its
    last marked batch that wrote rows; return that of each such sink of ``lags`` (those with
    ``on_failure="lag"``: they lag with it, the run goes on). A sink in ``accepted``
    (``accept_lost_targets``) whose target lost it writes on: its loss is accepted for this
    run, and a warning logged; one whose target holds it has no loss to accept at the
    start, and the warning says to drop the flag (left on a later command line it would
    accept the target's next loss unseen) unless the sink's refusal of a replayed batch
    named it (a PostgreSQL append batch whose marks name a table replaced under its name
    since: :attr:`fanout.SinkContext.accept_lost`). ``timeouts``: the sinks with
    ``write_timeout_s``, whose answer is waited for that long (no answer: cannot tell, the
    run goes on as before).
    ``pipeline_file``: the file ``fanout run`` runs (absolute), which the refusal's command
    names. ``query_id``: the query starting the epoch after ``epoch`` (a checkpoint reset),
    whose refused start's lost marks its checkpoint writes again (:func:`written_marks`).
    ``configured``: the sinks the pipeline configures now (``None``: every sink the ledger
    names), whose marks tell where the new epoch resumes. ``reset_to``: the epoch a
    checkpoint reset is about to start (asked before its ``epoch`` row and fences): a
    refusal leaves it unstarted, and its ways on are the reset run again."""
    bounds = timeouts or {}
    lost: dict[str, TargetLostError] = {}
    for name, sink in sorted(sinks.items()):
        mark = marks.get(name)
        if mark is None:
            continue
        bound = bounds.get(name)
        batch, (answer, reason) = mark, _answer(sink, pipeline, epoch, mark, bound)
        if answer is False:
            written = written_marks(ledger, pipeline, epoch, name, mark, query_id, configured)
            if not written:
                continue
            if written[0][0] != mark:
                batch, (answer, reason) = (
                    written[0][0],
                    _answer(sink, pipeline, epoch, written[0][0], bound),
                )
            if answer is False and written[0][1]:  # its copy removed, the batch written again
                kept = last_kept(written)
                if kept is None:
                    continue
                batch, (answer, reason) = kept, _answer(sink, pipeline, epoch, kept, bound)
        if answer is not False:
            if name in accepted and answer is not None:
                log.warning(
                    "pipeline %s, sink %s: accept_lost_targets (--accept-lost-target %s): "
                    "%s holds batch %s of epoch %s, which the ledger marks written there: "
                    "there is no loss to accept at the start: drop the flag, unless the "
                    "sink's refusal of a replayed batch named it (left on, it accepts this "
                    "target's next loss unseen)", pipeline, name, name,
                    redact(target_text(sink), sink.secret_values()), batch, epoch,
                )  # fmt: skip
            continue
        gone = None if reason is not None else gone_reason(sink, pipeline, epoch, batch, bound)
        if gone is not None:
            if gone_passes(sink, pipeline, epoch, batch, gone, name in accepted, _WRITES_ON):
                continue
            error: TargetLostError = _records_gone(
                pipeline, epoch, sink, batch, gone, pipeline_file, name in lags, reset_to
            )
            if name not in lags:
                raise error
            log.error("%s", error)
            lost[name] = error
            continue
        if name in accepted:
            log.warning(
                "pipeline %s, sink %s: its target no longer holds batch %s of epoch %s%s; "
                "accepted (accept_lost_targets): the batches marked written there stay lost "
                "from it", pipeline, name, batch, epoch, "" if reason is None else f" ({reason})",
            )  # fmt: skip
            continue
        lags_on = name in lags
        error = TargetLostError(
            redact(
                _message(
                    pipeline,
                    epoch,
                    ledger,
                    sink,
                    batch,
                    pipeline_file,
                    lags=lags_on,
                    reason=reason,
                    reset_to=reset_to,
                ),
                sink.secret_values(),
            ),
            sink=name,
            batch_id=batch,
        )
        if not lags_on:
            raise error
        log.error("%s", error)
        lost[name] = error
    return lost


def _answer(
    sink: Sink, pipeline: str, epoch: int, batch_id: int, timeout_s: float | None
) -> tuple[bool | PartlyHeld | None, str | None]:
    """``sink``'s answer about ``batch_id`` of ``epoch``, and why its target is not the one
    the batch was written to: ``False`` with the reason when
    :meth:`~fanout.Sink.target_replaced` gives one (asked only when ``holds_batch`` answered
    and did not say ``False``); ``None`` when it cannot tell (its hook failed, or did not
    return within ``timeout_s``: the run goes on)."""
    question = f"whether its target still holds batch {batch_id} of epoch {epoch}"
    answer = bounded(
        sink, pipeline, lambda: holds_answer(sink, pipeline, epoch, batch_id, question), timeout_s
    )
    if isinstance(answer, NoAnswer):
        log.warning(
            "pipeline %s, sink %s: cannot tell within its write_timeout_s=%g s %s",
            pipeline, sink.name, timeout_s, question,
        )  # fmt: skip
        return None, None  # its service hangs: not waited for twice
    held = None if isinstance(answer, CannotTell) else answer
    if held is False or not answers_target_replaced(sink):
        return held, None
    reason = replaced_reason(sink, pipeline, epoch, batch_id, timeout_s)
    return (held, None) if reason is None else (False, reason)


RESTORE_RECORDS = (
    "restore the sink's records (from the backup or dump that held them, or set back the "
    "option that moved them)"
)
"""The first way on of a refusal for a sink's own records gone, said alike by the run's
check and a new epoch's start (:mod:`fanout.steps.unmarked`)."""

_WRITES_ON = (
    "it writes on, and a batch written after that mark and never marked is written a second time"
)


def _records_gone(
    pipeline: str,
    epoch: int,
    sink: Sink,
    batch: int,
    gone: str,
    file: str | None,
    lags: bool,
    reset_to: int | None = None,
) -> SinkRecordsGoneError:
    """The refusal of a sink whose own records of ``batch`` (its last marked batch that
    wrote rows) are gone while its target holds rows (``gone``: the sink's words), or,
    ``lags``, the error it lags with. ``reset_to``: the epoch a checkpoint reset asked
    this before starting (:func:`refuse_lost_targets`): it starts nothing, and each way on
    is the reset run again."""
    flags = "" if reset_to is None or lags else " --new-epoch"
    run = f"fanout run {file or 'PIPELINE.toml'}{flags}"
    again = "start again" if not flags else f"run the reset again: `{run}`"
    accept = f"`{run} --accept-lost-target {shell_word(sink.name)}`"
    scope = "with the reset" if flags else "for this run"
    if file is None:  # not run from a pipeline file: a FanOut of the caller's own
        reset = "on_checkpoint_reset='new_epoch', " if flags else ""
        accept += f" (FanOut({reset}accept_lost_targets=[{sink.name!r}]))"
    if lags:
        now = (
            "Nothing is written to it by this run: with on_failure='lag' it lags, its batches "
            "wait in the spool (up to its max_lag), and the other sinks go on."
        )
    elif flags:
        now = (
            f"The checkpoint reset is refused before it started: epoch {reset_to} was not "
            "started and no sink was fenced or written (the replaced checkpoint, if you still "
            "have it, stays the pipeline's)."
        )
    else:
        now = "Nothing was written by this run."
    text = (
        f"pipeline {pipeline!r}, sink {sink.name!r}: its own records of batch {batch} of epoch "
        f"{epoch}, which the ledger marks written to {target_text(sink)} (its last marked "
        f"batch that wrote rows), are gone, and the target still holds rows: {gone}. "
        "Its target was not found lost: the records telling which batches it holds were "
        "removed apart from it. Without them a batch written after "
        f"batch {batch} and never marked (the driver killed between the write and the mark) "
        f"would be written a second time. {now}\n"
        f"Ways on: {RESTORE_RECORDS}, then {again}: each batch is written once. Or, "
        f"when they cannot be restored, accept it explicitly {scope}: {accept}, which "
        "writes on from the next batch into the target as it is, keeping new records from "
        f"there: first check that the target holds no row of batch {batch + 1} (written "
        "unmarked before the records went, it would then hold them twice)."
    )
    return SinkRecordsGoneError(redact(text, sink.secret_values()), sink=sink.name, batch_id=batch)


def gone_passes(
    sink: Sink, pipeline: str, epoch: int, batch: int, gone: str, accepted: bool, then: str
) -> bool:
    """Whether ``sink``, whose own records of ``batch`` of ``epoch`` are gone (``gone``: its
    words, :meth:`fanout.Sink.records_gone`), is let through instead of refused: its
    rewrite of a batch is harmless (:func:`harmless_gone`), or its loss is ``accepted``
    (``accept_lost_targets``); each logged as a warning, ``then`` saying what an accepted
    loss lets happen. The run's lost-target check and a new epoch's start
    (:func:`fanout.steps.unmarked.refuse_records_gone`) decide alike."""
    if harmless_gone(sink, pipeline, epoch, batch, gone):
        return True
    if not accepted:
        return False
    log.warning(
        "pipeline %s, sink %s: its own records of batch %s of epoch %s are gone (%s); "
        "accepted (accept_lost_targets): %s", pipeline, sink.name, batch, epoch, gone, then,
    )  # fmt: skip
    return True


def harmless_gone(sink: Sink, pipeline: str, epoch: int, batch: int, gone: str) -> bool:
    """Whether ``sink``, whose own records of ``batch`` are gone (``gone``: its words),
    takes a batch again harmlessly (:meth:`fanout.Sink.harmless_rewrite`: an upsert by key):
    a replay of a batch written and never marked rewrites its keys, no loss and no second
    copy to refuse for; logged as a warning then."""
    harmless = sink.harmless_rewrite()
    if harmless is None:
        return False
    log.warning(
        "pipeline %s, sink %s: its own records of batch %s of epoch %s are gone (%s); it "
        "writes on, as a batch written again is harmless there (%s): a batch written after "
        "that mark and never marked is written again over itself",
        pipeline, sink.name, batch, epoch, gone, harmless,
    )  # fmt: skip
    return True


def last_kept(written: list[tuple[int, bool]]) -> int | None:
    """The newest of ``written`` (:func:`written_marks`) that is not a lost mark whose copy
    the unmarked batch's refusal offered to remove (its records gone as that way on asks),
    ``None`` when none is left."""
    return next((batch for batch, lost in written if not lost), None)


def written_marks(
    ledger: Ledger,
    pipeline: str,
    epoch: int,
    sink: str,
    mark: int,
    query_id: str | None = None,
    configured: Collection[str] | None = None,
) -> list[tuple[int, bool]]:
    """The sink's marks of ``epoch`` at or before ``mark`` that wrote rows to its target,
    newest first, each with whether it is a lost mark that the next batch may write again
    (recorded when a new epoch's start found the batch written unmarked, the sink's own
    records holding it, while another sink's last mark of ``epoch`` is before it: the
    unmarked batch's refusal then offers to remove that copy and resume after the batch
    before it, :mod:`fanout.steps.unmarked`). Such a mark whose batch the target no longer
    holds passes to the one before it. So does one recorded at the refusal of ``query_id``
    (the query starting the next epoch now, not ``None``), a pipeline of one sink too: its
    checkpoint was refused for re-reading the batch (the refusal's "remove the copy and
    start this query again"). Not while every other sink marked the batch (a skip too) and
    the query is another: the new epoch resumes after it, and a removed copy is a loss.
    Only the sinks of ``configured`` count as other sinks: a sink removed from the pipeline
    keeps its old, low mark, which says nothing of where the new epoch resumes."""
    again = None if query_id is None else refused_query(query_id, epoch)
    entries = [e for e in ledger.committed_entries(pipeline, 0, epoch) if e.epoch == epoch]
    others: dict[str, int] = {}
    for e in entries:
        if e.sink != sink and (configured is None or e.sink in configured):
            others[e.sink] = max(others.get(e.sink, e.batch_id), e.batch_id)
    written = [
        (
            e.batch_id,
            bool(e.lost)
            and (
                any(m < e.batch_id for m in others.values())
                or (again is not None and (e.error or "").startswith(again))
            ),
        )
        for e in entries
        if e.sink == sink
        and e.batch_id <= mark
        and not is_skip(e)
        and (e.lost or (e.rows is not None and e.rows > 0))
    ]
    return sorted(written, reverse=True)


def moved_on_purpose(sink: Sink, again: str = "restart") -> str:
    """The way on of a sink whose target option was changed on purpose between runs (a
    new, empty target; the old one still holds the batches): set it back, or rename the
    sink too, which then starts afresh there (the old name's marks stay the ledger's record
    of the old target; docs/architecture.md §5, "A target lost"). ``again``: what the
    operator runs then (a refused checkpoint reset: the reset again)."""
    option = next(
        (o for o in TARGET_OPTIONS if isinstance(getattr(sink, o, None), str) and getattr(sink, o)),
        "target",
    )
    return (
        f" If {sink.name!r}'s {option} was changed on purpose to a new target (the old one "
        f"still holds those batches), set it back; or give the sink a new name too and "
        f"{again}: the new name starts afresh there with the next batch, and the old name's "
        "marks stay the record of the old target."
    )


def target_text(sink: Sink) -> str:
    """The sink's target as its options name it (a Delta path, a table, a topic)."""
    for option in TARGET_OPTIONS:
        value = getattr(sink, option, None)
        if isinstance(value, str) and value:
            return f"{option} {value!r}"
    return "its target"


def _message(
    pipeline: str,
    epoch: int,
    ledger: Ledger,
    sink: Sink,
    batch: int,
    file: str | None = None,
    *,
    lags: bool = False,
    reason: str | None = None,
    reset_to: int | None = None,
) -> str:
    """The refusal's text; ``reset_to``: the epoch a refused checkpoint reset did not start
    (its ways on carry ``--new-epoch``), unless the sink lags (the reset goes on)."""
    where = ledger_location(ledger)
    if reason is None:
        why = (
            "the target was probably deleted or replaced since, and created again empty "
            "(create_table, create_topic, or a Delta table written anew)"
        )
    else:
        why = f"the target was replaced since by one created again empty: {reason}"
    if reset_to is not None and not lags:
        return _reset_message(pipeline, epoch, sink, batch, file, why, where, reset_to)
    accept = f"`fanout run {file or 'PIPELINE.toml'} --accept-lost-target {shell_word(sink.name)}`"
    if file is None:  # not run from a pipeline file: a FanOut of the caller's own
        accept += f" (FanOut(accept_lost_targets=[{sink.name!r}]))"
    if lags:
        return (
            f"pipeline {pipeline!r}: {target_text(sink)} no longer holds batch {batch} of "
            f"epoch {epoch}, which the ledger marks written there (its last marked batch that "
            f"wrote rows): {why}. The "
            "batches the ledger counts for it are gone from it, and `fanout status` still "
            "counts them. Nothing is written to it by this run: with on_failure='lag' it "
            "lags, its batches wait in the spool (up to its max_lag), and the other sinks "
            "go on.\n"
            "Ways on: restore the target (from a backup or the storage's history: a Delta "
            "table's RESTORE, a PostgreSQL dump, the topic's mirror), then run again; or "
            f"accept the loss explicitly on the next run: {accept}, whose catch-up writes the "
            "spooled batches into the target as it is, then the sink writes on (the ledger "
            f"at {where} keeps counting the lost batches as written there)."
            + moved_on_purpose(sink)
        )
    return (
        f"pipeline {pipeline!r}: {target_text(sink)} no longer holds batch {batch} of epoch "
        f"{epoch}, which the ledger marks written there (its last marked batch that wrote "
        f"rows): {why}. The batches the ledger "
        "counts for it are gone from it, and `fanout status` still counts them. Nothing was "
        "written by this run.\n"
        "Ways on: restore the target (from a backup or the storage's history: a Delta table's "
        "RESTORE, a PostgreSQL dump, the topic's mirror), then start again; or accept the loss "
        f"explicitly for this run: {accept}, which writes on from the next batch "
        f"into the target as it is (the ledger at {where} keeps counting the lost batches "
        "as written there)." + moved_on_purpose(sink)
    )


def _reset_message(
    pipeline: str, epoch: int, sink: Sink, batch: int, file: str | None, why: str, where: str,
    reset_to: int,
) -> str:  # fmt: skip
    """The refusal of a checkpoint reset's first batch, asked before epoch ``reset_to``
    started: nothing of the reset is in the ledger or the sinks, so each way on is the reset
    run again (``--new-epoch``), or the replaced checkpoint, which still resumes."""
    run = f"fanout run {file or 'PIPELINE.toml'} --new-epoch"
    name = shell_word(sink.name)
    reset = f"`{run}`"
    accept = f"`{run} --accept-lost-target {name}`"
    if file is None:  # not run from a pipeline file: a FanOut of the caller's own
        reset += " (FanOut(on_checkpoint_reset='new_epoch'))"
        accept += f" (FanOut(on_checkpoint_reset='new_epoch', accept_lost_targets=[{sink.name!r}]))"
    return (
        f"pipeline {pipeline!r}: {target_text(sink)} no longer holds batch {batch} of epoch "
        f"{epoch}, which the ledger marks written there (its last marked batch that wrote "
        f"rows): {why}. The batches the ledger counts for it are gone from it, and `fanout "
        "status` still counts them. The checkpoint reset is refused before it started: "
        f"epoch {reset_to} was not started and no sink was fenced or written (the ledger is "
        "as before the reset: the replaced checkpoint, if you still have it, stays the "
        "pipeline's).\n"
        "Ways on: restore the target (from a backup or the storage's history: a Delta table's "
        "RESTORE, a PostgreSQL dump, the topic's mirror), then run the reset again: "
        f"{reset}; or accept the loss explicitly with the reset: {accept}, which starts epoch "
        f"{reset_to} and writes on from its first batch into the target as it is (the ledger "
        f"at {where} keeps counting the lost batches as written there)."
        + moved_on_purpose(sink, "run the reset again")
    )
