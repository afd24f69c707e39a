"""A replay that skips committed partitions reads a local checkpoint of its batch (the
kit's ``snapshot``): its blocks are released once the replay's write is done, not left
to Spark's cleaner; and a block of it lost (an executor lost with it: Spark does not
recompute a local checkpoint) fails the attempt as transient, saying so, and the next
attempt takes a new copy. Real local Spark, the sink of tests/integration/kit_route_sink.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import fanout.partitioned.sink as kit
from fanout import SinkContext
from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.errors import TransientSinkError
from fanout.partitioned.sink import PartitionInput
from tests.integration.kit_route_sink import RouteRecordingSink, read_rows

ROWS = [(i, f"v{i}") for i in range(30)]


def stored_rdds(spark: Any) -> set[int]:
    """Ids of the RDDs with blocks on the executors."""
    return {info.id() for info in spark.sparkContext._jsc.sc().getRDDStorageInfo()}


def rdd_id(df: Any) -> int:
    """The id of the checkpointed RDD a local checkpoint ``df`` reads."""
    return int(df._jdf.queryExecution().analyzed().rdd().id())


class Copies:
    """Records the RDD of every copy the kit takes (and that it holds blocks then);
    ``lose``: called on the first copy, to lose its blocks (:func:`drop_blocks`, or an
    executor killed)."""

    def __init__(
        self, spark: Any, monkeypatch: pytest.MonkeyPatch,
        lose: Callable[[Any], None] | None = None,
    ) -> None:  # fmt: skip
        self.ids: list[int] = []
        self.lose = lose
        take = kit.snapshot

        def snapshot(given: PartitionInput) -> PartitionInput:
            copy = take(given)
            self.ids.append(rdd_id(copy.df))
            assert self.ids[-1] in stored_rdds(spark)
            lose, self.lose = self.lose, None
            if lose is not None:
                lose(copy.df)
            return copy

        monkeypatch.setattr(kit, "snapshot", snapshot)


def drop_blocks(copy: Any) -> None:
    """The copy's blocks gone, as with an executor lost with them."""
    copy._jdf.queryExecution().analyzed().rdd().unpersist(True)


def half_written(spark: Any, tmp_path: Path) -> tuple[RouteRecordingSink, Batch, Path]:
    """Batch 3 written by a first attempt, one of its files then lost: the replay skips
    the two other partitions."""
    out = tmp_path / "out"
    sink = RouteRecordingSink("s", directory=str(out), partitions=3)
    sink.open(SinkContext("pipe"))
    df = spark.createDataFrame(ROWS, "id BIGINT, v STRING")
    batch = Batch(df, BatchInfo("pipe", 3), "s", txn_app_id("pipe", "s"))
    first = sink.write(batch)
    assert first.rows == 30
    files = sorted(out.glob("*.json"))
    assert len(files) == 3
    files[0].unlink()
    return sink, replace(batch, attempt=2), out


def released(spark: Any, rdd: int) -> bool:
    """Whether ``rdd``'s blocks are gone (the release does not wait for the executors)."""
    deadline = time.monotonic() + 10
    while rdd in stored_rdds(spark):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_the_replays_copy_is_released_when_its_write_is_done(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink, replay, out = half_written(spark, tmp_path)
    kept = len(read_rows(out))
    copies = Copies(spark, monkeypatch)
    result = sink.write(replay)
    assert len(copies.ids) == 1
    assert released(spark, copies.ids[0])
    details = result.details
    assert (len(details["committed_partitions"]), len(details["skipped_partitions"])) == (1, 2)
    assert details["written"] == 30 - kept
    assert sorted((r["id"], r["v"]) for r in read_rows(out)) == ROWS


def test_a_lost_block_of_the_copy_fails_the_attempt_as_transient_and_the_next_takes_a_new_one(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink, replay, out = half_written(spark, tmp_path)
    kept = len(read_rows(out))
    copies = Copies(spark, monkeypatch, drop_blocks)
    with pytest.raises(TransientSinkError) as lost:
        sink.write(replay)
    message = str(lost.value)
    assert "CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND" in message
    assert "the next attempt takes a new copy of the batch and checks it again" in message
    assert "sink 's'" in message and "batch 3" in message
    assert len(read_rows(out)) == kept < 30  # nothing more written
    sink.write(replace(replay, attempt=3))
    assert len(copies.ids) == 2 and copies.ids[0] != copies.ids[1]
    assert released(spark, copies.ids[1])
    assert sorted((r["id"], r["v"]) for r in read_rows(out)) == ROWS
