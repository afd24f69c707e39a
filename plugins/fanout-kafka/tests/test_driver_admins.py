"""The driver's admin client (the marker reads before each batch) lives from the sink's
``open()`` to its ``close()``: shared by the sinks of one configuration, destroyed with
the last of them, so a driver that closed its FanOut keeps no client reconnecting to
brokers it no longer uses."""

from __future__ import annotations

import gc
import os
import uuid
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Any

from fanout_kafka import KafkaSink
from fanout_kafka.driver_admins import ADMINS, admin_config
from fanout_kafka.membership import read_committed
from kafkatools import Broker, read_topic

from fanout import FanOut
from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.sink import SinkContext
from fanout.partitioned.membership import PartitionPlan
from tests.integration.streams import run_stream, write_input

FILES, ROWS = 2, 10


def _librdkafka_threads() -> int:
    """Threads of this process that librdkafka started (named ``rdk:...``)."""
    gc.collect()  # clients dropped in reference cycles (none expected) end here
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            names.append(Path(f"/proc/self/task/{tid}/comm").read_text().strip())
        except OSError:  # the thread ended meanwhile
            continue
    return sum(name.startswith("rdk:") for name in names)


def _own_settings() -> dict[str, Any]:
    """Connection settings no other test uses: sinks other tests opened and never closed
    hold the plain configuration's client for the whole test process."""
    return {"socket.timeout.ms": 20_000 + uuid.uuid4().int % 10_000}


def _sink(kafka: Broker, topic: str, producer: dict[str, Any], name: str = "events") -> KafkaSink:
    return KafkaSink(
        name, bootstrap_servers=kafka.bootstrap, topic=topic, key="order_id", producer=producer
    )


def test_the_admin_client_of_a_closed_fan_out_is_destroyed(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    producer = _own_settings()
    config = admin_config(producer, kafka.bootstrap)
    assert not ADMINS.holds(config)
    threads_before = _librdkafka_threads()
    write_input(tmp_path / "input", FILES, ROWS)
    sink = _sink(kafka, topic, producer)
    fan = FanOut(f"adm{uuid.uuid4().hex[:6]}", str(tmp_path / "ledger"), [sink])
    try:
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")
        assert ADMINS.holds(config)  # the marker reads of both batches used it
        client = weakref.ref(ADMINS.client(config))
        assert _librdkafka_threads() > threads_before
    finally:
        fan.close()
    assert len(read_topic(kafka.bootstrap, topic, FILES * ROWS)) == FILES * ROWS
    assert not ADMINS.holds(config)
    assert client() is None
    assert _librdkafka_threads() == threads_before


def test_sinks_of_one_configuration_share_the_client_until_the_last_closes(
    kafka: Broker, topic: str
) -> None:
    pipeline = f"adm{uuid.uuid4().hex[:6]}"
    producer = _own_settings()
    first, second = _sink(kafka, topic, producer, "first"), _sink(kafka, topic, producer, "second")
    first.open(SinkContext(pipeline))
    second.open(SinkContext(pipeline))
    config = admin_config(producer, kafka.bootstrap)
    plan = PartitionPlan(first.partitions, (("order_id", "bigint"),))
    for sink in (first, second):  # the driver's marker reads of batch 0: nothing committed
        batch = Batch(None, BatchInfo(pipeline, 0), sink.name, txn_app_id(pipeline, sink.name))
        settings = replace(sink.settings(batch), plan=plan)
        assert read_committed(settings, 0) == []
    shared = ADMINS.client(config)
    client = weakref.ref(shared)
    del shared

    first.close()
    assert ADMINS.holds(config) and client() is not None
    first.close()  # a second close releases nothing more
    assert ADMINS.holds(config) and client() is not None

    second.close()
    assert not ADMINS.holds(config)
    assert client() is None


def test_a_sink_never_opened_closes_without_touching_the_clients(kafka: Broker) -> None:
    producer = _own_settings()
    config = admin_config(producer, kafka.bootstrap)
    never_opened = _sink(kafka, "unused", producer)
    ADMINS.hold(config)  # as an open sink of the same brokers would
    try:
        ADMINS.client(config)
        never_opened.close()
        never_opened.close()
        assert ADMINS.holds(config)
    finally:
        ADMINS.release(config)
    assert not ADMINS.holds(config)
