"""Exactly once with a sink that fails alone: the PostgreSQL sink has
``on_failure="lag"``, its server is down for whole runs or stopped part way through one,
and the driver is SIGKILLed at seeded random points, during the outage and during the
catch-up (the long run: python -m tests.chaos.long_run --lag)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafkatools import hides_aborted

from tests.chaos.lag_harness import run_lag_chaos
from tests.chaos.services import embedded_servers

SEED = 20261123


def test_five_kills_while_postgres_flaps_leave_every_sink_exact(tmp_path: Path) -> None:
    with embedded_servers(tmp_path / "services") as (server, pg_url, bootstrap):
        filters_aborted = hides_aborted(bootstrap)
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
    lake, pg, bus = report.checks
    for check in (lake, pg):
        assert check.exact, report.table()
    assert (bus.missing, bus.wrong) == (0, 0), report.table()
    assert bus.present == bus.expected + bus.duplicated, report.table()
    if bus.duplicated and not filters_aborted:
        # Tansu shows aborted transactions to read_committed readers, and when its last
        # stable offset sticks the check reads uncommitted (plugins/fanout-kafka/README.md)
        pytest.xfail(f"{bus.duplicated} records of aborted Kafka transactions visible on Tansu")
    assert bus.duplicated == 0, report.table()
