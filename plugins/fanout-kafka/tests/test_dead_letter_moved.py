"""A Kafka sink's parked dead letters, its ``dead_letter`` moved between a kill and the
replay (docs/architecture.md §7, "A ``dead_letter`` moved").

The driver (``kafka_driver.py``, a subprocess, one core: partitions one after the other)
is killed by its executor right after partition 1 of batch 1 committed: partition 0's
transaction committed, naming its bad records (over ``max_record_bytes``) in its journal,
and its task parked them in Delta table ``letters_a``; partition 1 committed and parked
nothing yet; the ledger mark was not written. The restart names ``letters_b``.

Each partition's commit records a digest of its dead-letter target, and the replay,
finding partitions committed under another, was refused (``KafkaMarkerError``: set
``dead_letter`` back), since it parks a committed partition's letters again from its
journal, into the target it has: partition 0's would be kept twice. Now the restart asks
``letters_a`` (recorded in the ledger as the sink's target until batch 1) what it holds of
the batch, accepts the partitions committed under it, and parks only what it lacks:
partition 1's letters go to ``letters_b``, partition 0's stay where they are, once.

A real broker, real Delta tables, the driver a subprocess killed by its executor."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections import Counter
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
from tests.integration.streams import committed_marks, run_stream, write_input

DRIVER = Path(__file__).with_name("kafka_driver.py")
FILES, ROWS, PARTITIONS = 3, 12, 2
KILL_BATCH = 1
BIG = ["order_id", "IF(order_id % 3 = 1, repeat('x', 2000), status) AS status"]
"""The route: every third order's status is 2000 bytes, over a ``max_record_bytes`` of
1000: a bad record, parked as a dead letter."""


def _letters(path: Path) -> Counter[tuple[int, int]]:
    """(batch, order id) of each letter in the Delta table at ``path`` (a Kafka letter
    keeps the record it could not send: its value, the row's JSON)."""
    if not (path / "_delta_log").exists():
        return Counter()
    return Counter(
        (r["batch_id"], json.loads(json.loads(r["details"])["value"])["order_id"])
        for r in read_delta(str(path)).to_pylist()
    )


def test_a_replay_under_a_moved_target_parks_no_letter_the_first_target_holds(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    rows = write_input(tmp_path / "input", FILES, ROWS)
    pipeline = f"moved{uuid.uuid4().hex[:6]}"
    a, b = tmp_path / "letters_a", tmp_path / "letters_b"
    killed = subprocess.run(
        [sys.executable, str(DRIVER), str(tmp_path), kafka.bootstrap, topic, pipeline,
         "--partitions", str(PARTITIONS), "--dead-letter", str(a), "--select", *BIG,
         "--max-record-bytes", "1000", "--kill", f"{KILL_BATCH}:1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert killed.returncode in (faults.KILL_EXIT_CODE, -9), killed.stderr[-3000:]
    assert f"KILL driver after batch {KILL_BATCH} partition 1" in killed.stderr
    assert ("events", KILL_BATCH) not in committed_marks(tmp_path / "ledger", pipeline)
    bad = {k: {r["order_id"] for r in rows[k * ROWS : (k + 1) * ROWS] if r["order_id"] % 3 == 1}
           for k in range(FILES)}  # fmt: skip
    first = _letters(a)
    parked = {i for k, i in first if k == KILL_BATCH}  # partition 0's, not partition 1's
    assert parked and parked < bad[KILL_BATCH]
    assert first == Counter({(k, i): 1 for k in range(KILL_BATCH) for i in bad[k]}) + Counter(
        {(KILL_BATCH, i): 1 for i in parked}
    )

    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic, key="order_id",
                     partitions=PARTITIONS, dead_letter=str(b), max_record_bytes=1000)  # fmt: skip
    fan = FanOut(pipeline, str(tmp_path / "ledger"), [SinkSpec(sink, Route(select=tuple(BIG)))])
    try:
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")
    finally:
        fan.close()

    assert _letters(a) == first
    assert _letters(b) == Counter({(KILL_BATCH, i): 1 for i in bad[KILL_BATCH] - parked}) + (
        Counter({(FILES - 1, i): 1 for i in bad[FILES - 1]})
    )
    written = Counter(json.loads(v)["order_id"] for v in committed_values(kafka.bootstrap, topic))
    assert written == Counter({r["order_id"]: 1 for r in rows if r["order_id"] % 3 != 1})
    assert committed_marks(tmp_path / "ledger", pipeline) == {
        ("events", k): 1 for k in range(FILES)
    }
