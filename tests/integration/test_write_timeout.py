"""A lag sink that hangs (``write_timeout_s``): a PostgreSQL table locked by another
connection (``LOCK TABLE ... IN ACCESS EXCLUSIVE MODE`` in a held transaction) while batches
run. The Delta sink's batches land while the lock is held, the PostgreSQL sink lags with a
reason naming its timeout, and once the lock is gone the catch-up gives it every batch
once; its abandoned write is cancelled (a Spark job) or, when it cannot be (Python on the
driver), waited for before the batch is written again, and never marked."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from fanout_delta.sink import DeltaSink
from fanout_postgres.sink import PostgresSink

from fanout import FanOut, SinkResult, hookimpl
from fanout.app.status import report
from fanout.contract.batch import Batch, BatchInfo
from fanout.contract.lag import SinkLag, SpoolSize
from fanout.ledger.delta import DeltaLedger
from fanout.sink_spec import LagPolicy, SinkSpec
from tests.chaos.checker import libpq_url
from tests.integration.locked_postgres import pg_ids, postgres_url_fixture, run_bounded
from tests.integration.streams import (
    committed_marks,
    delta_rows,
    id_counts,
    write_input,
)

PIPELINE = "hang"
FILES, ROWS = 5, 4
LOCK_AT, RELEASE_AT = 1, 3  # the table is locked when batch 1 starts, freed when batch 3 does
TABLE = "hang_orders"
SAFETY_S = 60.0  # the lock is given up by then in any case: a hang fails, never hangs


class TableLock:
    """Locks the PostgreSQL table in another connection when batch ``LOCK_AT`` starts and
    releases it when batch ``RELEASE_AT`` starts (or after :data:`SAFETY_S`); records the
    Delta sink's ids, the status and the lag each batch reported while it was held."""

    def __init__(self, url: str, tmp: Path, release_at: int = RELEASE_AT) -> None:
        self.url, self.tmp, self.release_at = url, tmp, release_at
        self.conn: Any = None
        self.released_by_safety = False
        self.lake_at_release: list[int] | None = None
        self.status_at_release: str | None = None
        self.lags: dict[int, dict[str, SinkLag]] = {}
        self._lock = threading.Lock()

    @hookimpl
    def fanout_batch_start(self, info: BatchInfo, pending: Any, skipped: Any) -> None:
        """Take the lock, or give it back."""
        if info.batch_id == LOCK_AT:
            self.hold()
        elif info.batch_id == self.release_at and self.conn is not None:
            self.lake_at_release = sorted(id_counts(delta_rows(self.tmp / "lake")).elements())
            ledger = DeltaLedger(str(self.tmp / "ledger"))
            self.status_at_release = report(ledger, PIPELINE, spool=str(self.tmp / "spool"))
            self.release()

    @hookimpl
    def fanout_sink_lag(
        self, info: BatchInfo, lags: Mapping[str, SinkLag], spool: SpoolSize | None
    ) -> None:
        """Keep what each live batch said of the lagging sink."""
        self.lags.setdefault(info.batch_id, dict(lags))

    def hold(self) -> None:
        import psycopg2

        conn = psycopg2.connect(libpq_url(self.url))
        conn.cursor().execute(f'LOCK TABLE "{TABLE}" IN ACCESS EXCLUSIVE MODE')
        self.conn = conn
        threading.Timer(SAFETY_S, self._safety).start()

    def _safety(self) -> None:
        if self.conn is not None:
            self.released_by_safety = True
            self.release()

    def release(self) -> None:
        with self._lock:
            conn, self.conn = self.conn, None
        if conn is not None:
            conn.rollback()
            conn.close()


class DriverReadingPostgres(PostgresSink):
    """A PostgreSQL sink whose write first reads its table from the driver, in Python (no
    Spark job cancel reaches it), and which records each write: when it ran, what it
    returned or raised first, and any two writes of one batch running at once."""

    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name, **options)
        self.calls: list[tuple[int, float, float, SinkResult | None]] = []
        self.overlaps: list[int] = []
        self.errors: dict[int, str] = {}  # each batch's first error
        self._running: Counter[int] = Counter()
        self._guard = threading.Lock()

    def write(self, batch: Batch) -> SinkResult:
        import psycopg2

        with self._guard:
            self._running[batch.batch_id] += 1
            if self._running[batch.batch_id] > 1:
                self.overlaps.append(batch.batch_id)
        started, result = time.monotonic(), None
        try:
            with psycopg2.connect(libpq_url(str(self.url))) as conn, conn.cursor() as cur:
                cur.execute("SELECT to_regclass(%s) IS NOT NULL", (f'"{TABLE}"',))
                if cur.fetchone()[0]:  # created by the first write
                    cur.execute(f'SELECT count(*) FROM "{TABLE}"')  # waits while locked
            conn.close()
            result = super().write(batch)
            return result
        except Exception as exc:
            self.errors.setdefault(batch.batch_id, str(exc))
            raise
        finally:
            with self._guard:
                self._running[batch.batch_id] -= 1
            self.calls.append((batch.batch_id, started, time.monotonic(), result))


class LateExecutorDelta(DeltaSink):
    """A Delta sink writing from the executors whose Spark job starts once the PostgreSQL
    sink's write tasks have taken the cores (waiting on the lock while it is held)."""

    def write(self, batch: Batch) -> Any:
        time.sleep(1.5)
        return super().write(batch)


pg_url = postgres_url_fixture("hang")


def _fan(tmp: Path, pg: Any, lock: TableLock | None, lake: Any = None) -> FanOut:
    lake = lake or {"type": "delta", "name": "lake", "path": str(tmp / "lake")}
    return FanOut(
        PIPELINE,
        str(tmp / "ledger"),
        [lake, pg],
        spool=str(tmp / "spool"),
        probe_interval_s=0.5,
        retries=0,
        plugins=[] if lock is None else [lock],
    )


def _warm_up(spark: Any, tmp: Path, pg: Any, lake: Any = None) -> None:
    """Batch 0, without a timeout: the first write of a sink (its table created, Spark's
    Python workers started) takes seconds, the following ones a fraction of one."""
    write_input(tmp / "input", 1, ROWS)
    with _fan(tmp, pg, None, lake) as fan:
        _run_bounded(spark, tmp, fan, None)
    write_input(tmp / "input", FILES - 1, ROWS, start_file=1)


def _run_bounded(spark: Any, tmp: Path, fan: FanOut, lock: TableLock | None) -> None:
    """The stream, bounded: a batch that hangs fails the test (the lock given back)."""
    run_bounded(spark, tmp, fan, SAFETY_S + 60, None if lock is None else lock.release)


def _check_final(tmp: Path, pg_url: str, fan: FanOut, lock: TableLock) -> None:
    """Every id once in both sinks, one mark per sink and batch, nothing left behind."""
    assert not lock.released_by_safety, "the batches waited for the locked sink"
    # Delta got batches 1 and 2 while the table was locked
    assert lock.lake_at_release == list(range(RELEASE_AT * ROWS))
    for _ in range(3):  # a write after a cancel may start cold: abandoned, tried again longer
        caught = fan.catch_up(timeout_s=120)
        if caught["pg"].state == "live":
            break
    assert {name: lag.state for name, lag in caught.items()} == {"pg": "live"}
    assert fan.spool is not None and fan.spool.size() == (0, 0, 0)
    ids = Counter(range(FILES * ROWS))
    assert id_counts(delta_rows(tmp / "lake")) == ids
    assert Counter(pg_ids(pg_url, TABLE)) == ids
    assert committed_marks(tmp / "ledger", PIPELINE) == Counter(
        {(sink, b): 1 for sink in ("lake", "pg") for b in range(FILES)}
    )


def _check_lagged(lock: TableLock) -> None:
    """Batch 1 left the sink lagging, and said why: its timeout, the sink, the batch."""
    lag = lock.lags[LOCK_AT]["pg"]
    assert (lag.state, lag.batches) == ("lagging", 1)
    assert lag.error is not None
    assert lag.error.startswith("SinkTimeoutError: sink 'pg', batch 1: write did not return")
    assert "write_timeout_s=2 s" in lag.error
    assert lock.lags[LOCK_AT + 1]["pg"].batches == 2
    assert lock.status_at_release is not None
    assert "lagging 2 batches" in lock.status_at_release, lock.status_at_release


def _pg_options(url: str) -> dict[str, Any]:
    return {
        "url": url,
        "table": TABLE,
        "mode": "append",
        "create_table": True,
        "partitions": 2,
        "on_failure": "lag",
        "write_timeout_s": 2,
    }


def test_a_locked_postgres_sink_lags_at_its_timeout_and_its_spark_job_is_cancelled(
    spark: Any, tmp_path: Path, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    options = {"type": "postgres", "name": "pg", **_pg_options(pg_url)}
    _warm_up(spark, tmp_path, {k: v for k, v in options.items() if k != "write_timeout_s"})
    lock = TableLock(pg_url, tmp_path)
    fan = _fan(tmp_path, options, lock)
    try:
        with caplog.at_level(logging.DEBUG, logger="fanout"):
            _run_bounded(spark, tmp_path, fan, lock)
            _check_lagged(lock)
            _check_final(tmp_path, pg_url, fan, lock)
    finally:
        lock.release()
        fan.close()
    failed = [
        r for r in delta_rows(tmp_path / "ledger") if r["status"] == "failed" and r["sink"] == "pg"
    ]
    # one failed row per attempt: the timeout (the live write's, then each catch-up write's
    # of batch 1 tried while the table was locked); the abandoned write's Spark job failing
    # as cancelled by its tag is that same attempt, logged at debug, not recorded again
    timeouts = [r for r in failed if r["error"].startswith("SinkTimeoutError: ")]
    assert len(timeouts) == len(failed) >= 1, failed
    # each abandoned write ended: its running job cancelled, or (given up while still in
    # its Python, e.g. by a max_lag drain under load) no job started at all
    ended = [
        m
        for r in caplog.records
        if "of its abandoned write failed" in (m := r.getMessage())
        and ("cancelled job tags fanout-hang-pg-0-1-" in m or "were not started" in m)
    ]
    assert len(ended) == len(timeouts), ended
    assert any("cancelled job tags" in m for m in ended), ended  # the live write's job
    first = min(timeouts, key=lambda r: r["finished_at"])
    assert "write_timeout_s=2 s (all attempts together; now at attempt 1)" in first["error"]
    assert {r["batch_id"] for r in failed} == {LOCK_AT}


def test_a_locked_sink_holding_every_core_is_abandoned_at_its_timeout(
    spark: Any, tmp_path: Path, pg_url: str
) -> None:
    """The locked sink's two write tasks hold both cores of ``local[2]`` when the Delta
    sink's Spark job starts: that job waited for the cores, the batch for it, and the
    timeout was looked at only once the other sinks had written, so every sink waited for
    the lock, and the PostgreSQL write, done once it was freed, counted as written in time
    (no SinkTimeoutError). The deadline now cancels the hung write's job by itself."""
    options = {"type": "postgres", "name": "pg", **_pg_options(pg_url)}
    no_timeout = {k: v for k, v in options.items() if k != "write_timeout_s"}

    def lake() -> DeltaSink:
        return LateExecutorDelta("lake", path=str(tmp_path / "lake"), write_from="executors")

    _warm_up(spark, tmp_path, no_timeout, lake())
    lock = TableLock(pg_url, tmp_path)
    fan = _fan(tmp_path, options, lock, lake())
    try:
        _run_bounded(spark, tmp_path, fan, lock)
        _check_lagged(lock)
        _check_final(tmp_path, pg_url, fan, lock)
    finally:
        lock.release()
        fan.close()


def test_an_abandoned_write_running_on_is_waited_for_starts_no_job_and_writes_nothing_twice(
    spark: Any, tmp_path: Path, pg_url: str
) -> None:
    options = _pg_options(pg_url)
    policy = LagPolicy("lag", write_timeout_s=options.pop("write_timeout_s"))
    del options["on_failure"]
    _warm_up(
        spark, tmp_path, SinkSpec(DriverReadingPostgres("pg", **options), lag=LagPolicy("lag"))
    )
    lock = TableLock(pg_url, tmp_path)
    sink = DriverReadingPostgres("pg", **options)
    fan = _fan(tmp_path, SinkSpec(sink, lag=policy), lock)
    try:
        _run_bounded(spark, tmp_path, fan, lock)
        _check_lagged(lock)
        _check_final(tmp_path, pg_url, fan, lock)
    finally:
        lock.release()
        fan.close()
    assert sink.overlaps == []  # the catch-up waited for the abandoned write
    calls = [c for c in sink.calls if c[0] == LOCK_AT]
    first, replay = calls[0], calls[-1]
    # (on a loaded machine a catch-up write may pass its own bound too: abandoned between)
    # the abandoned write (still in Python when cancelled, which no job cancel reaches) ran
    # on past its timeout; once the lock was gone it reached the sink's Spark job, which an
    # abandoned write never starts (it ran and committed the batch late before waves): the
    # catch-up's write, started only after it ended, wrote every partition
    assert first[2] - first[1] > 2 and first[3] is None
    assert sink.errors[LOCK_AT].startswith(
        f"sink 'pg', batch {LOCK_AT}: abandoned at its write_timeout_s before any of "
        "partitions 0..1 was written: partitions [0, 1] were not started"
    ), sink.errors
    assert replay[1] >= first[2]
    assert replay[3] is not None and replay[3].rows == ROWS
    assert replay[3].details["skipped_partitions"] == []


def test_a_new_fanout_of_the_pipeline_waits_for_the_abandoned_write_close_left_running(
    spark: Any, tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() leaves an abandoned write still running (its sink open) and says the next
    run writes the batch; a next run in the same process (a notebook's re-run cell, a
    restarted query) must not write that batch beside it."""
    import fanout.dispatch.closing as closing_module

    monkeypatch.setattr(closing_module, "CLOSE_WAIT_S", 1.0)
    options = _pg_options(pg_url)
    policy = LagPolicy("lag", write_timeout_s=options.pop("write_timeout_s"))
    del options["on_failure"]
    _warm_up(
        spark, tmp_path, SinkSpec(DriverReadingPostgres("pg", **options), lag=LagPolicy("lag"))
    )
    lock = TableLock(pg_url, tmp_path, release_at=FILES + 1)  # held until released below
    first = DriverReadingPostgres("pg", **options)
    fan = _fan(tmp_path, SinkSpec(first, lag=policy), lock)
    try:
        _run_bounded(spark, tmp_path, fan, lock)
        fan.close()  # the abandoned write of batch 1 still waits for the lock
        assert fan.abandoned.running("pg") is not None
        second = DriverReadingPostgres("pg", **options)
        second._running, second.overlaps, second._guard = (
            first._running,
            first.overlaps,
            first._guard,
        )
        again = _fan(tmp_path, SinkSpec(second, lag=policy), None)
        try:
            caught = again.catch_up(timeout_s=3)  # the lock is still held: nothing lands
            assert caught["pg"].state != "live"
            lock.release()
            for _ in range(5):
                caught = again.catch_up(timeout_s=120)
                if caught["pg"].state == "live":
                    break
            assert caught["pg"].state == "live"
        finally:
            again.close()
    finally:
        lock.release()
        fan.close()
    ids = Counter(range(FILES * ROWS))
    assert Counter(pg_ids(pg_url, TABLE)) == ids
    assert committed_marks(tmp_path / "ledger", PIPELINE) == Counter(
        {(sink, b): 1 for sink in ("lake", "pg") for b in range(FILES)}
    )
    assert first.overlaps == []  # never two writes of one batch at once
    assert committed_marks(tmp_path / "ledger", PIPELINE) == Counter(
        {(sink, b): 1 for sink in ("lake", "pg") for b in range(FILES)}
    )
