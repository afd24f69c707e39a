"""A real driver killed (SIGKILL to its process group, Python and JVM) after the Delta
append sink wrote batch 1 and before its ledger mark, restarted on the same checkpoint
once the table's app transactions expired (``delta.setTransactionRetentionDuration`` of 2
seconds): Spark replays batch 1 with its original planning time, the sink cannot tell
whether its table holds it, and the batch is refused naming the sink instead of being
appended a second time (fanout.steps.replay). Its clean-stop twin, idle past the same
expiry, writes its new batch on. The restart runs in the test's process (a driver
subprocess starts Spark, ~10 s); the killed driver shares nothing with it but its files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import replay_driver
from deltacheck import ids

from fanout.ledger.delta import DeltaLedger
from fanout.ledger.gaps import skip_batches
from tests.cli_process import driver_process

pytestmark = pytest.mark.integration

DRIVER = Path(__file__).with_name("replay_driver.py")
EPOCH = 1_700_000_000


def _input(work: Path, files: range) -> None:
    """Input file n (batch n) holds ids ``10 n`` .. ``10 n + 2``, each file a second apart."""
    directory = work / "input"
    directory.mkdir(parents=True, exist_ok=True)
    for n in files:
        path = directory / f"in-{n}.json"
        path.write_text("".join(json.dumps({"id": 10 * n + i}) + "\n" for i in range(3)))
        os.utime(path, (EPOCH + n, EPOCH + n))


def _driver(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The driver in a process group of its own (:func:`driver_process`)."""
    return driver_process(str(DRIVER), str(work), *args)


def _listed(work: Path, log: str) -> list[str]:
    return sorted(p.name for p in (work / "checkpoint" / log).iterdir() if p.name.isdigit())


def test_a_replay_after_the_sinks_transactions_expired_is_refused_not_written_twice(
    spark: object, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    _input(work, range(2))
    killed = _driver(work, "--kill-after-write", "1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert "KILL after silver wrote batch 1" in killed.stderr
    assert ids(work / "silver") == [0, 1, 2, 10, 11, 12]
    assert (_listed(work, "offsets"), _listed(work, "commits")) == (["0", "1"], ["0"])
    time.sleep(3)  # the table forgets the app transactions 2 s after their commit

    error = replay_driver.run(spark, work)  # the restart: Spark replays batch 1

    assert "SinkRecordsGoneError: sink 'silver', batch 1: pipeline 'replaycrash', sink " in error
    assert "batch 1 of epoch 0 is a replay (planned at " in error
    assert "before this FanOut was built" in error
    assert "expired it after the epoch's last batch) while the table holds data files" in error
    assert "`fanout ledger skip --ledger " in error and "--through 1 --epoch 0`" in error
    assert ids(work / "silver") == [0, 1, 2, 10, 11, 12]  # batch 1 once, as before
    assert _listed(work, "commits") == ["0"]

    # the way on when the table holds the batch: record it as done for the sink
    ledger = DeltaLedger(str(work / "ledger"))
    ledger.open()
    skip_batches(ledger, replay_driver.PIPELINE, "silver", 1, 0)
    _input(work, range(2, 3))
    assert replay_driver.run(spark, work) == ""
    assert ids(work / "silver") == [0, 1, 2, 10, 11, 12, 20, 21, 22]


def test_an_idle_restart_after_the_transactions_expired_writes_its_new_batch(
    spark: object, tmp_path: Path
) -> None:
    """The clean-stop twin: the query ended with every batch committed (available now),
    stays idle past the expiry, and restarts with a new file: batch 2 is planned by the new
    run, no replay, and is written (before the check it passed too: no false refusal)."""
    work = tmp_path / "work"
    _input(work, range(2))
    done = _driver(work)
    assert done.returncode == 0, done.stderr[-3000:]
    assert ids(work / "silver") == [0, 1, 2, 10, 11, 12]
    assert (_listed(work, "offsets"), _listed(work, "commits")) == (["0", "1"], ["0", "1"])
    time.sleep(3)

    _input(work, range(2, 3))
    assert replay_driver.run(spark, work) == ""
    assert ids(work / "silver") == [0, 1, 2, 10, 11, 12, 20, 21, 22]
    assert _listed(work, "commits") == ["0", "1", "2"]
