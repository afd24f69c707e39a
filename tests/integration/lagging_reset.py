"""The pipeline the reset-with-a-lagging-sink tests build (test_reset_with_a_lagging_append_sink,
test_reset_with_a_lagging_upsert_sink): a Delta lake and a PostgreSQL sink (``on_failure=
"lag"``) over real Spark, a real Delta ledger and spool, the embedded PostgreSQL; and its
first epoch: batch 0 written to both, then batches 1 and 2 spooled for the sink while its
server is down, ``fanout recover`` saying to resume after batch 2."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from fanout import FanOut
from tests.in_process_cli import Cli
from tests.integration.streams import run_stream, write_input

FENCE = 2**63 - 1
"""The epoch fence's batch id (``fanout_postgres.statements.EPOCH_FENCE``)."""


def fan(tmp_path: Path, pipeline: str, pg_sink: dict[str, Any], **kw: Any) -> FanOut:
    """The pipeline: sink ``lake`` (Delta) and ``pg_sink`` (named ``pg``), spooled."""
    return FanOut(
        pipeline, str(tmp_path / "ledger"),
        [{"type": "delta", "name": "lake", "path": str(tmp_path / "lake")}, pg_sink],
        retries=0, backoff_s=0, spool=str(tmp_path / "spool"), probe_interval_s=3600, **kw,
    )  # fmt: skip


def pg_query(url: str, sql: str) -> list[tuple[Any, ...]]:
    """One statement on the embedded PostgreSQL, its rows (or [] for none)."""
    import psycopg2

    from tests.chaos.checker import libpq_url

    with psycopg2.connect(libpq_url(url)) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return [tuple(r) for r in cur.fetchall()] if cur.description else []


def lag_in_epoch_zero(
    spark: Any,
    tmp_path: Path,
    server: tuple[Any, str],
    fanout_cli: Cli,
    pipeline: str,
    pg_sink: dict[str, Any],
    create_table: str,
) -> None:
    """Epoch 0 of the pipeline (:func:`fan`): batch 0 (orders 0-2) written to both sinks,
    then, the server stopped, batches 1 and 2 (orders 3-8) spooled for ``pg``; ``fanout
    recover`` says to resume after batch 2. The server is left stopped."""
    pg, url = server
    inputs = tmp_path / "input"
    write_input(inputs, 1, 3)  # batch 0: orders 0-2
    pg.start()
    pg_query(url, create_table)
    first = fan(tmp_path, pipeline, pg_sink)
    try:
        run_stream(spark, inputs, first, tmp_path / "checkpoint")  # batch 0: lake and pg
    finally:
        first.close()
    pg.stop()

    write_input(inputs, 2, 3, start_file=1)  # batches 1, 2: orders 3-8
    second = fan(tmp_path, pipeline, pg_sink)  # PostgreSQL is down: both spooled for pg
    try:
        run_stream(spark, inputs, second, tmp_path / "checkpoint")
        assert second.spool is not None
        spooled = [(b.key, sorted(b.needed_by)) for b in second.spool.batches()]
        assert spooled == [((0, 1), ["pg"]), ((0, 2), ["pg"])]
    finally:
        second.close()

    ledger, spool = str(tmp_path / "ledger"), str(tmp_path / "spool")
    ran = fanout_cli("recover", "--ledger", ledger, "--pipeline", pipeline, "--spool", spool)
    assert ran.returncode == 0, ran
    out = ran.stdout
    resume = re.search(r"Resume after batch (\d+)", out)
    assert resume is not None and resume.group(1) == "2", out
