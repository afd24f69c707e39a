"""The driver is SIGKILLed after some partitions of a batch committed; the restart on the
same checkpoint writes only the other partitions: exactly once overall."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from kafkatools import Broker, key_counts, marker, read_topic

from fanout.testing.faults import KILL_EXIT_CODE
from tests.integration.streams import committed_marks, write_input

DRIVER = Path(__file__).with_name("kafka_driver.py")
FILES, ROWS, PARTITIONS = 3, 40, 4
KILL_BATCH, KILL_PARTITION = 1, 1


def _drive(workdir: Path, kafka: Broker, topic: str, pipeline: str, kill: str | None = None
           ) -> subprocess.CompletedProcess[str]:  # fmt: skip
    cmd = [sys.executable, str(DRIVER), str(workdir), kafka.bootstrap, topic, pipeline]
    return subprocess.run(cmd + (["--kill", kill] if kill else []), capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def _results(out: str) -> dict[int, dict[str, Any]]:
    lines = [json.loads(x[len("RESULT ") :]) for x in out.splitlines() if x.startswith("RESULT ")]
    return {r["batch"]: r for r in lines}


def test_kill_between_partitions_then_restart_is_exactly_once(
    kafka: Broker, topic: str, tmp_path: Path
) -> None:
    rows = write_input(tmp_path / "input", FILES, ROWS)
    pipeline = f"kill{uuid.uuid4().hex[:6]}"
    killed = _drive(tmp_path, kafka, topic, pipeline, kill=f"{KILL_BATCH}:{KILL_PARTITION}")
    assert killed.returncode in (KILL_EXIT_CODE, -9), killed.stderr[-3000:]
    assert f"KILL driver after batch {KILL_BATCH} partition {KILL_PARTITION}" in killed.stderr

    # The window really happened: partitions 0..k hold batch 2, the rest and the ledger don't.
    markers = [marker(kafka.bootstrap, pipeline, "events", p, "__fanout_markers")
               for p in range(PARTITIONS)]  # fmt: skip
    assert markers[: KILL_PARTITION + 1] == [KILL_BATCH + 1] * (KILL_PARTITION + 1), markers
    assert all(m <= KILL_BATCH for m in markers[KILL_PARTITION + 1 :]), markers
    assert ("events", KILL_BATCH) not in committed_marks(tmp_path / "ledger", pipeline)
    assert sorted(_results(killed.stdout)) == list(range(KILL_BATCH))

    restarted = _drive(tmp_path, kafka, topic, pipeline)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    replay = _results(restarted.stdout)
    assert sorted(replay) == list(range(KILL_BATCH, FILES))
    assert replay[KILL_BATCH]["skipped_partitions"] == list(range(KILL_PARTITION + 1))
    assert all(p > KILL_PARTITION for p in replay[KILL_BATCH]["committed_partitions"])

    records = read_topic(kafka.bootstrap, topic, FILES * ROWS)
    assert key_counts(records) == {str(r["order_id"]): 1 for r in rows}
    assert committed_marks(tmp_path / "ledger", pipeline) == {
        ("events", b): 1 for b in range(FILES)
    }
