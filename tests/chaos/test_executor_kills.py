"""Exactly once across Delta, PostgreSQL (upsert and append) and Kafka on a
``local-cluster`` master while executor JVMs are SIGKILLed mid-write: from the partitions'
commit hooks (before and after a partition's transaction commits; for the Delta append
from the executors, once a task's files are written, before the driver commits them) and
from outside while a sink writes. Spark retries each killed task on another executor;
one driver run, no driver kill (those are test_chaos's; the long run mixes both:
python -m tests.chaos.long_run --executor-kills N)."""

from __future__ import annotations

from pathlib import Path

from tests.chaos.chaos_driver import TOPIC
from tests.chaos.cluster_harness import ClusterReport, check_all, prepare, run_driver
from tests.chaos.executor_kills import ExecutorKill, OutsideKill, kills_done
from tests.chaos.harness import assert_exact, explain_kafka_duplicates

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
        expected = prepare(work, bootstrap, files=6, rows_per_file=300)
        done = run_driver(work, pg_url, bootstrap, inside=INSIDE, outside=OUTSIDE, seed=17)
        assert done.returncode == 0, done.stderr[-4000:]
        report = ClusterReport(seed=17, runs=1)
        report.checks = check_all(work, pg_url, bootstrap, expected)
        explain_kafka_duplicates(report, bootstrap, TOPIC)  # where each copy sits, if any
    kills = kills_done(work / "executor-kills")
    report.kills = [str(k["label"]) for k in kills]
    print("\n".join(report.kills) + "\n" + report.table())
    made = {(k["sink"], k["batch_id"], k.get("partition"), k["when"]) for k in kills}
    planned = {(k.sink, k.batch_id, k.partition, k.when) for k in INSIDE}
    assert made == planned | {("lake", 5, None, "outside")}, report.kills
    assert len({k["executor_pid"] for k in kills}) == len(kills)  # a new executor each time
    assert [c.expected for c in report.checks] == [1800] * 4
    # the Kafka partition killed before its commit left an aborted transaction; on Tansu
    # the check reads the log's markers, so it counts there as on Kafka: not at all
    assert_exact(report)
