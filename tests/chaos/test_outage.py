"""A sink outage mid-stream: PostgreSQL stops while the stream runs. The batch fails after
its retries naming the sink, the other sink keeps its marks, and once the server is back
the restarted query leaves both sinks exact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from fanout import FanOut, hookimpl
from fanout.contract.batch import BatchInfo
from tests.chaos.checker import check_delta, check_postgres
from tests.integration.streams import committed_marks, delta_rows, run_stream, write_input

OUTAGE_BATCH = 3


class StopServerAt:
    """A test plugin that stops the PostgreSQL server when batch ``batch`` starts."""

    def __init__(self, server: Any, batch: int) -> None:
        self.server, self.batch = server, batch

    @hookimpl
    def fanout_batch_start(self, info: BatchInfo, pending: Any, skipped: Any) -> None:
        """Pull the plug."""
        if info.batch_id == self.batch:
            self.server.stop()


def _fan(tmp_path: Path, url: str, plugins: list[object]) -> FanOut:
    return FanOut(
        "outage",
        str(tmp_path / "ledger"),
        [
            {"type": "delta", "name": "lake", "path": str(tmp_path / "lake")},
            {
                "type": "postgres",
                "name": "pg",
                "url": url,
                "table": "outage_orders",
                "keys": ["order_id"],
                "create_table": True,
                "partitions": 2,
            },
        ],
        retries=2,
        backoff_s=0.2,
        plugins=plugins,
    )


def test_postgres_outage_fails_the_batch_then_recovers_exactly(spark: Any, tmp_path: Path) -> None:
    from fanout_postgres.embedded import EmbeddedPostgres

    rows = write_input(tmp_path / "input", 6, 20)
    server = EmbeddedPostgres(tmp_path / "pgdata", database="outage", durable=False)
    url = server.start()
    try:
        with pytest.raises(StreamingQueryException) as outage:
            run_stream(
                spark,
                tmp_path / "input",
                _fan(tmp_path, url, [StopServerAt(server, OUTAGE_BATCH)]),
                tmp_path / "ckpt",
            )
        message = str(outage.value)
        assert f"batch {OUTAGE_BATCH}: 1 sink(s) failed (pg)" in message
        marks = committed_marks(tmp_path / "ledger", "outage")
        assert ("lake", OUTAGE_BATCH) in marks and ("pg", OUTAGE_BATCH) not in marks
        failed = sorted(
            (r["sink"], r["batch_id"], r["attempt"])
            for r in delta_rows(tmp_path / "ledger")
            if r["status"] == "failed"
        )
        assert failed == [("pg", OUTAGE_BATCH, 1), ("pg", OUTAGE_BATCH, 2), ("pg", OUTAGE_BATCH, 3)]

        url = server.start()  # the server is back
        run_stream(spark, tmp_path / "input", _fan(tmp_path, url, []), tmp_path / "ckpt")
        expected = {r["order_id"]: r for r in rows}
        assert check_delta(tmp_path / "lake", expected).exact
        assert check_postgres(url, "outage_orders", expected).exact
        assert committed_marks(tmp_path / "ledger", "outage") == {
            (s, b): 1 for s in ("lake", "pg") for b in range(6)
        }
    finally:
        server.stop()
