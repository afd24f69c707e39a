"""The chaos loop: run the driver, SIGKILL it at seeded random points, restart it on the
same checkpoint, and at the end let the independent checker count every sink."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "fanout-kafka" / "tests"))
from kafkatools import create_topic

from tests.chaos.chaos_driver import PG_TABLE, PIPELINE, SINKS, TOPIC, run_pipeline
from tests.chaos.checker import SinkCheck, check_delta, check_kafka, check_postgres
from tests.chaos.killer import POINTS, SINK_POINTS, KillPlan
from tests.chaos.noidem import NAME as NOIDEM
from tests.chaos.noidem import RECORD, NoidemRun, read_record
from tests.integration.streams import write_input

KILLED = -9  # what subprocess reports for a SIGKILLed child
REPO = Path(__file__).resolve().parents[2]


@dataclass
class ChaosReport:
    """What happened: the kills, and the checker's table."""

    seed: int
    kills: list[str] = field(default_factory=list)
    checks: list[SinkCheck] = field(default_factory=list)
    runs: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    """What the checker found out about inexact sinks (where the duplicates sit)."""
    noidem: list[NoidemRun] = field(default_factory=list)
    """Per run, what the sink without idempotency got (with ``noidem``)."""

    def verdict(self) -> tuple[bool, str]:
        """Exact in every sink (Kafka's committed records, on Tansu read from the log's
        transaction markers: tests.chaos.checker.check_kafka)."""
        if all(c.exact for c in self.checks):
            return True, "EXACT: 0 missing, 0 duplicated in every sink"
        return False, "NOT EXACT"

    def table(self) -> str:
        """The per-sink table, as printed by the long run."""
        width = max([len("sink"), *(len(c.sink) for c in self.checks)]) + 2
        lines = [
            f"{'sink':<{width}}{'expected':>10}{'present':>10}{'missing':>10}{'duplicated':>12}{'wrong':>8}"
        ]
        for c in self.checks:
            lines.append(
                f"{c.sink:<{width}}{c.expected:>10}{c.present:>10}{c.missing:>10}{c.duplicated:>12}{c.wrong:>8}"
            )
        return "\n".join(lines + self.notes)


def keep_log(workdir: Path, run: int, label: str, done: subprocess.CompletedProcess[str]) -> None:
    """Keep a driver run's output under ``workdir/runs`` (read when a check fails)."""
    runs = workdir / "runs"
    runs.mkdir(exist_ok=True)
    text = f"{label}: exit {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    (runs / f"{run:03d}.log").write_text(text)


def explain_kafka_duplicates(report: ChaosReport, bootstrap: str, topic: str) -> None:
    """When the Kafka check found duplicates on a broker whose log the checker reads raw
    (Tansu), note where each copy sits: partition, offset, producer id and epoch, headers."""
    from kafka_log import describe_duplicates
    from kafkatools import broker_hides_aborted

    duplicated = any(c.duplicated for c in report.checks if "kafka" in c.sink)
    if duplicated and not broker_hides_aborted(bootstrap):
        report.notes.append("kafka copies:\n" + describe_duplicates(bootstrap, topic))


def assert_exact(report: ChaosReport) -> None:
    """Every sink exact: no record missing, duplicated or wrong."""
    for check in report.checks:
        assert check.exact, report.table()


def high_water(workdir: Path, sink: str | None = None) -> int:
    """The highest batch any sink (or ``sink``) committed (-1 before the first), from the
    ledger's log."""
    from deltalake import DeltaTable

    log = workdir / "ledger" / "_delta_log"
    if not log.exists():
        return -1
    app_id = f"fanout/{PIPELINE}" + (f"/{sink}" if sink else "")
    version = DeltaTable(str(workdir / "ledger")).transaction_version(app_id)
    return -1 if version is None else int(version)


class NoidemWatch:
    """Reads, after each run, the record lines the run added and the sink's mark."""

    def __init__(self, workdir: Path, report: ChaosReport) -> None:
        self.workdir = workdir
        self.report = report
        self.offset = 0

    def after(self, label: str, plan: KillPlan | None = None) -> None:
        """Note the run just ended (``plan``: the kill that ended it)."""
        writes, self.offset = read_record(self.workdir / RECORD, self.offset)
        run = NoidemRun(label, high_water(self.workdir, NOIDEM), writes)
        if plan is not None:
            run.kill_point, run.kill_batch = plan.point, plan.batch_id
        self.report.noidem.append(run)


def input_exhausted(returncode: int, workdir: Path, files: int) -> bool:
    """Whether a driver run read all the input, so the next kill plans need more: it ended
    by itself, or every file's batch is committed (a micro-batch may hold two files, so
    the batch ids can stop short of the files)."""
    return returncode == 0 or high_water(workdir) >= files - 1


def draw_plan(rng: random.Random, point: str, next_batch: int, last_batch: int) -> KillPlan:
    """A batch and (for sink points) sink and delay for ``point``, drawn from ``rng``."""
    batch = min(last_batch, next_batch + rng.randint(0, 2))
    sink = rng.choice(SINKS) if point in SINK_POINTS else None
    delay = rng.uniform(0.0, 0.4) if point == "sink_writing" else rng.uniform(0.0, 0.03)
    return KillPlan(point, batch, sink, round(delay, 3))


def final_run(
    driver: list[str],
    workdir: Path,
    report: ChaosReport,
    *,
    pg_url: str,
    bootstrap: str,
    spark: Any = None,
    lag: bool = False,
    noidem: bool = False,
) -> None:
    """The run after the kills, to the end of the input: the ``driver`` command in a
    subprocess, or, given ``spark``, the same pipeline run in that session
    (:func:`tests.chaos.chaos_driver.run_pipeline`): a restart on the killed runs'
    checkpoint, ledger and sinks all the same, since nothing of a killed driver outlives
    its process but what it wrote there."""
    report.runs += 1
    if spark is not None:
        lags = run_pipeline(spark, workdir, pg_url, bootstrap, lag=lag, noidem=noidem)
        note = f"final, in the test's session: LAGS {json.dumps(lags)}" if lag else "final"
        keep_log(workdir, report.runs, note, subprocess.CompletedProcess(driver, 0, "", ""))
        return
    final = subprocess.run(driver, cwd=REPO, capture_output=True, text=True, timeout=900)
    keep_log(workdir, report.runs, "final", final)
    if final.returncode != 0:
        raise RuntimeError(f"final run failed ({final.returncode}):\n{final.stderr[-4000:]}")


def run_chaos(
    workdir: Path,
    *,
    pg_url: str,
    bootstrap: str,
    seed: int,
    kills: int,
    files: int,
    rows_per_file: int,
    say: Callable[[str], None] = print,
    spark: Any = None,
    noidem: bool = False,
) -> ChaosReport:
    """Kill the driver ``kills`` times, finish the stream, and check every sink. The last
    run, which no kill ends, is a driver of its own too, or a run in ``spark`` when given
    (the test's session: one Spark start less; :func:`final_run`). With ``noidem`` every
    run has the sink without idempotency too (:mod:`tests.chaos.noidem`), and
    ``report.noidem`` what it got per run."""
    started = time.monotonic()
    rng = random.Random(seed)
    report = ChaosReport(seed)
    rows = write_input(workdir / "input", files, rows_per_file)
    create_topic(bootstrap, TOPIC, 4)
    expected = {r["order_id"]: r for r in rows}
    driver = [sys.executable, "-m", "tests.chaos.chaos_driver", str(workdir), pg_url, bootstrap]
    driver += ["--noidem"] if noidem else []
    watch = NoidemWatch(workdir, report) if noidem else None
    misses = 0
    order = rng.sample(POINTS, len(POINTS))  # every 5 consecutive kills cover every point
    while len(report.kills) < kills:
        point = order[len(report.kills) % len(order)]
        plan = draw_plan(rng, point, high_water(workdir) + 1, files - 1)
        done = subprocess.run(
            [*driver, "--kill", json.dumps(asdict(plan))],
            cwd=REPO, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        report.runs += 1
        keep_log(workdir, report.runs, plan.describe(), done)
        if watch is not None and done.returncode in (KILLED, 0):
            watch.after(plan.describe(), plan if done.returncode == KILLED else None)
        if done.returncode == KILLED:
            report.kills.append(plan.describe())
            through = high_water(workdir)
            say(f"kill {len(report.kills)}/{kills}: {plan.describe()} (committed: {through})")
        elif done.returncode == 0:
            misses += 1  # the stream finished before reaching the planned point
            say(f"run {report.runs}: finished without reaching {plan.describe()}")
            if misses > kills:
                break
        else:
            raise RuntimeError(f"driver failed ({done.returncode}):\n{done.stderr[-4000:]}")
        if input_exhausted(done.returncode, workdir, files) and len(report.kills) < kills:
            more = write_input(workdir / "input", files // 4 or 1, rows_per_file, start_file=files)
            expected.update({r["order_id"]: r for r in more})
            files += files // 4 or 1
    final_run(
        driver, workdir, report, pg_url=pg_url, bootstrap=bootstrap, spark=spark, noidem=noidem
    )
    if watch is not None:
        watch.after("final")
    report.checks = [
        check_delta(workdir / "lake", expected),
        check_postgres(pg_url, PG_TABLE, expected),
        check_kafka(bootstrap, TOPIC, expected),
    ]
    explain_kafka_duplicates(report, bootstrap, TOPIC)
    report.seconds = time.monotonic() - started
    return report
