"""The ``kafka`` dead-letter kind: a topic of the Kafka sink's own cluster.

``dead_letter = "kafka:<topic>"`` on a Kafka sink. Records the sink's topic cannot take are
produced there in the partition's own transaction (:mod:`fanout_kafka.transaction`). Rows
failing the sink's *route* are written by fanout through :meth:`KafkaDeadLetters.write`:
one transaction with a marker of its own (``<marker group>#route``), skipped on a replay
that finds it. Each becomes a record with no key, the row before the route as JSON, the
batch headers plus ``fanout.error`` (the reason), ``fanout.topic``, ``fanout.record_bytes``
and, when known, ``fanout.column`` and ``fanout.value``.

The same transaction commits the route's fingerprint as the offset of group
``<that marker group>.route``: a replay finding the batch's letters there under another
route is refused before anything is written (:mod:`fanout.deadletters.route_letters`). The
offset holds the fingerprint only, so the refusal names the old route by fingerprint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from fanout.deadletters.route_letters import check_unchanged
from fanout.errors import SinkWriteError, TransientSinkError
from fanout_kafka.records import COLUMN_HEADER, VALUE_HEADER, Record, dead_letter_headers
from fanout_kafka.settings import KAFKA_TARGET, WriterSettings
from fanout_kafka.values import json_bytes

if TYPE_CHECKING:
    from fanout.contract.batch import Batch
    from fanout.contract.dead_letters import DeadLetter, RouteStamp, Source
    from fanout.contract.earlier_letters import HeldLetters

KAFKA = "kafka"


class KafkaDeadLetters:
    """A dead-letter topic of a Kafka sink (configuration only).

    :param topic: the dead-letter topic.
    :param settings_of: the sink's per-batch writer settings (``KafkaSink.settings``).
    """

    kind = KAFKA

    def __init__(self, topic: str, settings_of: Callable[[Batch], WriterSettings]) -> None:
        self.topic = topic
        self.settings_of = settings_of

    def describe(self) -> str:
        """``Kafka topic <topic>``."""
        return f"{KAFKA_TARGET}{self.topic}"

    def records(self, batch: Batch, letters: Sequence[DeadLetter]) -> list[Record]:
        """The letters as dead-letter records."""
        settings = self.settings_of(batch)
        records = []
        for letter in letters:
            row = json_bytes(dict(letter.row or {}))
            base = Record(None, row, list(settings.encoder.headers))
            headers = dead_letter_headers(base, letter.reason, settings.topic)
            if letter.column is not None:
                headers.append((COLUMN_HEADER, letter.column.encode()))
            if letter.value is not None:
                headers.append((VALUE_HEADER, str(letter.value).encode()))
            records.append(_fitting(Record(None, base.value, headers), settings.letter_limit))
        return records

    def write(
        self,
        batch: Batch,
        letters: Sequence[DeadLetter],
        *,
        source: Source,
        partition: int | None = None,
        route: RouteStamp | None = None,
    ) -> int:
        """One transaction to the topic with a marker of its own (``#<source>``); skipped
        when the marker says this batch's letters are there already. With ``route``, the
        transaction also commits its fingerprint, and letters of this batch already there
        under another route refuse the write."""
        settings = self._writer(batch, source, route)
        if route is not None:
            self._check_route(batch, route, settings, partition or 0)
        if not letters:
            return 0
        from fanout_kafka.transaction import PartitionWriter  # confluent-kafka: when used

        outcome = PartitionWriter(settings, partition or 0, batch.batch_id).write(
            self.records(batch, letters), []
        )
        failure = outcome.failure
        if failure is not None:
            error = TransientSinkError if failure.transient else SinkWriteError
            raise error(
                f"the dead letters could not be written to topic {self.topic!r}: {failure.message}",
                sink=batch.sink_name,
                batch_id=batch.batch_id,
            )
        return len(letters)

    def _writer(self, batch: Batch, source: Source, route: RouteStamp | None) -> WriterSettings:
        """The settings of the writer of ``source``'s letters: its own transactional ids
        and marker (``#<source>``), the topic this one."""
        settings = self.settings_of(batch)
        return replace(
            settings,
            sink=f"{settings.sink}#{source}",
            topic=self.topic,
            transactional_id_prefix=f"{settings.transactional_id_prefix}#{source}",
            dead_topic=None,
            dead_letters=None,
            route_stamp=None if route is None else int(route.fingerprint, 16),
        )

    def letters_held(self, batch: Batch) -> HeldLetters:
        """What this topic holds of ``batch``'s letters (asked when the sink's
        ``dead_letter`` moved since an attempt of the batch: :mod:`fanout.deadletters.moved`):
        its route letters when their writer's marker holds the batch (with the route's
        fingerprint when the batch is the last one written there; a later batch's leaves it
        unknown). Two offset reads. The sink's own refused records are produced in its
        partitions' transactions, which a replay never produces again (no partition whose
        marker holds the batch writes, and no journal names them): none is reported."""
        from fanout.contract.earlier_letters import HeldLetters

        settings = self._writer(batch, "route", None)
        marker = _committed(settings, settings.marker_group(0), batch)
        if marker < batch.batch_id + 1:
            return HeldLetters(self.describe())
        stamp = -1
        if marker == batch.batch_id + 1:
            stamp = _committed(settings, settings.route_group(0), batch)
        fingerprint = None if stamp < 0 else f"{stamp:015x}"
        return HeldLetters(self.describe(), route=True, fingerprint=fingerprint)

    def _check_route(
        self, batch: Batch, route: RouteStamp, settings: WriterSettings, partition: int
    ) -> None:
        """Refuse when this batch's letters are in the topic under another route: the
        letters' marker says this batch is the last one written (a later batch's letters
        leave this one's route unknown: no refusal) and the route group's offset holds
        another fingerprint (none: written before fanout recorded one)."""
        if _committed(settings, settings.marker_group(partition), batch) != batch.batch_id + 1:
            return
        stamp = _committed(settings, settings.route_group(partition), batch)
        recorded = None if stamp < 0 else f"{stamp:015x}"
        check_unchanged(batch, route, fingerprint=recorded, recorded=None, target=self.describe())

    def __repr__(self) -> str:
        return f"<KafkaDeadLetters {self.topic!r}>"


def _fitting(record: Record, limit: int) -> Record:
    """``record``, or, over ``limit`` (the producer would refuse it and fail the batch),
    without its value and with the ``fanout.value`` header cut to a preview."""
    if record.size <= limit:
        return record
    headers = [
        (name, value[:_PREVIEW] + b"..." if name == VALUE_HEADER and len(value) > _PREVIEW
         else value)
        for name, value in record.headers
    ]  # fmt: skip
    return Record(record.key, None, headers)


_PREVIEW = 200


def _committed(settings: WriterSettings, group: str, batch: Batch) -> int:
    """The offset ``group`` committed on the marker topic (negative: none)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    config = settings.consumer_config(0)
    config["group.id"] = group
    consumer = Consumer(config)
    try:
        (found,) = consumer.committed(
            [TopicPartition(settings.marker_topic, 0)], timeout=settings.operation_timeout_s
        )
        if found.error:
            raise KafkaException(found.error)
        return int(found.offset)
    except KafkaException as exc:
        raise TransientSinkError(
            f"the route letters' marker {group!r} could not be read from topic "
            f"{settings.marker_topic!r}: {exc}",
            sink=batch.sink_name,
            batch_id=batch.batch_id,
        ) from exc
    finally:
        consumer.close()
