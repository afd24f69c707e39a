"""Step 3c of a batch: a batch Spark replays, refused to a sink that cannot tell whether
it holds it while its own records are gone.

Spark runs a batch again, with the same ``offsets/N`` and the same ``batchTimestampMs``,
when the run that began it was killed or stopped in it (or it raised): that attempt may
have written it to a sink and died before its ledger mark. A sink's own records
(:meth:`fanout.Sink.holds_batch`: Kafka's marker groups, Delta's app transactions) then
skip what it holds. Records that expired or were deleted since cannot: ``holds_batch``
answers ``None`` (an idle pipeline's restart, which must pass, reads the same), and the
replay would write the batch a second time. So a replayed batch (:class:`RunMemory`) is
refused (:func:`refuse_unproven_replay`) to a pending sink with a mark in the epoch that
wrote rows, no harmless rewrite, whose ``holds_batch`` answers ``None`` about it and whose
:meth:`fanout.Sink.records_gone` says why (about that mark), unless the batch is empty or
fanout refused every earlier attempt of it before any write (:mod:`fanout.ledger.refusals`).

Telling a replay costs nothing: the planning time is the one the context step already
reads from ``offsets/N``, every batch a run plans is stamped after that run's start (so
after its ``FanOut`` was built), and a replay keeps the stamp of the run that planned it
(docs/proposals/replay-detection.md holds the evidence). A batch that is not a replay asks
no sink anything, runs no Spark job.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any

from fanout.contract.batch import BatchInfo
from fanout.contract.sessions import is_connect
from fanout.contract.sink import Sink
from fanout.errors import SinkRecordsGoneError, shell_word
from fanout.ledger.entry import Ledger
from fanout.ledger.gaps import release_command, skip_command
from fanout.observe.secrets import redact
from fanout.steps.holds import answers_records_gone, bounded, gone_reason, holds_answer
from fanout.steps.lost_target import last_kept, target_text, written_marks
from fanout.steps.state import BatchState

log = logging.getLogger("fanout")

QUERY_ID_PROPERTY = "sql.streaming.queryId"
"""The Spark local property set in the thread of a foreachBatch call (classic mode)."""

_CONNECT_WORKER = os.path.join("streaming", "worker", "foreach_batch_worker.py")
"""The file of Spark Connect's foreachBatch worker, whose ``process`` calls the function."""


def now_ms() -> int:
    """The wall clock in epoch milliseconds, as Spark's ``batchTimestampMs``."""
    return int(time.time() * 1000)


@dataclass
class RunMemory:
    """What a :class:`fanout.FanOut` knows of the batches it is handed: when it was built
    (``born_ms``) and the attempts it entered that did not complete (``entered``).

    ``born_ms`` is stamped when the ``FanOut`` is built, before the query's ``start()``
    (the object given to ``foreachBatch``), or, under Spark Connect, when the server's
    foreachBatch worker unpickles it at the query's setup, before the run plans a batch:
    a batch planned before it was planned by an earlier run. ``None`` for a ``FanOut``
    built inside a foreachBatch call (:func:`batch_call`), after its run planned the
    batch: then only ``entered`` tells (a warning says so).
    """

    born_ms: int | None
    entered: dict[int, int] = field(default_factory=dict)
    """Batch id -> planning time of each attempt this object began writing (past the
    step-3c check) and did not complete: a ``FanOut`` reused across restarts of its query
    in one process (born before the attempt) knows its own replays by them."""

    @classmethod
    def now(cls) -> RunMemory:
        """A memory born now."""
        return cls(now_ms())

    def replayed(self, info: BatchInfo) -> bool | None:
        """Whether ``info`` is a replay: what the caller set (``info.replayed``), else
        ``None`` without a planning time, else planned before :attr:`born_ms` or entered
        at the same planning time and not completed."""
        if info.replayed is not None:
            return info.replayed
        planned = info.batch_timestamp_ms
        if planned is None:
            return None
        if self.born_ms is not None and planned < self.born_ms:
            return True
        return self.entered.get(info.batch_id) == planned

    def told(self, info: BatchInfo) -> BatchInfo:
        """``info`` with :attr:`BatchInfo.replayed` set (:meth:`replayed`)."""
        replayed = self.replayed(info)
        return info if replayed == info.replayed else replace(info, replayed=replayed)

    def why(self, info: BatchInfo) -> str:
        """Why ``info`` reads as a replay, for the refusal."""
        planned = info.batch_timestamp_ms
        if info.replayed is True and planned is None:
            return "its caller says so (BatchInfo.replayed)"
        when = f"planned at {_iso(planned)} (batchTimestampMs {planned})"
        if planned is not None and self.born_ms is not None and planned < self.born_ms:
            built = _iso(self.born_ms)
            return f"{when}, before this FanOut was built ({built}): an earlier run began it"
        if planned is not None and self.entered.get(info.batch_id) == planned:
            return f"{when}: this FanOut began writing it before, and that attempt did not end"
        return f"{when}; its caller says so (BatchInfo.replayed)"

    def writing(self, info: BatchInfo) -> None:
        """The attempt of ``info`` may write from now on: remembered until it completes."""
        if info.batch_timestamp_ms is not None:
            self.entered[info.batch_id] = info.batch_timestamp_ms

    def completed(self, info: BatchInfo) -> None:
        """The attempt of ``info`` completed (every pending sink written and marked, or
        lagging): its replay, if any, has nothing left to doubt."""
        self.entered.pop(info.batch_id, None)


def _iso(ms: int | None) -> str:
    """``ms`` (epoch milliseconds) as an ISO time in UTC."""
    if ms is None:
        return "an unknown time"
    stamp = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def batch_call(spark: Any) -> str | None:
    """What says the calling thread is inside a foreachBatch call (``None``: it is not):
    in classic mode the query id Spark sets there (:data:`QUERY_ID_PROPERTY`), under
    Spark Connect the server worker's call of the function on the stack."""
    if spark is not None and not is_connect(spark):
        try:
            query = spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        except Exception:  # no SparkContext (stopped): not inside a batch of it
            query = None
        if query:
            return f"query {query}"
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "process" and code.co_filename.endswith(_CONNECT_WORKER):
            return "a Spark Connect foreachBatch call"
        frame = frame.f_back  # type: ignore[assignment]
    return None


def warn_built_in_batch(pipeline: str, where: str) -> None:
    """The warning for a ``FanOut`` built inside a foreachBatch call (``where``: what
    says so), which cannot tell a replay of an earlier run from a new batch."""
    log.warning(
        "pipeline %s: this FanOut was built inside a foreachBatch call (%s), after Spark "
        "planned the batch, so it cannot tell a batch replayed after a crash of an earlier "
        "run from a new one (only its own attempts): a replay to a sink whose own records "
        "are gone (Kafka markers, Delta app transactions) is not refused and may be written "
        "twice there. Build the FanOut before the query's start() and hand it to "
        "foreachBatch (docs/architecture.md §5)", pipeline, where,
    )  # fmt: skip


def may_refuse(sink: Sink) -> bool:
    """Whether :func:`unproven_sinks` could ever refuse a batch to ``sink``: its type
    answers ``records_gone`` and a second write would not be harmless."""
    return answers_records_gone(sink) and sink.harmless_rewrite() is None


def unproven_sinks(
    state: BatchState,
    sinks: Mapping[str, Sink],
    timeouts: Mapping[str, float],
    *,
    ledger: Ledger,
    noted: bool = False,
) -> dict[str, str]:
    """Each of ``sinks`` (open, pending) that would write the replayed batch of ``state``
    and cannot tell whether it holds it while its own records are gone, with what is gone:
    one with a mark in the epoch that wrote rows (its records existed: a mark of an empty
    batch, or a skip's, left none, :func:`fanout.steps.lost_target.written_marks`, read
    from ``ledger``), no harmless rewrite, answering ``records_gone``, whose
    ``holds_batch`` answers ``None`` about the batch and whose ``records_gone`` gives a
    reason about its newest such mark. ``True``, :class:`fanout.PartlyHeld` or ``False``:
    its records answer; raised or no answer within ``timeouts``: passes, as at the run's
    lost-target check (its write meets the same outage). Not asked: a sink whose mark is
    below the batch before this one, behind at the earlier attempt too (marks never move
    back), which a sink behind is never written past (held back, or the batch refused at
    its gap: docs/architecture.md §14.1).

    ``noted``: the batch is one a write to the sink may have begun for, by a record of its
    own (the catch-up's note, a doubted replay's flag in the spool:
    :mod:`fanout.steps.replay_lag`), not only Spark's replay: a sink with no mark in the
    epoch that wrote rows is asked too, ``records_gone`` about the batch itself (without
    such a record, refusing it would refuse every new epoch's first replayed batch)."""
    info, marks = state.info, state.marks or {}
    gone: dict[str, str] = {}
    for name in state.pending:
        sink, mark = sinks.get(name), marks.get(name)
        if sink is None or (mark is None and not noted) or not may_refuse(sink):
            continue
        if mark is not None and mark < info.batch_id - 1:
            continue
        held = bounded(sink, info.pipeline, partial(_holds, sink, info), timeouts.get(name))
        if held is not None:
            continue
        written = None
        if mark is not None:
            written = last_kept(written_marks(ledger, info.pipeline, info.epoch, name, mark))
        if written is None and noted:
            written = info.batch_id
        if written is None:
            continue
        reason = gone_reason(sink, info.pipeline, info.epoch, written, timeouts.get(name))
        if reason is not None:
            gone[name] = reason
    return gone


def _holds(sink: Sink, info: BatchInfo) -> object:
    """``sink``'s ``holds_batch`` about the replayed batch (:func:`holds_answer`)."""
    question = f"whether it holds batch {info.batch_id} of epoch {info.epoch}, a replay"
    return holds_answer(sink, info.pipeline, info.epoch, info.batch_id, question)


@dataclass(frozen=True)
class ReplayCheck:
    """What :func:`refuse_unproven_replay` needs of its pipeline besides the batch."""

    memory: RunMemory
    accepted: Collection[str] = ()
    """``accept_lost_targets``: written on, warned."""
    lags: Collection[str] = ()
    """Sinks with ``on_failure="lag"``: they lag with the refusal, the others go on."""
    ledger: str | None = None
    """The ledger as commands name it."""
    pipeline_file: str | None = None
    spool: str | None = None
    refused_before_writing: bool = False
    """Whether fanout itself refused every earlier attempt of the batch before any write
    (:func:`fanout.ledger.refusals.refused_unwritten`): then nothing of it was written and
    the replay passes. Nothing is recorded yet when this is asked: the caller records the
    attempt admitted later (``Attempts.admit_refused_replay``, after the gaps and hold-back
    checks of steps 3a and 3b, right before the first write), so that a refusal by those
    leaves the ``refused`` row the newest word, nothing written."""


def refuse_unproven_replay(
    state: BatchState,
    sinks: Mapping[str, Sink],
    timeouts: Mapping[str, float],
    check: ReplayCheck,
    *,
    ledger: Ledger,
) -> dict[str, SinkRecordsGoneError]:
    """Step 3c, on a replayed batch only (``state.info.replayed``): raise
    :class:`fanout.SinkRecordsGoneError` for the first of :func:`unproven_sinks` not in
    ``check.accepted`` (warned and written) nor ``check.lags`` (returned: they lag with
    it), unless fanout refused the batch's earlier attempt before it wrote anything
    (``check.refused_before_writing``) or the batch holds no row (one ``isEmpty()``, only
    here). ``ledger``: the pipeline's, whose marks say which wrote rows. Nothing is
    written before it; a batch that is not a replay asks nothing."""
    info = state.info
    if not info.replayed:
        return {}
    gone = unproven_sinks(state, sinks, timeouts, ledger=ledger)
    for name in sorted(set(gone) & set(check.accepted)):
        log.warning(
            "pipeline %s, sink %s: batch %s of epoch %s is a replay and the sink cannot tell "
            "whether its target holds it (%s); accepted (accept_lost_targets): it is written, "
            "a second time if the attempt before wrote it", info.pipeline, name,
            info.batch_id, info.epoch, gone.pop(name),
        )  # fmt: skip
    if not gone:
        return {}
    if check.refused_before_writing:
        log.info(
            "pipeline %s, batch %s: a replay of a batch fanout refused before writing it: "
            "written", info.pipeline, info.batch_id,
        )  # fmt: skip
        return {}
    if state.df.isEmpty():
        log.info(
            "pipeline %s, batch %s: a replay that %s cannot tell it holds, but it holds no "
            "row: nothing to write twice", info.pipeline, info.batch_id, ", ".join(sorted(gone)),
        )  # fmt: skip
        return {}
    lost: dict[str, SinkRecordsGoneError] = {}
    for name, reason in sorted(gone.items()):
        lags = name in check.lags
        error = SinkRecordsGoneError(
            redact(_message(info, sinks[name], reason, check, lags), sinks[name].secret_values()),
            sink=name,
            batch_id=info.batch_id,
        )
        if not lags:
            raise error
        log.error("%s", error)
        lost[name] = error
    return lost


def _message(info: BatchInfo, sink: Sink, reason: str, check: ReplayCheck, lags: bool) -> str:
    """The refusal of a replayed batch to ``sink`` (``reason``: its ``records_gone``)."""
    batch, epoch, name = info.batch_id, info.epoch, sink.name
    run = f"fanout run {check.pipeline_file or 'PIPELINE.toml'}"
    accept = f"`{run} --accept-lost-target {shell_word(name)}`"
    if check.pipeline_file is None:  # a FanOut of the caller's own
        accept += f" (FanOut(accept_lost_targets=[{name!r}]))"
    if lags and check.spool is not None and check.ledger is not None:
        skip = release_command(check.ledger, info.pipeline, name, batch, epoch, check.spool)
    else:
        skip = skip_command(check.ledger, info.pipeline, name, batch, epoch)
    now = (
        "Nothing of it is written to the sink by this run: with on_failure='lag' it lags, "
        "its batches wait in the spool, and the other sinks go on."
        if lags
        else "Nothing of the batch was written by this attempt, to any sink."
    )
    return (
        f"pipeline {info.pipeline!r}, sink {name!r}: batch {batch} of epoch {epoch} is a "
        f"replay ({check.memory.why(info)}): the attempt before may have written it to "
        f"{target_text(sink)} and died before its ledger mark, and the sink cannot tell "
        f"whether its target holds it, its own records of the epoch being gone: {reason}. "
        f"Written again, it could be there twice. {now} The batch's source offsets: "
        f"{info.source_offsets if info.source_offsets is not None else 'unknown'}.\n"
        "Ways on: look in the target for the batch's rows (the source offsets above name its "
        f"input). If it holds them, record the batch as done for the sink: `{skip}`, then "
        f"start again (the sink skips it, the others write it). If it does not, accept it "
        f"for the next run: {accept}, which writes batch {batch} to it."
    )
