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

The record is per scope, and a checkpoint reset starts a new one (``<pipeline>@e<n>``)
with none: a prefix changed together with the reset was never fenced, so the killed run's
open transaction under the former ids held back, on Tansu, the replaced epoch's markers
(the new epoch's start read its committed partition as not written, and wrote it again)
and the new epoch's own markers (its transactions share the topic's partitions), and on
Kafka a task of the replaced run still alive could commit beside the new epoch
(``tests/test_epoch_prefix_changed.py``). So the record of the replaced epoch counts too:

- the new epoch's start fences the replaced scope with the ids of the prefix recorded
  *there* (:class:`fanout_kafka.fence.ScopeFence`: one offset read and one record read,
  at the start only), not with the prefix now configured, whose ids no task of that
  scope holds;
- the first batch of an ``open()`` in a scope with no record yet, at epoch ``n > 0``,
  reads the newest record of scopes ``n-1`` down to ``0`` too (one offset read per
  scope looked at, one when ``n-1`` recorded; once per epoch: the record is written
  then) and fences that prefix's ids
  when it differs. Not only ``n-1``'s: an epoch killed before its first batch records
  nothing, and the one before it may have left a transaction open under its prefix
  (``test_a_reset_of_a_reset_fences_the_prefix_of_the_last_epoch_that_recorded_one``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from fanout.errors import TransientSinkError
from fanout.observe.secrets import redact

if TYPE_CHECKING:
    from fanout_kafka.settings import WriterSettings

log = logging.getLogger("fanout_kafka")


def ids_group(scope: str, sink: str) -> str:
    """The group whose offset points at the record of sink ``sink``'s prefix in
    ``scope``: ``fanout/<scope>/<sink>/ids`` (no marker, span or topic-id group's name)."""
    return f"fanout/{scope}/{sink}/ids"


def recorded_prefix(settings: WriterSettings, timeout_s: float) -> str | None:
    """The prefix recorded for the sink in its scope (``settings.scope``), ``None`` when
    none is (never recorded, or the record is gone).

    :raises confluent_kafka.KafkaException: when the offset or the record cannot be read.
    """
    return prefix_in_scope(settings.producer, settings.bootstrap_servers,
                           settings.marker_topic, settings.scope, settings.sink,
                           timeout_s)  # fmt: skip


def prefix_in_scope(
    producer: Mapping[str, Any],
    bootstrap_servers: str,
    marker_topic: str,
    scope: str,
    sink: str,
    timeout_s: float,
) -> str | None:
    """The prefix recorded for sink ``sink`` in ``scope`` (any epoch's: the fence of a
    replaced epoch reads that epoch's, :mod:`fanout_kafka.fence`), ``None`` when none is.

    :raises confluent_kafka.KafkaException: when the offset or the record cannot be read.
    """
    from fanout_kafka.driver_admins import admin_config
    from fanout_kafka.membership import read_offsets

    group = ids_group(scope, sink)
    config = admin_config(producer, bootstrap_servers)
    (position,) = read_offsets(config, marker_topic, [group], timeout_s)
    if position < 0:
        return None
    return _record_at(producer, bootstrap_servers, marker_topic, group, position, timeout_s)


def newest_earlier_record(
    settings: WriterSettings, epoch: int, timeout_s: float
) -> tuple[str, str] | None:
    """The newest scope of the sink's pipeline before ``epoch`` with a prefix recorded,
    and that prefix: ``(scope, prefix)``, ``None`` when none of epochs ``0..epoch-1`` has
    one. An epoch that recorded nothing (killed before its first batch) is skipped: the
    killed run's transaction of the epoch before it may still be open under that one's
    prefix, and an epoch that recorded one fenced every earlier prefix before it did
    (:meth:`fanout_kafka.KafkaSink._fence_former_prefix`). One offset read per epoch
    looked at, newest first (one when epoch ``epoch - 1`` recorded), one record read.

    :raises confluent_kafka.KafkaException: when an offset or the record cannot be read.
    """
    from fanout.contract.batch import pipeline_scope
    from fanout_kafka.driver_admins import admin_config
    from fanout_kafka.membership import read_offsets

    config = admin_config(settings.producer, settings.bootstrap_servers)
    for earlier in range(epoch - 1, -1, -1):
        scope = pipeline_scope(settings.pipeline, earlier)
        group = ids_group(scope, settings.sink)
        (position,) = read_offsets(config, settings.marker_topic, [group], timeout_s)
        if position >= 0:
            prefix = _record_at(settings.producer, settings.bootstrap_servers,
                                settings.marker_topic, group, position, timeout_s)  # fmt: skip
            return None if prefix is None else (scope, prefix)
    return None


def _record_at(
    producer: Mapping[str, Any], bootstrap_servers: str, marker_topic: str, group: str,
    position: int, timeout_s: float,
) -> str | None:  # fmt: skip
    """The prefix in the record of ``group`` at ``position`` of partition 0 of
    ``marker_topic``, ``None`` when it is gone (retention, compaction)."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    from fanout_kafka.options import connection_settings
    from fanout_kafka.settings import LIVELY_CONNECTIONS

    consumer = Consumer({
        **LIVELY_CONNECTIONS,
        **connection_settings(producer),
        "bootstrap.servers": bootstrap_servers,
        "group.id": group,  # assigned, never joined nor committed
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "isolation.level": "read_uncommitted",  # written outside any transaction
        "auto.offset.reset": "error",
    })  # fmt: skip
    deadline = time.monotonic() + timeout_s
    try:
        consumer.assign([TopicPartition(marker_topic, 0, position)])
        while True:
            message = consumer.poll(0.2)
            if message is None:
                if time.monotonic() >= deadline:
                    raise KafkaException(KafkaError(
                        KafkaError._TIMED_OUT,
                        f"the record of group {group!r} at offset {position} of "
                        f"{marker_topic!r} was not read within {timeout_s:g} s",
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


def rights_refused(exc: BaseException) -> bool:
    """Whether ``exc``, from reading or recording the prefix, is the broker refusing the
    sink's principal the rights (a record on the marker topic: needed nowhere else without
    Delta dead letters), which is warned, not refused."""
    from confluent_kafka import KafkaException

    from fanout_kafka.renamed import read_error_is_unauthorized

    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return error is not None and hasattr(error, "code") and read_error_is_unauthorized(error)


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


@dataclass(frozen=True)
class FormerPrefix:
    """What the prefix records say at a sink's first batch of an ``open()``
    (:func:`read_former_prefix`).

    :param here: the prefix recorded in the batch's scope (``None``: none).
    :param former: the prefix the sink last wrote under: ``here``, or in a new epoch's
        scope with no record yet, the newest earlier epoch's (``None``: none).
    :param span: how many partitions' ids of ``former`` to fence.
    """

    here: str | None
    former: str | None
    span: int


def read_former_prefix(
    settings: WriterSettings, span: int, batch_id: int, timeout_s: float, secrets: Sequence[str]
) -> FormerPrefix | None:
    """The prefix recorded in ``settings.scope`` and, in a new epoch's scope with no record
    yet, the newest earlier epoch's record too (a prefix changed together with a checkpoint
    reset, or two), with the partition span of that epoch when it is more than ``span``:
    one offset read, one record read when one was recorded. ``None``: the records cannot
    be read and the brokers refuse the rights (:func:`prefix_unrecorded`, warned).

    :raises fanout.TransientSinkError: when they cannot be read otherwise.
    """
    from confluent_kafka import KafkaException

    prefix = settings.transactional_id_prefix
    former_span = span
    try:
        here = former = recorded_prefix(settings, timeout_s)
        epoch = settings.info.epoch if settings.info is not None else 0
        if here is None and epoch > 0:  # a new epoch's first: the newest earlier record
            found = newest_earlier_record(settings, epoch, timeout_s)
            former = None if found is None else found[1]
            if found is not None and former != prefix:
                before = replace(settings, scope=found[0])
                former_span = max(span, recorded_span(before, timeout_s))  # its ids, not ours
    except (KafkaException, TimeoutError) as exc:
        prefix_unrecorded(settings, exc, batch_id, secrets)
        return None
    return FormerPrefix(here, former, former_span)


def fence_former_and_record(
    settings: WriterSettings,
    found: FormerPrefix,
    batch_id: int,
    timeout_s: float,
    secrets: Sequence[str],
) -> None:
    """Fence the ids of ``found.former`` when it is not the prefix in use
    (:func:`fanout_kafka.abandoned.fence_legacy_transactions`), then record the prefix in
    use where ``found.here`` is not it (:func:`record_prefix`): one record and one commit
    when it changed.

    :raises fanout.TransientSinkError: when the ids cannot be fenced or the record
        written, unless the brokers refuse the rights (:func:`prefix_unrecorded`).
    """
    from confluent_kafka import KafkaException

    from fanout_kafka.abandoned import fence_legacy_transactions

    prefix = settings.transactional_id_prefix
    try:
        if found.former is not None and found.former != prefix:
            log.info(
                "sink %r: transactional_id_prefix was %r in the last run (now %r): its "
                "ids fenced before the markers are read", settings.sink, found.former, prefix,
            )  # fmt: skip
            fence_legacy_transactions(settings, found.former, found.span, batch_id)
        if found.here != prefix:
            record_prefix(settings, timeout_s)
    except (KafkaException, TimeoutError) as exc:
        prefix_unrecorded(settings, exc, batch_id, secrets)


def prefix_unrecorded(
    settings: WriterSettings, exc: BaseException, batch_id: int, secrets: Sequence[str]
) -> None:
    """The prefix record could not be read or written (``exc``): warned when the brokers
    refuse the rights (:func:`rights_refused`: a record on the marker topic, needed nowhere
    else without Delta dead letters; refusing would stop every run's first batch), else
    refused.

    :raises fanout.TransientSinkError: unless the rights were refused.
    """
    if rights_refused(exc):
        log.warning(
            "sink %r: cannot read or record its transactional_id_prefix on marker "
            "topic %r (%s): a prefix changed between a crash and its replay is not "
            "fenced; grant the sink's principal READ and WRITE on that topic, or "
            "change the prefix only after a clean stop", settings.sink,
            settings.marker_topic, redact(str(exc), secrets),
        )  # fmt: skip
        return
    raise TransientSinkError(
        f"cannot read or record the sink's transactional_id_prefix on marker topic "
        f"{settings.marker_topic!r} (read before the markers): "
        f"{redact(str(exc), secrets)}",
        sink=settings.sink, batch_id=batch_id,
    ) from exc  # fmt: skip


def recorded_span(settings: WriterSettings, timeout_s: float) -> int:
    """The partition span recorded in ``settings.scope`` (0 when none: one request)."""
    from fanout_kafka.driver_admins import admin_config
    from fanout_kafka.markers import span_group
    from fanout_kafka.membership import read_offsets

    config = admin_config(settings.producer, settings.bootstrap_servers)
    group = span_group(settings.scope, settings.sink)
    (span,) = read_offsets(config, settings.marker_topic, [group], timeout_s)
    return max(span, 0)


__all__ = [
    "FormerPrefix",
    "fence_former_and_record",
    "ids_group",
    "newest_earlier_record",
    "prefix_in_scope",
    "prefix_unrecorded",
    "read_former_prefix",
    "record_prefix",
    "recorded_prefix",
    "recorded_span",
    "rights_refused",
]
