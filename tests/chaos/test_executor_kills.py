"""Exactly once across Delta, PostgreSQL (upsert and append) and Kafka on a
``local-cluster`` master while executor JVMs are SIGKILLed mid-write: from the partitions'
commit hooks (before and after a partition's transaction commits; for the Delta append
from the executors, once a task's files are written, before the driver commits them) and
from outside while a sink writes. Spark retries each killed task on another executor;
one driver run, no driver kill (those are test_chaos's; the long run mixes both:
python -m tests.chaos.long_run --executor-kills N)."""

from __future__ import annotations

from pathlib import Path

from kafkatools import hides_aborted

from tests.chaos.cluster_harness import ClusterReport, check_all, prepare, run_driver
from tests.chaos.executor_kills import ExecutorKill, OutsideKill, aborted_records, kills_done
from tests.chaos.harness import assert_exact

INSIDE = [
    ExecutorKill("pg", 0, 1, "before"),
    ExecutorKill("lake", 1, 0, "before"),
    ExecutorKill("pg", 1, 2, "after"),
    ExecutorKill("bus", 2, 0, "before"),
    ExecutorKill("pglog", 3, 3, "before"),
    ExecutorKill("pglog", 4, 1, "after"),
    ExecutorKill("bus", 4, 2, "after"),
]
OUTSIDE = [OutsideKill("lake", 5, 0.2)]


def test_executor_kills_leave_every_sink_exact(tmp_path: Path) -> None:
    from tests.chaos.services import embedded_services

    work = tmp_path / "work"
    with embedded_services(tmp_path / "services") as (pg_url, bootstrap):
        filters_aborted = hides_aborted(bootstrap)
        expected = prepare(work, bootstrap, files=6, rows_per_file=300)
        done = run_driver(work, pg_url, bootstrap, inside=INSIDE, outside=OUTSIDE, seed=17)
        assert done.returncode == 0, done.stderr[-4000:]
        report = ClusterReport(seed=17, runs=1)
        report.checks = check_all(work, pg_url, bootstrap, expected)
    kills = kills_done(work / "executor-kills")
    report.kills = [str(k["label"]) for k in kills]
    print("\n".join(report.kills) + "\n" + report.table())
    made = {(k["sink"], k["batch_id"], k.get("partition"), k["when"]) for k in kills}
    planned = {(k.sink, k.batch_id, k.partition, k.when) for k in INSIDE}
    assert made == planned | {("lake", 5, None, "outside")}, report.kills
    assert len({k["executor_pid"] for k in kills}) == len(kills)  # a new executor each time
    assert [c.expected for c in report.checks] == [1800] * 4
    # records a read_committed reader may see twice (Tansu shows aborted transactions) can
    # only be those of the Kafka partition killed before its commit: batch 2's rows, all of
    # that attempt's or none
    bus = report.checks[2]
    assert set(bus.duplicated_ids) <= set(range(600, 900)), bus.duplicated_ids
    assert bus.duplicated in (0, aborted_records(kills)), (bus, aborted_records(kills))
    assert_exact(report, filters_aborted)
