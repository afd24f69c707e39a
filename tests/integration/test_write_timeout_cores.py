"""A lag sink with ``write_timeout_s`` that writes from the executors (PostgreSQL with
``partitions = 2``) and hangs on a table locked by another connection (``LOCK TABLE ... IN
ACCESS EXCLUSIVE MODE`` in a held transaction) must not hold every core of ``local[2]``:
the other sink's writes, in the batch whose PostgreSQL write hangs and in the next one,
while the catch-up's write of the sink hangs in turn, take a fraction of its timeout."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from fanout_delta.sink import DeltaSink

from fanout import FanOut, hookimpl
from fanout.contract.batch import Batch, BatchInfo
from fanout.steps.cores import _cluster_slots
from tests.chaos.checker import libpq_url
from tests.integration.locked_postgres import pg_ids, postgres_url_fixture, run_bounded
from tests.integration.streams import (
    committed_marks,
    delta_rows,
    id_counts,
    write_input,
)

PIPELINE = "cores"
TABLE = "cores_orders"
FILES, ROWS = 4, 4
LOCK_AT, RELEASE_AT = 1, 3  # locked while batches 1 and 2 run
TIMEOUT_S = 10.0  # the locked sink's write_timeout_s: above a warm write
FAST_S = 6.0  # the other sink's write while the table is locked: well under TIMEOUT_S
SAFETY_S = 120.0  # the lock is given up by then in any case: a hang fails, never hangs


def _lock_waiters(url: str) -> set[int]:
    """The PostgreSQL sessions waiting for a lock (the hung sink's writes; a killed task's
    session waits on until the lock is gone: PostgreSQL does not see its client leave)."""
    import psycopg2

    with psycopg2.connect(libpq_url(url)) as conn, conn.cursor() as cur:
        cur.execute("SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
        waiting = {int(r[0]) for r in cur.fetchall()}
    conn.close()
    return waiting


def _until_hung(url: str, before: set[int]) -> set[int]:
    """Wait until a new write of the PostgreSQL sink waits for the lock (a session not in
    ``before``), its tasks started; return the sessions waiting then."""
    deadline = time.monotonic() + 30
    while not (waiting := _lock_waiters(url)) - before:
        assert time.monotonic() < deadline, "no write of the sink waited for the lock"
        time.sleep(0.1)
    time.sleep(1.0)  # the write's other tasks start with the first
    return waiting | _lock_waiters(url)


class TableLock:
    """Locks the table in another connection when batch ``LOCK_AT`` starts and releases it
    when batch ``RELEASE_AT`` starts (or after :data:`SAFETY_S`); batch ``LOCK_AT + 1``
    starts once the catch-up's write of batch ``LOCK_AT`` hangs on the lock."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn: Any = None
        self.released_by_safety = False
        self.waiting: set[int] = set()  # the sessions of batch LOCK_AT's write
        self.started = 0.0
        self.took = 0.0  # batch LOCK_AT + 1, from its start to its end

    @hookimpl
    def fanout_batch_end(self, info: BatchInfo, results: Any) -> None:
        """Time batch ``LOCK_AT + 1``."""
        if info.batch_id == LOCK_AT + 1:
            self.took = time.monotonic() - self.started

    @hookimpl
    def fanout_batch_start(self, info: BatchInfo, pending: Any, skipped: Any) -> None:
        """Take the lock, wait for the catch-up to hang, or give the lock back."""
        if info.batch_id == LOCK_AT:
            import psycopg2

            self.conn = psycopg2.connect(libpq_url(self.url))
            self.conn.cursor().execute(f'LOCK TABLE "{TABLE}" IN ACCESS EXCLUSIVE MODE')
            threading.Timer(SAFETY_S, self._safety).start()
        elif info.batch_id == LOCK_AT + 1:  # the catch-up's write of batch LOCK_AT hangs
            _until_hung(self.url, self.waiting)
            self.started = time.monotonic()
        elif info.batch_id == RELEASE_AT:
            self.release()

    def _safety(self) -> None:
        if self.conn is not None:
            self.released_by_safety = True
            self.release()

    def release(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.rollback()
            conn.close()


class TimedDelta(DeltaSink):
    """The Delta sink (its Spark job: the batch's Arrow conversion), timed; in batch
    ``LOCK_AT``, from the moment the PostgreSQL sink's write hangs on the lock, its tasks
    holding what cores they hold."""

    def __init__(self, name: str, lock: TableLock | None, **options: Any) -> None:
        super().__init__(name, **options)
        self.lock = lock
        self.took: dict[int, float] = {}

    def write(self, batch: Batch) -> Any:
        if self.lock is not None and batch.batch_id == LOCK_AT:
            self.lock.waiting = _until_hung(self.lock.url, set())
        started = time.monotonic()
        result = super().write(batch)
        self.took[batch.batch_id] = time.monotonic() - started
        return result


pg_url = postgres_url_fixture("cores")


def _fan(tmp: Path, pg: dict[str, Any], lake: DeltaSink, plugins: list[Any]) -> FanOut:
    return FanOut(
        PIPELINE, str(tmp / "ledger"), [lake, pg], spool=str(tmp / "spool"),
        probe_interval_s=0.5, retries=0, plugins=plugins,
    )  # fmt: skip


def test_a_hung_executor_sink_leaves_a_core_to_the_other_sinks(
    spark: Any, tmp_path: Path, pg_url: str
) -> None:
    """Before: the locked sink's two write tasks held both cores; the Delta sink's write
    waited for its timeout (batch 1), then for the catch-up's write, bounded by twice the
    timeout (batch 2)."""
    pg = {
        "type": "postgres", "name": "pg", "url": pg_url, "table": TABLE, "mode": "append",
        "create_table": True, "partitions": 2, "on_failure": "lag",
    }  # fmt: skip
    write_input(tmp_path / "input", 1, ROWS)  # batch 0: the table created, workers warm
    lake = str(tmp_path / "lake")
    with _fan(tmp_path, pg, TimedDelta("lake", None, path=lake), []) as fan:
        run_bounded(spark, tmp_path, fan, SAFETY_S + 120)
    write_input(tmp_path / "input", FILES - 1, ROWS, start_file=1)
    lock = TableLock(pg_url)
    sink = TimedDelta("lake", lock, path=lake)
    fan = _fan(tmp_path, {**pg, "write_timeout_s": TIMEOUT_S}, sink, [lock])
    try:
        run_bounded(spark, tmp_path, fan, SAFETY_S + 120)
        assert not lock.released_by_safety
        took = {**{f"lake {b}": t for b, t in sink.took.items()}, "batch 2": lock.took}
        assert {what: t < FAST_S for what, t in took.items()} == {
            "lake 1": True, "lake 2": True, "lake 3": True, "batch 2": True,
        }, took  # fmt: skip
        for _ in range(3):
            caught = fan.catch_up(timeout_s=120)
            if caught["pg"].state == "live":
                break
        assert {name: lag.state for name, lag in caught.items()} == {"pg": "live"}
    finally:
        lock.release()
        fan.close()
    ids = Counter(range(FILES * ROWS))
    assert id_counts(delta_rows(tmp_path / "lake")) == ids
    assert Counter(pg_ids(pg_url, TABLE)) == ids
    assert committed_marks(tmp_path / "ledger", PIPELINE) == Counter(
        {(name, b): 1 for name in ("lake", "pg") for b in range(FILES)}
    )


def test_the_scheduler_tells_a_real_sessions_task_slots(spark: Any) -> None:
    """What spark_cores asks a cluster (its unit test fakes the answer) of a real session:
    local[2] runs two tasks at once, whatever spark.default.parallelism says."""
    assert spark.sparkContext.master == "local[2]"
    assert _cluster_slots(spark.sparkContext) == 2
