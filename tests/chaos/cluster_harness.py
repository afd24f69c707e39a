"""Chaos on a ``local-cluster`` master: SIGKILL executor JVMs while the sinks write
(:mod:`tests.chaos.executor_kills`), beside SIGKILLs of the driver (:mod:`tests.chaos.killer`),
then let the independent checker count every sink.

Each driver run is a subprocess (a cluster session cannot share the test process's
``local[2]`` one); the executor kills it should make are passed to it, and an
:class:`~tests.chaos.executor_kills.OutsideKiller` thread kills executors from outside.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "fanout-kafka" / "tests"))
from kafkatools import create_topic

from fanout.spark import cluster_master
from tests.chaos.chaos_driver import APPEND_SINK, APPEND_TABLE, PG_TABLE, SINKS, TOPIC
from tests.chaos.checker import check_delta, check_kafka, check_postgres
from tests.chaos.executor_kills import (
    ExecutorKill,
    OutsideKill,
    OutsideKiller,
    kills_done,
)
from tests.chaos.harness import KILLED, ChaosReport, draw_plan, explain_kafka_duplicates, high_water
from tests.chaos.killer import POINTS
from tests.integration.streams import write_input

CLUSTER = cluster_master(executors=2, cores=1, memory_mb=1024)
REPO = Path(__file__).resolve().parents[2]
INSIDE = [
    *((sink, when) for sink in ("pg", APPEND_SINK, "bus") for when in ("before", "after")),
    ("lake", "before"),
]
"""The inside kill points: each executor-side sink, before or after a partition commits;
the Delta append from the executors once a task's files are written, before the driver
commits them (its partitions commit together, on the driver: no "after")."""


@dataclass
class ClusterReport(ChaosReport):
    """A :class:`ChaosReport` with the kills counted per point."""

    points: Counter[str] = field(default_factory=Counter)

    def point_table(self) -> str:
        """Kills per point."""
        lines = [f"{'kill point':<40}{'kills':>6}"]
        lines += [f"{point:<40}{n:>6}" for point, n in sorted(self.points.items())]
        return "\n".join(lines)


def run_driver(
    workdir: Path,
    pg_url: str,
    bootstrap: str,
    *,
    inside: Sequence[ExecutorKill] = (),
    outside: Sequence[OutsideKill] = (),
    driver_kill: dict[str, object] | None = None,
    seed: int = 0,
    timeout_s: float = 900,
) -> subprocess.CompletedProcess[str]:
    """One driver run on :data:`CLUSTER` (with the PostgreSQL append sink), making the
    given executor kills (and the driver kill, when given)."""
    command = [sys.executable, "-m", "tests.chaos.chaos_driver", str(workdir), pg_url, bootstrap,
               "--master", CLUSTER, "--append",
               "--executor-kills", json.dumps([asdict(k) for k in inside])]  # fmt: skip
    if driver_kill is not None:
        command += ["--kill", json.dumps(driver_kill)]
    (workdir / "writing.txt").unlink(missing_ok=True)
    # the caller's PYTHONPATH stays behind the checkout: a worktree's plugins, not the
    # installed ones, are what the driver and its executors import
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    driver = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip
    killer = OutsideKiller(
        list(outside), workdir / "writing.txt", workdir / "executor-kills", driver.pid, seed
    )
    killer.start()
    try:
        stdout, stderr = driver.communicate(timeout=timeout_s)
    finally:
        killer.stopped.set()
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    killer.join(5)
    runs = len(list(workdir.glob("driver-*.err")))
    (workdir / f"driver-{runs}.err").write_text(stderr)  # the whole story of a failed run
    return subprocess.CompletedProcess(command, driver.returncode, stdout, stderr)


def check_all(
    workdir: Path, pg_url: str, bootstrap: str, expected: dict[int, dict[str, object]]
) -> list:  # type: ignore[type-arg]
    """The checker's rows: Delta, PostgreSQL upsert, Kafka, PostgreSQL append."""
    return [
        check_delta(workdir / "lake", expected),
        check_postgres(pg_url, PG_TABLE, expected),
        check_kafka(bootstrap, TOPIC, expected),
        check_postgres(pg_url, APPEND_TABLE, expected, label=f"{APPEND_SINK} (pg append)"),
    ]


def prepare(workdir: Path, bootstrap: str, files: int, rows_per_file: int) -> dict[int, dict]:  # type: ignore[type-arg]
    """Write the input, create the topic; the expected rows by id."""
    rows = write_input(workdir / "input", files, rows_per_file)
    create_topic(bootstrap, TOPIC, 4)
    (workdir / "executor-kills").mkdir(parents=True, exist_ok=True)
    return {r["order_id"]: r for r in rows}


def run_cluster_chaos(
    workdir: Path,
    *,
    pg_url: str,
    bootstrap: str,
    seed: int,
    executor_kills: int,
    driver_kills: int,
    files: int,
    rows_per_file: int,
    say: Callable[[str], None] = print,
) -> ClusterReport:
    """Kill executors ``executor_kills`` times (inside and outside, every point in turn)
    and the driver ``driver_kills`` times, finish the stream, check every sink."""
    started = time.monotonic()
    rng = random.Random(seed)
    report = ClusterReport(seed)
    expected = prepare(workdir, bootstrap, files, rows_per_file)
    state = workdir / "executor-kills"
    points: list[tuple[str, str]] = [*INSIDE, ("outside", "")]
    order = rng.sample(points, len(points))
    driver_order = rng.sample(POINTS, len(POINTS))
    drawn = driver_killed = 0
    while len(kills_done(state)) < executor_kills or driver_killed < driver_kills:
        first = high_water(workdir) + 1
        inside, outside = [], []
        for offset in range(3):  # three executor kills a run, in the next three batches
            sink, when = order[drawn % len(order)]
            drawn += 1
            batch = min(files - 1, first + offset)
            if sink == "outside":
                target = rng.choice(SINKS)
                outside.append(OutsideKill(target, batch, round(rng.uniform(0.0, 0.6), 3)))
            else:
                partition = rng.randrange(4)
                inside.append(ExecutorKill(sink, batch, partition, when))  # type: ignore[arg-type]
        plan = None
        if driver_killed < driver_kills:
            point = driver_order[driver_killed % len(driver_order)]
            plan = draw_plan(rng, point, min(files - 1, first + 3), files - 1)
        before = len(kills_done(state))
        kill = asdict(plan) if plan else None
        done = run_driver(workdir, pg_url, bootstrap, inside=inside, outside=outside,
                          driver_kill=kill, seed=rng.randrange(10**6))  # fmt: skip
        report.runs += 1
        for n, note in enumerate(kills_done(state)[before:], start=before + 1):
            report.kills.append(str(note["label"]))
            report.points[str(note["point"])] += 1
            say(f"executor kill {n}: {note['label']}")
        if done.returncode == KILLED and plan is not None:
            driver_killed += 1
            report.kills.append(plan.describe())
            report.points[f"driver {plan.point}"] += 1
            say(
                f"driver kill {driver_killed}: {plan.describe()} (committed: {high_water(workdir)})"
            )
        elif done.returncode != 0:
            raise RuntimeError(f"driver failed ({done.returncode}):\n{done.stderr[-4000:]}")
        if high_water(workdir) >= files - 1:  # all committed: a new input wave
            wave = max(3, files // 4)
            more = write_input(workdir / "input", wave, rows_per_file, start_file=files)
            expected.update({r["order_id"]: r for r in more})
            files += wave
        if report.runs > 3 * (executor_kills + driver_kills) + 4:
            raise RuntimeError(f"kills keep missing: {report.kills}")
    final = run_driver(workdir, pg_url, bootstrap)
    report.runs += 1
    if final.returncode != 0:
        raise RuntimeError(f"final run failed ({final.returncode}):\n{final.stderr[-4000:]}")
    report.checks = check_all(workdir, pg_url, bootstrap, expected)
    explain_kafka_duplicates(report, bootstrap, TOPIC)
    report.seconds = time.monotonic() - started
    return report
