"""Transactional ids: the default prefix ``fanout/<pipeline>/<sink>`` is unambiguous (the
former ``fanout-<pipeline>-<sink>`` was not: pipeline ``a-b`` with sink ``c`` and pipeline
``a`` with sink ``b-c`` fenced each other), and a sink on the default fences the former
ids once per open, so a producer of the old version cannot commit beside the new one."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from fanout_kafka import KafkaSink
from fanout_kafka.markers import default_transactional_id_prefix, legacy_transactional_id_prefix
from fanout_kafka.transaction import PartitionWriter
from kafka_log import committed_values
from kafkatools import Broker, create_topic

from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.sink import SinkContext
from fanout.partitioned.membership import PartitionPlan

PLAN = PartitionPlan(1, (("id", "string"),))


def _sink(kafka: Broker, topic: str, pipeline: str, name: str, **options: object) -> KafkaSink:
    sink = KafkaSink(name, bootstrap_servers=kafka.bootstrap, topic=topic, key="id",
                     value="v", partitions=1, **options)  # type: ignore[arg-type]  # fmt: skip
    sink.open(SinkContext(pipeline))
    return sink


def _batch(pipeline: str, sink: str) -> Batch:
    return Batch(None, BatchInfo(pipeline, 0), sink, txn_app_id(pipeline, sink))


def _rows(value: str) -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pylist([{"id": f"k{i}", "v": value} for i in range(3)])]


def test_names_that_joined_alike_get_different_ids_and_do_not_fence_each_other(
    kafka: Broker,
) -> None:
    tag = uuid.uuid4().hex[:6]
    topic = f"ids-{tag}"
    create_topic(kafka.bootstrap, topic, 1)
    one = _sink(kafka, topic, f"a{tag}-b", "c")
    two = _sink(kafka, topic, f"a{tag}", "b-c")
    assert one.transactional_id_prefix == f"fanout/a{tag}-b/c"
    assert two.transactional_id_prefix == f"fanout/a{tag}/b-c"

    first = PartitionWriter(replace(one.settings(_batch(f"a{tag}-b", "c"))), 0, 0)
    second = PartitionWriter(replace(two.settings(_batch(f"a{tag}", "b-c"))), 0, 0)
    assert first.transactional_id != second.transactional_id
    assert first.prepare() is False  # its producer is initialised...
    assert second.prepare() is False  # ...and the other's does not fence it
    one_records, _ = first.settings.encoder.encode_arrow(_rows("one"))
    two_records, _ = second.settings.encoder.encode_arrow(_rows("two"))
    one_done = first.write(one_records, [], prepared=True)
    two_done = second.write(two_records, [], prepared=True)
    assert (one_done.status, two_done.status) == ("committed", "committed")
    assert sorted(committed_values(kafka.bootstrap, topic)) == [b"one"] * 3 + [b"two"] * 3


def test_a_sink_on_the_default_fences_a_producer_left_under_the_former_id(
    kafka: Broker,
) -> None:
    tag = uuid.uuid4().hex[:6]
    topic, pipeline = f"ids-{tag}", f"mig{tag}"
    create_topic(kafka.bootstrap, topic, 1)
    # an older fanout's task, killed or still running, with its transaction open
    old = Producer({"bootstrap.servers": kafka.bootstrap,
                    "transactional.id": f"fanout-{pipeline}-events-0"})  # fmt: skip
    old.init_transactions(30)
    old.begin_transaction()
    old.produce(topic, b"old", b"k0")
    assert old.flush(30) == 0

    sink = _sink(kafka, topic, pipeline, "events")  # the upgraded driver
    assert sink.transactional_id_prefix == f"fanout/{pipeline}/events"
    batch = _batch(pipeline, "events")
    assert sink.committed_partitions(batch, PLAN) == []  # fences the former ids first
    settings = replace(sink.settings(batch), plan=PLAN)
    done = PartitionWriter(settings, 0, 0).run(_rows("new"))
    assert (done.status, done.written) == ("committed", 3)

    # the old producer is fenced: what it sends now is refused, and it cannot commit
    errors: list[KafkaError] = []
    old.produce(topic, b"late", b"k1", on_delivery=lambda err, msg: errors.append(err))
    old.flush(10)
    assert [e.code() for e in errors] == [KafkaError.PRODUCER_FENCED]
    with pytest.raises(KafkaException) as fenced:
        old.commit_transaction(10)
    assert fenced.value.args[0].code() == KafkaError.PRODUCER_FENCED
    assert sorted(committed_values(kafka.bootstrap, topic)) == [b"new"] * 3


def test_an_explicit_prefix_is_kept_and_fences_nothing_else() -> None:
    sink = KafkaSink("events", bootstrap_servers="127.0.0.1:1", topic="t",
                     transactional_id_prefix="mine")  # fmt: skip
    assert sink.transactional_id_prefix == "mine" and sink._legacy_prefix is None


def test_the_default_is_unambiguous_where_the_former_was_not() -> None:
    assert default_transactional_id_prefix("a-b", "c") == "fanout/a-b/c"
    assert default_transactional_id_prefix("a", "b-c") == "fanout/a/b-c"
    # the reason for the change: the former default joined them alike
    assert legacy_transactional_id_prefix("a-b", "c") == legacy_transactional_id_prefix("a", "b-c")
