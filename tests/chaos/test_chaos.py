"""Exactly once across Delta, PostgreSQL and Kafka under seeded random SIGKILLs of the
driver (the long run: python -m tests.chaos.long_run; the five-kill run this test was
until it took 3 minutes of CI: python -m tests.chaos.long_run --kills 5 --files 10
--rows 4000 --seed 20261121)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.chaos.harness import assert_exact, high_water, run_chaos
from tests.chaos.noidem import ledger_skips, unexpected_writes
from tests.chaos.services import embedded_services

SEED = 20261165
"""Its first three kills, one per sink: sink_done of bus, sink_writing of lake,
ledger_commit of pg (tests/integration/test_hard_kill.py kills at batch_start, sink_done
and batch_end, never while a sink writes or during a ledger commit)."""


def test_three_kills_one_per_sink_leave_every_sink_exact(spark: Any, tmp_path: Path) -> None:
    """Three driver runs SIGKILLed, then the last run in the test's own session; beside
    the three sinks, one that skips nothing by itself (tests/chaos/noidem.py) gets each
    batch once but where a kill fell between its write and its mark: the ledger alone
    skips it on the restarts."""
    with embedded_services(tmp_path / "services") as (pg_url, bootstrap):
        report = run_chaos(
            tmp_path / "work",
            pg_url=pg_url,
            bootstrap=bootstrap,
            seed=SEED,
            kills=3,
            files=6,
            rows_per_file=200,
            spark=spark,
            noidem=True,
        )
    print(f"seed {SEED}: kills {report.kills}\n{report.table()}")
    assert [k.split(" @")[0] for k in report.kills] == [
        "sink_done of bus",
        "sink_writing of lake",
        "ledger_commit of pg",
    ], report.kills
    assert_exact(report)
    runs = report.noidem
    print(
        "noidem: "
        + "; ".join(f"{r.label}: {[w.batch for w in r.writes]} mark {r.mark}" for r in runs)
    )
    problems = unexpected_writes(runs, report.checks[0].expected, high_water(tmp_path / "work"))
    assert not problems, "\n".join(problems)
    # the restart after a kill that left the sink marked and Spark's commit not written
    # had to skip it, or the assertion above could not fail without the ledger's skip
    assert ledger_skips(runs), runs
