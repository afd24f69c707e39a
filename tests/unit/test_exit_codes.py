"""Every fanout process exits with its real code, every time.

A process that read a Delta table through a pyarrow dataset over delta-rs' Python
filesystem used to abort at interpreter exit (exit 134, "terminate called without an
active exception") in about 2 of 3 runs: an Arrow I/O thread dropped the last reference to
a Python-owned read buffer while the interpreter was finalizing. One run proves nothing,
so each command runs 8 times, in fresh processes, on a tiny ledger; no Spark starts. At 2
aborts in 3 runs, 8 clean runs of one command happen by chance once in 6,500 (20 runs
took ~3.5 minutes of CI across the five commands).
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry, now_utc

RUNS = 8

USER_SCRIPT = """
import sys
from fanout.ledger.delta import DeltaLedger
from fanout.delta_tables.io import read_delta

ledger = DeltaLedger(sys.argv[1])
print(len(ledger.committed_entries("orders")), len(ledger.read()))
print(len(read_delta(sys.argv[1])))
"""


@pytest.fixture(scope="module")
def ledger_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("exit") / "ledger")
    ledger = DeltaLedger(path)
    ledger.open()
    for batch in range(2):
        ledger.mark_committed(
            LedgerEntry(
                "orders",
                "bronze",
                batch,
                "committed",
                query_id="q1",
                rows=3,
                finished_at=now_utc(),
                source_offsets='[{"orders": {"0": 7}}]',
            )
        )
    return path


def _exit_codes(argv: list[str]) -> list[tuple[int, str]]:
    """Run ``argv`` RUNS times (two at a time: the machine has two cores)."""

    def once(_: int) -> tuple[int, str]:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        return done.returncode, done.stderr[-300:]

    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(once, range(RUNS)))


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["status", "--json"],
        ["recover", "--pipeline", "orders"],
        ["ledger", "maintain", "--no-vacuum"],
    ],
    ids=lambda c: " ".join(c),
)
def test_cli_commands_that_read_delta_exit_0_every_time(
    ledger_path: str, command: list[str]
) -> None:
    argv = [sys.executable, "-m", "fanout.app.cli", *command, "--ledger", ledger_path]
    results = _exit_codes(argv)
    failed = [(code, err) for code, err in results if code != 0]
    assert not failed, f"{len(failed)} of {RUNS} runs of `fanout {' '.join(command)}`: {failed[:2]}"


def test_a_users_script_reading_the_ledger_exits_0_every_time(
    ledger_path: str, tmp_path: Path
) -> None:
    script = tmp_path / "driver.py"
    script.write_text(USER_SCRIPT)
    results = _exit_codes([sys.executable, str(script), ledger_path])
    failed = [(code, err) for code, err in results if code != 0]
    assert not failed, f"{len(failed)} of {RUNS} runs of a script reading the ledger: {failed[:2]}"
