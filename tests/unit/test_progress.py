"""The progress lines of ``fanout run``: the observer fed the hooks of a real dispatcher,
joined with progress records shaped like Spark's."""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from fanout import BatchFailedError, FanOut
from fanout.app.progress import ProgressObserver
from fanout.contract.batch import Batch, BatchInfo
from fanout.contract.sink import SinkResult
from fanout.errors import SinkWriteError, TransientSinkError
from fanout.ledger.memory import MemoryLedger
from fanout.testing import ArrowFrame, RecordingSink


def _spark(batch_id: int, rows: int, started: datetime, ran: bool = True) -> dict[str, Any]:
    durations = {"addBatch": 120, "triggerExecution": 150} if ran else {"triggerExecution": 3}
    return {
        "batchId": batch_id,
        "numInputRows": rows,
        "timestamp": started.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z",
        "durationMs": durations,
    }


class Failing(RecordingSink):
    """Fails every write, with a message naming a password the sink declared secret."""

    def write(self, batch: Batch) -> SinkResult:
        """Always raises."""
        raise SinkWriteError(
            "connection refused (password s3cr3t)", sink=self.name, batch_id=batch.batch_id
        )

    def secret_values(self) -> list[str]:
        """The password to mask."""
        return ["s3cr3t"]


def _frame(*ids: int | None) -> ArrowFrame:
    import pyarrow as pa

    return ArrowFrame(pa.table({"id": list(ids)}))


def _normalise(text: str) -> str:
    return re.sub(r"\d+\.\d\ds", "T", text)


def test_one_line_per_batch_once_spark_reports_it_and_a_summary() -> None:
    progress = ProgressObserver()
    fan = FanOut(
        "orders",
        MemoryLedger(),
        [RecordingSink("bronze"), RecordingSink("paid")],
        plugins=[progress],
    )
    started = datetime.now(UTC) - timedelta(seconds=2)
    out = io.StringIO()
    fan.process(_frame(1, 2, 3), BatchInfo("orders", 0))
    assert progress.report([], out) == 0  # Spark has not reported batch 0 yet
    idle = _spark(1, 0, started, ran=False)  # an idle trigger names the next batch
    assert progress.report([_spark(0, 3, started), idle], out) == 1
    fan.process(_frame(4), BatchInfo("orders", 1))
    fan.process(_frame(4), BatchInfo("orders", 1))  # a replay: both sinks skip
    assert progress.report([_spark(0, 3, started), idle], out) == 0
    assert progress.flush([_spark(0, 3, started)], out) == 1  # the end of the run
    lines = _normalise(out.getvalue()).splitlines()
    assert re.fullmatch(
        r"batch 0: 3 rows in \| bronze 3 rows T, paid 3 rows T \| lag 2\.\ds", lines[0]
    )
    assert lines[1] == "batch 1: ? rows in | nothing to write | skipped bronze, paid"
    assert _normalise(progress.summary("orders")).splitlines() == [
        "pipeline 'orders': 2 batches, 3 rows in, 2 sink writes skipped (already committed)",
        "  bronze: 3 rows written in T",
        "  paid: 3 rows written in T",
    ]


class HeldAlready(RecordingSink):
    """Finds, by its own records, every batch committed already (a lost ledger mark)."""

    def write(self, batch: Batch) -> SinkResult:
        """Writes nothing; counts the batch's rows."""
        return SinkResult(batch.arrow().num_rows, already_written=True)


def test_a_sink_finding_the_batch_written_by_its_own_records_says_so() -> None:
    """A replay whose write a sink skipped by its own idempotency records (its mark lost)
    read as a write, so a plugin author killing a run could not see the skip happen."""
    progress = ProgressObserver()
    fan = FanOut(
        "orders", MemoryLedger(), [HeldAlready("latest"), RecordingSink("bronze")],
        plugins=[progress],
    )  # fmt: skip
    out = io.StringIO()
    fan.process(_frame(1, 2), BatchInfo("orders", 0))
    progress.flush([], out)
    assert _normalise(out.getvalue()).splitlines() == [
        "batch 0: ? rows in | latest 2 rows already written by an earlier run T, bronze 2 rows T"
    ]
    # a replay that wrote nothing did not write those rows (the summary said "2 rows in")
    assert _normalise(progress.summary("orders")).splitlines() == [
        "pipeline 'orders': 1 batch, 0 rows in",
        "  bronze: 2 rows written in T",
        "  latest: 0 rows written in T, 2 rows already there",
    ]


class CommitsThenFails(RecordingSink):
    """Commits the batch, then fails (a lost connection after the commit): the retry finds
    it written by its own records."""

    def write(self, batch: Batch) -> SinkResult:
        """The first attempt commits and raises; later ones find the batch."""
        if batch.attempt == 1:
            raise TransientSinkError("connection lost after the commit", sink=self.name,
                                     batch_id=batch.batch_id)  # fmt: skip
        return SinkResult(batch.arrow().num_rows, already_written=True)


def test_a_retry_finding_its_own_batch_written_is_not_called_a_replay() -> None:
    """The line said ``already written`` (read: a run before this one wrote it) when this
    run's first attempt had committed the rows and then failed. In the run's first batch
    (which Spark replays after a crash) the failed attempt may have written nothing, the
    earlier run everything: the line said ``by an earlier attempt`` there too, that the
    rows reached the target in this run."""
    progress = ProgressObserver()
    fan = FanOut(
        "orders", MemoryLedger(), [CommitsThenFails("pg")], plugins=[progress], backoff_s=0
    )
    out = io.StringIO()
    fan.process(_frame(1, 2, 3), BatchInfo("orders", 4))
    fan.process(_frame(4, 5), BatchInfo("orders", 5))
    progress.flush([], out)
    assert _normalise(out.getvalue()).splitlines() == [
        "batch 4: ? rows in | pg 3 rows already written by an earlier run or attempt T",
        "batch 5: ? rows in | pg 2 rows already written by an earlier attempt T",
    ]
    assert _normalise(progress.summary("orders")).splitlines() == [
        "pipeline 'orders': 2 batches, 0 rows in",
        "  pg: 0 rows written in T, 5 rows already there",
    ]


def test_a_later_batch_found_written_at_its_first_attempt_is_not_called_a_replay() -> None:
    """Only the run's first batch can be one an earlier run wrote (Spark replays the batch
    it had not committed, then goes on to new ones): a later batch a sink finds written at
    its first attempt was written in this run (a Kafka partition's speculative copy that
    began after the original committed), but the line said ``by an earlier run``."""
    progress = ProgressObserver()
    fan = FanOut("orders", MemoryLedger(), [HeldAlready("events")], plugins=[progress])
    out = io.StringIO()
    fan.process(_frame(1, 2), BatchInfo("orders", 7))
    fan.process(_frame(3), BatchInfo("orders", 8))
    progress.flush([], out)
    assert _normalise(out.getvalue()).splitlines() == [
        "batch 7: ? rows in | events 2 rows already written by an earlier run T",
        "batch 8: ? rows in | events 1 rows already written by an earlier attempt T",
    ]


def test_a_failed_batch_names_the_failed_sink_without_its_secret() -> None:
    progress = ProgressObserver()
    fan = FanOut(
        "orders",
        MemoryLedger(),
        [RecordingSink("bronze"), Failing("pg")],
        plugins=[progress],
        backoff_s=0,
    )
    try:
        fan.process(_frame(1), BatchInfo("orders", 7))
    except BatchFailedError as failed:
        # Spark reports no progress for a failed batch: fanout counts its rows (the summary
        # read "0 rows in" though the batch brought rows)
        assert failed.rows_in == 1
    else:
        raise AssertionError("the batch was meant to fail")
    out = io.StringIO()
    assert progress.flush([], out) == 1
    assert _normalise(out.getvalue()) == (
        "batch 7 FAILED | bronze 1 rows T | pg failed: SinkWriteError: "
        "sink 'pg', batch 7: connection refused (password ***)\n"
    )
    assert progress.summary("orders").splitlines()[0] == (
        "pipeline 'orders': 1 batch, 1 rows in, 1 failed"
    )


def test_the_summary_counts_the_rows_a_lagging_sink_caught_up() -> None:
    """A lagging sink's catch-up writes were left out of the summary: after a run in which
    it lagged and caught up, it read ``clicks_pg: 2800 rows`` beside ``bronze: 4960 rows``
    though it held every row."""
    progress = ProgressObserver()
    info = BatchInfo("clicks", 5)
    progress.fanout_batch_start(info, ["bronze", "clicks_pg"], [])
    progress.fanout_sink_done(BatchInfo("clicks", 3), "clicks_pg", SinkResult(7), 0.5)
    progress.fanout_sink_done(BatchInfo("clicks", 4), "clicks_pg", SinkResult(2), 0.5)
    progress.fanout_sink_done(info, "bronze", SinkResult(4), 0.25)
    progress.fanout_sink_done(info, "clicks_pg", SinkResult(4), 0.25)
    progress.fanout_sink_lag(info, {}, None)
    progress.fanout_batch_end(info, {})
    progress.fanout_batch_start(BatchInfo("clicks", 6), ["catchup_only"], [])
    progress.fanout_sink_done(BatchInfo("clicks", 2), "catchup_only", SinkResult(3), 0.5)
    out = io.StringIO()
    assert progress.flush([], out) == 1
    assert out.getvalue().endswith("| clicks_pg caught up 2 batch(es)\n")
    assert progress.summary("clicks").splitlines() == [
        "pipeline 'clicks': 1 batch, 0 rows in",
        "  bronze: 4 rows written in 0.25s",
        "  catchup_only: 3 rows in 1 batch caught up",
        "  clicks_pg: 4 rows written in 0.25s, 9 rows in 2 batches caught up",
    ]


def test_a_catch_up_finding_a_batch_written_counts_its_rows_apart() -> None:
    """An abandoned write whose commit landed: its catch-up finds the batch written and
    wrote nothing, but the summary counted its rows caught up."""
    progress = ProgressObserver()
    info = BatchInfo("clicks", 5)
    progress.fanout_batch_start(info, ["lake"], [])
    progress.fanout_sink_done(
        BatchInfo("clicks", 4), "lake", SinkResult(6, already_written=True), 0.5
    )
    progress.fanout_sink_done(BatchInfo("clicks", 3), "lake", SinkResult(2), 0.5)
    progress.fanout_sink_done(info, "lake", SinkResult(4), 0.25)
    progress.fanout_sink_lag(info, {}, None)
    progress.fanout_batch_end(info, {})
    out = io.StringIO()
    progress.flush([], out)
    assert out.getvalue().endswith("| lake caught up 1 batch(es)\n")  # the one it wrote
    assert progress.summary("clicks").splitlines() == [
        "pipeline 'clicks': 1 batch, 0 rows in",
        "  lake: 4 rows written in 0.25s, 2 rows in 1 batch caught up, 6 rows already there",
    ]


class _CountedFrame(ArrowFrame):
    """An :class:`ArrowFrame` that records each ``count()`` and whether the batch was
    released (unpersisted) before it: a count then reads the batch's source again."""

    def __init__(self, table: Any) -> None:
        super().__init__(table)
        self.counts: list[str] = []

    def count(self) -> int:
        """Record the call, then count."""
        self.counts.append("after unpersist" if self.unpersist_calls else "held")
        return super().count()


def test_a_failed_batch_counts_its_rows_from_the_arrow_a_sink_converted() -> None:
    """A sink that read Arrow converted the batch: its rows are known without a Spark job
    (the count ran after the batch's Arrow was released: a second read of the source)."""
    import pyarrow as pa

    frame = _CountedFrame(pa.table({"id": [1, 2, 3]}))
    fan = FanOut("orders", MemoryLedger(), [RecordingSink("bronze"), Failing("pg")], backoff_s=0)
    try:
        fan.process(frame, BatchInfo("orders", 4))
    except BatchFailedError as failed:
        assert (failed.rows_in, frame.counts) == (3, [])
    else:
        raise AssertionError("the batch was meant to fail")


def test_a_failed_batch_counts_its_rows_before_the_batch_is_released() -> None:
    """No sink converted the batch: its one count runs while the batch is still held
    (persisted when two sinks read it), not after step 7 unpersisted it."""
    import pyarrow as pa

    frame = _CountedFrame(pa.table({"id": [1, 2]}))
    sinks = [RecordingSink("bronze", reads="dataframe"), Failing("pg", reads="dataframe")]
    fan = FanOut("orders", MemoryLedger(), sinks, backoff_s=0)
    try:
        fan.process(frame, BatchInfo("orders", 5))
    except BatchFailedError as failed:
        assert (failed.rows_in, frame.counts) == (2, ["held"])
    else:
        raise AssertionError("the batch was meant to fail")


class RefusesNullIds(RecordingSink):
    """Sets aside (counts as dead-lettered) the rows whose id is null."""

    def write(self, batch: Batch) -> SinkResult:
        """Counts the rows with an id as written, the others as dead letters."""
        ids = batch.arrow().column("id").to_pylist()
        nulls = ids.count(None)
        return SinkResult(len(ids) - nulls, dead_lettered=nulls)


def test_a_sink_s_dead_lettered_rows_are_shown_beside_its_rows() -> None:
    """The line said ``files 2 rows`` of a 3-row batch whose third row the sink set aside
    as a dead letter: the row read as lost, and nothing in the run's output said where it
    went (found writing a sink plugin from the docs)."""
    progress = ProgressObserver()
    fan = FanOut(
        "orders", MemoryLedger(), [RefusesNullIds("files"), RecordingSink("bronze")],
        plugins=[progress],
    )  # fmt: skip
    out = io.StringIO()
    fan.process(_frame(1, None, 3), BatchInfo("orders", 0))
    fan.process(_frame(4, 5), BatchInfo("orders", 1))
    fan.process(_frame(None, 7), BatchInfo("orders", 2))
    progress.flush([], out)
    assert _normalise(out.getvalue()).splitlines() == [
        "batch 0: ? rows in | files 2 rows + 1 dead-lettered T, bronze 3 rows T",
        "batch 1: ? rows in | files 2 rows T, bronze 2 rows T",
        "batch 2: ? rows in | files 1 rows + 1 dead-lettered T, bronze 2 rows T",
    ]
    assert _normalise(progress.summary("orders")).splitlines() == [
        "pipeline 'orders': 3 batches, 0 rows in",
        "  bronze: 7 rows written in T",
        "  files: 5 rows written in T, 2 rows dead-lettered",
    ]
