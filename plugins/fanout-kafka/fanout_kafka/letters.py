"""The driver's count of the letters a batch's committed partitions named in their journals
(:meth:`fanout_kafka.KafkaSink.holds_batch`, with a dead-letter target outside the cluster).

Every transaction with letters commits their count and batch for its partition's refused
group (:func:`fanout_kafka.journal.pack_refused`), beside its journal's offset for the
letters group. One request round reads every partition's two groups: a count of this batch
is the partition's letters; a count of another batch says the journal the letters group
points at is that batch's (they were committed together), so none of this one; no letters
group, no letters. Only a journal with no count at all (committed by the version before,
which counted only a dead-letter topic's letters) is read, all of them by one consumer; one
gone (the marker topic's retention or compaction removed it while the group offsets live
on) is :attr:`NamedLetters.unknown`. (The one journal this misdates: one the version before
wrote for a Delta table after a count it committed for a dead-letter topic, the target
changed within an epoch, is taken as that count's batch.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fanout.deadletters.held import refused_rows_held
from fanout.ledger.gaps import ledger_note, skip_command
from fanout.observe.secrets import redact
from fanout_kafka import journal
from fanout_kafka.driver_admins import admin_config
from fanout_kafka.membership import read_offsets

if TYPE_CHECKING:
    from fanout.contract.dead_letters import DeadLetterTarget
    from fanout_kafka.settings import WriterSettings

log = logging.getLogger("fanout_kafka")

_JUMP = 256
"""Journals closer than this many offsets are reached by reading on, not by a new fetch."""


@dataclass(frozen=True)
class NamedLetters:
    """What a batch's committed partitions named of their letters.

    :param counted: the letters of the partitions whose count or journal was read.
    :param unknown: ``(partition, position)`` of each partition whose journal, committed
        without a count, is gone: it may have named letters of the batch.
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
    groups += [settings.refused_group(p) for p in range(partitions)]
    config = admin_config(settings.producer, settings.bootstrap_servers)
    offsets = read_offsets(config, settings.marker_topic, groups, timeout)
    positions, counts = offsets[:partitions], offsets[partitions:]
    counted = sum(journal.unpack_refused(count, batch_id) for count in counts)
    to_read = {p: position for p, position in enumerate(positions)
               if position >= 0 and counts[p] < 0}  # fmt: skip
    if not to_read:
        return NamedLetters(counted)
    found = read_journals(settings, to_read, timeout)
    unknown = []
    for p, position in sorted(to_read.items()):
        value = found[p]
        if value is None:
            unknown.append((p, position))
            continue
        journal_batch, letters = journal.summary(value)
        if journal_batch == batch_id:
            counted += letters
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


def letters_waiting(
    settings: WriterSettings,
    dead: DeadLetterTarget,
    pipeline: str,
    epoch: int,
    batch_id: int,
    partitions: int,
    name: str,
    *,
    topic: str | None,
    secrets: Sequence[str],
) -> int:
    """How many letters the batch's committed partitions (``0 .. partitions-1``, of sink
    ``name``) named in their journals that the dead-letter target ``dead`` (not a topic: a
    topic's are in the transactions) does not hold: the task parks them after its commit,
    and one killed in between leaves them to the batch's replay. A target that cannot say
    what it holds (no ``read_rows``), or whose read fails, holds none. The letters are
    counted from the partitions' refused groups, read in one request round, and a journal
    (one consumer for all) only where its commit recorded no count (:func:`named_letters`);
    the target is read only when they named letters. Such a journal gone counts as one
    letter waiting (logged, naming ``topic``, the sink's; ``secrets`` masked)."""
    found = named_letters(settings, batch_id, partitions)
    named = found.counted
    if not named and not found.unknown:
        return 0
    kept = refused_rows_held(dead, pipeline, name, (epoch, batch_id),
                             secrets=secrets, logger=log)  # fmt: skip
    if not found.unknown:
        return max(named - kept, 0)
    _log_journals_gone(settings, dead, pipeline, epoch, batch_id, found.unknown,
                       topic=topic, secrets=secrets)  # fmt: skip
    return max(named - kept, 0) + len(found.unknown)


def _log_journals_gone(
    settings: WriterSettings,
    dead: DeadLetterTarget,
    pipeline: str,
    epoch: int,
    batch_id: int,
    gone: Sequence[tuple[int, int]],
    *,
    topic: str | None,
    secrets: Sequence[str],
) -> None:
    """Say which partitions' letters cannot be counted, and what the user can do."""
    where = dead.describe()
    parts = ", ".join(f"{p} (offset {position})" for p, position in gone)
    log.warning(
        "sink %r, batch %d: the letters journal of partition(s) %s on marker topic %r is "
        "gone (the topic's retention or compaction removed it; the partitions' offsets "
        "still point at it), and their commits recorded no letter count (fanout before "
        "a count for a Delta table): cannot tell whether they set rows of this batch aside "
        "for %s. Counted as one waiting letter each, so the batch reads as held in part: "
        "a new epoch is refused and `fanout recover` records no lost mark. A replay "
        "cannot write them either (it rebuilds them from the journal). Every partition "
        "committed its rows to %r: if you accept that those partitions' refused rows of "
        "batch %d may be missing from %s, record the batch for this sink with `%s`%s "
        "and restart the query.",
        settings.sink, batch_id, parts, settings.marker_topic, redact(where, secrets),
        topic, batch_id, redact(where, secrets),
        skip_command(settings.ledger, pipeline, settings.sink, batch_id, epoch),
        ledger_note(settings.ledger),
    )  # fmt: skip


__all__ = ["NamedLetters", "letters_waiting", "named_letters", "read_journals"]
