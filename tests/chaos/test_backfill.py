"""A sink added to a running pipeline with ``backfill_from`` receives every batch the
named Delta sink holds, in batch order, then the live ones, exactly once, also when the
driver is SIGKILLed during the backfill (a real subprocess). The runs no kill ends (the
first, before the sink is added, and the last) run in the test's own session: a Spark
start each less, and the same restart on the killed runs' checkpoint, ledger and sinks."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tests.chaos.backfill_driver import PG_TABLE, PIPELINE, run_pipeline
from tests.chaos.harness import KILLED
from tests.chaos.killer import KillPlan
from tests.chaos.lag_input import final_state, postgres_rows, versions, write_lag_input
from tests.integration.streams import delta_rows

REPO = Path(__file__).resolve().parents[2]
BEFORE, AFTER = 5, 3  # batches before the sink is added, and after
KILLS = (
    KillPlan("catchup_done", 0, "pg"),  # backfilled batch 0 written, not marked
    KillPlan("catchup_writing", 0, "pg", 0.15),  # after the restart, while writing one
)  # each kill is a Spark driver run of its own (~25 s of CI): two, one per kill point


def _run(workdir: Path, pg_url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tests.chaos.backfill_driver", str(workdir), pg_url, *flags]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)


def test_a_new_sink_backfills_from_the_delta_sink_then_goes_live_through_kills(
    spark: Any, tmp_path: Path
) -> None:
    from fanout_postgres.embedded import EmbeddedPostgres

    work = tmp_path / "work"
    rows = write_lag_input(work / "input", BEFORE)
    server = EmbeddedPostgres(tmp_path / "pgdata", database="grows", durable=False)
    pg_url = server.start()
    try:
        run_pipeline(spark, work, pg_url, after=False)
        rows += write_lag_input(work / "input", AFTER, start_file=BEFORE)

        for plan in KILLS:  # the sink is added; each run dies during its backfill
            killed = _run(work, pg_url, "--after", "--kill", json.dumps(asdict(plan)))
            assert killed.returncode == KILLED, (plan, killed.stderr[-3000:])
        run_pipeline(spark, work, pg_url, after=True)

        assert postgres_rows(pg_url, PG_TABLE) == final_state(rows)
        assert versions(delta_rows(work / "lake")) == versions(rows)
        ledger = [r for r in delta_rows(work / "ledger") if r["pipeline"] == PIPELINE]
        marks = [r for r in ledger if r["status"] == "committed"]
        # every batch once per sink; pg's marks in batch order, backfilled ones first
        assert sorted(r["batch_id"] for r in marks if r["sink"] == "lake") == list(
            range(BEFORE + AFTER)
        )
        pg = [
            r["batch_id"]
            for r in sorted(marks, key=lambda r: r["finished_at"])
            if r["sink"] == "pg"
        ]
        assert pg == list(range(BEFORE + AFTER))
        # the backfilled batches carry the query id and offsets the Delta sink's marks have
        lake_plans = {
            r["batch_id"]: (r["query_id"], r["source_offsets"])
            for r in marks
            if r["sink"] == "lake"
        }
        pg_plans = {
            r["batch_id"]: (r["query_id"], r["source_offsets"]) for r in marks if r["sink"] == "pg"
        }
        assert pg_plans == lake_plans
    finally:
        server.stop()
