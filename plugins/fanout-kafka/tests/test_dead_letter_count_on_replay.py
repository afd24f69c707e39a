"""A replay's ledger row counts the dead letters its batch has, however the replay's own
checks would judge the records now. The driver, killed right after the partition
committed (a record over ``max_record_bytes`` set aside, its letter in the dead-letter
topic) and before its ledger mark, restarts with ``max_record_bytes`` raised (the topic's
limit raised meanwhile): the replay's size check lets the record through, the partition
is skipped, and the committed mark said ``dead_lettered`` 0 and counted the letter's row
in ``rows``, for a batch whose letter sits in the dead-letter topic."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from fanout_kafka import KafkaSink
from kafka_log import committed_records, committed_values
from kafkatools import Broker, create_topic

from fanout import FanOut
from fanout.routes.route import Route
from fanout.sink_spec import SinkSpec
from fanout.testing import faults
from tests.integration.streams import delta_rows, run_stream, write_input

DRIVER = Path(__file__).with_name("kafka_driver.py")
ROWS = 5
BIG = ["order_id", "IF(order_id = 1, repeat('x', 2000), status) AS status"]
"""The route: order 1's status is 2000 bytes, over a ``max_record_bytes`` of 1000."""


def test_a_replay_skipping_a_partition_counts_the_letter_its_commit_set_aside(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    rows = write_input(tmp_path / "input", 1, ROWS)
    pipeline = f"dlc{uuid.uuid4().hex[:6]}"
    dlq = f"{topic}-dlq"
    create_topic(kafka.bootstrap, dlq, 1)
    killed = subprocess.run(
        [sys.executable, str(DRIVER), str(tmp_path), kafka.bootstrap, topic, pipeline,
         "--partitions", "1", "--dead-letter", f"kafka:{dlq}", "--select", *BIG,
         "--max-record-bytes", "1000", "--kill", "0:0"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert killed.returncode in (faults.KILL_EXIT_CODE, -9), killed.stderr[-3000:]
    assert "KILL driver after batch 0 partition 0" in killed.stderr
    assert len(committed_records(kafka.bootstrap, dlq, 1)) == 1  # the letter, committed
    assert not _marks(tmp_path, pipeline)  # killed before its ledger mark

    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic, key="order_id",
                     partitions=1, dead_letter=f"kafka:{dlq}",
                     max_record_bytes=100_000)  # fmt: skip
    fan = FanOut(pipeline, str(tmp_path / "ledger"), [SinkSpec(sink, Route(select=tuple(BIG)))])
    try:
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")
    finally:
        fan.close()
    assert _marks(tmp_path, pipeline) == [(0, ROWS - 1, 1)]
    assert len(committed_values(kafka.bootstrap, topic)) == ROWS - 1  # written once
    assert len(committed_records(kafka.bootstrap, dlq, 1)) == 1
    assert {r["order_id"] for r in rows} == set(range(ROWS))


def _marks(workdir: Path, pipeline: str) -> list[tuple[int, int, int]]:
    """(batch, rows, dead_lettered) of each committed ledger row of sink ``events``."""
    ledger = workdir / "ledger"
    if not ledger.exists():
        return []
    return sorted(
        (r["batch_id"], r["rows"], r["dead_lettered"])
        for r in delta_rows(ledger)
        if r["pipeline"] == pipeline and r["sink"] == "events" and r["status"] == "committed"
    )
