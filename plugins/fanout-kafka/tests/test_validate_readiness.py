"""``fanout validate`` of a Kafka sink checks what a run would otherwise fail on only at
its first batch, or mid-stream (:mod:`fanout_kafka.readiness`), against the real broker:
the brokers reachable, the topic there (or creatable), the transactional producer
initialising, without disturbing a pipeline running on the same ids. (Tansu has no ACLs:
the rights refusals are covered in ``test_readiness_refusals.py``.)"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient
from fanout_kafka import KafkaSink
from fanout_kafka.embedded import free_port
from kafka_log import committed_values
from kafkatools import Broker

from fanout import BatchInfo, FanOut
from fanout.contract.sink import SinkContext
from tests.in_process_cli import Cli
from tests.integration.checklist import validate


def _sinks(bootstrap: str, topic: str) -> str:
    """The pipeline file's one ``[[sinks]]`` table: sink ``events`` on ``topic``."""
    options = {"type": "kafka", "name": "events", "bootstrap_servers": bootstrap,
               "topic": topic, "key": "id", "marker_topic": f"{topic}-markers",
               "open_timeout_s": 2}  # fmt: skip
    return "[[sinks]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in options.items())


def _transaction_left_open(kafka: Broker, topic: str, transactional_id: str) -> Producer:
    """A producer of ``transactional_id`` in the middle of a transaction (one record)."""
    producer = Producer(
        {"bootstrap.servers": kafka.bootstrap, "transactional.id": transactional_id}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, transactional_id.encode(), b"k")
    assert producer.flush(30) == 0
    return producer


def test_validate_names_a_port_no_broker_listens_on(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    bootstrap = f"127.0.0.1:{free_port()}"
    validated = validate(tmp_path, "id LONG", _sinks(bootstrap, "t"),
                         fanout_cli)  # fmt: skip
    assert validated.code == 1  # a target out of reach, as `fanout run` exits for it
    assert validated.lines[3] == "  OK    sink events: options"
    # exact but for librdkafka's own clauses: its timing, an "identical error(s)
    # suppressed" count, and its count of brokers down when the check gave up
    cause = f"{bootstrap}/bootstrap: Connect to ipv4#{bootstrap} failed: Connection refused (after "
    expected = (
        re.escape(
            f"  FAIL  sink events: opens its target: sink 'events': cannot reach the Kafka "
            f"brokers at {bootstrap!r} within 2 s ({cause}"
        )
        + r"\d+ms in state CONNECT[^)]*\)(; \d+/\d+ brokers are down)?"
        + re.escape(
            "); check 'bootstrap_servers', the network, and the security settings in "
            "'producer' (security.protocol, sasl.*, ssl.*), and that the brokers run"
        )
    )
    assert re.fullmatch(expected, validated.lines[4]), validated.lines[4]
    assert validated.lines[5:] == []  # no schema check of a target that did not open


def test_validate_names_a_missing_topic_it_may_not_create(
    spark: Any, kafka: Broker, tmp_path: Path, fanout_cli: Cli
) -> None:
    topic = f"missing-{uuid.uuid4().hex[:8]}"
    validated = validate(tmp_path, "id LONG", _sinks(kafka.bootstrap, topic),
                         fanout_cli)  # fmt: skip
    assert validated.code == 2
    assert validated.lines[3:] == [
        "  OK    sink events: options",
        f"  FAIL  sink events: opens its target: Kafka sink 'events': topic {topic!r} (option "
        f"'topic') does not exist on {kafka.bootstrap!r}; create it (kafka-topics.sh --create "
        "...) or set the option create_topic: true, or {partitions: N, replication_factor: R}",
    ]


def test_validate_initialises_a_transactional_producer_of_its_own_id(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path, fanout_cli: Cli
) -> None:
    """The check passes on the broker, and a run's producer of the same prefix, in the
    middle of its transaction, is not fenced by it: validate's id is ``<prefix>#validate``."""
    pipeline = f"rd{uuid.uuid4().hex[:6]}"
    running = _transaction_left_open(kafka, topic, f"fanout/{pipeline}/events-0")

    validated = validate(tmp_path, "id LONG", _sinks(kafka.bootstrap, topic),
                         fanout_cli, name=pipeline)  # fmt: skip
    assert validated.lines[3:] == [
        "  OK    sink events: options",
        "  OK    sink events: opens its target",
        f"  INFO  sink events: would create topic '{topic}-markers' (option 'marker_topic') "
        "with 1 partition(s)",
        "  OK    sink events: target takes the routed schema",
        "  sink events: KafkaSink, transactional",
    ]
    assert validated.code == 0, validated.err
    running.commit_transaction(30)  # not fenced
    assert committed_values(kafka.bootstrap, topic) == [f"fanout/{pipeline}/events-0".encode()]


def test_open_checking_initialises_the_validate_id_only(kafka: Broker, topic: str) -> None:
    """The sink opened as ``fanout validate`` opens it: the transactional id it initialises
    is ``<prefix>#validate`` (a producer of it initialised before is fenced), no other."""
    prefix = f"rd-{uuid.uuid4().hex[:6]}"
    earlier = _transaction_left_open(kafka, topic, f"{prefix}#validate")
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic,
                     transactional_id_prefix=prefix, marker_topic=f"{topic}-markers",
                     create_topic=True)  # fmt: skip
    sink.open(SinkContext("p", checking=True, readiness=True))
    sink.close()
    with pytest.raises(KafkaException):  # fenced (Tansu: its commit is not answered)
        earlier.commit_transaction(10)
    assert committed_values(kafka.bootstrap, topic) == []


def test_recover_opens_without_the_validate_producer(kafka: Broker, topic: str) -> None:
    """``fanout recover --config`` opens the sink with ``checking`` only (it asks
    ``holds_batch``, and must pass on a principal that may not write): no transactional id
    is initialised, so a producer of ``<prefix>#validate`` mid-transaction still commits."""
    prefix = f"rd-{uuid.uuid4().hex[:6]}"
    earlier = _transaction_left_open(kafka, topic, f"{prefix}#validate")
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic,
                     transactional_id_prefix=prefix, marker_topic=f"{topic}-markers",
                     create_topic=True)  # fmt: skip
    sink.open(SinkContext("p", checking=True))  # as fanout.app.recover_sinks opens it
    sink.close()
    earlier.commit_transaction(30)  # not fenced
    assert committed_values(kafka.bootstrap, topic) == [f"{prefix}#validate".encode()]


def test_validate_warns_when_the_marker_groups_of_the_epoch_are_gone(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path, fanout_cli: Cli
) -> None:
    """The ledger marks batch 0 written by the sink; once its marker groups are deleted
    (as the brokers expire them after offsets.retention.minutes), validate says so with a
    WARN line (exit 0: a run goes on), and not before."""
    pipeline = f"gone{uuid.uuid4().hex[:6]}"
    options = {"type": "kafka", "name": "events", "bootstrap_servers": kafka.bootstrap,
               "topic": topic, "key": "id", "marker_topic": f"{topic}-markers"}  # fmt: skip
    fan = FanOut(pipeline, str(tmp_path / "ledger"), [options])
    try:
        fan.process(spark.createDataFrame([(i,) for i in range(8)], "id BIGINT"),
                    BatchInfo(pipeline, 0, "q"))  # fmt: skip
    finally:
        fan.close()
    sinks = _sinks(kafka.bootstrap, topic)
    opened = ["  OK    sink events: options", "  OK    sink events: opens its target"]
    schema = ["  OK    sink events: target takes the routed schema",
              "  sink events: KafkaSink, transactional"]  # fmt: skip
    kept = validate(tmp_path, "id LONG", sinks, fanout_cli, name=pipeline)
    assert (kept.code, kept.lines[2:]) == (0, opened + schema), kept.err  # the ledger there

    groups = [f"fanout/{pipeline}/events/p{p}" for p in range(4)]
    with AdminClient({"bootstrap.servers": kafka.bootstrap}) as admin:
        for future in admin.delete_consumer_groups(groups).values():
            future.result(10)
    (tmp_path / "input").rmdir()  # validate() makes it again
    gone = validate(tmp_path, "id LONG", sinks, fanout_cli, name=pipeline)
    warned = (
        f"  WARN  sink events: its marker groups hold its last marked batch: no marker group "
        f"of epoch 0 is left on marker topic '{topic}-markers' (groups "
        f"'fanout/{pipeline}/events/p0' ...), while the ledger marks batch 0 written by this "
        "sink: the brokers deleted them offsets.retention.minutes after their last commit "
        "(the pipeline was idle longer than that), or someone deleted them. A run cannot "
        f"tell then whether topic '{topic}' holds its marked batches, and a batch a killed "
        "run wrote after its last mark would be written again. A run commits the markers "
        "it finds again at its first batch: run the pipeline within "
        "offsets.retention.minutes (or raise it on the brokers), and do not delete the "
        f"consumer groups prefixed 'fanout/{pipeline}'"
    )
    assert (gone.code, gone.lines[2:]) == (0, [*opened, warned, *schema]), gone.err


def _groups_of(bootstrap: str, word: str) -> list[str]:
    """The consumer groups on the broker whose id holds ``word``, sorted."""
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        listed = admin.list_consumer_groups(request_timeout=30).result(30)
    return sorted(g.group_id for g in listed.valid if word in g.group_id)


def test_validate_leaves_no_consumer_group_nor_record(kafka: Broker, topic: str) -> None:
    """The sink opened as ``fanout validate`` opens it, with a ledger mark to check its
    marker groups by: it describes a marker group (the principal's rights on it) and reads
    the marker groups' offsets, which create no group; its producer ``<prefix>#validate``
    begins no transaction, so no record is written anywhere: not in the target topic, and
    the marker topic, missing, is not created (``context.would`` names it: a run creates
    it), so it holds none either (nor the prefix record a run's first batch writes there,
    :mod:`fanout_kafka.former_ids`). What stays on the broker is
    that transactional id, in state Empty, until the coordinator expires it
    (``transactional.id.expiration.ms``): no Kafka request deletes a transactional id
    (:mod:`fanout_kafka.readiness`), and a later validate reuses the same one."""
    word = uuid.uuid4().hex[:8]
    pipeline, prefix = f"v{word}", f"rd-{word}"
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic,
                     transactional_id_prefix=prefix, marker_topic=f"{topic}-markers",
                     create_topic=True)  # fmt: skip
    context = SinkContext(pipeline, checking=True, readiness=True, last_mark=(0, 0))
    sink.open(context)
    sink.close()
    assert [what for what, _ in context.warnings] == [
        "its marker groups hold its last marked batch"  # read, and none there
    ]
    assert _groups_of(kafka.bootstrap, word) == []
    assert committed_values(kafka.bootstrap, topic) == []
    markers = f"{topic}-markers"
    assert context.changes == [
        f"create topic {markers!r} (option 'marker_topic') with 1 partition(s)"
    ]
    with AdminClient({"bootstrap.servers": kafka.bootstrap}) as admin:
        listed = admin.list_topics(timeout=30).topics  # all: naming one may create it
    assert (topic in listed, markers in listed) == (True, False)
