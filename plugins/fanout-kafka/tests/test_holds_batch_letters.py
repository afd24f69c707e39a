"""A batch whose partition committed while its Delta dead letters were not parked yet is
held only in part: ``fanout recover`` records no lost mark for it, and the old
checkpoint's replay parks them.

The driver (``kafka_driver.py``, one partition, a Delta dead-letter table) is killed right
after the partition's Kafka transaction committed, a record over ``max_record_bytes`` set
aside and named in its journal, before the task parked its letter. ``holds_batch`` said
``True``, "all of it": ``fanout recover --config`` recorded the sink's lost mark, and the
restart of the same checkpoint skipped the sink for the batch, so the letter never reached
the table: the row was in neither the topic nor the dead letters.

A real broker, a real Delta table, the driver a subprocess killed by its executor."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from fanout_kafka import KafkaSink
from kafka_log import committed_values
from kafkatools import Broker

from fanout import FanOut
from fanout.delta_tables.io import read_delta
from fanout.routes.route import Route
from fanout.sink_spec import SinkSpec
from fanout.testing import faults
from tests.in_process_cli import Cli
from tests.integration.streams import committed_marks, run_stream, write_input

DRIVER = Path(__file__).with_name("kafka_driver.py")
ROWS = 5
BIG = ["order_id", "IF(order_id = 1, repeat('x', 2000), status) AS status"]
"""The route: order 1's status is 2000 bytes, over a ``max_record_bytes`` of 1000."""


def _config(workdir: Path, pipeline: str, bootstrap: str, topic: str, dead: Path) -> str:
    file = workdir / "pipeline.toml"
    select = ", ".join(f'"{e}"' for e in BIG)
    file.write_text(
        f'[pipeline]\nname = "{pipeline}"\nledger = "{workdir / "ledger"}"\n'
        f'checkpoint = "{workdir / "checkpoint"}"\n[source]\nformat = "rate"\n'
        f'[[sinks]]\ntype = "kafka"\nname = "events"\nbootstrap_servers = "{bootstrap}"\n'
        f'topic = "{topic}"\nkey = "order_id"\npartitions = 1\nmax_record_bytes = 1000\n'
        f'dead_letter = "{dead}"\nselect = [{select}]\n'
    )
    return str(file)


def _letters(path: Path) -> list[str]:
    if not (path / "_delta_log").exists():
        return []
    return sorted(r["column"] or "" for r in read_delta(str(path)).to_pylist())


def test_recover_records_no_lost_mark_while_a_committed_partition_s_letters_wait(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path, fanout_cli: Cli
) -> None:
    rows = write_input(tmp_path / "input", 1, ROWS)
    pipeline = f"hbl{uuid.uuid4().hex[:6]}"
    dead = tmp_path / "dead"
    killed = subprocess.run(
        [sys.executable, str(DRIVER), str(tmp_path), kafka.bootstrap, topic, pipeline,
         "--partitions", "1", "--dead-letter", str(dead), "--select", *BIG,
         "--max-record-bytes", "1000", "--kill", "0:0"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert killed.returncode in (faults.KILL_EXIT_CODE, -9), killed.stderr[-3000:]
    assert "KILL driver after batch 0 partition 0" in killed.stderr
    assert len(committed_values(kafka.bootstrap, topic)) == ROWS - 1  # committed
    assert _letters(dead) == []  # not parked
    assert ("events", 0) not in committed_marks(tmp_path / "ledger", pipeline)

    ran = fanout_cli("recover", "--config", _config(tmp_path, pipeline, kafka.bootstrap, topic,
                                                     dead))  # fmt: skip
    assert ran.returncode == 0, ran
    out = ran.stdout
    assert "events: holds part of batch 0 (1 of 1 partitions committed" in out, out
    assert ("events", 0) not in committed_marks(tmp_path / "ledger", pipeline), out

    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic, key="order_id",
                     partitions=1, dead_letter=str(dead), max_record_bytes=1000)  # fmt: skip
    fan = FanOut(pipeline, str(tmp_path / "ledger"), [SinkSpec(sink, Route(select=tuple(BIG)))])
    try:
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")
    finally:
        fan.close()
    assert len(_letters(dead)) == 1, "order 1 is in neither the topic nor the dead letters"
    assert len(committed_values(kafka.bootstrap, topic)) == ROWS - 1  # written once
    assert {r["order_id"] for r in rows} == set(range(ROWS))
    assert committed_marks(tmp_path / "ledger", pipeline) == {("events", 0): 1}
