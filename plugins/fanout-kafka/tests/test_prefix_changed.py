"""``transactional_id_prefix`` changed between a killed run and its restart
(:mod:`fanout_kafka.former_ids`): the replay fences the ids of the prefix recorded in the
last run before it reads its markers. Before, it initialised only the new ids: the
transaction the killed task left open under the old ones stayed open, on Tansu holding
back the marker of the partition committed beside it, and the replay wrote that
partition's 5 records again (read_committed: k0-k4 "kept" and k0-k4 "replayed"); on Kafka
a task of the old run still alive could have committed beside the replay."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka import KafkaException
from fanout_kafka import KafkaSink
from fanout_kafka.former_ids import recorded_prefix
from kafkatools import Broker, create_topic, marker
from test_abandoned_transactions import (
    KEPT,
    PLAN,
    _batch,
    _commit,
    _committed_records,
    _left_open,
    _replay_kept,
)

from fanout.contract.sink import SinkContext


def _sink(kafka: Broker, topic: str, pipeline: str, prefix: str) -> KafkaSink:
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic, key="id",
                     value="v", partitions=2, transactional_id_prefix=prefix)  # fmt: skip
    sink.open(SinkContext(pipeline))
    return sink


def test_a_restart_under_another_prefix_fences_the_former_ids_before_reading_markers(
    kafka: Broker,
) -> None:
    topic, pipeline = f"ab-{uuid.uuid4().hex[:8]}", f"ab{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap, topic, 1)  # both partitions' records share its partition
    killed = _sink(kafka, topic, pipeline, f"{pipeline}-old")
    assert killed.committed_partitions(_batch(pipeline), PLAN) == []
    settings = killed.settings(_batch(pipeline))
    assert recorded_prefix(settings, 10) == f"{pipeline}-old"
    with _left_open(killed, pipeline, topic) as left:
        _commit(killed, pipeline)
        restarted = _sink(kafka, topic, pipeline, f"{pipeline}-new")
        assert _replay_kept(restarted, pipeline) == "skipped"
        # the old run's producer is fenced: it cannot commit beside the replay
        with pytest.raises(KafkaException):
            left.commit_transaction(10)

    assert recorded_prefix(restarted.settings(_batch(pipeline)), 10) == f"{pipeline}-new"
    assert marker(kafka.bootstrap, pipeline, "events", KEPT, "__fanout_markers") == 1
    assert _committed_records(kafka, topic) == [(f"k{i}", "kept") for i in range(5)]


def test_a_prefix_the_sink_may_not_record_is_warned_not_refused(
    kafka: Broker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A sink without READ and WRITE on the marker topic (rights it needs nowhere else
    without Delta dead letters) cannot read or record its prefix: warned, and the markers
    read as before, so a secured pipeline is not stopped at every run's first batch; any
    other error is transient (the batch is tried again)."""
    from confluent_kafka import KafkaError
    from fanout_kafka import former_ids

    from fanout.errors import TransientSinkError

    topic, pipeline = f"ab-{uuid.uuid4().hex[:8]}", f"ab{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap, topic, 1)

    def refused(code: int) -> Any:
        def read(settings: Any, timeout_s: float) -> str | None:
            raise KafkaException(KafkaError(code, "stand-in"))

        return read

    monkeypatch.setattr(former_ids, "recorded_prefix",
                        refused(KafkaError.TOPIC_AUTHORIZATION_FAILED))  # fmt: skip
    sink = _sink(kafka, topic, pipeline, f"{pipeline}-p")
    assert sink.committed_partitions(_batch(pipeline), PLAN) == []
    assert "cannot read or record its transactional_id_prefix" in caplog.text
    assert "TOPIC_AUTHORIZATION_FAILED" in caplog.text

    monkeypatch.setattr(former_ids, "recorded_prefix", refused(KafkaError._TRANSPORT))
    again = _sink(kafka, topic, pipeline, f"{pipeline}-p")
    with pytest.raises(TransientSinkError) as caught:
        again.committed_partitions(_batch(pipeline), PLAN)
    assert str(caught.value).startswith(
        "sink 'events', batch 0: cannot read or record the sink's transactional_id_prefix on "
        "marker topic '__fanout_markers' (read before the markers): "
    )
