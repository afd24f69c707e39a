"""Exactly once with a sink that fails alone: the PostgreSQL sink has
``on_failure="lag"``, its server is down for whole runs or stopped part way through one,
and the driver is SIGKILLed at seeded random points, during the outage and during the
catch-up (the long run: python -m tests.chaos.long_run --lag; the five-kill run this test
was until it took 6 minutes of CI: python -m tests.chaos.long_run --lag --kills 5 --files 8
--rows 160 --seed 20261123)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.chaos.harness import assert_exact
from tests.chaos.lag_harness import run_lag_chaos
from tests.chaos.services import embedded_servers

SEED = 20261197
"""Two kills in three driver runs: at the start of batch 2 with the server down (batches 0
and 1 written to Delta and Kafka, PostgreSQL behind), then in the catch-up, after the
PostgreSQL sink wrote a missed batch and before its mark."""


def test_kills_while_postgres_is_down_and_catching_up_leave_every_sink_exact(
    spark: Any, tmp_path: Path
) -> None:
    """Two driver runs SIGKILLed, then the last run (and its catch-up) in the test's own
    session."""
    with embedded_servers(tmp_path / "services") as (server, pg_url, bootstrap):
        report = run_lag_chaos(
            tmp_path / "work",
            server=server,
            pg_url=pg_url,
            bootstrap=bootstrap,
            seed=SEED,
            kills=2,
            files=4,
            spark=spark,
        )
    print(f"seed {SEED}: kills {report.kills}\n{report.table()}")
    assert report.kills == [
        "batch_start @ batch 2 [pg down]",
        "catchup_done of pg @ batch 2 [pg up]",
    ]
    assert report.runs == 3, report.runs
    assert_exact(report)
