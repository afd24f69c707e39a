"""A pipeline of two Delta sinks (``bronze``, ``silver``) fed batches by hand, as two drivers
on one ledger see them across a checkpoint reset: the setup the reset tests share
(``test_zombie_query``, ``test_unmarked_batch``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fanout import BatchInfo, FanOut
from tests.integration.streams import delta_rows

OLD, NEW = "query-old", "query-new"
SINKS = ("bronze", "silver")
ROWS = 10  # rows per batch; a batch's Kafka end offset is its last row + 1


def fan(pipeline: str, tmp_path: Path, *plugins: object, on_reset: str = "refuse") -> FanOut:
    """The pipeline's ``FanOut``: bronze, then silver (one at a time: interleavings exact)."""
    return FanOut(
        pipeline,
        str(tmp_path / "ledger"),
        [{"type": "delta", "name": s, "path": str(tmp_path / s)} for s in SINKS],
        on_checkpoint_reset=on_reset,  # type: ignore[arg-type]
        plugins=plugins,
        parallelism=1,
        retries=0,
    )


def batch(
    pipeline: str, spark: Any, query: str, batch_id: int, first_row: int
) -> tuple[Any, BatchInfo]:
    """Rows ``first_row`` .. ``first_row + ROWS - 1`` as batch ``batch_id`` of ``query``,
    read from Kafka topic ``orders`` up to the offset after them."""
    rows = [(n, f"order-{n}") for n in range(first_row, first_row + ROWS)]
    offsets = [{"orders": {"0": first_row + ROWS}}]
    info = BatchInfo(pipeline, batch_id, query, offsets, batch_timestamp_ms=1000 + batch_id)
    return spark.createDataFrame(rows, "id LONG, name STRING"), info


def run(fan: FanOut, spark: Any, query: str, batch_id: int, first_row: int) -> None:
    """``fan`` processes :func:`batch` ``batch_id`` of ``query``."""
    fan.process(*batch(fan.pipeline, spark, query, batch_id, first_row))


def ids(tmp_path: Path, sink: str) -> list[int]:
    """The ids in ``sink``'s table, sorted (repeats kept)."""
    return sorted(r["id"] for r in delta_rows(tmp_path / sink))


def marks(tmp_path: Path) -> list[tuple[int, str, int]]:
    """The ledger's committed rows as (epoch, sink, batch), sorted."""
    rows = delta_rows(tmp_path / "ledger")
    return sorted(
        (r["epoch"], r["sink"], r["batch_id"]) for r in rows if r["status"] == "committed"
    )
