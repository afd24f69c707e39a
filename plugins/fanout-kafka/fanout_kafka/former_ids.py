"""The transactional id prefix a sink last wrote under, recorded on the marker topic, so
that a run under another ``transactional_id_prefix`` fences the former ids before it reads
its markers.

A new transactional id does not fence an old one. Killed in the middle of a batch (one
partition's transaction left open, another committed) and restarted with
``transactional_id_prefix`` changed, the replay initialised only the new ids: on the Tansu
broker the open transaction, never ended, held back the committed partition's marker
(:mod:`fanout_kafka.abandoned`), so the replay read it unmarked and wrote the partition
again (``tests/test_prefix_changed.py``: its 5 records twice); on Kafka a task of the old
run still alive could commit its partition beside the replay's. The sink on the default
prefix fenced the former *default* ids already (:func:`fanout_kafka.abandoned.
fence_legacy_transactions`); a prefix the user sets could not be known.

So the driver records the prefix: one record on partition 0 of the marker topic, keyed by
the group ``fanout/<scope>/<sink>/ids`` and holding the prefix, and that group's offset
pointing at it (as a letters journal is found, :mod:`fanout_kafka.journal`). At the first
batch of each ``open()``, before the markers are read: the group's offset is read (one
request); when it points at a record of another prefix, that prefix's ids are initialised
(fenced, their open transactions aborted) and the prefix now used is recorded (one record
and one offset commit); when it names this prefix, nothing more. A record gone (the marker
topic's retention) or never written (a sink of an older fanout) is written anew: a former
prefix it held cannot be fenced, as before.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fanout_kafka.settings import WriterSettings


def ids_group(scope: str, sink: str) -> str:
    """The group whose offset points at the record of sink ``sink``'s prefix in
    ``scope``: ``fanout/<scope>/<sink>/ids`` (no marker, span or topic-id group's name)."""
    return f"fanout/{scope}/{sink}/ids"


def recorded_prefix(settings: WriterSettings, timeout_s: float) -> str | None:
    """The prefix recorded for the sink in its scope, ``None`` when none is (never
    recorded, or the record is gone).

    :raises confluent_kafka.KafkaException: when the offset or the record cannot be read.
    """
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    from fanout_kafka.driver_admins import admin_config
    from fanout_kafka.membership import read_offsets

    group = ids_group(settings.scope, settings.sink)
    config = admin_config(settings.producer, settings.bootstrap_servers)
    (position,) = read_offsets(config, settings.marker_topic, [group], timeout_s)
    if position < 0:
        return None
    consumer = Consumer({
        **settings.consumer_config(0),
        "isolation.level": "read_uncommitted",  # written outside any transaction
        "auto.offset.reset": "error",
    })  # fmt: skip
    deadline = time.monotonic() + timeout_s
    try:
        consumer.assign([TopicPartition(settings.marker_topic, 0, position)])
        while True:
            message = consumer.poll(0.2)
            if message is None:
                if time.monotonic() >= deadline:
                    raise KafkaException(KafkaError(
                        KafkaError._TIMED_OUT,
                        f"the record of group {group!r} at offset {position} of "
                        f"{settings.marker_topic!r} was not read within {timeout_s:g} s",
                    ))  # fmt: skip
                continue
            error = message.error()
            if error is not None:
                if error.code() in (KafkaError.OFFSET_OUT_OF_RANGE,
                                    KafkaError._AUTO_OFFSET_RESET):  # fmt: skip
                    return None  # the log starts after it (retention)
                raise KafkaException(error)
            offset = message.offset()
            if offset is None or offset < position:
                continue
            if offset > position or message.key() != group.encode():
                return None  # removed (compaction), or not this record
            return (message.value() or b"").decode("utf-8", "replace")
    finally:
        consumer.close()


def record_prefix(settings: WriterSettings, timeout_s: float) -> None:
    """Record the sink's prefix now in use: its record, then the group's offset at it.

    :raises confluent_kafka.KafkaException: when either cannot be written.
    """
    from confluent_kafka import KafkaError, KafkaException, Producer

    from fanout_kafka.driver_admins import ADMINS, admin_config
    from fanout_kafka.membership import commit_offset

    group = ids_group(settings.scope, settings.sink)
    config = admin_config(settings.producer, settings.bootstrap_servers)
    producer = Producer({**config, "linger.ms": 0})  # one record: a repeat is harmless
    reports: list[object] = []

    def delivered(error: object, message: object) -> None:
        reports.append(error or message)

    producer.produce(settings.marker_topic, settings.transactional_id_prefix.encode(),
                     group.encode(), partition=0, on_delivery=delivered)  # fmt: skip
    left = producer.flush(timeout_s)
    report = reports[0] if reports else None
    if left or report is None or isinstance(report, KafkaError):
        error = report if isinstance(report, KafkaError) else KafkaError(
            KafkaError._TIMED_OUT, f"the record of group {group!r} not written in {timeout_s:g} s"
        )  # fmt: skip
        raise KafkaException(error)
    offset = report.offset()  # type: ignore[attr-defined]
    commit_offset(ADMINS.client(config), settings.marker_topic, group, int(offset), timeout_s)


__all__ = ["ids_group", "record_prefix", "recorded_prefix"]
