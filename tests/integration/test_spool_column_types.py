"""A batch spooled after a column changed type (a deploy while a sink lags: a source's
schema widened, a cast changed) reaches the lagging sink with its own values.

The spool keeps every batch in one Delta table, whose schema is the first type each column
had. delta-rs' merge-mode append casts a batch's columns to the table's types without a
word (a ``DOUBLE`` 12.5 into a ``BIGINT`` column is written as 12, a ``DOUBLE`` 0.1 into
a ``FLOAT`` one as 0.100000001490116), and the catch-up then read the batch back with its
own schema: a file Spark cannot read as that type failed the catch-up at every probe (the
sink stuck at the batch, which Spark had committed: only ``fanout ledger skip`` went on,
giving its rows up), one Spark can widen gave the sink other values than the batch had.
Real Spark, file stream, Delta ledger and spool."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from fanout import FanOut
from fanout.sink_spec import SinkSpec, lag_policy
from fanout.testing import RecordingSink
from tests.integration.streams import EPOCH, DownSink, run_stream


def _run(spark: Any, tmp_path: Path, schema: str, *, down: bool) -> tuple[FanOut, DownSink]:
    """One run of the pipeline over the input there is (a ``live`` sink, and ``copy``
    lagging), its final catch-up when ``copy`` is up."""
    copy, live = DownSink("copy", down=down), RecordingSink("live")
    fan = FanOut(
        "types", str(tmp_path / "ledger"),
        [live, SinkSpec(copy, lag=lag_policy("copy", {"on_failure": "lag"}))],
        retries=0, backoff_s=0, spool=str(tmp_path / "spool"), probe_interval_s=3600,
    )  # fmt: skip
    try:
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint", schema)
        if not down:
            fan.final_catch_up()
    finally:
        fan.close()
    return fan, copy


def _write(directory: Path, index: int, rows: list[dict[str, Any]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"orders-{index:04d}.json"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    os.utime(path, (EPOCH + index, EPOCH + index))


@pytest.mark.parametrize(
    ("before", "after", "values"),
    [
        ("amount BIGINT", "amount DOUBLE", [12.5, -0.25, 3.0, 7.75]),  # unreadable as spooled
        ("amount FLOAT", "amount DOUBLE", [0.1, 12.5, 3.3, 2.0]),  # read back as other values
        ("amount BIGINT", "AMOUNT BIGINT", [7, 8, 9, 10]),  # refused: could not be spooled
    ],
    ids=["bigint-to-double", "float-to-double", "name-in-upper-case"],
)
def test_a_batch_spooled_after_a_column_changed_type_reaches_the_sink_with_its_values(
    spark: Any, tmp_path: Path, before: str, after: str, values: list[float]
) -> None:
    """Batch 0 (its column as ``before``) and batch 1 (the query restarted with the column
    as ``after``) spooled while ``copy`` is down; the run after, with no new data, catches
    it up: each batch exactly as it ran."""
    name = after.split()[0]
    first = [{"order_id": i, "amount": 10 + i} for i in range(4)]
    second = [{"order_id": 4 + i, name: v} for i, v in enumerate(values)]
    _write(tmp_path / "input", 0, first)
    _run(spark, tmp_path, f"order_id BIGINT, {before}", down=True)
    _write(tmp_path / "input", 1, second)
    _, down = _run(spark, tmp_path, f"order_id BIGINT, {after}", down=True)
    assert down.batches == {}

    fan, copy = _run(spark, tmp_path, f"order_id BIGINT, {after}", down=False)

    assert copy.calls == [(0, 1), (1, 1)]
    assert copy.batches[0] == first
    assert copy.batches[1] == second
    assert fan.spool is not None and fan.spool.size() == (0, 0, 0)
