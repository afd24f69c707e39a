"""Marker groups belong to one pipeline and sink (issue 13, hole 4).

fanout 0.1 named them ``fanout.<pipeline>.<sink>.p<n>``: pipeline ``orders.eu`` with sink
``kafka`` and pipeline ``orders`` with sink ``eu.kafka`` shared every group, and the
pipeline behind read the other's higher marker and skipped its partitions silently.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from fanout_kafka import KafkaSink
from fanout_kafka.errors import KafkaMarkerError
from kafkatools import Broker, create_topic, key_counts, read_topic

from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.sink import SinkContext

ROWS, PARTITIONS = 12, 3


def write(spark: Any, sink: KafkaSink, pipeline: str, batch_id: int) -> dict[str, Any]:
    rows = [(batch_id * 100 + i, f"c{i}") for i in range(ROWS)]
    df = spark.createDataFrame(rows, "order_id BIGINT, customer STRING")
    info = BatchInfo(pipeline, batch_id, "q")
    result = sink.write(Batch(df, info, sink.name, txn_app_id(pipeline, sink.name)))
    return dict(result.details)


def kafka_sink(
    kafka: Broker, name: str, pipeline: str, topic: str, spark: Any, markers: str
) -> KafkaSink:
    sink = KafkaSink(
        name, bootstrap_servers=kafka.bootstrap, topic=topic, key="order_id",
        partitions=PARTITIONS, marker_topic=markers,
    )  # fmt: skip
    sink.open(SinkContext(pipeline, spark))
    return sink


def test_pipelines_whose_dotted_names_collide_keep_their_own_markers(
    spark: Any, kafka: Broker
) -> None:
    tag = uuid.uuid4().hex[:6]
    topic_a, topic_b = f"a-{tag}", f"b-{tag}"
    for topic in (topic_a, topic_b):
        create_topic(kafka.bootstrap, topic, 3)
    markers = f"markers-{tag}"  # one marker topic, as by default on a cluster
    ahead = kafka_sink(kafka, "kafka", f"orders{tag}.eu", topic_a, spark, markers)
    behind = kafka_sink(kafka, "eu.kafka", f"orders{tag}", topic_b, spark, markers)
    for batch_id in range(3):
        write(spark, ahead, f"orders{tag}.eu", batch_id)
    details = write(spark, behind, f"orders{tag}", 0)
    assert details["skipped_partitions"] == []
    records = read_topic(kafka.bootstrap, topic_b, ROWS)
    assert key_counts(records) == {str(i): 1 for i in range(ROWS)}


def test_a_marker_past_the_batch_is_refused_before_writing(spark: Any, kafka: Broker) -> None:
    tag = uuid.uuid4().hex[:6]
    topic, pipeline = f"t-{tag}", f"p{tag}"
    create_topic(kafka.bootstrap, topic, 3)
    sink = kafka_sink(kafka, "events", pipeline, topic, spark, f"markers-{topic}")
    for batch_id in range(3):
        write(spark, sink, pipeline, batch_id)
    with pytest.raises(KafkaMarkerError) as info:
        write(spark, sink, pipeline, 1)  # as if the ledger had lost the marks of 1 and 2
    message = str(info.value)
    assert message.startswith(f"sink 'events', batch 1: markers in topic 'markers-{topic}'")
    assert "says batch 2" in message and "another pipeline or sink" in message
    records = read_topic(kafka.bootstrap, topic, 3 * ROWS)
    assert key_counts(records) == {str(b * 100 + i): 1 for b in range(3) for i in range(ROWS)}


def test_a_batch_half_committed_under_the_old_names_is_refused(spark: Any, kafka: Broker) -> None:
    from confluent_kafka import Consumer, TopicPartition
    from fanout_kafka.markers import legacy_marker_group

    tag = uuid.uuid4().hex[:6]
    topic, pipeline, markers = f"t-{tag}", f"p{tag}", f"markers-{tag}"
    create_topic(kafka.bootstrap, topic, 3)
    sink = kafka_sink(kafka, "events", pipeline, topic, spark, markers)
    old = legacy_marker_group(pipeline, "events", 1)  # fanout 0.1 committed partition 1 of batch 4
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": old})
    consumer.commit(offsets=[TopicPartition(markers, 0, 5)], asynchronous=False)
    consumer.close()
    with pytest.raises(KafkaMarkerError) as info:
        write(spark, sink, pipeline, 4)
    assert str(info.value).startswith("sink 'events', batch 4: batch 4 was half committed by")
    assert repr(old) in str(info.value)
    with pytest.raises(KafkaMarkerError):  # and again when the batch is retried
        write(spark, sink, pipeline, 4)
    write(spark, sink, pipeline, 5)  # checked once per sink: later batches go on
    records = read_topic(kafka.bootstrap, topic, ROWS)
    assert key_counts(records) == {str(500 + i): 1 for i in range(ROWS)}
