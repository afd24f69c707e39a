"""``fanout demo`` as a user runs it: a subprocess, its printed proof, its exit code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def test_demo_proves_no_loss_and_no_duplicate(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fanout.app.cli",
            "demo",
            "--workdir",
            str(tmp_path / "demo"),
            "--rows",
            "40",
            "--batches",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    out = done.stdout
    assert "latest: FAILED (sink 'latest', batch 3: simulated outage" in out
    planned = out.split("run 1: the query stopped, as planned:\n", 1)[1].splitlines()
    assert planned[0] == (
        "pipeline 'demo', batch 3: 1 sink(s) failed (latest); bronze, events, pg committed the "
        "batch and will be skipped when the query restarts and Spark replays it:"
    )
    assert planned[1].startswith("  - latest: ") and "simulated outage" in planned[1]
    assert "reading every sink back with its own client" in out
    assert "(the demo's tables, ledger and checkpoint are in " in out
    rows = {
        m.group(1): m.group(0).split()
        for m in re.finditer(
            r"^(bronze|latest|pg|events)\s+(append|merge|upsert|kafka)\s.*$", out, re.M
        )
    }
    assert rows == {
        "bronze": ["bronze", "append", "200", "200", "0", "0", "0"],
        "latest": ["latest", "merge", "40", "40", "0", "0", "0"],
        "pg": ["pg", "upsert", "200", "200", "0", "0", "0"],
        "events": ["events", "kafka", "200", "200", "0", "0", "0"],
    }
    assert "batch 3: writing latest (skipping bronze, pg, events: already committed)" in out
    assert "OK: no row lost, none duplicated, in any sink." in out
    # everything the demo left is its own, so a second demo may clear it (and only it)
    from fanout.app.demo.workdir import DEMO_ENTRIES

    assert {p.name for p in (tmp_path / "demo").iterdir()} <= DEMO_ENTRIES


def test_demo_with_an_unreachable_postgres_fails_before_any_run(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fanout.app.cli", "demo", "--workdir", str(tmp_path / "demo"),
         "--rows", "10", "--postgres-url", "postgresql://nobody:secret@127.0.0.1:1/none"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "fanout: sink unreachable: sink 'pg'" in done.stderr  # not a configuration error
    assert "sink 'pg'" in done.stderr and "secret" not in done.stderr + done.stdout
    assert "as planned" not in done.stdout and "run 2" not in done.stdout
