"""The ``kafka`` dead-letter kind: a topic of the Kafka sink's own cluster.

``dead_letter = "kafka:<topic>"`` on a Kafka sink. Records the sink's topic cannot take are
produced there in the partition's own transaction (:mod:`fanout_kafka.transaction`). Rows
failing the sink's *route* are written by fanout through :meth:`KafkaDeadLetters.write`:
one transaction with a marker of its own (``<marker group>#route``), skipped on a replay
that finds it. Each becomes a record with no key, the row before the route as JSON, the
batch headers plus ``fanout.error`` (the reason), ``fanout.topic``, ``fanout.record_bytes``
and, when known, ``fanout.column`` and ``fanout.value``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from fanout.errors import SinkWriteError, TransientSinkError
from fanout_kafka.records import Record, dead_letter_headers
from fanout_kafka.settings import WriterSettings
from fanout_kafka.transaction import PartitionWriter
from fanout_kafka.values import json_bytes

if TYPE_CHECKING:
    from fanout.contract.batch import Batch
    from fanout.contract.dead_letters import DeadLetter, Source

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
        return f"Kafka topic {self.topic}"

    def records(self, batch: Batch, letters: Sequence[DeadLetter]) -> list[Record]:
        """The letters as dead-letter records."""
        settings = self.settings_of(batch)
        records = []
        for letter in letters:
            row = json_bytes(dict(letter.row or {}))
            base = Record(None, row, list(settings.encoder.headers))
            headers = dead_letter_headers(base, letter.reason, settings.topic)
            if letter.column is not None:
                headers.append(("fanout.column", letter.column.encode()))
            if letter.value is not None:
                headers.append(("fanout.value", str(letter.value).encode()))
            records.append(Record(None, base.value, headers))
        return records

    def write(
        self,
        batch: Batch,
        letters: Sequence[DeadLetter],
        *,
        source: Source,
        partition: int | None = None,
    ) -> int:
        """One transaction to the topic with a marker of its own (``#<source>``); skipped
        when the marker says this batch's letters are there already."""
        if not letters:
            return 0
        settings = self.settings_of(batch)
        settings = replace(
            settings,
            sink=f"{settings.sink}#{source}",
            topic=self.topic,
            transactional_id_prefix=f"{settings.transactional_id_prefix}#{source}",
            dead_topic=None,
            dead_letters=None,
        )
        outcome = PartitionWriter(settings, partition or 0, batch.batch_id).write(
            self.records(batch, letters), []
        )
        if outcome.status == "failed":
            error = TransientSinkError if outcome.transient else SinkWriteError
            raise error(
                f"the dead letters could not be written to topic {self.topic!r}: {outcome.error}",
                sink=batch.sink_name,
                batch_id=batch.batch_id,
            )
        return len(letters)

    def __repr__(self) -> str:
        return f"<KafkaDeadLetters {self.topic!r}>"
