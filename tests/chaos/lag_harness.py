"""The lag chaos loop: the PostgreSQL sink has ``on_failure="lag"`` and its server flaps
(down for whole runs, or stopped part way through one) while the driver is SIGKILLed at
seeded random points, including during the catch-up. At the end, with the server up, the
independent readers check every sink: each appended row once, and the upsert table as
an unfailing run leaves it (which only holds when the missed batches came in order)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kafkatools import create_topic

from tests.chaos.chaos_driver import PG_TABLE, TOPIC
from tests.chaos.checker import SinkCheck
from tests.chaos.harness import (
    KILLED,
    ChaosReport,
    explain_kafka_duplicates,
    final_run,
    high_water,
    input_exhausted,
    keep_log,
)
from tests.chaos.killer import KillPlan
from tests.chaos.lag_input import (
    STEP,
    final_state,
    kafka_rows,
    postgres_rows,
    versions,
    write_lag_input,
)
from tests.integration.streams import delta_rows

LAG_POINTS = (
    "batch_start", "sink_writing", "sink_done", "ledger_commit", "batch_end",
    "catchup_writing", "catchup_done", "catchup_done",
)  # fmt: skip
"""Kill points of the lag runs; the catch-up's are drawn more often."""

SERVER_MODES = ("down", "flap", "up")
WAVE = 10
"""Input files (batches) added when the stream has consumed all its input."""


def draw_lag_plan(rng: random.Random, point: str, next_batch: int, last_batch: int) -> KillPlan:
    """A kill plan for ``point``; catch-up points kill the PostgreSQL sink's catch-up."""
    batch = min(last_batch, next_batch + rng.randint(0, 2))
    if point in ("catchup_writing", "catchup_done"):
        return KillPlan(point, next_batch, "pg", round(rng.uniform(0.0, 0.3), 3))
    sink = (
        rng.choice(("lake", "pg", "bus"))
        if point in ("sink_writing", "sink_done", "ledger_commit")
        else None
    )
    delay = rng.uniform(0.0, 0.4) if point == "sink_writing" else rng.uniform(0.0, 0.03)
    return KillPlan(point, batch, sink, round(delay, 3))


def _flap(server: Any, mode: str, rng: random.Random) -> threading.Timer | None:
    """Put the server in ``mode`` for the next run: up, down, or up then stopped after a
    random moment of the run (a timer)."""
    if mode == "down":
        server.stop()
        return None
    server.start()
    if mode == "flap":
        timer = threading.Timer(rng.uniform(0.5, 4.0), server.stop)
        timer.daemon = True
        timer.start()
        return timer
    return None


def run_lag_chaos(
    workdir: Path,
    *,
    server: Any,
    pg_url: str,
    bootstrap: str,
    seed: int,
    kills: int,
    files: int,
    step: int = STEP,
    say: Callable[[str], None] = print,
    spark: Any = None,
) -> ChaosReport:
    """Kill the driver ``kills`` times while the PostgreSQL server flaps; finish with the
    server up (that last run in ``spark`` when given: :func:`tests.chaos.harness.final_run`);
    check every sink."""
    started = time.monotonic()
    rng = random.Random(seed)
    report = ChaosReport(seed)
    rows = write_lag_input(workdir / "input", files, step=step)
    create_topic(bootstrap, TOPIC, 4)
    driver = [
        sys.executable,
        "-m",
        "tests.chaos.chaos_driver",
        str(workdir),
        pg_url,
        bootstrap,
        "--lag",
    ]
    repo = Path(__file__).resolve().parents[2]
    misses = 0
    behind = False  # whether the PostgreSQL sink may have batches waiting in the spool
    while len(report.kills) < kills:
        point = (
            LAG_POINTS[len(report.kills) % len(LAG_POINTS)]
            if rng.random() < 0.7
            else rng.choice(LAG_POINTS)
        )
        if point.startswith("catchup") and not behind:
            # nothing to catch up: first a run, unkilled, of new input while the server
            # is down, which leaves the sink behind by that many batches
            more = WAVE
            rows += write_lag_input(workdir / "input", more, start_file=files, step=step)
            files += more
            _flap(server, "down", rng)
            prep = subprocess.run(driver, cwd=repo, capture_output=True, text=True, timeout=600)
            report.runs += 1
            keep_log(workdir, report.runs, "catch-up preparation", prep)
            if prep.returncode != 0:
                raise RuntimeError(f"driver failed ({prep.returncode}):\n{prep.stderr[-4000:]}")
            behind = True
            say(f"run {report.runs}: {more} batch(es) while the server is down")
        # the server's state in turn (down, flap, up), so a few kills cover each
        mode = "up" if point.startswith("catchup") else SERVER_MODES[report.runs % 3]
        plan = draw_lag_plan(rng, point, high_water(workdir) + 1, files - 1)
        timer = _flap(server, mode, rng)
        done = subprocess.run(
            [*driver, "--kill", json.dumps(asdict(plan))],
            cwd=repo, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if timer is not None:
            timer.cancel()
        report.runs += 1
        keep_log(workdir, report.runs, plan.describe(), done)
        if mode != "up":
            behind = True
        elif done.returncode == 0:
            behind = False  # the run ended with the server up and caught up
        if done.returncode == KILLED:
            report.kills.append(f"{plan.describe()} [pg {mode}]")
            say(f"kill {len(report.kills)}/{kills}: {plan.describe()} [pg {mode}] "
                f"(committed: {high_water(workdir)})")  # fmt: skip
        elif done.returncode == 0:
            misses += 1
            say(f"run {report.runs}: finished without reaching {plan.describe()} [pg {mode}]")
            if misses > 2 * kills:
                break
        else:
            raise RuntimeError(f"driver failed ({done.returncode}):\n{done.stderr[-4000:]}")
        if input_exhausted(done.returncode, workdir, files) and len(report.kills) < kills:
            more = WAVE
            rows += write_lag_input(workdir / "input", more, start_file=files, step=step)
            files += more
    server.start()
    final_run(driver, workdir, report, pg_url=pg_url, bootstrap=bootstrap, spark=spark, lag=True)
    report.checks = check_lag_sinks(workdir, pg_url, bootstrap, rows)
    explain_kafka_duplicates(report, bootstrap, TOPIC)
    report.seconds = time.monotonic() - started
    return report


def check_lag_sinks(
    workdir: Path, pg_url: str, bootstrap: str, rows: list[dict[str, Any]]
) -> list[SinkCheck]:
    """Per sink: expected, present, missing, duplicated, wrong; the appending sinks by
    (order id, version), the upsert table against the final state of an unfailing run."""
    expected = versions(rows)

    def appended(name: str, got: list[dict[str, Any]]) -> SinkCheck:
        seen = versions(got)
        return SinkCheck(
            sink=name,
            expected=sum(expected.values()),
            present=sum(seen.values()),
            missing=sum(1 for k in expected if k not in seen),
            duplicated=sum(c - 1 for c in seen.values() if c > 1),
            wrong=sum(1 for k in seen if k not in expected),
        )

    final = final_state(rows)
    table = postgres_rows(pg_url, PG_TABLE)
    pg = SinkCheck(
        sink="pg (postgres)",
        expected=len(final),
        present=len(table),
        missing=len(final.keys() - table.keys()),
        duplicated=0,  # a primary key: an upsert cannot duplicate; wrong values show order
        wrong=sum(1 for k, row in table.items() if k in final and row != final[k]),
    )
    records, stuck = kafka_rows(bootstrap, TOPIC, sum(expected.values()))
    return [
        appended("lake (delta)", delta_rows(workdir / "lake")),
        pg,
        appended("bus (kafka)" + (" LSO stuck: uncommitted read" if stuck else ""), records),
    ]
