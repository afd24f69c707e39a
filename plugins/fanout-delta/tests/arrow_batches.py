"""Batches of Arrow tables for the Delta sink's tests, without Spark."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from fanout.contract.batch import Batch, BatchInfo, txn_app_id

APP_ID = txn_app_id("p", "s")
"""The app transaction of sink ``s`` of pipeline ``p`` (epoch 0), the batches' sink."""


class FakeFrame:
    """Stands in for a Spark batch DataFrame: only ``toArrow()`` is used by engine rs (the
    sink then runs the executors' ``FileWriter`` in this process, the same code a Spark task
    runs); ``conversions`` counts the calls."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self.conversions = 0

    def toArrow(self) -> pa.Table:
        self.conversions += 1
        return self.table


def batch_of(df: Any, batch_id: int = 0) -> Batch:
    """Batch ``batch_id`` of sink ``s`` of pipeline ``p``: ``df`` itself, or an Arrow table
    in a :class:`FakeFrame`."""
    return Batch(
        df=df if not isinstance(df, pa.Table) else FakeFrame(df),
        info=BatchInfo(pipeline="p", batch_id=batch_id),
        sink_name="s",
        txn_app_id=APP_ID,
    )
