"""The driver's count of the letters a batch's committed partitions named in their journals
(:meth:`fanout_kafka.KafkaSink.holds_batch`, with a dead-letter target outside the cluster).

One request round reads every partition's letters group (where its last journal is) and
journaled group (:func:`fanout_kafka.journal.pack_journaled`: that journal's batch and
letter count, committed with it). A partition with no journal named none; one whose
journaled offset was committed with the journal the letters group points at is counted
from it. Only the rest (journals written by the version before, which committed no count)
are read, all with one consumer.

A journal can be gone: the marker topic's retention (``retention.ms``, ``retention.bytes``)
or compaction removed it while the group offsets, kept by ``offsets.retention.minutes``,
still point at it. Whether it was this batch's is then told, where the facts allow, by
its position: journals are produced while their batch is written, and a sink writes its
batches in order, so a journal before another partition's journal of an earlier batch is
an earlier batch's too (none of this batch). Otherwise its partition is
:attr:`NamedLetters.unknown`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fanout_kafka import journal
from fanout_kafka.driver_admins import admin_config
from fanout_kafka.membership import read_offsets

if TYPE_CHECKING:
    from fanout_kafka.settings import WriterSettings

_JUMP = 256
"""Journals closer than this many offsets are reached by reading on, not by a new fetch."""


@dataclass(frozen=True)
class NamedLetters:
    """What a batch's committed partitions named of their letters.

    :param counted: the letters of the partitions whose journal could be counted.
    :param unknown: ``(partition, position)`` of each partition whose journal is gone
        and whose count cannot be told otherwise: it may have named letters of the batch.
    :param read: how many journals were read (the rest were counted from the offsets).
    """

    counted: int
    unknown: tuple[tuple[int, int], ...] = ()
    read: int = 0


def named_letters(settings: WriterSettings, batch_id: int, partitions: int) -> NamedLetters:
    """The letters partitions ``0 .. partitions-1`` named in their journals of batch
    ``batch_id`` (each holds the batch: the caller read their markers)."""
    timeout = settings.operation_timeout_s
    groups = [settings.letters_group(p) for p in range(partitions)]
    groups += [settings.journaled_group(p) for p in range(partitions)]
    config = admin_config(settings.producer, settings.bootstrap_servers)
    offsets = read_offsets(config, settings.marker_topic, groups, timeout)
    positions, counts = offsets[:partitions], offsets[partitions:]
    counted, earlier, to_read = 0, [], {}
    for p, position in enumerate(positions):
        if position < 0:
            continue  # no journal ever
        known = journal.journaled_letters(counts[p], position, batch_id)
        if known is None:
            to_read[p] = position
        elif known:
            counted += known
        else:
            earlier.append(position)
    if not to_read:
        return NamedLetters(counted)
    found = read_journals(settings, to_read, timeout)
    gone = []
    for p, position in sorted(to_read.items()):
        value = found[p]
        if value is None:
            gone.append((p, position))
            continue
        journal_batch, letters = journal.summary(value)
        if journal_batch == batch_id:
            counted += letters
        else:
            earlier.append(position)
    unknown = []
    for p, position in gone:
        if any(e > position for e in earlier):
            continue  # before an earlier batch's journal: an earlier batch's
        unknown.append((p, position))
    return NamedLetters(counted, tuple(unknown), read=len(to_read))


def read_journals(
    settings: WriterSettings, positions: Mapping[int, int], timeout_s: float
) -> dict[int, bytes | None]:
    """Per partition, the value of the journal at its position on partition 0 of the
    marker topic, or ``None`` when that record is gone (below the log's start: out of
    range; or skipped, the next record read being a later one). Read by one consumer, in
    position order.

    :raises KafkaException: a read error, or no record within ``timeout_s``.
    :raises RuntimeError: the record at a position is not that partition's journal.
    """
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    topic = settings.marker_topic
    wanted = sorted(set(positions.values()))
    records: dict[int, tuple[bytes | None, bytes | None] | None] = {}
    consumer = Consumer(
        {
            **settings.consumer_config(0),
            # committed offsets point at them: they are committed, and read_uncommitted
            # does not wait for other open transactions (the last stable offset)
            "isolation.level": "read_uncommitted",
            "auto.offset.reset": "error",
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, wanted[0])])
        at, last = 0, wanted[0] - 1
        deadline = time.monotonic() + timeout_s
        while at < len(wanted):
            message = consumer.poll(0.2)
            if message is None:
                if time.monotonic() >= deadline:
                    raise KafkaException(
                        KafkaError(
                            KafkaError._TIMED_OUT,
                            f"the letters journal at offset {wanted[at]} of {topic!r} was not "
                            f"read within {timeout_s:.0f} s",
                        )
                    )
                continue
            error = message.error()
            if error is not None:
                if error.code() not in (KafkaError.OFFSET_OUT_OF_RANGE,
                                        KafkaError._AUTO_OFFSET_RESET):  # fmt: skip
                    raise KafkaException(error)
                records[wanted[at]] = None  # the log starts after it (retention)
                at += 1
            else:
                offset = message.offset()
                if offset is None or offset <= last:
                    continue  # fetched before the last jump
                while at < len(wanted) and wanted[at] < offset:
                    records[wanted[at]] = None  # skipped: removed (compaction)
                    at += 1
                if at < len(wanted) and wanted[at] == offset:
                    records[offset] = (message.key(), message.value())
                    at += 1
                last = offset
            if at < len(wanted) and (error is not None or wanted[at] > last + _JUMP):
                consumer.assign([TopicPartition(topic, 0, wanted[at])])
                last = wanted[at] - 1
            deadline = time.monotonic() + timeout_s
    finally:
        consumer.close()
    found: dict[int, bytes | None] = {}
    for p, position in positions.items():
        record = records[position]
        if record is None:
            found[p] = None
            continue
        key, value = record
        if key != settings.letters_group(p).encode() or value is None:
            raise RuntimeError(
                f"the letters journal at offset {position} of {topic!r} is not partition {p}'s"
            )
        found[p] = value
    return found


__all__ = ["NamedLetters", "named_letters", "read_journals"]
