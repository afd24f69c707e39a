"""A Kafka sink renamed between a crash and its replay (docs/architecture.md §8, "A sink
renamed mid-batch").

The sink wrote batch 0 (marked) under its old name. Its marker groups are named by the
sink: killed after its partitions committed batch 1 and before its ledger mark, then
restarted with the sink renamed (same topic), the replay found no marker under the new
name and wrote every partition of batch 1 again: read_committed readers got its records
twice. The run is now refused at its first batch (:mod:`fanout.steps.renamed`, the new
sink's ``holds_batch_of`` the old name), nothing written, and the refusal names the old
sink, the batch and the ways on.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kafkatools import Broker, read_topic

from fanout import BatchFailedError, BatchInfo, FanOut
from fanout.errors import RenamedSinkError, SinkWriteError, TransientSinkError
from fanout.testing.faults import MarkLost


def _sink(kafka: Broker, topic: str, name: str) -> dict[str, Any]:
    return {"type": "kafka", "name": name, "bootstrap_servers": kafka.bootstrap,
            "topic": topic, "key": "id", "partitions": 2,
            "marker_topic": f"{topic}-markers", "create_topic": True}  # fmt: skip


def test_a_kafka_sink_renamed_between_a_crash_and_its_replay_is_refused(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    pipeline, ledger = f"kren{uuid.uuid4().hex[:6]}", str(tmp_path / "ledger")
    FanOut(pipeline, ledger, [_sink(kafka, topic, "old")], retries=0).process(
        spark.range(0, 4), BatchInfo(pipeline, 0, "q")
    )
    with pytest.raises(BatchFailedError):  # the driver "dies" before the ledger mark
        FanOut(pipeline, MarkLost(ledger, "old"), [_sink(kafka, topic, "old")],
               retries=0).process(spark.range(4, 8), BatchInfo(pipeline, 1, "q"))  # fmt: skip

    renamed = FanOut(pipeline, ledger, [_sink(kafka, topic, "new")], retries=0)
    refused: BatchFailedError | None = None
    try:
        renamed.process(spark.range(4, 8), BatchInfo(pipeline, 1, "q"))
    except BatchFailedError as exc:
        refused = exc
    renamed.close()
    keys = sorted(int(r["key"]) for r in read_topic(kafka.bootstrap, topic, 8))
    assert keys == list(range(8))  # before: 4-7 twice
    assert refused is not None and set(refused.failures) == {"new"}
    text = str(refused.failures["new"])
    assert f"topic '{topic}' holds batch 1 of sink 'old'" in text
    assert "rename the sink back to 'old'" in text

    # the way out it names: the old name completes the batch, then the new one goes on
    back = FanOut(pipeline, ledger, [_sink(kafka, topic, "old")], retries=0)
    assert back.process(spark.range(4, 8), BatchInfo(pipeline, 1, "q"))["old"].already_written
    back.close()
    after = FanOut(pipeline, ledger, [_sink(kafka, topic, "new")], retries=0)
    after.process(spark.range(8, 10), BatchInfo(pipeline, 2, "q"))
    after.close()
    keys = sorted(int(r["key"]) for r in read_topic(kafka.bootstrap, topic, 10))
    assert keys == list(range(10))


def test_a_kafka_sink_killed_in_its_first_batch_and_renamed_is_refused_at_its_first_write(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed in its very first batch (after its transactions committed, before any mark
    or failure row), the old name is unknown to the ledger, so the run's start check asks
    nothing; the renamed sink wrote the batch again (batch 0's records twice for a
    read_committed reader). Its first write to the topic now finds the old name in the
    records' headers at the topic's end, confirmed by that name's markers of the batch,
    and refuses before writing (:mod:`fanout_kafka.renamed`), also when another writer
    buried the batch under more than the first round's offsets in every partition (read
    further back), and when the read fails (tried again when the error may pass, refused
    when it cannot)."""
    from confluent_kafka import KafkaError, KafkaException, Producer
    from fanout_kafka import renamed as renamed_module
    from fanout_kafka.records import batch_headers

    pipeline, ledger = f"kren{uuid.uuid4().hex[:6]}", str(tmp_path / "ledger")
    # planned once: a crash replay keeps offsets/0's batchTimestampMs (test_hard_kill), so
    # the read's time bound is the crashed run's planning, not the restart's
    batch0 = BatchInfo(pipeline, 0, "q", batch_timestamp_ms=int(time.time() * 1000))
    with pytest.raises(BatchFailedError):  # the driver "dies" before the ledger mark
        FanOut(pipeline, MarkLost(ledger, "old"), [_sink(kafka, topic, "old")],
               retries=0).process(spark.range(0, 4), batch0)  # fmt: skip
    # a plain producer on the shared topic buries the batch before the restart: more
    # than the first round's 50 offsets in every partition (one record a record batch:
    # Tansu answers a partition's end as its last record batch's first offset + 1)
    plain = Producer({"bootstrap.servers": kafka.bootstrap, "batch.num.messages": 1})
    for n in range(3 * (renamed_module.TAIL_OFFSETS + 10)):
        plain.produce(topic, b"{}", str(100 + n).encode(), partition=n % 3)
    # ... and last, a vanished name's record of a later batch with no marker in this epoch
    # (an older epoch's: the headers carry none), which does not refuse: read past it
    plain.produce(topic, b"{}", b"99", partition=0,
                  headers=list(batch_headers(pipeline, "ghost", 9)))  # fmt: skip
    plain.flush(30)
    others = [99, *range(100, 100 + 3 * (renamed_module.TAIL_OFFSETS + 10))]

    def refusal(process: Any) -> BatchFailedError | None:
        renamed = FanOut(pipeline, ledger, [_sink(kafka, topic, "new")], retries=0)
        try:
            process(renamed)
        except BatchFailedError as exc:
            return exc
        finally:
            renamed.close()
        return None

    refused = refusal(lambda f: f.process(spark.range(0, 4), batch0))
    keys = sorted(int(r["key"]) for r in read_topic(kafka.bootstrap, topic, 4 + len(others)))
    assert keys == [*range(4), *others]  # before: 0-3 twice (the batch not seen; the
    # ghost's record alone in the first round, or the whole first round other writers')
    assert refused is not None and set(refused.failures) == {"new"}
    error = refused.failures["new"]
    assert isinstance(error, RenamedSinkError)
    text = str(error)
    assert f"topic '{topic}' holds batch 0 of sink 'old'" in text
    assert "rename the sink back to 'old' and restart" in text
    assert "cannot be removed from a topic" in text
    assert "remove batch" not in text  # the one way offered where a target can give it back

    # a read failing with an error that does not pass refuses at once, naming it; one
    # that may pass is tried again (before: a warning, and the batch written)
    real_tail = renamed_module.tail_writers
    calls: list[int] = []

    def failing(code: int, times: int) -> Any:
        def tail(*args: Any, **kwargs: Any) -> dict[str, int] | None:
            calls.append(code)
            if calls.count(code) <= times:
                raise KafkaException(KafkaError(code, "stand-in"))
            return real_tail(*args, **kwargs)

        return tail

    monkeypatch.setattr(renamed_module, "RETRY_PAUSE_S", 0.01)
    # (a right refused warns instead: the next test)
    monkeypatch.setattr(renamed_module, "tail_writers",
                        failing(KafkaError._UNKNOWN_PARTITION, 9))  # fmt: skip
    failed = refusal(lambda f: f.process(spark.range(0, 4), batch0))
    assert failed is not None and calls == [KafkaError._UNKNOWN_PARTITION]
    error = failed.failures["new"]
    assert type(error) is SinkWriteError
    assert f"cannot write batch 0, this sink's first write to topic '{topic}'" in str(error)
    assert "_UNKNOWN_PARTITION" in str(error) and "fix it" in str(error)
    monkeypatch.setattr(renamed_module, "tail_writers", failing(KafkaError._TRANSPORT, 2))
    again = refusal(lambda f: f.process(spark.range(0, 4), batch0))
    # tried 3 times, the last one read (and read again past the ghost)
    assert calls[1:] == [KafkaError._TRANSPORT] * 4
    assert again is not None and isinstance(again.failures["new"], RenamedSinkError)
    monkeypatch.setattr(renamed_module, "tail_writers", failing(KafkaError._TIMED_OUT, 9))
    gave_up = refusal(lambda f: f.process(spark.range(0, 4), batch0))
    assert calls[5:] == [KafkaError._TIMED_OUT] * 3
    assert gave_up is not None and type(gave_up.failures["new"]) is TransientSinkError
    assert "failed 3 times" in str(gave_up.failures["new"])
    monkeypatch.setattr(renamed_module, "tail_writers", real_tail)
    keys = sorted(int(r["key"]) for r in read_topic(kafka.bootstrap, topic, 4 + len(others)))
    assert keys == [*range(4), *others]  # nothing written by any of them

    # the way out it names: the old name completes the batch, then the new one goes on
    back = FanOut(pipeline, ledger, [_sink(kafka, topic, "old")], retries=0)
    assert back.process(spark.range(0, 4), batch0)["old"].already_written
    back.close()
    # the ghost's record does not refuse; the topic's end is read at the new name's first
    # write (twice: again past the ghost), not per batch
    reads: list[dict[str, int] | None] = []
    tail_writers = renamed_module.tail_writers

    def counted(*args: Any, **kwargs: Any) -> dict[str, int] | None:
        reads.append(tail_writers(*args, **kwargs))
        return reads[-1]

    monkeypatch.setattr(renamed_module, "tail_writers", counted)
    after = FanOut(pipeline, ledger, [_sink(kafka, topic, "new")], retries=0)
    after.process(spark.range(4, 6), BatchInfo(pipeline, 1, "q"))
    after.process(spark.range(6, 8), BatchInfo(pipeline, 2, "q"))
    after.close()
    assert reads == [{"ghost": 9}, {}]  # batch 1's first write only; ghost: no marker
    keys = sorted(int(r["key"]) for r in read_topic(kafka.bootstrap, topic, 8 + len(others)))
    assert keys == [*range(8), *others]


def test_the_topic_end_names_only_vanished_sinks_of_the_pipeline_from_the_batch_on(
    kafka: Broker, topic: str
) -> None:
    """:func:`fanout_kafka.renamed.tail_writers`, the first write's read: of the records at
    the end of each partition (read_committed), the sinks of this pipeline not configured
    now, each with its highest batch at or past the one to write. Another pipeline's sink,
    a configured one, a batch before it, records without fanout's headers or with a batch
    id that is no number, and what lies past the last ``depth`` offsets are not named."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient
    from fanout_kafka.records import batch_headers
    from fanout_kafka.renamed import CLOCK_SKEW_MS, tail_writers

    producer = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": topic})
    producer.init_transactions(30)
    producer.begin_transaction()
    sent = [("p", "gone", 3, 0), ("p", "gone", 4, 1), ("p", "early", 2, 2), ("q", "other", 9, 0),
            ("p", "kept", 7, 1), ("p", "deep", 9, 2)]  # fmt: skip
    for pipeline, sink, batch, partition in sent:
        headers = list(batch_headers(pipeline, sink, batch))
        producer.produce(topic, b"v", b"k", partition=partition, headers=headers)
    producer.produce(topic, b"v", b"k", partition=2)  # no headers
    producer.produce(topic, b"v", b"k", partition=2,
                     headers=[("fanout.pipeline", b"p"), ("fanout.sink", b"odd"),
                              ("fanout.batch_id", b"x")])  # fmt: skip
    producer.flush(30)
    producer.commit_transaction(30)
    config = {"bootstrap.servers": kafka.bootstrap}
    with AdminClient(config) as admin:
        found = tail_writers(admin, config, topic, "p", {"kept"}, 3, 10.0)
        assert found == {"gone": 4, "deep": 9}
        # partition 2 holds deep, the headerless record, odd, and the commit marker: the
        # last 3 offsets leave deep out
        assert tail_writers(admin, config, topic, "p", {"kept"}, 3, 10.0, depth=3) == {"gone": 4}
        # nothing named in those 3: read again from further back, to the log's start
        # (before: {}, deep buried)
        deep = tail_writers(admin, config, topic, "p", {"kept", "gone"}, 3, 10.0, depth=3)
        assert deep == {"deep": 9}
        # ... but not past a record stamped before the batch's planning (less the clocks'
        # skew): a batch planned after these records cannot be among them
        planned = int(time.time() * 1000) + CLOCK_SKEW_MS + 60_000
        assert tail_writers(admin, config, topic, "p", {"kept", "gone"}, 3, 10.0, depth=3,
                            since_ms=planned) == {}  # fmt: skip
        assert tail_writers(admin, config, topic, "p", {"kept", "gone"}, 3, 10.0, depth=3,
                            since_ms=planned - 600_000) == {"deep": 9}  # fmt: skip
        # a topic not there yet (made by the broker at the first produce): nothing named,
        # not an error that would refuse a new pipeline's first write
        assert tail_writers(admin, config, f"{topic}-later", "p", set(), 0, 10.0) == {}


def test_a_read_error_is_tried_again_only_when_it_may_pass(kafka: Broker, topic: str) -> None:
    """:func:`fanout_kafka.renamed.read_error_is_transient`: a broker not reachable (a real
    one: a port nothing listens on, as a broker stopped between the crash and the restart)
    or not answering in time, a leader or coordinator moving, is tried again; an
    authorization refused, a partition or topic unknown, a fatal error are not."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient
    from fanout_kafka.renamed import (
        read_error_is_transient,
        read_error_is_unauthorized,
        tail_writers,
    )

    stopped = {"bootstrap.servers": "127.0.0.1:9", "log_level": 0}
    with AdminClient(stopped) as admin, pytest.raises(KafkaException) as raised:
        tail_writers(admin, stopped, topic, "p", set(), 0, 0.5)
    assert raised.value.args[0].code() == KafkaError._TRANSPORT
    assert read_error_is_transient(raised.value.args[0])
    assert read_error_is_transient(TimeoutError())
    # a topic's metadata not yet on every broker (made, or deleted, a moment ago): Kafka
    # calls UNKNOWN_TOPIC_OR_PART retriable; tried again, a topic gone is seen gone
    # (nothing read, nothing to refuse) and a new one answers
    for code in (KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN,
                 KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.REQUEST_TIMED_OUT,
                 KafkaError.UNKNOWN_TOPIC_OR_PART):  # fmt: skip
        assert read_error_is_transient(KafkaError(code))
    for code in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError._UNKNOWN_PARTITION,
                 KafkaError._INVALID_ARG):  # fmt: skip
        assert not read_error_is_transient(KafkaError(code))
        # a right refused: the sink cannot tell (warned, written); the others refuse
        unauthorized = code == KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert read_error_is_unauthorized(KafkaError(code)) is unauthorized
    assert read_error_is_unauthorized(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED))
    assert read_error_is_transient(
        KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, retriable=True)
    )
    assert not read_error_is_transient(KafkaError(KafkaError._TRANSPORT, fatal=True))


def test_a_sink_writing_without_headers_in_a_pipeline_is_warned_at_its_open(
    kafka: Broker, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An old sink with ``headers: false`` names no writer in its records: renamed after it
    committed its first batch of an epoch and before that batch's mark, the new name's
    first write cannot find the batch (its markers are named by the old name, which
    nothing on the cluster lists) and writes it again. Not closable from the topic, so
    the sink is warned of it at every open in a pipeline (none with headers, nor outside
    a :class:`fanout.FanOut`, where no other sink's first write asks)."""
    import logging

    from fanout_kafka import KafkaSink

    from fanout import SinkContext

    def warned(headers: bool, sinks: tuple[str, ...]) -> list[str]:
        caplog.clear()
        sink = KafkaSink("plain", bootstrap_servers=kafka.bootstrap, topic=topic, key="id",
                         partitions=1, headers=headers)  # fmt: skip
        with caplog.at_level(logging.WARNING, logger="fanout.kafka"):
            sink.open(SinkContext("p", sinks=sinks))
        sink.close()
        return [r.getMessage() for r in caplog.records if "without fanout's headers" in r.message]

    (text,) = warned(False, ("plain", "other"))
    assert text.startswith(f"sink 'plain' writes its records to topic '{topic}' without ")
    assert "the sink that takes its place cannot find that batch in the topic and writes " \
        "it again" in text and "Rename it only when `fanout status` shows its last batch " \
        "marked, or set headers: true" in text  # fmt: skip
    assert warned(True, ("plain", "other")) == []
    assert warned(False, ()) == []


def test_a_sink_that_may_not_read_its_topic_is_warned_at_its_first_write_not_refused(
    spark: Any,
    kafka: Broker,
    topic: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Producer-only rights (WRITE and DESCRIBE on the topic, no READ) are common, and the
    sink needs no READ on its topic elsewhere (its markers are group offsets on the marker
    topic): the first write's read of the topic's end then fails with
    ``TOPIC_AUTHORIZATION_FAILED``. Refusing it would stop such a pipeline at the first
    batch of every run: the sink cannot tell, so it warns (sink, batch, topic, the error
    with secrets masked, the right to grant) and writes, as before the read refused its
    errors; the same for a vanished name's marker groups it may not read."""
    import logging

    from confluent_kafka import KafkaError, KafkaException
    from fanout_kafka import KafkaSink
    from fanout_kafka import renamed as renamed_module

    calls: list[str] = []

    def unauthorized(*args: Any, **kwargs: Any) -> dict[str, int] | None:
        calls.append(args[2])
        refused = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied to s3cr3t")
        raise KafkaException(refused)

    monkeypatch.setattr(renamed_module, "tail_writers", unauthorized)
    monkeypatch.setattr(KafkaSink, "secret_values", lambda self: ["s3cr3t"])
    pipeline, ledger = f"kacl{uuid.uuid4().hex[:6]}", str(tmp_path / "ledger")
    with caplog.at_level(logging.WARNING, logger="fanout.kafka"):
        fan = FanOut(pipeline, ledger, [_sink(kafka, topic, "writer")], retries=0)
        try:
            fan.process(spark.range(0, 3), BatchInfo(pipeline, 0, "q"))  # before: refused
            fan.process(spark.range(3, 5), BatchInfo(pipeline, 1, "q"))
        finally:
            fan.close()
    assert calls == [topic]  # the first write only, not tried again: it cannot pass
    keys = sorted(int(r["key"]) for r in read_topic(kafka.bootstrap, topic, 5))
    assert keys == list(range(5))
    (text,) = [r.getMessage() for r in caplog.records if "may not read" in r.getMessage()]
    assert text.startswith(f"sink 'writer', batch 0: cannot tell whether topic '{topic}' ")
    assert "TOPIC_AUTHORIZATION_FAILED" in text and "s3cr3t" not in text and "***" in text
    assert "grant the sink's principal READ on the topic" in text
