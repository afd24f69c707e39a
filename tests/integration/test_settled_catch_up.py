"""A batch spooled for a lagging sink while a sink without ``on_failure="lag"`` fails it is
not settled: Spark has not committed it, and a checkpoint reset could still give it up.
The catch-up writes it only once its replay settles it (docs/architecture.md §14.4,
"Settled"). Real Spark, a real Delta lake, ledger and spool, the embedded PostgreSQL."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from fanout import FanOut
from tests.chaos.lag_input import postgres_rows
from tests.integration.streams import (
    committed_marks,
    delta_rows,
    run_stream,
    write_input,
)


def _fan(tmp_path: Path, url: str) -> FanOut:
    return FanOut(
        "settled", str(tmp_path / "ledger"),
        [{"type": "delta", "name": "lake", "path": str(tmp_path / "lake")},
         {"type": "postgres", "name": "pg", "url": url, "table": "orders",
          "keys": ["order_id"], "create_table": True, "on_failure": "lag", "retries": 0}],
        retries=0, backoff_s=0, spool=str(tmp_path / "spool"), probe_interval_s=3600,
    )  # fmt: skip


def _pg(url: str) -> dict[int, float]:
    return {i: float(r["amount"]) for i, r in postgres_rows(url, "orders").items()}


def test_a_batch_the_lake_failed_reaches_the_lagging_sink_only_after_its_replay(
    spark: Any, tmp_path: Path, server: tuple[Any, str]
) -> None:
    pg, url = server
    inputs, lake, aside = tmp_path / "input", tmp_path / "lake", tmp_path / "lake-aside"
    rows = write_input(inputs, 1, 3)
    first = _fan(tmp_path, url)  # PostgreSQL down: batch 0 is spooled for pg, settled
    try:
        run_stream(spark, inputs, first, tmp_path / "checkpoint")
    finally:
        first.close()

    rows += write_input(inputs, 1, 3, start_file=1)
    second = _fan(tmp_path, url)
    shutil.move(lake, aside)
    lake.write_text("not a table")  # the lake fails batch 1 for good: the query fails
    try:
        with pytest.raises(Exception, match=r"batch 1: 1 sink\(s\) failed \(lake\)"):
            run_stream(spark, inputs, second, tmp_path / "checkpoint")
        assert second.spool is not None
        assert [(b.batch_id, sorted(b.needed_by)) for b in second.spool.batches()] == [
            (0, ["pg"]), (1, ["pg"]),
        ]  # fmt: skip
        pg.start()  # PostgreSQL is back; the lake still fails batch 1, Spark never committed it
        second.catchup.stop()
        lags = second.catch_up(timeout_s=120)
        assert (lags["pg"].state, lags["pg"].batches) == ("catching_up", 1)
        assert _pg(url) == {r["order_id"]: r["amount"] for r in rows[:3]}  # batch 0 only
        assert [b.batch_id for b in second.spool.batches()] == [1]
    finally:
        second.close()
    assert not (tmp_path / "checkpoint" / "commits" / "1").exists()

    lake.unlink()
    shutil.move(aside, lake)
    third = _fan(tmp_path, url)  # the replay of batch 1 settles it
    try:
        run_stream(spark, inputs, third, tmp_path / "checkpoint")
        assert {n: s.state for n, s in third.final_catch_up().items()} == {"pg": "live"}
    finally:
        third.close()
    assert _pg(url) == {r["order_id"]: r["amount"] for r in rows}
    assert sorted(delta_rows(lake), key=lambda r: r["order_id"]) == rows
    assert committed_marks(tmp_path / "ledger", "settled") == Counter(
        {(sink, b): 1 for sink in ("lake", "pg") for b in range(2)}
    )
