"""Batches of Arrow tables for the Delta sink's tests, without Spark, and the sink they
go to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
from fanout_delta import DeltaSink

from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.sink import SinkContext

APP_ID = txn_app_id("p", "s")
"""The app transaction of sink ``s`` of pipeline ``p`` (epoch 0), the batches' sink."""


class FakeFrame:
    """Stands in for a Spark batch DataFrame: ``toArrow()`` for engine rs (the sink then
    runs the executors' ``FileWriter`` in this process, the same code a Spark task runs;
    ``conversions`` counts the calls), ``count()`` for the spark engine's skip path (the
    only part of it that runs without Spark)."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self.conversions = 0

    def toArrow(self) -> pa.Table:
        self.conversions += 1
        return self.table

    def count(self) -> int:
        return self.table.num_rows


def opened(path: Path, **options: Any) -> DeltaSink:
    """Sink ``s`` of pipeline ``p`` writing the Delta table at ``path``, opened."""
    sink = DeltaSink(name="s", path=str(path), **options)
    sink.open(SinkContext(pipeline="p"))
    return sink


def batch_of(df: Any, batch_id: int = 0) -> Batch:
    """Batch ``batch_id`` of sink ``s`` of pipeline ``p``: ``df`` itself, or an Arrow table
    in a :class:`FakeFrame`."""
    return Batch(
        df=df if not isinstance(df, pa.Table) else FakeFrame(df),
        info=BatchInfo(pipeline="p", batch_id=batch_id),
        sink_name="s",
        txn_app_id=APP_ID,
    )
