"""An append partition task of the query a checkpoint reset replaced (a task of an executor
Spark gave up on, of a job that failed, still running) that commits batch m + 1 after the
new epoch began: the reset's new checkpoint reads m + 1's rows again (no sink held it when
the new epoch started), in a scope of its own, so the old task's progress mark meets no
other attempt's and its rows landed a second time (up to this version). The new epoch now
closes the old scope before it asks the sinks whether they hold m + 1
(:meth:`fanout.Sink.fence_earlier_epochs`; docs/architecture.md §8.2, "A straggler of an
earlier batch"): a task starting after the fence is refused before it writes, and one whose
transaction is open when the fence comes is waited for, so the question sees its commit
and the start is refused instead."""

from __future__ import annotations

import logging
import pickle
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from commit_hooks import CommitGate, NoCommitHooks
from fanout_postgres import PostgresSink
from fanout_postgres.statements import EPOCH_FENCE, epoch_fence_lock
from pgcheck import execute, query, waiting_on_a_lock

from fanout import FanOut, UnmarkedBatchError
from fanout.contract.batch import Batch, BatchInfo
from fanout.partitioned.membership import MemberDigest
from fanout.testing import open_sink

DDL = "CREATE TABLE t (id bigint NOT NULL, name text NOT NULL)"
SCHEMA = "id LONG, name STRING"
ARROW = pa.schema([("id", pa.int64()), ("name", pa.string())])
ROWS = [(1, "m+1"), (2, "m+1")]

pytestmark = pytest.mark.usefixtures("no_kept_connections")


def _arrow(rows: list[tuple[Any, ...]]) -> pa.Table:
    return pa.Table.from_pylist([{"id": i, "name": n} for i, n in rows], schema=ARROW)


def test_an_append_straggler_of_the_replaced_query_does_not_append_its_rows_twice(
    spark: Any, pg_url: str
) -> None:
    """The straggler starts after the new epoch closed the old scope: refused before it
    writes. (Before the fence: its mark met nothing in the old scope, and rows 1 and 2 were
    in the table twice.)"""
    execute(pg_url, DDL)
    sink = open_sink(
        PostgresSink("pg", url=pg_url, table="t", mode="append", partitions=1), "strag"
    )
    old = Batch(spark.createDataFrame(ROWS, SCHEMA), BatchInfo("strag", 7, "q0"), "pg",
                "fanout/strag/pg")  # fmt: skip
    # the old query's task of batch 7, shipped before that query failed; it still runs
    task = pickle.loads(pickle.dumps(sink.partition_writer(old, None)))
    # the reset: the new epoch closes the old scope before it asks the sink about batch 7
    sink.fence_earlier_epochs("strag", 1)
    assert sink.holds_batch("strag", 0, 7) is False
    # the new checkpoint reads batch 7's rows again as epoch 1's batch 0
    info = BatchInfo("strag", 0, "q1", epoch=1)
    new = Batch(spark.createDataFrame(ROWS, SCHEMA), info, "pg", "fanout/strag@e1/pg")
    assert sink.write(new).rows == 2
    assert query(pg_url, "SELECT id, name FROM t ORDER BY id") == [(1, "m+1"), (2, "m+1")]

    outcome = task.write_partition(0, iter(_arrow(ROWS).to_batches()), NoCommitHooks(),
                                   MemberDigest())  # fmt: skip

    assert query(pg_url, "SELECT id, name FROM t ORDER BY id") == [(1, "m+1"), (2, "m+1")]
    assert outcome.status == "failed"
    assert outcome.failure is not None
    assert "closed this batch's epoch for this sink" in outcome.failure.message
    assert (
        "lift it: `fanout ledger lift-fence --config PIPELINE.toml --epoch 1` (PIPELINE.toml: "
        "the pipeline's file), or by hand: DELETE FROM fanout.progress WHERE pipeline = "
        "'strag' AND sink = 'pg' AND batch_id = 9223372036854775807 AND partition = -1"
    ) in outcome.failure.message
    assert query(
        pg_url, "SELECT pipeline, batch_id, partition FROM fanout.progress ORDER BY 1, 2"
    ) == [("strag", EPOCH_FENCE, -1), ("strag@e1", 0, 0)]


def test_the_first_write_of_an_epoch_fences_too(spark: Any, pg_url: str) -> None:
    """A process whose first batch is of epoch 1 without having started it (the start's
    fence then came from another process, or the sink lagged through the start) fences in
    its preflight: the straggler meets the fence all the same."""
    execute(pg_url, DDL)
    sink = open_sink(
        PostgresSink("pg", url=pg_url, table="t", mode="append", partitions=1), "strag"
    )
    old = Batch(spark.createDataFrame(ROWS, SCHEMA), BatchInfo("strag", 7, "q0"), "pg",
                "fanout/strag/pg")  # fmt: skip
    task = pickle.loads(pickle.dumps(sink.partition_writer(old, None)))
    info = BatchInfo("strag", 0, "q1", epoch=1)
    new = Batch(spark.createDataFrame(ROWS, SCHEMA), info, "pg", "fanout/strag@e1/pg")
    assert sink.write(new).rows == 2

    outcome = task.write_partition(0, iter(_arrow(ROWS).to_batches()), NoCommitHooks(),
                                   MemberDigest())  # fmt: skip

    assert query(pg_url, "SELECT id, name FROM t ORDER BY id") == [(1, "m+1"), (2, "m+1")]
    assert outcome.status == "failed"


def _fan(tmp_path: Path, url: str, on_reset: str = "refuse") -> FanOut:
    sinks = [{"type": "postgres", "name": "pg", "url": url, "table": "t", "mode": "append",
              "partitions": 1}]  # fmt: skip
    return FanOut(
        "strag", str(tmp_path / "ledger"), sinks, parallelism=1, retries=0,
        on_checkpoint_reset=on_reset,  # type: ignore[arg-type]
    )  # fmt: skip


def _info(batch_id: int, query_id: str, end: int) -> BatchInfo:
    return BatchInfo("strag", batch_id, query_id, [{"orders": {"0": end}}],
                     batch_timestamp_ms=1000 + batch_id)  # fmt: skip


def test_a_straggler_open_when_the_new_epoch_starts_refuses_the_start(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """The replaced query's task of batch 1 has inserted its rows, not committed, when the
    new checkpoint's first batch (batch 1's rows again) starts epoch 1: the fence waits for
    that transaction, the task commits, and the question after the fence finds batch 1
    held, so the start is refused (nothing of epoch 1 written) and the lifted fence lets the
    old checkpoint go on. Before the fence the start found batch 1 not held and appended
    its rows, and the task's commit put them there a second time."""
    execute(pg_url, DDL)
    old = _fan(tmp_path, pg_url)
    old.process(spark.createDataFrame([(0, "batch 0")], SCHEMA), _info(0, "q-old", 1))
    sink = old.sinks["pg"]
    batch = Batch(spark.createDataFrame(ROWS, SCHEMA), BatchInfo("strag", 1, "q-old"), "pg",
                  "fanout/strag/pg")  # fmt: skip
    straggler = pickle.loads(pickle.dumps(sink.partition_writer(batch, None)))
    gate = CommitGate()
    outcomes: dict[str, Any] = {}

    def late() -> None:
        rows = iter(_arrow(ROWS).to_batches())
        outcomes["straggler"] = straggler.write_partition(0, rows, gate, MemberDigest())

    def start() -> None:
        try:
            new.process(spark.createDataFrame(ROWS, SCHEMA), _info(1, "q-new", 3))
            outcomes["start"] = "started"
        except Exception as exc:
            outcomes["start"] = exc

    task = threading.Thread(target=late)
    task.start()
    assert gate.reached.wait(60), "the straggler never reached its commit"
    new = _fan(tmp_path, pg_url, on_reset="new_epoch")
    starting = threading.Thread(target=start)
    starting.start()
    deadline = time.monotonic() + 60
    while (
        starting.is_alive()
        and not waiting_on_a_lock(pg_url, "advisory")
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    waited = starting.is_alive()
    gate.opened.set()
    task.join(60)
    starting.join(120)
    old.close()
    new.close()

    assert waited, f"the new epoch's start did not wait for the straggler: {outcomes}"
    assert outcomes["straggler"].status == "committed"
    assert isinstance(outcomes["start"], UnmarkedBatchError), outcomes
    assert "sink pg holds batch 1 of epoch 0 by its own records" in str(outcomes["start"])
    assert query(pg_url, "SELECT id, name FROM t ORDER BY id") == [
        (0, "batch 0"), (1, "m+1"), (2, "m+1"),
    ]  # fmt: skip
    # the refused start lifted its fence: the old scope holds only the batches' marks
    assert query(
        pg_url, "SELECT pipeline, batch_id, partition FROM fanout.progress ORDER BY 1, 2"
    ) == [("strag", 0, 0), ("strag", 1, 0)]


def test_a_fence_waiting_for_a_straggler_says_what_it_waits_for(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A straggler's partition transaction left open (its task hung, its connection alive)
    holds the new epoch's start at the fence for as long as it stays open (for ever with no
    ``write_timeout_s``): the fence says so once, naming the sink, the scope and the
    PostgreSQL backend it waits for, before it waits."""
    import psycopg2
    from pgcheck import dsn

    execute(pg_url, DDL)
    sink = open_sink(
        PostgresSink("pg", url=pg_url, table="t", mode="append", partitions=1), "strag"
    )
    stuck = psycopg2.connect(dsn(pg_url))  # the hung straggler: its lock held shared
    done = threading.Event()
    try:
        with stuck.cursor() as cur:
            cur.execute("SELECT pg_backend_pid(), pg_advisory_xact_lock_shared(%s)",
                        (epoch_fence_lock("strag", "pg"),))  # fmt: skip
            (pid, _) = cur.fetchone()
        fencing = threading.Thread(
            target=lambda: (sink.fence_earlier_epochs("strag", 1), done.set())
        )
        with caplog.at_level(logging.WARNING, logger="fanout_postgres"):
            fencing.start()
            deadline = time.monotonic() + 30
            while not caplog.records and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not done.is_set()
            messages = [r.getMessage() for r in caplog.records]
            stuck.rollback()  # the straggler's transaction ends: the fence goes on
            fencing.join(30)
    finally:
        stuck.close()
        sink.close()
    assert done.is_set()
    assert len(messages) == 1, messages
    assert messages[0].startswith(
        "pipeline strag, sink pg: the epoch fence waits for partition transaction(s) of "
        f"epoch scope(s) strag still open: PostgreSQL backend(s) {pid} ("
    ), messages
    assert query(
        pg_url, "SELECT pipeline, batch_id, partition FROM fanout.progress ORDER BY 1, 2"
    ) == [("strag", EPOCH_FENCE, -1)]
