"""A batch half written with more ``partitions`` than its replay has is refused, also when
a partition between the new count and the committed ones never wrote anything: only a
partition that had rows commits a marker, so the markers' reader, which looked past the
count "for as long as each group has one", stopped at that gap and missed the committed
partitions behind it. The replay then wrote their rows a second time, and a new epoch's
``holds_batch`` said it could not tell (so a reset wrote them again too)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from fanout_kafka import KafkaSink
from kafkatools import Broker, key_counts, marker, read_topic

from fanout import FanOut, PartlyHeld
from fanout.contract.sink import SinkContext
from fanout.testing import faults
from tests.integration.streams import EPOCH, order, run_stream

DRIVER = Path(__file__).with_name("kafka_driver.py")
WIDE, NARROW = 8, 4
WRITTEN, UNWRITTEN = 5, 6
"""The batch's rows hash into partitions 5 and 6 of 8 (none into 0..4): the driver is
killed once 5 committed, before 6 did."""
MARKERS = "__fanout_markers"


def _ids(spark: Any, partition: int, count: int) -> list[int]:
    """``count`` order ids that the sink's key (``order_id``, a long) hashes into
    ``partition`` of :data:`WIDE` (Spark's hash partitioning: ``pmod(hash(key), n)``)."""
    rows = spark.range(0, 2000).selectExpr("id", f"pmod(hash(id), {WIDE}) AS p").collect()
    return [int(r.id) for r in rows if r.p == partition][:count]


def _restart(spark: Any, kafka: Broker, topic: str, workdir: Path, pipeline: str,
             partitions: int) -> str:  # fmt: skip
    """The killed driver's stream started again in this process with ``partitions``: the
    text of the error it ended with, ``""`` when it ran to the end of its input."""
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic, key="order_id",
                     partitions=partitions)  # fmt: skip
    fan = FanOut(pipeline, str(workdir / "ledger"), [sink])
    try:
        run_stream(spark, workdir / "input", fan, workdir / "checkpoint")
    except Exception as exc:  # Spark wraps the foreachBatch error
        return f"{type(exc).__name__}: {exc}"
    finally:
        fan.close()
    return ""


def test_a_half_written_batch_replayed_with_fewer_partitions_past_an_empty_one_is_refused(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    """Batch 0 (the epoch's first: no partition has a marker yet) written with 8 partitions,
    the driver SIGKILLed after partition 5 committed; the restart with 4 is refused before
    anything is written (its partition 4 never had a marker, and 5 holds the batch), and
    ``holds_batch`` with 4 says part of the batch is held. With 8 again, the batch
    completes: each row once."""
    written, unwritten = _ids(spark, WRITTEN, 5), _ids(spark, UNWRITTEN, 5)
    rows = [order(i) for i in written + unwritten]
    (tmp_path / "input").mkdir()
    path = tmp_path / "input" / "orders-0000.json"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    os.utime(path, (EPOCH, EPOCH))
    pipeline = f"fewer{uuid.uuid4().hex[:6]}"

    cmd = [sys.executable, str(DRIVER), str(tmp_path), kafka.bootstrap, topic, pipeline,
           "--partitions", str(WIDE), "--kill", f"0:{WRITTEN}"]  # fmt: skip
    killed = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert killed.returncode in (faults.KILL_EXIT_CODE, -9), killed.stderr[-3000:]
    assert f"KILL driver after batch 0 partition {WRITTEN}" in killed.stderr
    markers = [marker(kafka.bootstrap, pipeline, "events", p, MARKERS) for p in range(WIDE)]
    assert markers == [-1001] * WRITTEN + [1] + [-1001] * (WIDE - WRITTEN - 1), markers
    held = key_counts(read_topic(kafka.bootstrap, topic, len(written)))
    assert held == {str(i): 1 for i in written}

    narrow = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic, key="order_id",
                       partitions=NARROW)  # fmt: skip
    narrow.open(SinkContext(pipeline))
    try:
        answer = narrow.holds_batch(pipeline, 0, 0)
    finally:
        narrow.close()
    assert answer == PartlyHeld(1, WIDE), answer

    refused = _restart(spark, kafka, topic, tmp_path, pipeline, NARROW)
    after = key_counts(read_topic(kafka.bootstrap, topic, len(written)))
    assert after == held, f"the restart with {NARROW} partitions wrote: {dict(after)}"
    assert "PartitioningError" in refused, refused[-3000:]
    assert "sink 'events', batch 0" in refused, refused[-3000:]
    assert f"partitions {WIDE}" in refused and f"now {NARROW}" in refused, refused[-3000:]

    assert _restart(spark, kafka, topic, tmp_path, pipeline, WIDE) == ""
    done = key_counts(read_topic(kafka.bootstrap, topic, len(rows)))
    assert done == {str(i): 1 for i in written + unwritten}
