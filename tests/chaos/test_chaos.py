"""Exactly once across Delta, PostgreSQL and Kafka under seeded random SIGKILLs of the
driver (the long run: python -m tests.chaos.long_run)."""

from __future__ import annotations

from pathlib import Path

from tests.chaos.harness import assert_exact, run_chaos
from tests.chaos.services import embedded_services

SEED = 20261121


def test_five_kills_leave_every_sink_exact(tmp_path: Path) -> None:
    with embedded_services(tmp_path / "services") as (pg_url, bootstrap):
        report = run_chaos(
            tmp_path / "work",
            pg_url=pg_url,
            bootstrap=bootstrap,
            seed=SEED,
            kills=5,
            files=10,
            rows_per_file=400,
        )
    print(f"seed {SEED}: kills {report.kills}\n{report.table()}")
    assert len(report.kills) == 5, report.kills
    assert_exact(report)
