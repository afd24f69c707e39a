"""Error classes and settings of the partition writer, and how the driver turns partition
outcomes into one error: no broker needed."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pyarrow as pa
import pytest
from confluent_kafka import KafkaError, KafkaException
from fanout_kafka import KafkaAbortedError, KafkaBadRecordError, KafkaFencedError, KafkaSink
from fanout_kafka.failures import Rejected, TransactionTooLong
from fanout_kafka.records import BadRecord, Encoder, Record
from fanout_kafka.settings import WriterSettings, scope_of
from fanout_kafka.transaction import PartitionWriter, classify, is_retriable

from fanout.contract.batch import Batch, BatchInfo
from fanout.deadletters.delta import DeltaDeadLetters
from fanout.delta_tables.io import read_delta
from fanout.errors import SinkWriteError, TransientSinkError
from fanout.observe.secrets import SinkSecrets
from fanout.partitioned.outcome import PartitionFailure, PartitionOutcome


def kafka_error(code: int, **flags: bool) -> KafkaException:
    return KafkaException(KafkaError(code, "reason", **flags))


@pytest.mark.parametrize(
    ("exc", "kind", "transient"),
    [
        (kafka_error(KafkaError._FENCED, fatal=True), "fenced", False),
        (kafka_error(KafkaError.PRODUCER_FENCED), "fenced", False),
        (kafka_error(KafkaError.INVALID_PRODUCER_EPOCH), "fenced", False),
        (kafka_error(KafkaError._INCONSISTENT, fatal=True), "fatal", False),
        (kafka_error(KafkaError._TIMED_OUT, txn_requires_abort=True), "abortable", True),
        (kafka_error(KafkaError._TIMED_OUT, retriable=True), "retriable", True),
        (kafka_error(KafkaError.TOPIC_AUTHORIZATION_FAILED), "error", False),
        (Rejected([]), "bad_record", False),
        (TransactionTooLong(2.0, 1000, 3), "timeout", False),
        (TransientSinkError("veto", sink="s"), "aborted", True),
        (RuntimeError("bug"), "error", False),
    ],
)
def test_classify(exc: BaseException, kind: str, transient: bool) -> None:
    assert classify(exc) == (kind, transient)


def test_only_plain_retriable_errors_are_retried_in_the_task() -> None:
    assert is_retriable(KafkaError(KafkaError._TIMED_OUT, retriable=True))
    assert not is_retriable(KafkaError(KafkaError._TIMED_OUT, retriable=True, fatal=True))
    assert not is_retriable(
        KafkaError(KafkaError._TIMED_OUT, retriable=True, txn_requires_abort=True)
    )
    assert not is_retriable(KafkaError(KafkaError._FENCED))


APP_ID = "fanout/orders/events"


def settings(**overrides: object) -> WriterSettings:
    options: dict[str, object] = {
        "pipeline": "orders",
        "sink": "events",
        "scope": "orders",
        "bootstrap_servers": "127.0.0.1:1",
        "topic": "t",
        "producer": {"linger.ms": 50, "acks": "all", "partitioner": "consistent"},
        "transactional_id_prefix": "fanout-orders-events",
        "marker_topic": "__fanout_markers",
        "transaction_timeout_ms": 30000,
        "encoder": Encoder(("id",), None, (), (), 1000),
    }
    options.update(overrides)
    return WriterSettings(**options)  # type: ignore[arg-type]


def test_ids_groups_and_producer_settings() -> None:
    s = settings()
    assert s.transactional_id(3) == "fanout-orders-events-3"  # an explicit prefix
    assert s.marker_group(3) == "fanout/orders/events/p3"
    assert settings(scope="orders@e2").marker_group(0) == "fanout/orders@e2/events/p0"
    config = s.producer_config(3)
    assert config["transactional.id"] == "fanout-orders-events-3"
    assert config["transaction.timeout.ms"] == 30000
    assert config["message.timeout.ms"] == 30000
    assert config["enable.idempotence"] is True and config["acks"] == "all"
    assert config["linger.ms"] == 50 and config["partitioner"] == "consistent"
    assert settings(producer={}).producer_config(0)["partitioner"] == "murmur2_random"
    assert config["delivery.report.only.error"] is True
    assert config["enable.sparse.connections"] is False
    consumer = s.consumer_config(3)
    assert consumer["group.id"] == "fanout/orders/events/p3"
    assert consumer["isolation.level"] == "read_committed"
    assert "linger.ms" not in consumer
    assert consumer["enable.sparse.connections"] is False


def test_sparse_connections_can_be_turned_back_on_for_producer_and_consumer() -> None:
    s = settings(producer={"enable.sparse.connections": True})
    assert s.producer_config(0)["enable.sparse.connections"] is True
    assert s.consumer_config(0)["enable.sparse.connections"] is True


def test_scope_of_a_transaction_id() -> None:
    assert scope_of("fanout/orders/events", "events") == "orders"
    assert scope_of("fanout/orders@e1/events", "events") == "orders@e1"


def test_bad_record_without_dead_letter_fails_before_any_producer_exists() -> None:
    writer = PartitionWriter(settings(), partition=2, batch_id=5)
    rows = pa.RecordBatch.from_pylist([{"id": 1}, {"id": None}])
    outcome = writer.run([rows])
    failure = outcome.failure
    assert outcome.status == "failed" and failure is not None and failure.kind == "bad_record"
    assert outcome.rows == 2 and not failure.transient
    assert writer._producer is None  # nothing was sent, no transaction was begun
    assert failure.message.startswith(
        "partition 2 (transactional.id 'fanout-orders-events-2', topic 't'): 1 record(s) the "
        "topic cannot take and no 'dead_letter' target: null key: key column(s) 'id'"
    )


def test_a_bad_record_s_reason_is_masked_of_the_pipeline_s_secrets() -> None:
    """The reason (a dead letter's ``fanout.error``, the journal's, the failure's) may
    quote a value that is another sink's password: masked on the executor already."""
    masked = settings(secrets=SinkSecrets(("own-pw-31",), ("Other-sink-pw-2207",)))
    rows = pa.RecordBatch.from_pylist([{"id": None, "note": "Other-sink-pw-2207 own-pw-31"}])
    failure = PartitionWriter(masked, partition=0, batch_id=5).run([rows]).failure
    assert failure is not None
    assert failure.message.endswith(
        'null key: key column(s) \'id\' are null in row {"id": null, "note": "*** ***"}'
    )


def test_empty_partition_needs_no_transaction() -> None:
    writer = PartitionWriter(settings(), partition=0, batch_id=5)
    assert writer.run([]) == PartitionOutcome(0, "empty")
    assert writer._producer is None


class PrepareWatch:
    """Stands in for the broker's side of a writer: ``prepare`` and ``commit`` record what
    they were given, and ``close`` when it ran; ``prepare`` answers once released."""

    def __init__(
        self, writer: PartitionWriter, answer: bool = False, error: Exception | None = None
    ) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.committed: list[Any] = []
        self.events: list[str] = []
        self.answer, self.error = answer, error
        self.writer, self._close = writer, writer.close
        writer.prepare = self.prepare  # type: ignore[method-assign]
        writer.commit = self.commit  # type: ignore[method-assign]
        writer.close = self.close  # type: ignore[method-assign]

    def prepare(self) -> bool:
        self.started.set()
        self.release.wait(10)
        time.sleep(0.05)  # the broker's round trips
        self.writer._producer = "a producer"  # what close() must release
        self.events.append("prepared")
        if self.error is not None:
            raise self.error
        return self.answer

    def commit(self, records: list[Record], bad: list[BadRecord]) -> tuple[int, list[BadRecord]]:
        self.committed.append(([r.key for r in records], [b.record.key for b in bad]))
        return len(records), bad

    def close(self) -> None:
        self.release.set()  # the broker answers late: close() must wait for it
        self._close()
        self.events.append("closed")


def batches(*ids: int | None) -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pylist([{"id": i}]) for i in ids]


def test_the_producer_is_prepared_while_the_rest_of_the_partition_encodes() -> None:
    writer = PartitionWriter(settings(), partition=1, batch_id=5)
    watch = PrepareWatch(writer)
    seen: list[bool] = []

    def input_() -> Iterator[pa.RecordBatch]:
        first, second = batches(1, 2)
        yield first
        # the next batch comes only once the broker's round trips are under way
        seen.append(watch.started.wait(10))
        watch.release.set()
        yield second

    result = writer.run(input_())
    assert seen == [True]
    assert result == PartitionOutcome(1, "committed", 2, 2)
    assert watch.committed == [([b"1", b"2"], [])]
    assert watch.events == ["prepared", "closed"] and writer._producer is None


def test_a_partition_already_written_is_skipped_on_the_early_answer() -> None:
    writer = PartitionWriter(settings(), partition=0, batch_id=5)
    watch = PrepareWatch(writer, answer=True)
    watch.release.set()
    assert writer.run(batches(1, 2, 3)) == PartitionOutcome(0, "skipped", 3)
    assert watch.events == ["prepared", "closed"] and watch.committed == []


def test_the_early_prepares_error_is_the_partitions_failure() -> None:
    # a fenced attempt first reads the marker (did its fencer commit the batch?): no broker
    # answers at 127.0.0.1:1, so that read fails after operation_timeout_s (60 s by default)
    writer = PartitionWriter(settings(operation_timeout_s=0.5, retries=1), partition=3, batch_id=5)
    fenced = kafka_error(KafkaError.PRODUCER_FENCED)
    watch = PrepareWatch(writer, error=fenced)
    watch.release.set()
    result = writer.run(batches(1, 2))
    assert result.status == "failed" and result.rows == 2
    assert result.failure is not None and result.failure.kind == "fenced"
    assert not result.failure.transient and watch.committed == []
    assert result.failure.message == (
        "partition 3 (transactional.id 'fanout-orders-events-3', topic 't'): fenced: another "
        "writer took over transactional id 'fanout-orders-events-3' (a newer attempt of this "
        "partition, a task of the query a checkpoint reset replaced, still running, or "
        "another pipeline using the same transactional_id_prefix); this attempt's "
        "transaction is aborted and none of it is visible (PRODUCER_FENCED: reason)"
    )
    assert watch.events == ["prepared", "closed"] and writer._producer is None


def test_a_bad_record_after_the_first_batch_fails_the_partition_once_prepare_ended() -> None:
    writer = PartitionWriter(settings(), partition=2, batch_id=5)
    watch = PrepareWatch(writer)
    result = writer.run(batches(1, None))
    assert result.status == "failed" and result.rows == 2
    assert result.failure is not None and result.failure.kind == "bad_record"
    assert watch.events == ["prepared", "closed"] and writer._producer is None
    assert watch.committed == []


def test_input_failing_while_the_producer_is_prepared_releases_it() -> None:
    writer = PartitionWriter(settings(), partition=0, batch_id=5)
    watch = PrepareWatch(writer)

    def input_() -> Iterator[pa.RecordBatch]:
        yield from batches(1)
        assert watch.started.wait(10)
        raise OSError("the shuffle read failed")

    with pytest.raises(OSError, match="the shuffle read failed"):
        writer.run(input_())
    assert watch.events == ["prepared", "closed"] and writer._producer is None
    assert watch.committed == []


def outcome(partition: int, status: str, kind: str | None = None) -> PartitionOutcome:
    transient = kind in ("abortable", "retriable", "aborted")
    failure = None if kind is None else PartitionFailure(kind, f"p{partition}: {kind}", transient)
    return PartitionOutcome(partition, status, failure=failure)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kinds", "error_class"),
    [
        (["abortable", "fenced"], KafkaFencedError),
        (["bad_record", "abortable"], KafkaBadRecordError),
        (["abortable", "retriable"], KafkaAbortedError),
        (["aborted"], KafkaAbortedError),
        (["error", "abortable"], SinkWriteError),
    ],
)
def test_the_driver_raises_one_error_naming_sink_batch_and_every_partition(
    kinds: list[str], error_class: type[Exception]
) -> None:
    sink = KafkaSink("events", bootstrap_servers="h:1", topic="t")
    failed = [outcome(i + 1, "failed", k) for i, k in enumerate(kinds)]
    everything = [outcome(0, "committed"), *failed]
    batch = Batch(None, BatchInfo("orders", 7), "events", "fanout/orders/events")
    error = sink.partition_failure(batch, failed, everything)
    assert type(error) is error_class
    assert sink.is_transient(error) == (error_class is KafkaAbortedError)
    text = str(error)
    assert text.startswith(
        f"sink 'events', batch 7: {len(kinds)} of {len(everything)} partition(s) failed; "
        "partitions holding the batch (skipped on replay): [0]"
    )
    for i, k in enumerate(kinds):
        assert f"  - p{i + 1}: {k}" in text


class RefusingWriter(PartitionWriter):
    """A partition whose first transaction the broker refuses one record of; records what
    the Delta dead-letter table held when each transaction ran (no broker needed)."""

    def __init__(self, path: str, refuse: Record) -> None:
        dead = DeltaDeadLetters(path)
        info = BatchInfo("orders", 7)
        super().__init__(settings(dead_letters=dead, info=info, txn_app_id=APP_ID), 1, 7)
        self.path, self.refuse = path, refuse
        self.seen: list[tuple[int, int]] = []  # (records in the transaction, letters in Delta)

    def _new_producer(self, *, reports: bool = False) -> None:
        self.seen.append((-1, int(reports)))  # a producer for the retry (reporting: journal)

    def _marker_says_written(self) -> bool:
        return False  # no other attempt committed the partition meanwhile

    def _letters(self) -> int:
        return len(read_delta(self.path)) if (Path(self.path) / "_delta_log").exists() else 0

    def _transaction(self, records: list[Record], bad: list[BadRecord]) -> int:
        self.seen.append((len(records), self._letters()))
        if self.refuse in records:
            raise Rejected([BadRecord(self.refuse, "rejected by the broker: too large")])
        return len(records)  # committed (with the journal naming ``bad``)


def test_refused_records_reach_a_delta_dead_letter_table_after_the_commit(
    tmp_path: Path,
) -> None:
    ok, refused = Record(b"1", b"{}", []), Record(b"2", b"{big}", [])
    writer = RefusingWriter(str(tmp_path / "dlq"), refused)
    assert writer.commit([ok, refused], []) == (1, [BadRecord(refused, ANY)])
    # neither transaction saw a letter parked: the letters follow the commit; the retry's
    # producer reports deliveries (the journal's offset)
    assert writer.seen == [(2, 0), (-1, 1), (1, 0)]
    again = RefusingWriter(str(tmp_path / "dlq"), refused)  # a replay of the partition
    again.commit([ok, refused], [])
    rows = read_delta(str(tmp_path / "dlq")).to_pylist()
    facts = [json.loads(r["details"]) for r in rows]
    assert [
        (r["batch_id"], r["partition"], f["key"], f["value"])
        for r, f in zip(rows, facts, strict=True)
    ] == [(7, 1, "2", "{big}")]
    reason = "rejected by the broker: too large"
    assert (rows[0]["reason"], rows[0]["source"]) == (reason, "refused")


class IdleProducer:
    """A producer with nothing in flight."""

    def begin_transaction(self) -> None:
        pass

    def flush(self, timeout: float) -> int:
        return 0


class EpochBumpedWriter(PartitionWriter):
    """A commit that fails like a coordinator's timeout abort: INVALID_PRODUCER_EPOCH."""

    def __init__(self, timeout_ms: int, took_s: float) -> None:
        super().__init__(settings(transaction_timeout_ms=timeout_ms), 0, 7)
        self.took_s = took_s

    def _retrying(self, what: str, operation: Any) -> Any:
        if what == "begin the transaction":
            return None
        time.sleep(self.took_s)
        raise kafka_error(KafkaError.INVALID_PRODUCER_EPOCH)

    def _produce_all(self, *args: Any) -> list[BadRecord]:
        return []

    def _check_deliveries(self, failures: Any) -> None:
        pass

    def _abort(self) -> None:
        return None


def test_an_epoch_error_after_the_timeout_is_a_too_long_transaction_not_fencing() -> None:
    writer = EpochBumpedWriter(timeout_ms=100, took_s=0.15)
    writer._producer = IdleProducer()
    with pytest.raises(TransactionTooLong) as info:
        writer._transaction([Record(b"1", b"{}", [])], [])
    writer.close()
    assert (info.value.timeout_ms, info.value.records) == (100, 1)
    assert classify(info.value) == ("timeout", False)
    text = writer._describe(info.value, "timeout")
    assert "longer than transaction_timeout_ms=100" in text and "fenced" in text


def test_an_epoch_error_within_the_timeout_stays_fencing() -> None:
    writer = EpochBumpedWriter(timeout_ms=60_000, took_s=0.0)
    writer._producer = IdleProducer()
    with pytest.raises(KafkaException) as info:
        writer._transaction([Record(b"1", b"{}", [])], [])
    writer.close()
    assert classify(info.value) == ("fenced", False)
