"""``fanout run`` on the shipped example: SIGTERM mid-run, restart, exactly once in every
sink (routing included), and the metrics endpoint agreeing with the ledger."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.integration.streams import committed_marks, delta_rows, id_counts, write_input

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pipeline.toml"
FILES, ROWS = 6, 30
SINKS = ("bronze", "paid", "latest")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(data: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "FANOUT_DATA": str(data), "FANOUT_METRICS_PORT": str(port)}
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "fanout.cli", "run", str(EXAMPLE)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _wait_for_marks(data: Path, enough: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        if (data / "_fanout" / "ledger" / "_delta_log").exists():
            marks = committed_marks(data / "_fanout" / "ledger", "orders")
            if sum(1 for sink, _ in marks if sink == "bronze") >= enough:
                return
        time.sleep(0.5)
    raise AssertionError(
        f"fewer than {enough} batches committed in time:\n{log.read_text()[-3000:]}"
    )


def _terminate(proc: subprocess.Popen[bytes], log: Path) -> str:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    return log.read_text()


def _metric(text: str, name: str, sink: str) -> float:
    match = re.search(rf'^{name}{{pipeline="orders",sink="{sink}"}} (\S+)$', text, re.M)
    assert match, f"{name} for {sink} not in metrics"
    return float(match.group(1))


def test_run_sigterm_restart_exactly_once_and_metrics(tmp_path: Path) -> None:
    rows = write_input(tmp_path / "input", FILES, ROWS)
    port = _free_port()

    first = _start(tmp_path, port, tmp_path / "run1.log")
    _wait_for_marks(tmp_path, 2, first, tmp_path / "run1.log")
    out = _terminate(first, tmp_path / "run1.log")
    assert re.search(r"SIGTERM: (stopped between batches|batch \d+ (finished|abandoned))", out)
    stopped_at = len(
        {b for s, b in committed_marks(tmp_path / "_fanout" / "ledger", "orders") if s == "bronze"}
    )
    assert stopped_at < FILES, "the first run was meant to stop mid-stream"

    restarted_at = datetime.now(UTC)
    second = _start(tmp_path, port, tmp_path / "run2.log")
    _wait_for_marks(tmp_path, FILES, second, tmp_path / "run2.log")
    time.sleep(1)  # let the last batch's observers finish
    scraped = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    ledger = delta_rows(tmp_path / "_fanout" / "ledger")
    for sink in SINKS:
        marks = [
            r
            for r in ledger
            if r["sink"] == sink and r["status"] == "committed" and r["finished_at"] >= restarted_at
        ]
        assert _metric(scraped, "fanout_rows_written_total", sink) == sum(r["rows"] for r in marks)
        assert _metric(scraped, "fanout_last_committed_batch", sink) == FILES - 1
    _terminate(second, tmp_path / "run2.log")

    assert committed_marks(tmp_path / "_fanout" / "ledger", "orders") == {
        (s, b): 1 for s in SINKS for b in range(FILES)
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


def test_validate_opens_every_sink_without_starting(
    spark: Any, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    from fanout.cli import main

    monkeypatch.setenv("FANOUT_DATA", str(tmp_path))
    (tmp_path / "input").mkdir()
    assert main(["validate", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "pipeline 'orders' is valid" in out
    assert "sink paid: DeltaSink, transactional route: where=\"status = 'paid'\"" in out
    assert not (tmp_path / "_checkpoints").exists()  # the stream never started

    broken = tmp_path / "broken.toml"
    broken.write_text(
        EXAMPLE.read_text().replace('name = "latest"', 'name = "latest"\nengine = "spark"')
    )
    assert main(["validate", str(broken)]) == 2
    err = capsys.readouterr().err
    assert "configuration error: Delta sink 'latest'" in err and "io.delta.tables.DeltaTable" in err
