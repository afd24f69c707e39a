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


def test_a_driver_committing_its_span_again_keeps_a_larger_one_recorded_meanwhile(
    kafka: Broker, topic: str, monkeypatch: Any
) -> None:
    """Two drivers of one pipeline at once (a zombie beside its successor): the one with 4
    partitions records its span, the one with 8 records 8 (and may then be killed half way
    through a batch); the first one's hourly commit must not record 4 again, or a replay
    with 4 partitions stops reading at a partition that never had rows and writes the
    committed ones behind it again (the test above)."""
    from fanout_kafka.driver_admins import admin_config
    from fanout_kafka.markers import span_group
    from fanout_kafka.membership import read_offsets

    from fanout.contract.batch import Batch, BatchInfo, txn_app_id

    pipeline = f"span{uuid.uuid4().hex[:6]}"
    batch = Batch(None, BatchInfo(pipeline, 0), "events", txn_app_id(pipeline, "events"))

    def opened(partitions: int) -> KafkaSink:
        sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic,
                         key="order_id", partitions=partitions)  # fmt: skip
        sink.open(SinkContext(pipeline))
        return sink

    narrow, wide = opened(NARROW), opened(WIDE)
    try:
        settings = narrow.settings(batch)
        assert narrow._partition_span(settings, NARROW, 0) == NARROW
        assert wide._partition_span(wide.settings(batch), WIDE, 0) == WIDE
        monkeypatch.setattr(KafkaSink, "topic_id_refresh_s", 0.0)  # an hour later
        assert narrow._partition_span(settings, NARROW, 1) == WIDE
    finally:
        narrow.close()
        wide.close()
    group = span_group(settings.scope, "events")
    config = admin_config({}, kafka.bootstrap)
    assert read_offsets(config, settings.marker_topic, [group], 10.0) == [WIDE]
