"""What a Kafka partition commits about its partitioning, and the driver's check of it.

Each partition's transaction commits, besides its marker (``batch + 1`` for group
``<marker group>``), the *plan offset* for group ``<marker group>.plan`` on the marker
topic: one 63-bit number packing the partition count (15 bits), the first 16 bits of the
partitioning fingerprint and a 32-bit digest of the partition's rows (count and checksum,
see :mod:`fanout.partitioning`). It is committed through ``send_offsets_to_transaction``
in the same transaction as the records and the marker, so it holds exactly when the
marker does.

Why an offset and not the commit's metadata string: the embedded Tansu broker drops offset
commit metadata (``committed()`` returns ``None`` for it, transactional or not), while
committed offsets are kept by every broker; another record on the marker topic would
commit atomically too, but finding the newest one for a group means reading the topic.

On the driver, before a batch is written, :func:`committed_partitions` reads the markers
(one admin request per group, in parallel; no Spark job) and returns the partitions that
already hold the batch, with what they committed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from fanout.errors import TransientSinkError
from fanout.partitioning import (
    CommittedPartition,
    PartitionDigest,
    PartitionPlan,
    check_committed,
    summarize,
    with_member_column,
)
from fanout_kafka.options import connection_settings

if TYPE_CHECKING:
    from fanout_kafka.transaction import WriterSettings

log = logging.getLogger("fanout_kafka")

PLAN_SUFFIX = ".plan"
_COUNT_BITS, _FINGERPRINT_BITS, _DIGEST_BITS = 15, 16, 32
NO_OFFSET = -1001
"""librdkafka's OFFSET_INVALID: the group has committed nothing."""


def plan_group(marker_group: str) -> str:
    """The group whose committed offset is the partition's packed plan."""
    return marker_group + PLAN_SUFFIX


def pack(plan: PartitionPlan, digest: PartitionDigest) -> int:
    """The plan offset of a partition: count, fingerprint prefix, row digest."""
    count = plan.partitions & ((1 << _COUNT_BITS) - 1)
    fingerprint = int(plan.fingerprint[: _FINGERPRINT_BITS // 4], 16)
    return (
        (count << (_FINGERPRINT_BITS + _DIGEST_BITS))
        | (fingerprint << _DIGEST_BITS)
        | (digest.short() & ((1 << _DIGEST_BITS) - 1))
    )


def plan_group_metadata(settings: WriterSettings, partition: int) -> Any:
    """The group metadata ``send_offsets_to_transaction`` needs for the plan group, from
    a consumer that never connects (only its group id is used)."""
    from confluent_kafka import Consumer

    config = settings.consumer_config(partition)
    config["group.id"] = plan_group(settings.marker_group(partition))
    config["enable.sparse.connections"] = True
    consumer = Consumer(config)
    try:
        return consumer.consumer_group_metadata()
    finally:
        consumer.close()


def unpack(partition: int, offset: int, plan: PartitionPlan) -> CommittedPartition:
    """What a plan offset says, in terms :func:`fanout.partitioning.check_committed`
    compares with ``plan`` (a count past 15 bits is compared modulo 2**15)."""
    count = offset >> (_FINGERPRINT_BITS + _DIGEST_BITS)
    fingerprint = (offset >> _DIGEST_BITS) & ((1 << _FINGERPRINT_BITS) - 1)
    short = offset & ((1 << _DIGEST_BITS) - 1)
    if count == plan.partitions & ((1 << _COUNT_BITS) - 1):
        count = plan.partitions
    same = f"{fingerprint:04x}" == plan.fingerprint[: _FINGERPRINT_BITS // 4]
    return CommittedPartition(
        partition,
        partitions=count,
        fingerprint=plan.fingerprint if same else f"{fingerprint:04x}...",
        short=short,
    )


def committed_partitions(
    admin_config: Mapping[str, Any],
    marker_topic: str,
    marker_group: Callable[[int], str],
    batch_id: int,
    plan: PartitionPlan,
    timeout_s: float,
) -> list[CommittedPartition]:
    """The partitions whose marker says they committed ``batch_id``, with their plan.

    Reads the markers of partitions ``0..n-1`` and then of ``n, n+1, ...`` for as long as
    such a group has a marker, so a count lowered since a partial commit is found too.
    """
    admin = _admin(admin_config)
    done: list[CommittedPartition] = []
    markers = _offsets(admin, marker_topic, [marker_group(p) for p in range(plan.partitions)],
                       timeout_s)  # fmt: skip
    extra = plan.partitions
    while True:
        (beyond,) = _offsets(admin, marker_topic, [marker_group(extra)], timeout_s)
        if beyond == NO_OFFSET:
            break
        markers.append(beyond)
        extra += 1
    holding = [p for p, offset in enumerate(markers) if offset == batch_id + 1]
    if not holding:
        return done
    plans = _offsets(admin, marker_topic, [plan_group(marker_group(p)) for p in holding],
                     timeout_s)  # fmt: skip
    for partition, offset in zip(holding, plans, strict=True):
        if offset == NO_OFFSET:  # committed by a fanout without plan offsets: count only
            done.append(CommittedPartition(partition))
        else:
            done.append(unpack(partition, offset, plan))
    return done


_admins: dict[tuple[tuple[str, str], ...], Any] = {}
_admins_lock = threading.Lock()


def _admin(config: Mapping[str, Any]) -> Any:
    """One admin client per configuration, kept for the driver's life: a new client per
    batch spent ~50 ms connecting (thread-safe; never pickled, unlike the sink)."""
    from confluent_kafka.admin import AdminClient

    key = tuple(sorted((str(k), str(v)) for k, v in config.items()))
    with _admins_lock:
        if key not in _admins:
            # librdkafka's own log lines (a broker gone away) go to Python logging
            logger = logging.getLogger("fanout_kafka.librdkafka")
            _admins[key] = AdminClient({**config, "logger": logger})
        return _admins[key]


def _offsets(admin: Any, topic: str, groups: list[str], timeout_s: float) -> list[int]:
    """The committed offset of each group on partition 0 of ``topic``."""
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition

    futures = [
        admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(g, [TopicPartition(topic, 0)])],
            request_timeout=timeout_s,
        )[g]
        for g in groups
    ]
    result = []
    for group, future in zip(groups, futures, strict=True):
        (tp,) = future.result(timeout_s).topic_partitions
        if tp.error is not None:
            raise KafkaException(tp.error)
        result.append(int(tp.offset) if tp.offset >= 0 else NO_OFFSET)
        log.debug("marker group %s: offset %s", group, tp.offset)
    return result


def check_replay(settings: WriterSettings, batch_id: int, parted: Any, by: list[str]) -> Any:
    """On the driver, before any partition writes: refuse when partitions that already
    committed the batch were committed under another count, other partitioning columns,
    or with other rows than ``parted`` now holds. Returns ``parted`` with the member
    column the partition tasks digest.

    :raises fanout.PartitioningError: naming the sink, the batch and what changed.
    :raises fanout.TransientSinkError: when the markers cannot be read.
    """
    from confluent_kafka import KafkaException

    plan = settings.plan
    assert plan is not None
    config = {
        **connection_settings(settings.producer),
        "bootstrap.servers": settings.bootstrap_servers,
    }
    try:
        committed = committed_partitions(
            config, settings.marker_topic, settings.marker_group, batch_id, plan,
            settings.operation_timeout_s,
        )  # fmt: skip
    except KafkaException as exc:
        raise TransientSinkError(
            f"cannot read the partition markers in {settings.marker_topic!r}: {exc}",
            sink=settings.sink, batch_id=batch_id,
        ) from exc  # fmt: skip
    check_committed(
        committed, plan, lambda: summarize(parted, by), sink=settings.sink, batch_id=batch_id
    )
    return with_member_column(parted, by)
