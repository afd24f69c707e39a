"""A checkpoint reset after an epoch's *first* batch was failed by a sink without
``on_failure="lag"`` while the lagging sink spooled it: no sink has a mark in that epoch,
yet the batch was not settled (Spark never committed it). The new epoch re-reads its rows
from the start, as `fanout recover` says, so the spooled copy is given up, not written:
the lagging (append-mode) sink holds each row once (docs/architecture.md §14.4, "An older
epoch"). Real Spark, a real Delta lake, ledger and spool, the embedded PostgreSQL."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from fanout import FanOut
from fanout.app.recover import NO_CONFIG
from tests.in_process_cli import Cli
from tests.integration.streams import (
    committed_marks,
    delta_rows,
    id_counts,
    run_stream,
    write_input,
)
from tests.newest_lines import without_newest


def _fan(tmp_path: Path, url: str, **kw: Any) -> FanOut:
    return FanOut(
        "reset", str(tmp_path / "ledger"),
        [{"type": "delta", "name": "lake", "path": str(tmp_path / "lake")},
         {"type": "postgres", "name": "pg", "url": url, "table": "orders", "mode": "append",
          "create_table": True, "on_failure": "lag", "retries": 0}],
        retries=0, backoff_s=0, spool=str(tmp_path / "spool"), probe_interval_s=3600, **kw,
    )  # fmt: skip


def _pg_ids(url: str) -> Counter[int]:
    import psycopg2

    from tests.chaos.checker import libpq_url

    with psycopg2.connect(libpq_url(url)) as conn, conn.cursor() as cur:
        cur.execute('SELECT order_id FROM "orders"')
        return Counter(int(r[0]) for r in cur.fetchall())


def test_a_first_batch_the_lake_failed_is_not_written_twice_to_the_lagging_sink_after_a_reset(
    spark: Any, tmp_path: Path, server: tuple[Any, str], fanout_cli: Cli
) -> None:
    pg, url = server
    inputs, lake = tmp_path / "input", tmp_path / "lake"
    rows = write_input(inputs, 1, 3)
    first = _fan(tmp_path, url)
    lake.write_text("not a table")  # the lake fails batch 0 for good; PostgreSQL is down
    try:
        with pytest.raises(Exception, match=r"batch 0: 1 sink\(s\) failed \(lake\)"):
            run_stream(spark, inputs, first, tmp_path / "checkpoint")
        assert first.spool is not None
        spooled = [(b.key, sorted(b.needed_by), b.party) for b in first.spool.batches()]
        assert spooled == [((0, 0), ["pg"], {"lake", "pg"})]
    finally:
        first.close()

    ledger, spool = str(tmp_path / "ledger"), str(tmp_path / "spool")
    ran = fanout_cli("recover", "--ledger", ledger, "--pipeline", "reset", "--spool", spool)
    assert ran.returncode == 0, ran
    assert without_newest(ran.stdout)[0].splitlines() == [
        "pipeline 'reset': the ledger holds no committed batch",
        "  pg: batch(es) 0 in the spool, never committed by Spark: given up at a reset (the "
        "new checkpoint reads their rows again)",
        NO_CONFIG,
    ]

    lake.unlink()  # the lake fixed, PostgreSQL back; a new checkpoint reads from the start
    pg.start()
    second = _fan(tmp_path, url, on_checkpoint_reset="new_epoch")
    try:
        run_stream(spark, inputs, second, tmp_path / "checkpoint-new")
        assert {n: s.state for n, s in second.final_catch_up().items()} == {"pg": "live"}
        assert second.spool is not None and second.spool.size() == (0, 0, 0)
    finally:
        second.close()
    assert _pg_ids(url) == id_counts(rows)  # each row once
    assert sorted(delta_rows(lake), key=lambda r: r["order_id"]) == rows
    assert committed_marks(tmp_path / "ledger", "reset") == Counter(
        {(sink, b): 1 for sink in ("lake", "pg") for b in range(1)}
    )
    epochs = {(r["sink"], r["epoch"]) for r in delta_rows(tmp_path / "ledger")
              if r["status"] == "committed"}  # fmt: skip
    assert epochs == {("lake", 1), ("pg", 1)}
