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
            "fanout.cli",
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
    from fanout.demo_workdir import DEMO_ENTRIES

    assert {p.name for p in (tmp_path / "demo").iterdir()} <= DEMO_ENTRIES
