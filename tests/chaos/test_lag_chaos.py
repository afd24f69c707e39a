"""Exactly once with a sink that fails alone: the PostgreSQL sink has
``on_failure="lag"``, its server is down for whole runs or stopped part way through one,
and the driver is SIGKILLed at seeded random points, during the outage and during the
catch-up (the long run: python -m tests.chaos.long_run --lag)."""

from __future__ import annotations

from pathlib import Path

from tests.chaos.harness import assert_exact
from tests.chaos.lag_harness import run_lag_chaos
from tests.chaos.services import embedded_servers

SEED = 20261123


def test_five_kills_while_postgres_flaps_leave_every_sink_exact(tmp_path: Path) -> None:
    with embedded_servers(tmp_path / "services") as (server, pg_url, bootstrap):
        report = run_lag_chaos(
            tmp_path / "work",
            server=server,
            pg_url=pg_url,
            bootstrap=bootstrap,
            seed=SEED,
            kills=5,
            files=8,
        )
    print(f"seed {SEED}: kills {report.kills}\n{report.table()}")
    assert len(report.kills) == 5, report.kills
    assert any("catchup" in kill for kill in report.kills), report.kills
    assert any("[pg down]" in kill or "[pg flap]" in kill for kill in report.kills), report.kills
    assert_exact(report)
