"""An upsert partition task of a batch that ends after a later batch of the sink committed
(a straggler: the attempt of a speculative pair Spark did not take, or a task of an
executor Spark gave up on while it still ran) must not write its rows over the later
batch's: the key keeps the later batch's value."""

from __future__ import annotations

import dataclasses
import pickle
import threading
import time
from typing import Any

import pyarrow as pa
import pytest
from commit_hooks import CommitGate, NoCommitHooks
from fanout_postgres import PostgresSink
from pgcheck import execute, query, waiting_on_a_lock

from fanout.contract.batch import Batch, BatchInfo
from fanout.errors import SinkWriteError
from fanout.partitioned.membership import MemberDigest
from fanout.testing import open_sink

DDL = "CREATE TABLE t (id bigint PRIMARY KEY, name text NOT NULL)"
SCHEMA = "id LONG, name STRING"
ARROW = pa.schema([("id", pa.int64()), ("name", pa.string())])

pytestmark = pytest.mark.usefixtures("no_kept_connections")


def _arrow(rows: list[tuple[Any, ...]]) -> pa.Table:
    return pa.Table.from_pylist([{"id": i, "name": n} for i, n in rows], schema=ARROW)


def _table(url: str) -> list[tuple[Any, ...]]:
    return query(url, "SELECT id, name FROM t ORDER BY id")


def _batch(spark: Any, rows: list[tuple[Any, ...]], batch_id: int) -> Batch:
    df = spark.createDataFrame(rows, SCHEMA)
    return Batch(df, BatchInfo("strag", batch_id, "q"), "pg", "fanout/strag/pg")


@pytest.mark.parametrize("direct", [True, False], ids=["direct-copy", "staged"])
def test_a_straggler_of_an_earlier_batch_does_not_undo_a_later_batch(
    spark: Any, pg_url: str, direct: bool
) -> None:
    execute(pg_url, DDL)
    sink = open_sink(PostgresSink("pg", url=pg_url, table="t", partitions=1), "strag")
    old = [(1, "batch 0"), (2, "batch 0")]
    new = [(1, "batch 1"), (3, "batch 1")]
    first = _batch(spark, old, 0)
    # the task Spark ships for batch 0 (one partition): one attempt of it commits ...
    shipped = pickle.loads(pickle.dumps(sink.partition_writer(first, None)))
    task = dataclasses.replace(shipped, direct=direct)  # direct: refused at key 1, staged
    assert sink.write(first).rows == 2
    # ... Spark takes it, and the sink writes the next batch
    assert sink.write(_batch(spark, new, 1)).rows == 2
    assert _table(pg_url) == [
        (1, "batch 1"), (2, "batch 0"), (3, "batch 1"),
    ]  # fmt: skip

    # the other attempt of batch 0's partition ends now
    hooks = NoCommitHooks()
    outcome = task.write_partition(0, iter(_arrow(old).to_batches()), hooks, MemberDigest())

    assert _table(pg_url) == [
        (1, "batch 1"), (2, "batch 0"), (3, "batch 1"),
    ]  # fmt: skip
    assert outcome.status == "failed"
    assert outcome.failure is not None
    assert outcome.failure.message == (
        "SinkWriteError: sink 'pg', batch 0: partition 0 rolled back: "
        "fanout.upsert_routes says batch 1, after this one, is committed to t, and this "
        "partition's rows would have overwritten that batch's values of their keys. An "
        "attempt Spark no longer waits for (the slower of a speculative pair, a task of an "
        "executor it gave up on) ends so, and its outcome is discarded. If this batch is "
        "the pipeline's newest (the pipeline's checkpoint and ledger were replaced and it "
        "starts again under the same name; the driver refuses that before writing, unless "
        "the earlier run committed that batch meanwhile), those records are an earlier "
        "run's: restore the ledger and checkpoint, or, only if the table is meant to be "
        "written again, delete them: DELETE FROM fanout.upsert_routes WHERE pipeline = "
        "'strag' AND sink = 'pg'"
    )


def test_a_straggler_waiting_on_a_later_batch_s_transaction_does_not_overwrite_it(
    spark: Any, pg_url: str
) -> None:
    """The straggler's direct COPY meets a key the later batch's open transaction updated:
    it waits on the unique index, and once that batch committed its COPY is refused and its
    staged upsert overwrites the key; only a check made after the write sees the later
    batch. (Staged at once, its MERGE reads the key's committed value, batch 0's own, and
    changes nothing: no wait, no harm.)"""
    execute(pg_url, DDL)
    sink = open_sink(PostgresSink("pg", url=pg_url, table="t", partitions=1), "strag")
    old = [(1, "batch 0"), (2, "batch 0")]
    new = [(1, "batch 1"), (3, "batch 1")]
    first, second = _batch(spark, old, 0), _batch(spark, new, 1)
    straggler = dataclasses.replace(sink.partition_writer(first, None), direct=True)
    assert sink.write(first).rows == 2
    later = sink.partition_writer(second, None)
    gate = CommitGate()
    outcomes: dict[str, Any] = {}

    def attempt(name: str, writer: Any, rows: list[tuple[Any, ...]], hooks: Any) -> None:
        batches = iter(_arrow(rows).to_batches())
        outcomes[name] = writer.write_partition(0, batches, hooks, MemberDigest())

    live = threading.Thread(target=attempt, args=("batch 1", later, new, gate))
    live.start()
    assert gate.reached.wait(60), "batch 1's partition never reached its commit"
    late = threading.Thread(target=attempt, args=("batch 0", straggler, old, NoCommitHooks()))
    late.start()
    deadline = time.monotonic() + 30
    while late.is_alive() and not waiting_on_a_lock(pg_url) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert late.is_alive(), f"the straggler did not wait for batch 1: {outcomes}"
    gate.opened.set()
    live.join(60)
    late.join(60)

    assert _table(pg_url) == [(1, "batch 1"), (2, "batch 0"), (3, "batch 1")]
    assert outcomes["batch 1"].status == "committed"
    assert outcomes["batch 0"].status == "failed"


def test_a_pipeline_started_again_without_its_ledger_is_refused_before_writing(
    spark: Any, pg_url: str
) -> None:
    """Started again under the same name with a new checkpoint and a new ledger (epoch 0
    again), the pipeline's batch 0 meets its old run's batch 1 in ``upsert_routes``: the
    driver refuses it before any partition writes (the same query that reads the batch's
    routes), naming the later batch and the statement that lets the table be written again,
    which then works."""
    execute(pg_url, DDL)
    sink = open_sink(PostgresSink("pg", url=pg_url, table="t", partitions=1), "strag")
    assert sink.write(_batch(spark, [(1, "batch 0"), (2, "batch 0")], 0)).rows == 2
    assert sink.write(_batch(spark, [(1, "batch 1"), (3, "batch 1")], 1)).rows == 2
    again = _batch(spark, [(1, "again"), (4, "again")], 0)
    delete = "DELETE FROM fanout.upsert_routes WHERE pipeline = 'strag' AND sink = 'pg'"

    with pytest.raises(SinkWriteError) as refused:
        sink.check_replay(again)  # on the driver, before the route letters and partitions
    message = str(refused.value)
    assert "batch 1" in message and "Restore the pipeline" in message and delete in message
    with pytest.raises(SinkWriteError) as written:
        sink.write(again)
    assert "partition(s) failed" not in str(written.value)  # no partition task ran
    assert _table(pg_url) == [(1, "batch 1"), (2, "batch 0"), (3, "batch 1")]

    execute(pg_url, delete)  # what the message says to do to write the table again
    assert sink.write(again).rows == 2
    assert _table(pg_url) == [
        (1, "again"), (2, "batch 0"), (3, "batch 1"), (4, "again"),
    ]  # fmt: skip


@pytest.mark.parametrize("direct", [True, False], ids=["direct-copy", "staged"])
def test_a_straggler_of_an_epoch_a_reset_replaced_does_not_undo_the_new_epoch(
    spark: Any, pg_url: str, direct: bool
) -> None:
    """After a checkpoint reset accepted as a new epoch, batch ids start again (another
    scope, ``strag@e1``): a straggler of epoch 0's batch 7 ending after epoch 1's batch 2
    committed is rolled back all the same (epoch 1 has no batch after 7, but it is after
    every batch of epoch 0), and so is the replaced query's next batch, on the driver; and
    epoch 1's batches, whose ids are below 7, are not refused for epoch 0's rows."""
    execute(pg_url, DDL)
    sink = open_sink(PostgresSink("pg", url=pg_url, table="t", partitions=1), "strag")
    old = [(1, "epoch 0"), (2, "epoch 0")]
    new = [(1, "epoch 1"), (3, "epoch 1")]
    first = Batch(
        spark.createDataFrame(old, SCHEMA), BatchInfo("strag", 7, "q0"), "pg",
        "fanout/strag/pg",
    )  # fmt: skip
    shipped = pickle.loads(pickle.dumps(sink.partition_writer(first, None)))
    task = dataclasses.replace(shipped, direct=direct)
    assert sink.write(first).rows == 2
    for batch_id in (0, 1, 2):  # the new epoch's first batches: not refused
        info = BatchInfo("strag", batch_id, "q1", epoch=1)
        second = Batch(spark.createDataFrame(new, SCHEMA), info, "pg", "fanout/strag@e1/pg")
        assert sink.write(second).rows == 2
    assert _table(pg_url) == [(1, "epoch 1"), (2, "epoch 0"), (3, "epoch 1")]

    outcome = task.write_partition(0, iter(_arrow(old).to_batches()), NoCommitHooks(),
                                   MemberDigest())  # fmt: skip

    assert _table(pg_url) == [(1, "epoch 1"), (2, "epoch 0"), (3, "epoch 1")]
    assert outcome.status == "failed"
    assert outcome.failure is not None
    assert "a later epoch of the pipeline" in outcome.failure.message
    # the replaced query's driver, still running, is refused before its tasks write
    with pytest.raises(SinkWriteError) as refused:
        sink.write(dataclasses.replace(first, info=BatchInfo("strag", 8, "q0")))
    assert "a later epoch of pipeline 'strag' began writing this sink" in str(refused.value)
    # the old checkpoint started again after a killed start: the lift named
    assert "fanout ledger lift-fence --config PIPELINE.toml --epoch 1" in str(refused.value)
    assert "partition(s) failed" not in str(refused.value)  # no partition task ran
    assert _table(pg_url) == [(1, "epoch 1"), (2, "epoch 0"), (3, "epoch 1")]
