"""``fanout run`` on the shipped example: SIGTERM mid-run, restart, exactly once in every
sink (routing included), and the metrics endpoint agreeing with the ledger."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from deltalake import DeltaTable
from kafkatools import read_topic

from fanout.contract.batch import txn_app_id
from tests.chaos.checker import check_postgres
from tests.chaos.services import embedded_services
from tests.integration.streams import committed_marks, delta_rows, id_counts, write_input

if TYPE_CHECKING:
    from tests.in_process_cli import Ran

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pipeline.toml"
FILES, ROWS = 6, 30
SINKS = ("bronze", "paid", "latest", "orders_pg", "order_events")


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """An embedded PostgreSQL server and Kafka-protocol broker, as the example's env."""
    with embedded_services(tmp_path_factory.mktemp("services")) as (pg_url, bootstrap):
        yield {"FANOUT_PG_URL": pg_url, "FANOUT_KAFKA_BOOTSTRAP": bootstrap}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(data: Path, port: int, log: Path, services: dict[str, str]) -> subprocess.Popen[bytes]:
    env = {**os.environ, **services, "FANOUT_DATA": str(data), "FANOUT_METRICS_PORT": str(port)}
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "fanout.app.cli", "run", str(EXAMPLE)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _marks(data: Path) -> Counter[tuple[str, int]]:
    """The ledger's committed marks so far (none before its first commit)."""
    ledger = data / "_fanout" / "ledger"
    if not (ledger / "_delta_log").exists():
        return Counter()
    return committed_marks(ledger, "orders")


def _poll(
    proc: subprocess.Popen[bytes], log: Path, what: str, ready: Callable[[], int | None]
) -> int:
    """Call ``ready`` every 0.5 s, for up to 180 s while the run is alive, until it returns
    a number (returned)."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        found = ready()
        if found is not None:
            return found
        time.sleep(0.5)
    raise AssertionError(f"{what} in time:\n{log.read_text()[-3000:]}")


def _wait_for_marks(data: Path, enough: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    def ready() -> int | None:
        bronze = sum(1 for sink, _ in _marks(data) if sink == "bronze")
        return bronze if bronze >= enough else None

    _poll(proc, log, f"fewer than {enough} batches committed", ready)


def _wait_for_every_row(data: Path, ids: set[int], proc: subprocess.Popen[bytes], log: Path) -> int:
    """Wait until bronze holds every id and every sink has marked the batch that wrote
    bronze's last rows; the number of batches. Not a count of files: a restart after
    Spark's file source logged its next file, but before the batch's offsets, may join two
    files in one batch."""

    def ready() -> int | None:
        # bronze's rows and the batch that last wrote them, from one snapshot, read before
        # the marks (a mark follows the write it marks)
        if not (data / "bronze" / "_delta_log").exists():
            return None
        bronze = DeltaTable(str(data / "bronze"))
        last = bronze.transaction_version(txn_app_id("orders", "bronze"))
        rows = set(bronze.to_pyarrow_table(columns=["order_id"]).column(0).to_pylist())
        if last is None or rows != ids:
            return None
        marks = _marks(data)
        return last + 1 if all((sink, last) in marks for sink in SINKS) else None

    return _poll(proc, log, "not every row written", ready)


def _terminate(proc: subprocess.Popen[bytes], log: Path) -> str:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    return log.read_text()


def _metric(text: str, name: str, sink: str) -> float:
    match = re.search(rf'^{name}{{pipeline="orders",sink="{sink}"}} (\S+)$', text, re.M)
    assert match, f"{name} for {sink} not in metrics"
    return float(match.group(1))


def _scraped_until(port: int, expected: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """Each sink's rows written and last committed batch from the metrics endpoint, scraped
    until they are ``expected`` or for 10 s (the last batch's observers run after its
    marks); the last scrape's."""
    deadline = time.monotonic() + 10
    while True:
        url = f"http://127.0.0.1:{port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        got = {
            sink: (
                _metric(text, "fanout_rows_written_total", sink),
                _metric(text, "fanout_last_committed_batch", sink),
            )
            for sink in SINKS
        }
        if got == expected or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def test_run_sigterm_restart_exactly_once_and_metrics(
    tmp_path: Path, services: dict[str, str]
) -> None:
    rows = write_input(tmp_path / "input", FILES, ROWS)
    port = _free_port()

    first = _start(tmp_path, port, tmp_path / "run1.log", services)
    _wait_for_marks(tmp_path, 2, first, tmp_path / "run1.log")
    out = _terminate(first, tmp_path / "run1.log")
    clean = r"SIGTERM: (stopped between batches|stopped before batch \d+ began|batch \d+ finished)"
    assert re.search(clean, out), [line for line in out.splitlines() if "SIGTERM" in line]
    stopped_at = len(
        {b for s, b in committed_marks(tmp_path / "_fanout" / "ledger", "orders") if s == "bronze"}
    )
    assert stopped_at < FILES, "the first run was meant to stop mid-stream"

    restarted_at = datetime.now(UTC)
    second = _start(tmp_path, port, tmp_path / "run2.log", services)
    batches = _wait_for_every_row(
        tmp_path, {r["order_id"] for r in rows}, second, tmp_path / "run2.log"
    )
    assert stopped_at < batches <= FILES
    ledger = delta_rows(tmp_path / "_fanout" / "ledger")
    expected = {}
    for sink in SINKS:
        marks = [
            r
            for r in ledger
            if r["sink"] == sink and r["status"] == "committed" and r["finished_at"] >= restarted_at
        ]
        expected[sink] = (float(sum(r["rows"] for r in marks)), float(batches - 1))
    assert _scraped_until(port, expected) == expected  # once the last batch's observers ran
    _terminate(second, tmp_path / "run2.log")

    assert committed_marks(tmp_path / "_fanout" / "ledger", "orders") == {
        (s, b): 1 for s in SINKS for b in range(batches)
    }
    counts = id_counts(delta_rows(tmp_path / "bronze"))
    assert set(counts) == {r["order_id"] for r in rows} and set(counts.values()) == {1}
    paid: list[dict[str, Any]] = sorted(delta_rows(tmp_path / "paid"), key=lambda r: r["order_id"])
    assert paid == [
        {"order_id": r["order_id"], "cents": int(r["amount"] * 100)}
        for r in rows
        if r["status"] == "paid"
    ]
    latest = delta_rows(tmp_path / "latest")
    winners = {r["customer"]: r["order_id"] for r in rows}
    assert sorted((r["customer"], r["order_id"]) for r in latest) == sorted(winners.items())
    by_id = {r["order_id"]: r for r in rows}
    pg = check_postgres(services["FANOUT_PG_URL"], "orders", by_id)
    assert pg.exact, pg
    events = read_topic(services["FANOUT_KAFKA_BOOTSTRAP"], "order-events", len(rows))
    values = sorted((json.loads(e["value"]) for e in events), key=lambda v: v["order_id"])
    assert values == [{k: r[k] for k in ("order_id", "customer", "status")} for r in rows]


def test_validate_opens_every_sink_without_starting(
    fanout_cli: Callable[..., Ran], tmp_path: Path, monkeypatch: Any, services: dict[str, str]
) -> None:
    monkeypatch.setenv("FANOUT_DATA", str(tmp_path))
    for name, value in services.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "input").mkdir()
    validated = fanout_cli("validate", EXAMPLE)
    assert validated.returncode == 0
    out = validated.stdout
    assert "pipeline 'orders' is valid" in out
    assert "sink paid: DeltaSink, transactional route: where=\"status = 'paid'\"" in out
    assert not (tmp_path / "_checkpoints").exists()  # the stream never started
    assert [p.name for p in tmp_path.iterdir()] == ["input"]  # no ledger, no table: read only

    broken = tmp_path / "broken.toml"
    broken.write_text(
        EXAMPLE.read_text().replace('name = "latest"', 'name = "latest"\nengine = "spark"')
    )
    refused = fanout_cli("validate", broken)
    assert refused.returncode == 2
    err = refused.stderr
    assert "configuration error: 1 of " in err
    assert "sink latest: opens its target: Delta sink 'latest'" in err
    assert "io.delta.tables.DeltaTable" in err


PROGRESS_PIPELINE = """
[pipeline]
name = "progress"
ledger = "{root}/ledger"
checkpoint = "{root}/checkpoint"
trigger = {{ available_now = true }}

[spark]
master = "local[2]"
[spark.conf]
"spark.sql.shuffle.partitions" = "2"

[source]
format = "json"
path = "{root}/input"
schema = "order_id LONG, customer STRING, amount DOUBLE, status STRING"
[source.options]
maxFilesPerTrigger = 1

[[sinks]]
type = "delta"
name = "bronze"
path = "{root}/bronze"

[[sinks]]
type = "delta"
name = "paid"
path = "{root}/paid"
where = "status = 'paid'"
"""


def test_run_prints_one_line_per_batch_and_a_summary(
    fanout_cli: Callable[..., Ran], tmp_path: Path
) -> None:
    """``fanout run`` in the test's process and session (what it prints is the command's;
    the process's own exit is proven by the SIGTERM test above)."""
    rows = write_input(tmp_path / "input", 3, 10)
    paid = [sum(r["status"] == "paid" for r in rows[f * 10 : f * 10 + 10]) for f in range(3)]
    pipeline = tmp_path / "progress.toml"
    pipeline.write_text(PROGRESS_PIPELINE.format(root=tmp_path))
    done = fanout_cli("run", pipeline)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = [  # Spark's own log lines (log4j, to stdout in a process of its own) left out
        line
        for line in re.sub(r"\d+\.\d\ds", "T", done.stdout).splitlines()
        if line.startswith(("pipeline ", "batch ", "  "))
    ]
    assert lines[0].startswith("pipeline 'progress' started (query ")
    for batch in range(3):
        line = lines[1 + batch]
        expected = f"batch {batch}: 10 rows in | bronze 10 rows T, paid {paid[batch]} rows T | lag "
        assert line.startswith(expected) and re.fullmatch(r"\d+\.\ds", line[len(expected) :]), line
    assert lines[4:] == [
        "pipeline 'progress': 3 batches, 30 rows in",
        "  bronze: 30 rows written in T",
        f"  paid: {sum(paid)} rows written in T",
        "pipeline 'progress' finished (last committed batch 2)",
    ]
