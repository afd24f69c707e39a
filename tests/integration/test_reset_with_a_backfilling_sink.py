"""A checkpoint reset after a batch spooled for a lagging sink while another sink still
backfilled (held back: its source wrote the batch, the spool did not keep it for it). Spark
committed the batch, so the catch-up writes it to the lagging sink after the reset;
`fanout recover --spool` must count the lagging sink there too, or the new checkpoint it
places reads the batch's rows again and the lagging sink gets them twice (docs/architecture.md
§14.4, "An older epoch"). Real Spark, real Delta lake, ledger and spool, the embedded
PostgreSQL."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from fanout import FanOut
from tests.in_process_cli import Cli
from tests.integration.streams import id_counts, run_stream, write_input

LAKE = "lake"


def _fan(tmp_path: Path, url: str, *, copy: bool, **kw: Any) -> FanOut:
    sinks: list[dict[str, Any]] = [
        {"type": "delta", "name": "lake", "path": str(tmp_path / "lake")},
        {"type": "postgres", "name": "pg", "url": url, "table": "orders", "mode": "append",
         "create_table": True, "on_failure": "lag", "retries": 0},
    ]  # fmt: skip
    if copy:
        sinks.append({"type": "delta", "name": "copy", "path": str(tmp_path / "copy"),
                      "backfill_from": "lake", "retries": 0})  # fmt: skip
    return FanOut(
        "held", str(tmp_path / "ledger"), sinks, retries=0, backoff_s=0,
        spool=str(tmp_path / "spool"), probe_interval_s=3600, **kw,
    )  # fmt: skip


def _pg_ids(url: str) -> Counter[int]:
    import psycopg2

    from tests.chaos.checker import libpq_url

    with psycopg2.connect(libpq_url(url)) as conn, conn.cursor() as cur:
        cur.execute('SELECT order_id FROM "orders"')
        return Counter(int(r[0]) for r in cur.fetchall())


def _copy_that_refuses_every_batch(path: Path) -> None:
    """A table whose order_id is a string: every backfill write to it fails, so the sink
    stays behind, backfilling, for the whole test."""
    import pyarrow as pa
    from deltalake import write_deltalake

    write_deltalake(str(path), pa.table({"order_id": pa.array(["x"], pa.string())}))


def test_a_batch_a_backfilling_sink_was_held_back_from_is_counted_by_recover_and_written_once(
    spark: Any, tmp_path: Path, server: tuple[Any, str], fanout_cli: Cli
) -> None:
    pg, url = server
    inputs = tmp_path / "input"
    rows = write_input(inputs, 1, 3)
    pg.start()
    first = _fan(tmp_path, url, copy=False)
    try:
        run_stream(spark, inputs, first, tmp_path / "checkpoint")  # batch 0: lake and pg
    finally:
        first.close()
    pg.stop()

    _copy_that_refuses_every_batch(tmp_path / "copy")
    rows += write_input(inputs, 1, 3, start_file=1)
    second = _fan(tmp_path, url, copy=True)  # copy backfills (and fails), pg is down
    try:
        run_stream(spark, inputs, second, tmp_path / "checkpoint")  # batch 1: lake only
        assert second.spool is not None
        assert [(b.key, sorted(b.needed_by)) for b in second.spool.batches()] == [((0, 1), ["pg"])]
    finally:
        second.close()
    assert (tmp_path / "checkpoint" / "commits" / "1").exists()  # Spark committed batch 1

    ledger, spool = str(tmp_path / "ledger"), str(tmp_path / "spool")
    ran = fanout_cli("recover", "--ledger", ledger, "--pipeline", "held", "--spool", spool)
    assert ran.returncode == 0, ran
    out = ran.stdout
    assert "given up" not in out, out
    resume = re.search(r"Resume after batch (\d+)", out)
    assert resume is not None and resume.group(1) == "1", out

    # the reset, where recover said: a new checkpoint reads the files after that batch
    after = tmp_path / "input-new"
    rows += write_input(after, 1, 3, start_file=2)
    for n in range(int(resume.group(1)) + 1, 2):
        write_input(after, 1, 3, start_file=n)
    pg.start()
    third = _fan(tmp_path, url, copy=True, on_checkpoint_reset="new_epoch")
    try:
        run_stream(spark, after, third, tmp_path / "checkpoint-new")
        lags = third.catch_up(timeout_s=120)  # copy stays behind: its table refuses
        assert (lags["pg"].state, lags["copy"].state) == ("live", "lagging")
    finally:
        third.close()
    assert _pg_ids(url) == id_counts(rows)  # each row once
