"""Bad input fails with an error naming sink, batch and cause, or goes to the dead-letter
target; open() checks the brokers and topics before the stream starts."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from fanout_kafka import KafkaAbortedError, KafkaBadRecordError, KafkaFencedError, KafkaSink
from fanout_kafka.embedded import EmbeddedKafka, free_port
from fanout_kafka.records import RECORD_BATCH_HEADER_BYTES
from kafkatools import Broker, create_topic, key_counts, read_topic

from fanout import FanOut, hookimpl
from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.partitions import PartitionCommit
from fanout.contract.sink import SinkContext, SinkResult
from fanout.errors import ConfigurationError, SinkUnreachableError, SinkWriteError
from fanout.testing import open_sink
from tests.integration.streams import delta_rows

BIG = 1_100_000  # over librdkafka's default message.max.bytes (1,000,000)
SCHEMA = "id LONG, payload STRING"


def write(spark: Any, sink: KafkaSink, rows: list[tuple[Any, str]], batch_id: int = 5
          ) -> SinkResult:  # fmt: skip
    pipeline = sink.pipeline or "p"
    df = spark.createDataFrame(rows, SCHEMA)
    info = BatchInfo(pipeline, batch_id)
    return sink.write(Batch(df, info, sink.name, txn_app_id(pipeline, sink.name)))


def opened(kafka: Broker, topic: str, **options: Any) -> KafkaSink:
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic, key="id",
                     partitions=2, **options)  # fmt: skip
    return open_sink(sink, f"bad{uuid.uuid4().hex[:6]}")


SMALL = [(1, "a"), (2, "b"), (3, "c")]


def test_record_over_the_size_limit_fails_naming_sink_batch_and_cause(
    spark: Any, kafka: Broker, topic: str
) -> None:
    sink = opened(kafka, topic)
    with pytest.raises(KafkaBadRecordError) as caught:
        write(spark, sink, [*SMALL, (4, "x" * BIG)])
    text = str(caught.value)
    assert text.startswith("sink 'events', batch 5: 1 of 2 partition(s) failed")
    assert "record(s) the topic cannot take and no 'dead_letter' target: record of " in text
    assert "bytes (key '4') is over the sink's limit of 1000000 bytes" in text
    _replay_with_dead_letter_is_exactly_once(spark, kafka, sink, [*SMALL, (4, "x" * BIG)])


def test_null_key_fails_naming_sink_batch_and_column(spark: Any, kafka: Broker, topic: str) -> None:
    sink = opened(kafka, topic)
    with pytest.raises(KafkaBadRecordError) as caught:
        write(spark, sink, [*SMALL, (None, "no key")])
    assert str(caught.value).startswith("sink 'events', batch 5: 1 of 2 partition(s) failed")
    assert "null key: key column(s) 'id' are null in row " in str(caught.value)
    assert '"payload": "no key"' in str(caught.value)
    _replay_with_dead_letter_is_exactly_once(spark, kafka, sink, [*SMALL, (None, "no key")])


def _replay_with_dead_letter_is_exactly_once(
    spark: Any, kafka: Broker, failed: KafkaSink, rows: list[tuple[Any, str]]
) -> None:
    """The failed partition sent nothing (its records were checked first); the others
    committed. With a dead-letter target added, the replay writes only the failed
    partition: every good row once, the bad one in the dead-letter topic."""
    topic = str(failed.topic)
    partial = read_topic(kafka.bootstrap, topic, 1, timeout=5, idle=1)
    assert {r["key"] for r in partial} < {"1", "2", "3"}  # some, never the bad partition
    dlq = f"{topic}-dlq"
    create_topic(kafka.bootstrap, dlq, 1)
    fixed = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic, key="id",
                      partitions=2, dead_letter=f"kafka:{dlq}")  # fmt: skip
    open_sink(fixed, str(failed.pipeline))
    result = write(spark, fixed, rows)
    assert len(result.details["skipped_partitions"]) == 1
    assert (result.details["dead_letters"], result.rows) == (1, 3)
    records = read_topic(kafka.bootstrap, topic, 3)
    assert sorted(r["key"] for r in records) == ["1", "2", "3"]
    assert len(read_topic(kafka.bootstrap, dlq, 1)) == 1


def test_bad_records_go_to_a_dead_letter_topic_in_the_same_transactions(
    spark: Any, kafka: Broker, topic: str
) -> None:
    dlq = f"{topic}-dlq"
    create_topic(kafka.bootstrap, dlq, 1)
    sink = opened(kafka, topic, dead_letter=f"kafka:{dlq}")
    result = write(spark, sink, [*SMALL, (4, "x" * BIG), (None, "no key")])
    assert result.rows == 3  # the rows written: the refused two are dead letters
    assert (result.details["written"], result.details["dead_letters"]) == (3, 2)
    good = read_topic(kafka.bootstrap, topic, 3)
    assert sorted((r["key"], r["value"]) for r in good) == [
        ("1", '{"id":1,"payload":"a"}'), ("2", '{"id":2,"payload":"b"}'),
        ("3", '{"id":3,"payload":"c"}')]  # fmt: skip
    dead = sorted(read_topic(kafka.bootstrap, dlq, 2), key=lambda r: str(r["key"]))
    assert [(r["key"], r["value"]) for r in dead] == [
        ("4", None),  # too big for any topic of this broker: reference only
        (None, '{"id":null,"payload":"no key"}'),
    ]
    assert dead[0]["headers"]["fanout.error"].startswith("record of ")
    assert dead[0]["headers"]["fanout.topic"] == topic
    assert int(dead[0]["headers"]["fanout.record_bytes"]) > BIG
    assert dead[1]["headers"]["fanout.error"].startswith("null key: key column(s) 'id'")
    assert dead[1]["headers"]["fanout.batch_id"] == "5"


def test_bad_records_go_to_a_delta_dead_letter_table_once(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    sink = opened(kafka, topic, dead_letter=str(tmp_path / "dlq"))
    first = write(spark, sink, [*SMALL, (None, "no key")])
    again = write(spark, sink, [*SMALL, (None, "no key")])  # a replay of batch 5
    assert (first.details["written"], first.details["dead_letters"]) == (3, 1)
    assert again.already_written is True and again.details["written"] == 0
    rows = delta_rows(tmp_path / "dlq")
    assert len(rows) == 1
    row, facts = rows[0], json.loads(rows[0]["details"])
    assert (row["sink"], row["batch_id"], facts["topic"], facts["key"]) == (
        "events",
        5,
        topic,
        None,
    )
    assert facts["value"] == '{"id":null,"payload":"no key"}'
    assert row["reason"].startswith("null key: key column(s) 'id'")
    assert sorted(r["key"] for r in read_topic(kafka.bootstrap, topic, 3)) == ["1", "2", "3"]


def test_unknown_topic_without_create_topic_fails_at_open(
    spark: Any, kafka: Broker, tmp_path: Path
) -> None:
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    sink = {"type": "kafka", "name": "events", "bootstrap_servers": kafka.bootstrap,
            "topic": missing}  # fmt: skip
    with pytest.raises(ConfigurationError) as caught:
        FanOut("p", str(tmp_path / "ledger"), [sink])
    assert str(caught.value).startswith(
        f"Kafka sink 'events': topic {missing!r} (option 'topic') does not exist on "
        f"{kafka.bootstrap!r}; create it"
    )
    with AdminClient({"bootstrap.servers": kafka.bootstrap}) as admin:
        assert missing not in admin.list_topics(timeout=10).topics  # and nothing created it

        created = KafkaSink(
            "events", bootstrap_servers=kafka.bootstrap, topic=missing,
            create_topic={"partitions": 2}, marker_topic=f"{missing}-markers",
        )  # fmt: skip
        created.open(SinkContext("p"))
        topics = admin.list_topics(timeout=10).topics
        assert missing not in topics  # created at the first write (the lost-target check)
        assert len(topics[f"{missing}-markers"].partitions) == 1  # fanout's own, at open()
        assert write(spark, created, SMALL).rows == 3
        assert len(admin.list_topics(timeout=10).topics[missing].partitions) == 2
        assert sorted(r["value"] for r in read_topic(kafka.bootstrap, missing, 3)) == [
            '{"id":1,"payload":"a"}',
            '{"id":2,"payload":"b"}',
            '{"id":3,"payload":"c"}',
        ]


def test_a_missing_topics_record_limit_is_the_one_create_topic_gives_it(kafka: Broker) -> None:
    missing = f"missing-{uuid.uuid4().hex[:8]}"

    def sink(limit: str) -> KafkaSink:
        return KafkaSink(
            "events", bootstrap_servers=kafka.bootstrap, topic=missing,
            create_topic={"config": {"max.message.bytes": limit}},
            marker_topic=f"{missing}-markers",
        )  # fmt: skip

    created = sink("20000")
    created.open(SinkContext("p"))
    assert created.max_record_bytes == 20000 - RECORD_BATCH_HEADER_BYTES
    with pytest.raises(ConfigurationError) as caught:
        sink("1MB").open(SinkContext("p"))
    assert str(caught.value) == (
        "Kafka sink 'events': create_topic.config 'max.message.bytes' must be a positive "
        "integer (bytes), got '1MB'"
    )
    with AdminClient({"bootstrap.servers": kafka.bootstrap}) as admin:
        assert missing not in admin.list_topics(timeout=10).topics


def test_topic_deleted_after_open_fails_the_batch_naming_it(
    spark: Any, kafka: Broker, topic: str
) -> None:
    sink = opened(kafka, topic)
    with AdminClient({"bootstrap.servers": kafka.bootstrap}) as admin:
        admin.delete_topics([topic])[topic].result(10)
    with pytest.raises(SinkWriteError) as caught:
        write(spark, sink, SMALL)
    assert str(caught.value).startswith("sink 'events', batch 5: 2 of 2 partition(s) failed")
    assert f"topic {topic!r} does not exist on {kafka.bootstrap!r}" in str(caught.value)


def test_unreachable_broker_fails_open_within_the_timeout() -> None:
    """A port no broker listens on is a :class:`SinkUnreachableError` (also a
    ``ConfigurationError``), as a PostgreSQL server down is: it was a plain
    ``ConfigurationError``, so `fanout run` exited 2 (a mistake in the file) for a broker
    that was only down, and a lag sink could not start behind (next test)."""
    bootstrap = f"127.0.0.1:{free_port()}"
    sink = KafkaSink("events", bootstrap_servers=bootstrap, topic="t", open_timeout_s=1.5)
    started = time.monotonic()
    with pytest.raises(SinkUnreachableError) as caught:
        sink.open(SinkContext("p"))
    assert time.monotonic() - started < 8  # the 1.5 s given, not the default 10 s (loaded CI)
    assert isinstance(caught.value, ConfigurationError)
    assert str(caught.value).startswith(
        f"sink 'events': cannot reach the Kafka brokers at {bootstrap!r} within 1.5 s ("
    )
    assert str(caught.value).endswith(
        "check 'bootstrap_servers', the network, and the security settings in 'producer' "
        "(security.protocol, sasl.*, ssl.*), and that the brokers run"
    )


def test_a_lag_sink_whose_broker_is_down_at_the_start_starts_behind(tmp_path: Path) -> None:
    """``on_failure="lag"`` promises that the other sinks go on while one's target is down,
    and that one whose server is down at the start starts behind. A Kafka sink's broker
    down at ``FanOut(...)`` raised ``ConfigurationError: Kafka sink 'events': cannot reach
    the Kafka brokers ...``, so nothing started; now the sink starts unopened."""
    from fanout.ledger.memory import MemoryLedger
    from fanout.testing import RecordingSink

    bootstrap = f"127.0.0.1:{free_port()}"
    down = {"type": "kafka", "name": "events", "bootstrap_servers": bootstrap, "topic": "t",
            "open_timeout_s": 1, "on_failure": "lag"}  # fmt: skip
    fan = FanOut("lagging", MemoryLedger(), [RecordingSink("kept"), down], backoff_s=0,
                 spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip
    try:
        assert fan.unopened == ("events",)
    finally:
        fan.close()


def test_brokers_refusing_the_sasl_settings_are_a_configuration_error(
    kafka: Broker, tmp_path: Path
) -> None:
    """Brokers that answer and refuse the connection's security settings (SASL against a
    plaintext listener here; a wrong password alike) are a mistake in the options, as a
    refused PostgreSQL login is: a plain ``ConfigurationError`` (exit 2), which stops a
    lag sink's ``FanOut(...)`` too. Once brokers out of reach became a
    ``SinkUnreachableError``, such a sink started behind, as if its brokers were only down,
    and lagged on without a word of the options (``fanout run``: exit 1, "run again once
    the server answers")."""
    from fanout.ledger.memory import MemoryLedger
    from fanout.testing import RecordingSink

    producer = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                "sasl.username": "app", "sasl.password": "Secret-pw9"}  # fmt: skip
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic="t",
                     open_timeout_s=2, producer=producer)  # fmt: skip
    with pytest.raises(ConfigurationError) as caught:
        sink.open(SinkContext("p"))
    said = str(caught.value)
    assert not isinstance(caught.value, SinkUnreachableError), said
    assert said.startswith(
        f"Kafka sink 'events': the Kafka brokers at {kafka.bootstrap!r} refused the connection ("
    )
    assert said.endswith(
        "check the security settings in 'producer' (security.protocol, sasl.mechanism, "
        "sasl.username, sasl.password, ssl.*) against the brokers' listener"
    )
    assert "SASL" in said and "Secret-pw9" not in said
    lagging = {
        "type": "kafka",
        "name": "events",
        "bootstrap_servers": kafka.bootstrap,
        "topic": "t",
        "open_timeout_s": 2,
        "on_failure": "lag",
        "producer": producer,
    }
    with pytest.raises(ConfigurationError) as refused:  # fmt: skip
        FanOut("refused", MemoryLedger(), [RecordingSink("kept"), lagging], backoff_s=0,
               spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip
    assert not isinstance(refused.value, SinkUnreachableError), str(refused.value)
    assert "refused the connection" in str(refused.value)
    assert "Secret-pw9" not in str(refused.value)


def test_a_host_that_does_not_resolve_is_named_once() -> None:
    """A misspelt host is told as such, once: librdkafka reports the failed lookup at every
    reconnect, each line differing only in its timing ("after 3ms"), and the message
    listed them all (eleven times in 3 s), burying what to fix."""
    sink = KafkaSink("events", bootstrap_servers="kafak.invalid:9092", topic="t",
                     open_timeout_s=2)  # fmt: skip
    with pytest.raises(SinkUnreachableError) as caught:
        sink.open(SinkContext("p"))
    said = str(caught.value)
    assert said.startswith(
        "sink 'events': cannot reach the Kafka brokers at 'kafak.invalid:9092' within 2 s ("
    )
    assert said.count("Failed to resolve 'kafak.invalid:9092'") == 1, said


def test_an_unreachable_broker_is_logged_once_not_at_every_reconnect(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """librdkafka logged each reconnect attempt of the open check at ERROR (about 20 lines
    a second: ~190 for the default 10 s), burying the one error open() raises."""
    bootstrap = f"127.0.0.1:{free_port()}"
    sink = KafkaSink("events", bootstrap_servers=bootstrap, topic="t", open_timeout_s=3)
    with caplog.at_level("DEBUG", logger="fanout_kafka.librdkafka"):
        with pytest.raises(ConfigurationError):
            sink.open(SinkContext("p"))
    lines = [r.getMessage() for r in caplog.records if r.name == "fanout_kafka.librdkafka"]
    assert len(lines) == 1
    assert f"Connect to ipv4#{bootstrap} failed: Connection refused" in lines[0]


def test_embedded_broker_starts_on_a_free_port_and_stops() -> None:
    broker = EmbeddedKafka()
    bootstrap = broker.start()
    assert bootstrap == broker.bootstrap and bootstrap.startswith("127.0.0.1:")
    process = broker.process
    assert process is not None and process.poll() is None
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        assert admin.list_topics(timeout=5).brokers
    broker.stop()
    assert process.poll() is not None  # the broker process is gone
    broker.stop()  # idempotent


def test_delta_dead_letters_of_a_committed_partition_survive_another_partition_failing(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    from pyspark.sql.functions import spark_partition_id

    from fanout.testing import faults

    rows = [*((i, f"p{i}") for i in range(1, 21)), (None, "no key")]
    df = spark.createDataFrame(rows, SCHEMA)
    (holder,) = {
        r["p"]
        for r in df.repartition(2, "id").withColumn("p", spark_partition_id()).collect()
        if r["id"] is None
    }
    veto = faults.VetoOnce(batch=5, partition=1 - holder, state=str(tmp_path / "veto.json"))
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic, key="id",
                     partitions=2, dead_letter=str(tmp_path / "dlq"))  # fmt: skip
    open_sink(sink, f"dl{uuid.uuid4().hex[:6]}", plugins=[veto])
    with pytest.raises(KafkaAbortedError, match="injected veto before commit"):
        write(spark, sink, rows)
    # the partition holding the bad record committed, and its letter is already parked
    assert [json.loads(r["details"])["key"] for r in delta_rows(tmp_path / "dlq")] == [None]
    replay = write(spark, sink, rows)
    assert replay.details["skipped_partitions"] == [holder]
    letters = delta_rows(tmp_path / "dlq")
    assert [
        (r["batch_id"], r["partition"], json.loads(r["details"])["value"]) for r in letters
    ] == [(5, holder, '{"id":null,"payload":"no key"}')]
    counts = key_counts(read_topic(kafka.bootstrap, topic, 20))
    assert set(counts) == {str(i) for i in range(1, 21)}, "rows lost"
    vetoed = json.loads((tmp_path / "veto.json").read_text())["records"]
    twice = [k for k, c in counts.items() if c == 2]
    if not kafka.hides_aborted:
        # Tansu shows the vetoed (aborted) attempt's records to read_committed readers, all
        # or, depending on its fetch batching, some of them: never more than those, never
        # a key more than twice
        assert len(twice) <= vetoed and max(counts.values()) <= 2
    else:
        assert twice == []


class SlowCommit:
    """Takes longer than the sink's transaction timeout before committing (a partition
    too big for ``transaction_timeout_ms``)."""

    @hookimpl
    def fanout_partition_commit(self, commit: PartitionCommit) -> None:
        time.sleep(1.5)


def test_a_transaction_longer_than_its_timeout_fails_saying_what_to_change(
    spark: Any, kafka: Broker, topic: str
) -> None:
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors need not import it
    sink = KafkaSink(
        "events", bootstrap_servers=kafka.bootstrap, topic=topic, key="id", partitions=1,
        transaction_timeout_ms=1000,
    )  # fmt: skip
    open_sink(sink, f"slow{uuid.uuid4().hex[:6]}", plugins=[SlowCommit()])
    with pytest.raises(SinkWriteError) as info:
        write(spark, sink, SMALL)
    error = info.value
    assert not isinstance(error, KafkaFencedError)
    assert not sink.is_transient(error)  # a replay would repeat it: no retry loop
    message = str(error)
    assert "its transaction of 3 record(s) ran" in message
    assert "longer than transaction_timeout_ms=1000" in message
    assert "Raise the sink's `transaction_timeout_ms`" in message and "`partitions`" in message
    assert "another writer took over" not in message
    if kafka.hides_aborted:  # Tansu shows aborted records to read_committed readers
        assert read_topic(kafka.bootstrap, topic, 1, timeout=5) == []
