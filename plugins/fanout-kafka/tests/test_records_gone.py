"""The Kafka sink's own records (its marker groups on the marker topic) deleted while the
topic still holds the batches: a replay of a batch written and never marked is refused
(fanout.steps.replay) instead of being written a second time, and the refusal's way on
(the batch recorded as done for the sink) writes on. A pipeline's first batch on a topic
created beforehand (no marker yet: ``holds_batch`` cannot tell) is not refused; and
:meth:`KafkaSink.records_gone` says "gone" only where ``holds_batch`` cannot tell, so the
lost-target check and a new epoch's start, which ask it after a ``False``, refuse nothing
more than before."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from kafkatools import Broker, create_topic, key_counts, read_topic

from fanout import BatchInfo, FanOut, SinkRecordsGoneError
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.gaps import skip_batches
from fanout.testing.faults import DieAfterWrite, DieBeforeWrites, DriverKilled

pytestmark = pytest.mark.integration


def _sink(kafka: Broker, topic: str, create: bool = True) -> dict[str, Any]:
    sink = {"type": "kafka", "name": "k", "bootstrap_servers": kafka.bootstrap, "topic": topic,
            "key": "id", "partitions": 2}  # fmt: skip
    return {**sink, "create_topic": {"partitions": 2}} if create else sink


def _write(kafka: Broker, topic: str, pipeline: str, spark: Any, batch_id: int,
           tmp_path: Path, planned: dict[int, int], *plugins: object, create: bool = True,
           **options: Any) -> None:  # fmt: skip
    """Write batch ``batch_id`` (keys ``10 * batch_id`` + 0..2) to ``topic`` through sink
    ``k`` (two partitions), with a FanOut built for it, then close. ``planned`` holds the
    planning time of each batch written before: a batch in it is a replay (Spark keeps its
    first attempt's ``batchTimestampMs``); one not in it is stamped after its FanOut is built,
    as Spark stamps a batch its run plans (fanout.steps.replay), and added."""
    fan = FanOut(pipeline, str(tmp_path / "ledger"), [_sink(kafka, topic, create)],
                 retries=0, plugins=plugins, **options)  # fmt: skip
    # stamped after the FanOut's birth: one taken before reads as a replay whenever a
    # millisecond ticks in between (a CI failure on a slow machine)
    when = planned.setdefault(batch_id, _now())
    info = BatchInfo(pipeline, batch_id, "query-1", [{"src": {"0": batch_id + 1}}],
                     batch_timestamp_ms=when)  # fmt: skip
    try:
        fan.process(spark.createDataFrame([(batch_id * 10 + n,) for n in range(3)], "id BIGINT"),
                    info)  # fmt: skip
    finally:
        fan.close()


def _now() -> int:
    return int(time.time() * 1000)


def _delete_markers(kafka: Broker, pipeline: str) -> None:
    """Delete the sink's marker groups (``fanout_kafka.markers.marker_group``), as an
    operator cleaning "unused" consumer groups does, or the broker's offset retention."""
    groups = [f"fanout/{pipeline}/k/p{p}" for p in range(2)]
    with AdminClient({"bootstrap.servers": kafka.bootstrap}) as admin:
        for future in admin.delete_consumer_groups(groups).values():
            future.result(10)


def test_markers_deleted_after_an_unmarked_batch_refuse_its_replay(
    spark: Any, kafka: Broker, tmp_path: Path
) -> None:
    pipeline, topic = f"gonek{uuid.uuid4().hex[:6]}", f"gone-{uuid.uuid4().hex[:8]}"
    planned: dict[int, int] = {}
    _write(kafka, topic, pipeline, spark, 0, tmp_path, planned)
    with pytest.raises(DriverKilled):
        _write(kafka, topic, pipeline, spark, 1, tmp_path, planned, DieAfterWrite("k", 1))
    written = {"0": 1, "1": 1, "2": 1, "10": 1, "11": 1, "12": 1}
    assert key_counts(read_topic(kafka.bootstrap, topic, 6, timeout=15)) == written
    _delete_markers(kafka, pipeline)

    with pytest.raises(SinkRecordsGoneError) as refused:
        _write(kafka, topic, pipeline, spark, 1, tmp_path, planned)  # the replay
    assert (refused.value.sink, refused.value.batch_id) == ("k", 1)
    text = str(refused.value)
    assert text.startswith(
        f"sink 'k', batch 1: pipeline '{pipeline}', sink 'k': batch 1 of epoch 0 is a replay "
    )
    assert (
        "its own records of the epoch being gone: no partition marker of epoch 0 is left on "
        f"marker topic '__fanout_markers' (groups like 'fanout/{pipeline}/k/p0': deleted, or "
        f"expired offsets.retention.minutes after their last commit) while topic '{topic}' "
        "is there."
    ) in text
    assert f"--pipeline {pipeline} --sink k --through 1 --epoch 0`" in text
    assert key_counts(read_topic(kafka.bootstrap, topic, 6, timeout=15, idle=3.0)) == written

    ledger = DeltaLedger(str(tmp_path / "ledger"))  # the way on: the topic holds batch 1
    ledger.open()
    skip_batches(ledger, pipeline, "k", 1, 0)
    _write(kafka, topic, pipeline, spark, 1, tmp_path, planned)  # the replay skips k
    _write(kafka, topic, pipeline, spark, 2, tmp_path, planned)
    after = {**written, "20": 1, "21": 1, "22": 1}
    assert key_counts(read_topic(kafka.bootstrap, topic, 9, timeout=15, idle=3.0)) == after


def test_a_pipelines_first_batch_replayed_on_a_topic_created_beforehand_is_written(
    spark: Any, kafka: Broker, tmp_path: Path
) -> None:
    """No marker of the pipeline yet and the topic there: ``holds_batch`` cannot tell and
    ``records_gone`` would say gone, but the sink has no mark in the epoch (its records
    never existed): the replay of the first batch is written, once."""
    pipeline, topic = f"firstk{uuid.uuid4().hex[:6]}", f"first-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, 2)
    planned: dict[int, int] = {}
    with pytest.raises(DriverKilled):
        _write(
            kafka, topic, pipeline, spark, 0, tmp_path, planned, DieBeforeWrites(0), create=False
        )

    _write(kafka, topic, pipeline, spark, 0, tmp_path, planned, create=False)  # the replay
    assert key_counts(read_topic(kafka.bootstrap, topic, 3, timeout=15, idle=3.0)) == {
        "0": 1, "1": 1, "2": 1
    }  # fmt: skip


def test_records_gone_only_where_holds_batch_cannot_tell(
    spark: Any, kafka: Broker, tmp_path: Path
) -> None:
    pipeline, topic = f"hookk{uuid.uuid4().hex[:6]}", f"hook-{uuid.uuid4().hex[:8]}"
    _write(kafka, topic, pipeline, spark, 0, tmp_path, {})
    fan = FanOut(pipeline, str(tmp_path / "ledger"), [_sink(kafka, topic)], retries=0)
    sink = fan.sinks["k"]
    try:
        assert sink.holds_batch(pipeline, 0, 1) is False and sink.holds_batch(pipeline, 0, 0)
        assert sink.records_gone(pipeline, 0, 0) is None  # its markers are there
        _delete_markers(kafka, pipeline)
        assert sink.holds_batch(pipeline, 0, 0) is None
        assert sink.records_gone(pipeline, 0, 0) is not None
        with AdminClient({"bootstrap.servers": kafka.bootstrap}) as admin:
            admin.delete_topics([topic])[topic].result(10)
        time.sleep(1)
        assert sink.holds_batch(pipeline, 0, 0) is False  # a lost target, as before
        assert sink.records_gone(pipeline, 0, 0) is None
    finally:
        fan.close()
