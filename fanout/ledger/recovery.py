"""``fanout recover``'s report, recorded in the ledger, and what an epoch started from it
checks (ARCHITECTURE §5, "A query still running during a reset").

A report says where a new checkpoint must start: after the batch of the sink furthest
behind (``resume_after``), given the batch it counted each sink at. A query of the
replaced epoch that is still running (a zombie: not stopped) commits batches the report
did not count, and the new checkpoint reads their input again. So the report is recorded
(:meth:`fanout.ledger.delta.DeltaLedger.record_recovery`): rows of status ``recovery``,
``attempt`` holding the report's number, which the transaction
``fanout/<pipeline>#recovery`` counts (the newest report is the one at its version). The
next epoch started on a ledger whose newest report is of the epoch it replaces is started
from that report: refused when a batch past the report was committed meanwhile
(:func:`refused_start`), and its start records the report's number
(``fanout/<pipeline>@e<epoch>#from-recovery``), so a batch of the old epoch marked after
the start and past the report fails, naming the batch its sinks now hold twice
(:func:`late_mark`).

Older fanout versions read the rows as a sink ``*`` and sinks without progress (a status
they do not know); no reader of theirs counts them as marks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from fanout.contract.batch import pipeline_scope
from fanout.errors import ZombieBatchError, batch_ranges, shell_word
from fanout.ledger.entry import REWRITTEN, LedgerEntry, now_utc
from fanout.ledger.gaps import is_skip

RECOVERY: Final = "recovery"
"""The status of a recorded report's rows."""

RESUME = "*"
"""The ``sink`` of a report's row naming the batch a new checkpoint resumes after."""


def recovery_app_id(pipeline: str) -> str:
    """The transaction whose version is the number of ``pipeline``'s newest report."""
    return f"fanout/{pipeline}#recovery"


def started_from_app_id(pipeline: str, epoch: int) -> str:
    """The transaction whose version is the report ``epoch`` was started from."""
    return f"fanout/{pipeline_scope(pipeline, epoch)}#from-recovery"


@dataclass(frozen=True)
class RecoveryReport:
    """One recorded ``fanout recover`` report of one pipeline.

    :param number: the report's number (1, 2, ... per pipeline).
    :param epoch: the epoch whose marks it counted.
    :param resume_after: the batch a new checkpoint resumes after (the sink furthest
        behind among those the pipeline still writes).
    :param counted: per sink with a mark (or a spooled batch) in ``epoch``, the batch it
        was counted at.
    :param recorded_at: when ``fanout recover`` recorded it (``None``: not known).
    """

    pipeline: str
    number: int
    epoch: int
    resume_after: int
    counted: Mapping[str, int] = field(default_factory=dict)
    recorded_at: datetime | None = field(default=None, compare=False)

    def beyond(self, entry: LedgerEntry) -> bool:
        """Whether the committed ``entry`` is a batch the report did not count and a
        checkpoint started from it reads again: of the report's epoch, after
        ``resume_after`` and after its sink's counted batch (a sink it did not count: any
        such batch)."""
        return (
            entry.epoch == self.epoch
            and entry.batch_id > self.resume_after
            and entry.batch_id > self.counted.get(entry.sink, -1)
        )

    def since(self, committed: Iterable[LedgerEntry]) -> dict[str, list[int]]:
        """Per sink, the batches of ``committed`` the report did not count (:meth:`beyond`),
        but for lost marks recorded by a start that let the sink take the batch again
        harmlessly (:data:`fanout.ledger.entry.REWRITTEN`), and for the marks of ``fanout
        ledger skip`` (the report's choice 2: give the batch up for the sinks without it,
        then resume after it): no query wrote them since."""
        found: dict[str, set[int]] = {}
        for entry in committed:
            if (
                self.beyond(entry)
                and not (entry.error or "").startswith(REWRITTEN)
                and not is_skip(entry)
            ):
                found.setdefault(entry.sink, set()).add(entry.batch_id)
        return {sink: sorted(batches) for sink, batches in sorted(found.items())}

    def counted_text(self, sink: str) -> str:
        """How the report counted ``sink``."""
        if sink not in self.counted:
            return f"which did not count the sink (no mark in epoch {self.epoch})"
        return f"which counted the sink at batch {self.counted[sink]}"


def report_entries(
    number: int, resume: LedgerEntry, counted: Mapping[str, LedgerEntry]
) -> list[LedgerEntry]:
    """The ledger rows of report ``number``: where to resume (``resume``, the mark of the
    sink furthest behind) and each counted sink's batch."""
    at = now_utc()

    def row(sink: str, entry: LedgerEntry) -> LedgerEntry:
        return LedgerEntry(
            pipeline=entry.pipeline,
            sink=sink,
            batch_id=entry.batch_id,
            status=RECOVERY,
            query_id=entry.query_id,
            attempt=number,
            started_at=at,
            source_offsets=entry.source_offsets,
            epoch=resume.epoch,
            batch_timestamp_ms=entry.batch_timestamp_ms,
        )

    return [row(RESUME, resume), *(row(s, e) for s, e in sorted(counted.items()))]


def report_of(pipeline: str, number: int, entries: Iterable[LedgerEntry]) -> RecoveryReport | None:
    """Report ``number`` from its ledger rows (``None``: no such rows)."""
    rows = [e for e in entries if e.status == RECOVERY and e.attempt == number]
    resume = next((e for e in rows if e.sink == RESUME), None)
    if resume is None:
        return None
    counted = {e.sink: e.batch_id for e in rows if e.sink != RESUME}
    return RecoveryReport(
        pipeline, number, resume.epoch, resume.batch_id, counted, resume.started_at
    )


def _listed(since: Mapping[str, list[int]]) -> str:
    return ", ".join(
        f"{sink}: batch{'es' if len(ids) > 1 else ''} {batch_ranges(ids)}"
        for sink, ids in since.items()
    )


def _recorded_text(report: RecoveryReport) -> str:
    if report.recorded_at is None:
        return ""
    return f", recorded {report.recorded_at.strftime('%Y-%m-%d %H:%M:%S')} UTC"


def refused_start(
    report: RecoveryReport, entry: LedgerEntry, since: Mapping[str, list[int]], ledger: str
) -> ZombieBatchError:
    """The refusal of ``entry`` (an ``epoch`` row) starting its epoch from ``report``:
    the old epoch's query committed ``since`` after the report."""
    return ZombieBatchError(
        f"pipeline {entry.pipeline!r}: query {entry.query_id} cannot start epoch "
        f"{entry.epoch} from the `fanout recover` report {report.number} (epoch "
        f"{report.epoch}{_recorded_text(report)}): since that report, epoch "
        f"{report.epoch}'s query committed "
        f"{_listed(since)}. A checkpoint started where the report said (after batch "
        f"{report.resume_after}) reads their input again and would write those rows "
        f"twice. Nothing was written under epoch {entry.epoch}. Stop every query of this "
        "pipeline (the old one was still running after the report, or the report is older "
        "than this reset: made while the pipeline ran, which `fanout recover --no-record` "
        "avoids), then "
        f"run `fanout recover --ledger {ledger} --pipeline {shell_word(entry.pipeline)}` again, "
        "and "
        "start the new query from the offsets it prints, on a new checkpoint (this one "
        "planned its first batch from the old offsets)."
    )


def late_mark(
    report: RecoveryReport, entry: LedgerEntry, new_owner: str | None, ledger: str
) -> ZombieBatchError:
    """The failure of ``entry``, a mark of the old epoch committed after the epoch started
    from ``report`` (owned by ``new_owner``), of a batch the report did not count."""
    new = report.epoch + 1
    owner = "" if new_owner is None else f" (query {new_owner})"
    return ZombieBatchError(
        f"pipeline {entry.pipeline!r}, sink {entry.sink}: query {entry.query_id} committed "
        f"batch {entry.batch_id} of epoch {entry.epoch} after epoch {new} started{owner} "
        f"from the `fanout recover` report {report.number}, {report.counted_text(entry.sink)}: "
        "the new epoch reads that batch's input again, so the sink holds its rows twice. "
        f"The ledger records the mark (source offsets {entry.source_offsets}). Stop query "
        f"{entry.query_id}: its checkpoint was replaced, and it is refused from its next "
        "batch on (when this is the catch-up of a lagging sink instead, writing a spooled "
        "batch: the report was made without --spool, and counted the sink at its mark). "
        "Then remove one copy of those rows (the input up to those offsets) from the sink, "
        f"unless it upserts by key; `fanout recover --ledger {ledger} --pipeline "
        f"{shell_word(entry.pipeline)}` lists the marks."
    )
