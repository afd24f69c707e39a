"""A sink of one's own that is not on the partitioned-sink kit but upserts by key columns
whose replay writes the batch again (``Sink.deterministic_columns()``): fanout refuses a
batch computing those keys non-deterministically, naming the sink, the batch and the
expression, before the sink writes anything; a batch with deterministic keys is written.
Real local Spark and Delta ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fanout import Batch, BatchFailedError, FanOut, PartitioningError, Sink, SinkResult
from fanout.contract.batch import BatchInfo
from fanout.contract.partitions import StableColumns
from fanout.contract.sink import Reads
from tests.integration.streams import SCHEMA, write_input


class KeyedUpsert(Sink):
    """Upserts rows by ``id`` into a dict, one row at a time (a kill halfway leaves some)."""

    guarantees = ("idempotent",)  # upserts by key: not warned about as at-least-once

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.target: dict[int, dict[str, Any]] = {}

    @property
    def reads(self) -> Reads:
        return "arrow"

    def deterministic_columns(self) -> StableColumns:
        return StableColumns(["id"], "upserts by", "a replay would upsert other keys")

    def write(self, batch: Batch) -> SinkResult:
        rows = batch.arrow().to_pylist()
        for row in rows:
            self.target[row["id"]] = row
        return SinkResult(rows=len(rows))


def test_a_plain_sink_upserting_by_volatile_keys_is_refused_before_it_writes(
    spark: Any, tmp_path: Path
) -> None:
    sink = KeyedUpsert("kv")
    fan = FanOut("stable", str(tmp_path / "ledger"), [sink], retries=0)
    batch = spark.range(3).selectExpr("CAST(rand() * 1000 AS BIGINT) AS id", "'x' AS v")
    with pytest.raises(BatchFailedError) as failed:
        fan.process(batch, BatchInfo("stable", 0, "query-volatile"))
    error = failed.value.failures["kv"]
    assert isinstance(error, PartitioningError)
    assert str(error) == (
        "sink 'kv', batch 0: the batch's column 'id' (CAST((rand() * CAST(1000 AS DOUBLE)) AS "
        "BIGINT) AS id) is not deterministic: a replay would upsert other keys. This sink "
        "upserts by id: derive those columns deterministically from the input (its other "
        "columns may be non-deterministic)"
    )
    assert sink.target == {}
    fan.close()


def test_a_plain_sink_upserting_by_deterministic_keys_writes(spark: Any, tmp_path: Path) -> None:
    sink = KeyedUpsert("kv")
    fan = FanOut("stable", str(tmp_path / "ledger"), [sink], retries=0)
    batch = spark.range(3).selectExpr("id", "uuid() AS v")  # a volatile value is fine
    assert fan.process(batch, BatchInfo("stable", 0, "query-stable"))["kv"].rows == 3
    assert sorted(sink.target) == [0, 1, 2]
    fan.close()


def _run(spark: Any, input_dir: Path, fan: FanOut, checkpoint: Path, key: str) -> None:
    """One run of the file stream to the end of its input, ``key`` computing ``id``."""
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(input_dir))
    query = (
        stream.selectExpr(f"{key} AS id", "customer AS v")
        .writeStream.foreachBatch(fan)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def test_a_query_restarted_in_the_same_process_with_volatile_keys_is_refused(
    spark: Any, tmp_path: Path
) -> None:
    """A restart keeps the query's id (the checkpoint's), not its plan: a notebook's cell run
    again with ``rand()`` now in the keys, on the same checkpoint, in the same process, must
    be checked again (the pass of the first run was remembered per query id, and the second
    run upserted random keys)."""
    write_input(tmp_path / "input", 1, 3)
    sink = KeyedUpsert("kv")
    with FanOut("stable", str(tmp_path / "ledger"), [sink], retries=0) as fan:
        _run(spark, tmp_path / "input", fan, tmp_path / "checkpoint", "order_id")
    assert sorted(sink.target) == [0, 1, 2]

    write_input(tmp_path / "input", 1, 3, start_file=1)
    again = KeyedUpsert("kv")
    with FanOut("stable", str(tmp_path / "ledger"), [again], retries=0) as fan:
        with pytest.raises(Exception) as failed:
            _run(
                spark,
                tmp_path / "input",
                fan,
                tmp_path / "checkpoint",
                "CAST(rand() * 1000 AS BIGINT)",
            )
    assert "PartitioningError" in str(failed.value), str(failed.value)[-3000:]
    assert "sink 'kv', batch 1: the " in str(failed.value)
    assert "rand()" in str(failed.value) and "is not deterministic" in str(failed.value)
    assert again.target == {}
