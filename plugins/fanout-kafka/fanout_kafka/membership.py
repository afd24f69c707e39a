"""What a Kafka partition commits about its partitioning, and the driver's check of it.

Each partition's transaction commits, besides its marker (``batch + 1`` for group
``<marker group>``), the *plan offset* for group ``<marker group>.plan`` on the marker
topic: one 63-bit number packing the partition count (15 bits), the first 16 bits of the
partitioning fingerprint and a 32-bit digest of the partition's rows (count and checksum,
see :mod:`fanout.partitioned.membership`). It is committed through ``send_offsets_to_transaction``
in the same transaction as the records and the marker, so it holds exactly when the
marker does.

Why an offset and not the commit's metadata string: the embedded Tansu broker drops offset
commit metadata (``committed()`` returns ``None`` for it, transactional or not), while
committed offsets are kept by every broker; another record on the marker topic would
commit atomically too, but finding the newest one for a group means reading the topic.

On the driver, before a batch is written, :func:`committed_partitions` reads the markers
(one admin request per group, in parallel; no Spark job; stable offsets, as the tasks'
read_committed consumers see them) and returns the partitions that already hold the batch,
with what they committed.

Which partitions' markers are read: only a partition that had rows commits one, so the
marker groups of a scope need not be ``0..n-1`` in a row. A batch half written with more
``partitions`` than its replay has must be found (the kit then refuses the replay), so the
driver records, before the first write of each ``open()``, the *partition span*: the most
partitions the sink has written a batch of the scope in, the offset of group
``fanout/<scope>/<sink>/partitions`` on the marker topic (:func:`record_span`; kept, never
lowered: read again before each commit; committed again hourly so the broker does not
forget it while the markers are kept). The readers read every marker of
``0..max(span, partitions)-1``, with one or not, then those beyond for as long as each
has one (history written before the span was recorded). Reading on from the count "for
as long as each group has one" alone stopped at the first partition that never had rows:
a partition behind it that committed the batch was missed, and the replay with fewer
partitions wrote its rows again (``tests/test_partitions_lowered.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from fanout.contract.sink import FENCE_LEFT, lift_by_hand
from fanout.errors import TransientSinkError
from fanout.partitioned.membership import (
    CommittedPartition,
    PartitionDigest,
    PartitionPlan,
)
from fanout_kafka.driver_admins import ADMINS, admin_config
from fanout_kafka.markers import real_offset

if TYPE_CHECKING:
    from fanout_kafka.settings import WriterSettings

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
    return group_metadata(settings, partition, plan_group(settings.marker_group(partition)))


def group_metadata(settings: WriterSettings, partition: int, group: str) -> Any:
    """The group metadata of ``group`` for ``send_offsets_to_transaction``, from a
    consumer that never connects (only its group id is used)."""
    from confluent_kafka import Consumer

    config = settings.consumer_config(partition)
    config["group.id"] = group
    config["enable.sparse.connections"] = True
    consumer = Consumer(config)
    try:
        return consumer.consumer_group_metadata()
    finally:
        consumer.close()


def unpack(partition: int, offset: int, plan: PartitionPlan) -> CommittedPartition:
    """What a plan offset says, in terms :func:`fanout.partitioned.membership.check_committed`
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
    *,
    sink: str = "?",
    span: int = 0,
    lift: tuple[str, int | str] | None = None,
) -> list[CommittedPartition]:
    """The partitions whose marker says they committed ``batch_id``, with their plan.

    Reads the markers of partitions ``0..m-1``, ``m`` the larger of the plan's count and
    ``span`` (the sink's partition span, :func:`record_span`: a count lowered since a
    partial commit), each whether it has one or not, and then of ``m, m+1, ...`` for as
    long as such a group has a marker (a count lowered before the span was recorded).

    :raises KafkaMarkerError: when a marker is past ``batch_id``: this sink writes its
        batches in order and marks each in the ledger before the next, so only another
        writer of the same groups (or a ledger that lost marks) can have put it there.
    """
    admin = _admin(admin_config)
    done: list[CommittedPartition] = []
    count = max(plan.partitions, span)
    raw = _offsets(admin, marker_topic, [marker_group(p) for p in range(count)], timeout_s)
    refuse_fenced(raw, batch_id, marker_group, sink=sink, marker_topic=marker_topic, lift=lift)
    markers = [real_offset(offset) for offset in raw]
    markers += _markers_beyond(admin, marker_topic, marker_group, count, timeout_s)
    refuse_markers_ahead(markers, batch_id, marker_group, sink=sink, marker_topic=marker_topic)
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


def refuse_fenced(
    markers: list[int],
    batch_id: int,
    marker_group: Callable[[int], str],
    *,
    sink: str,
    marker_topic: str,
    lift: tuple[str, int | str] | None = None,
) -> None:
    """Raise :class:`fanout_kafka.errors.EpochFencedError` when a marker (raw offsets)
    carries a later epoch's fence (:mod:`fanout_kafka.fence`): this scope's query was
    replaced by a checkpoint reset, and the new epoch writes its batches. ``lift``: the
    pipeline (as written in Python) and the epoch whose fence the refusal names lifting
    (:func:`fanout.contract.sink.lift_by_hand`)."""
    from fanout_kafka.errors import EpochFencedError
    from fanout_kafka.markers import is_fenced

    fenced = [marker_group(p) for p, offset in enumerate(markers) if is_fenced(offset)]
    if not fenced:
        return
    raise EpochFencedError(
        f"the marker group(s) {', '.join(map(repr, fenced))} in topic {marker_topic!r} are "
        "closed: a checkpoint reset started a new epoch of the pipeline, which writes this "
        "batch again, so this query (of the replaced epoch) writes nothing. "
        + FENCE_LEFT
        + lift_by_hand(*(lift or ("<pipeline>", "<the refused epoch>")), "restart this query."),
        sink=sink,
        batch_id=batch_id,
    )


def _marker_offsets(admin: Any, topic: str, groups: list[str], timeout_s: float) -> list[int]:
    """:func:`_offsets` of marker groups, a later epoch's fence cleared
    (:func:`fanout_kafka.markers.real_offset`)."""
    return [real_offset(offset) for offset in _offsets(admin, topic, groups, timeout_s)]


def refuse_markers_ahead(
    markers: list[int],
    batch_id: int,
    marker_group: Callable[[int], str],
    *,
    sink: str,
    marker_topic: str,
) -> None:
    """Raise :class:`KafkaMarkerError` when a marker says a batch past ``batch_id`` was
    committed (its offset is the committed batch id + 1)."""
    from fanout_kafka.errors import KafkaMarkerError

    ahead = [(p, offset - 1) for p, offset in enumerate(markers) if offset > batch_id + 1]
    if not ahead:
        return
    listed = ", ".join(f"{marker_group(p)!r} says batch {done}" for p, done in ahead)
    raise KafkaMarkerError(
        f"markers in topic {marker_topic!r} are past this batch ({listed}). This sink "
        "commits its batches in order and records each in the ledger before the next, so "
        "another pipeline or sink writes the same marker groups (pipeline and sink names "
        "must be unique per Kafka cluster), or the ledger lost this sink's marks. Nothing "
        "was written: skipping these partitions would lose their rows. Rename the other "
        "writer's pipeline or sink, or restore the ledger. Do not move this sink to another "
        "`marker_topic` to get past it: a replay reads only the markers in the topic "
        "configured now, so the partitions these markers hold would be written again.",
        sink=sink,
        batch_id=batch_id,
    )


_elsewhere_checked: set[tuple[str, str, str, str]] = set()


def forget_elsewhere_checks(sink: str) -> None:
    """Check other topics for sink ``sink``'s markers again (its ``open()``): a sink
    reopened in the same process may have written a batch in part under another
    ``marker_topic`` since the last check passed for this one (moved to ``B`` and back
    to ``A``), which the check cached for ``A`` would not see."""
    with _legacy_lock:
        _elsewhere_checked.difference_update({k for k in _elsewhere_checked if k[3] == sink})


def refuse_markers_elsewhere(
    admin_config: Mapping[str, Any],
    settings: WriterSettings,
    batch_id: int,
    partitions: int,
) -> None:
    """Once per sink and ``open()``, when no marker in ``settings.marker_topic`` holds
    ``batch_id``: refuse the batch when this sink's marker groups say, in another topic
    of the cluster, that partitions hold it. That is a batch half written before
    ``marker_topic`` was changed: the replay, reading only the new topic, would write
    those partitions again. A change between batches finds no marker at ``batch_id + 1``
    there (finished history) and passes. Read with one group-offsets request per
    partition over partition 0 of every other topic: markers are committed on partition 0,
    and a former marker topic may have gained partitions since (up to this version only
    one-partition topics were read, and such a topic's half batch was written again); a
    topic the brokers do not let the sink describe is not seen."""
    from fanout_kafka.errors import KafkaMarkerError

    servers = str(admin_config.get("bootstrap.servers"))
    key = (servers, settings.marker_topic, settings.scope, settings.sink)
    with _legacy_lock:
        if key in _elsewhere_checked:
            return
    admin = _admin(admin_config)
    timeout_s = settings.operation_timeout_s
    listed = admin.list_topics(timeout=timeout_s).topics
    topics = sorted(name for name in listed if name != settings.marker_topic)
    holding: dict[str, list[int]] = {}
    if topics:
        groups = [settings.marker_group(p) for p in range(partitions)]
        for partition, found in enumerate(_offsets_in(admin, topics, groups, timeout_s)):
            for topic, offset in found.items():
                if offset == batch_id + 1:
                    holding.setdefault(topic, []).append(partition)
    if not holding:
        with _legacy_lock:
            _elsewhere_checked.add(key)  # a refused batch is checked again when retried
        return
    where = "; ".join(f"partition(s) {ps} in topic {t!r}" for t, ps in sorted(holding.items()))
    (first, _), *_ = sorted(holding.items())
    raise KafkaMarkerError(
        f"batch {batch_id} is half written: its markers say {where} hold it, but this "
        f"sink's marker_topic is now {settings.marker_topic!r}, where no partition holds "
        "it. A replay reads only the markers in the topic configured now, so it would "
        "write those partitions again. Nothing was written. Set marker_topic back to "
        f"{first!r} until this batch is complete (a change between batches is safe); if "
        "those markers are another pipeline's with the same pipeline and sink names, "
        "rename one of them.",
        sink=settings.sink,
        batch_id=batch_id,
    )


def _offsets_in(
    admin: Any, topics: list[str], groups: list[str], timeout_s: float
) -> list[dict[str, int]]:
    """Per group, its committed offset on partition 0 of each of ``topics`` that has one
    (stable offsets; a topic answering with another error is left out)."""
    from confluent_kafka import (
        ConsumerGroupTopicPartitions,
        KafkaError,
        KafkaException,
        TopicPartition,
    )

    wanted = [TopicPartition(t, 0) for t in topics]
    deadline = time.monotonic() + timeout_s
    while True:
        futures = {  # one group a request (the client's limit), all sent at once
            g: admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(g, wanted)],
                require_stable=True, request_timeout=timeout_s,
            )[g]
            for g in groups
        }  # fmt: skip
        result, unstable = [], False
        for group in groups:
            found: dict[str, int] = {}
            for tp in futures[group].result(timeout_s).topic_partitions:
                if tp.error is not None:
                    unstable |= tp.error.code() == KafkaError.UNSTABLE_OFFSET_COMMIT
                elif tp.offset >= 0:
                    found[tp.topic] = int(tp.offset)
            result.append(found)
        if not unstable:
            return result
        if time.monotonic() >= deadline:
            raise KafkaException(KafkaError(KafkaError.UNSTABLE_OFFSET_COMMIT))
        time.sleep(0.1)


_legacy_checked: set[tuple[str, str, str, str]] = set()
_legacy_lock = threading.Lock()


def refuse_legacy_half_commit(
    admin_config: Mapping[str, Any],
    settings: WriterSettings,
    batch_id: int,
    partitions: int,
) -> None:
    """Once per sink and process: refuse a batch that fanout 0.1 left half committed under
    its dotted marker names (which the new names do not see, so those partitions would be
    written twice). A legacy marker at ``batch_id + 1`` is that case; other legacy markers
    are finished history and ignored."""
    from fanout_kafka.errors import KafkaMarkerError
    from fanout_kafka.markers import legacy_marker_group

    servers = str(admin_config.get("bootstrap.servers"))
    key = (servers, settings.marker_topic, settings.scope, settings.sink)
    with _legacy_lock:
        if key in _legacy_checked:
            return
    groups = [legacy_marker_group(settings.scope, settings.sink, p) for p in range(partitions)]
    offsets = _offsets(
        _admin(admin_config), settings.marker_topic, groups, settings.operation_timeout_s
    )
    half = [g for g, offset in zip(groups, offsets, strict=True) if offset == batch_id + 1]
    if not half:
        with _legacy_lock:
            _legacy_checked.add(key)  # a refused batch is checked again when retried
        return
    raise KafkaMarkerError(
        f"batch {batch_id} was half committed by fanout 0.1, whose marker groups "
        f"({', '.join(repr(g) for g in half)}) this version no longer reads: writing it "
        "now would write those partitions twice. Finish this batch with fanout 0.1 "
        "(restart the query once with it), then upgrade; or delete those groups "
        "(kafka-consumer-groups --delete) accepting that their partitions are written "
        "again.",
        sink=settings.sink,
        batch_id=batch_id,
    )


def refuse_topic_change(
    admin_config: Mapping[str, Any],
    settings: WriterSettings,
    batch_id: int,
    holding: list[int],
) -> None:
    """Refuse a replay whose topic, encoding, dead-letter target or route is not the one
    the partitions ``holding`` the batch committed it under (their target offsets, and last
    session's topic-only ones: :mod:`fanout_kafka.target`): one admin request per group
    and partition, sent together, on replays only. Partitions that recorded nothing are
    not compared."""
    from fanout_kafka.target import compare, legacy_target_group, refuse_moved, target_group

    admin = _admin(admin_config)
    timeout_s = settings.operation_timeout_s
    groups = [target_group(settings.marker_group(p)) for p in holding]
    groups += [legacy_target_group(settings.marker_group(p)) for p in holding]
    offsets = _offsets(admin, settings.marker_topic, groups, timeout_s)
    check = compare(holding, offsets[: len(holding)], offsets[len(holding) :],
                    settings.target_stamp(), batch_id)  # fmt: skip
    if check.unknown:
        log.info(
            "sink %r, batch %d: partition(s) %s committed the batch without recording their "
            "topic (an older fanout): a change of 'topic' since cannot be detected for them",
            settings.sink, batch_id, check.unknown,
        )  # fmt: skip
    refuse_moved(
        check, settings.topic, batch_id, lambda: admin.list_topics(timeout=timeout_s).topics,
        sink=settings.sink,
    )  # fmt: skip


def marked_beyond(settings: WriterSettings, partitions: int) -> int:
    """How many partitions from ``partitions`` on, in a row, hold a marker (they committed
    some batch while the sink had more partitions), read on the driver as
    :func:`committed_partitions` reads them."""
    admin = _admin(_admin_config(settings))
    found = _markers_beyond(admin, settings.marker_topic, settings.marker_group, partitions,
                            settings.operation_timeout_s)  # fmt: skip
    return len(found)


def _markers_beyond(
    admin: Any, marker_topic: str, marker_group: Callable[[int], str], start: int,
    timeout_s: float,
) -> list[int]:  # fmt: skip
    """The markers of partitions ``start, start+1, ...`` for as long as each holds one."""
    found: list[int] = []
    while True:
        group = marker_group(start + len(found))
        (offset,) = _marker_offsets(admin, marker_topic, [group], timeout_s)
        if offset == NO_OFFSET:
            return found
        found.append(offset)


def held_partitions(
    admin_config: Mapping[str, Any],
    marker_topic: str,
    marker_group: Callable[[int], str],
    batch_id: int,
    partitions: int,
    timeout_s: float = 60.0,
    span_group: str | None = None,
) -> tuple[int | None, int | None]:
    """How many partitions' markers (partitions ``0 .. m-1``, ``m`` the larger of
    ``partitions`` and the partition span ``span_group`` records, each whether it has one
    or not, then the next ones for as long as each has one: the sink had more) say they
    committed ``batch_id``, and the partition count their plan offsets recorded (``None``:
    none recorded, or they disagree). The span is read in the markers' request round.
    ``(None, None)`` when a marker is past the batch: a later batch committed, so this one
    did, whole. ``(0, 0)`` when no partition has a marker at all: nothing committed in the
    scope, or the broker forgot the markers (``offsets.retention.minutes`` after their
    last commit)."""
    admin = _admin(admin_config)
    # not only those in a row from partition 0: the epoch's first batch may have committed
    # in partition 1 while partition 0, which failed, has no marker yet
    groups = [marker_group(p) for p in range(partitions)]
    markers = _offsets(admin, marker_topic, groups + ([span_group] if span_group else []),
                       timeout_s)  # fmt: skip
    span = markers.pop() if span_group else NO_OFFSET
    markers = [real_offset(offset) for offset in markers]  # a later epoch's fence cleared
    if span > partitions:  # lowered since: the partitions past the count, each
        more = [marker_group(p) for p in range(partitions, span)]
        markers += _marker_offsets(admin, marker_topic, more, timeout_s)
    markers += _markers_beyond(admin, marker_topic, marker_group, len(markers), timeout_s)
    if any(offset > batch_id + 1 for offset in markers):  # a marker is batch + 1
        return None, None
    if all(offset == NO_OFFSET for offset in markers):
        return 0, 0
    holding = [p for p, offset in enumerate(markers) if offset == batch_id + 1]
    if not holding:
        return 0, None
    plans = _offsets(admin, marker_topic, [plan_group(marker_group(p)) for p in holding],
                     timeout_s)  # fmt: skip
    counts = {offset >> (_FINGERPRINT_BITS + _DIGEST_BITS) for offset in plans
              if offset != NO_OFFSET}  # fmt: skip
    count = counts.pop() if len(counts) == 1 and NO_OFFSET not in plans else None
    return len(holding), count


def read_offsets(
    admin_config: Mapping[str, Any], topic: str, groups: list[str], timeout_s: float
) -> list[int]:
    """The committed offset of each group on partition 0 of ``topic``, as the markers are
    read (stable offsets; :data:`NO_OFFSET` for none)."""
    return _offsets(_admin(admin_config), topic, groups, timeout_s)


def _admin_config(settings: WriterSettings) -> dict[str, Any]:
    """The driver's admin client settings for ``settings``' brokers."""
    return admin_config(settings.producer, settings.bootstrap_servers)


def _admin(config: Mapping[str, Any]) -> Any:
    """The driver's admin client of ``config`` (:mod:`fanout_kafka.driver_admins`)."""
    return ADMINS.client(config)


def _offsets(admin: Any, topic: str, groups: list[str], timeout_s: float) -> list[int]:
    """The committed offset of each group on partition 0 of ``topic``: stable offsets
    only, so the driver sees what the executors' read_committed consumers will see."""
    futures = {g: _request_offset(admin, topic, g, timeout_s) for g in groups}
    result = []
    for group in groups:
        offset = _stable_offset(admin, topic, group, futures[group], timeout_s)
        result.append(offset if offset >= 0 else NO_OFFSET)
        log.debug("marker group %s: offset %s", group, offset)
    return result


def _request_offset(admin: Any, topic: str, group: str, timeout_s: float) -> Any:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    request = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])]
    # A transaction that committed a marker is complete for readers only once its offsets
    # are written to the group; until then Kafka answers an unstable request with the
    # previous offset, while the executors' read_committed consumers (which ask for stable
    # offsets) wait. The driver must not see less than they will: a partition it thought
    # unwritten would skip the membership check and then be skipped by its task.
    return admin.list_consumer_group_offsets(
        request, require_stable=True, request_timeout=timeout_s
    )[group]


def _stable_offset(admin: Any, topic: str, group: str, future: Any, timeout_s: float) -> int:
    """The group's offset, asking again while the broker says a transaction's offset
    commit is still being completed (UNSTABLE_OFFSET_COMMIT), for up to ``timeout_s``."""
    from confluent_kafka import KafkaError, KafkaException

    deadline, pause = time.monotonic() + timeout_s, 0.02
    while True:
        try:
            (tp,) = future.result(timeout_s).topic_partitions
            error = tp.error
        except KafkaException as exc:  # the request failed as a whole
            error = exc.args[0]
        if error is None:
            return int(tp.offset)
        if error.code() != KafkaError.UNSTABLE_OFFSET_COMMIT or time.monotonic() >= deadline:
            raise KafkaException(error)
        time.sleep(pause)
        pause = min(pause * 2, 0.5)
        future = _request_offset(admin, topic, group, timeout_s)


def record_span(
    admin_config: Mapping[str, Any],
    settings: WriterSettings,
    partitions: int,
    first: Callable[[], None] | None = None,
) -> int:
    """Record, before this ``open()``'s first write in ``settings.scope``, the sink's
    partition span there: the larger of what is recorded (read: one request, each time,
    so that a larger span another driver of the pipeline recorded since is never
    lowered) and ``partitions``, committed for group :func:`fanout_kafka.markers.
    span_group` on partition 0 of the marker topic (one offset commit of a group without
    members, outside any transaction; also when unchanged, so the broker does not forget
    it while the markers are kept). Returns the span: the readers read every marker of
    ``0..span-1`` (a partition that never had rows has none, and the markers past it
    must be found too).

    ``first`` is called, before the commit, when none is recorded (the sink's first write
    in the scope, or one the broker forgot); what it raises leaves none recorded, so the
    next attempt calls it again (:mod:`fanout_kafka.renamed`).

    :raises KafkaException: when it cannot be read or committed.
    """
    from fanout_kafka.markers import span_group

    admin = _admin(admin_config)
    group = span_group(settings.scope, settings.sink)
    timeout_s = settings.operation_timeout_s
    (known,) = _offsets(admin, settings.marker_topic, [group], timeout_s)
    if known < 0 and first is not None:
        first()
    span = max(known, partitions)
    commit_offset(admin, settings.marker_topic, group, span, timeout_s)
    return span


def commit_offset(admin: Any, topic: str, group: str, offset: int, timeout_s: float) -> None:
    """Commit ``offset`` for ``group`` on partition 0 of ``topic`` (a group without
    members, outside any transaction: the driver's records on the marker topic).

    :raises KafkaException: when the broker refuses it.
    """
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition

    request = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0, offset)])]
    (tp,) = (
        admin.alter_consumer_group_offsets(request, request_timeout=timeout_s)[group]
        .result(timeout_s)
        .topic_partitions
    )
    if tp.error is not None:
        raise KafkaException(tp.error)


def read_committed(
    settings: WriterSettings, batch_id: int, span: int = 0
) -> list[CommittedPartition]:
    """On the driver, before any partition writes: the partitions whose markers say they
    hold ``batch_id`` (every one of ``0..span-1`` read, ``span`` the sink's partition span,
    :func:`record_span`), with the plan and digest each committed (the kit compares them:
    :mod:`fanout.partitioned.sink`); a half commit under 0.1 names is refused.

    :raises fanout.TransientSinkError: when the markers cannot be read.
    """
    from confluent_kafka import KafkaException

    plan = settings.plan
    assert plan is not None
    config = _admin_config(settings)
    try:
        refuse_legacy_half_commit(config, settings, batch_id, plan.partitions)
        epoch = 0 if settings.info is None else settings.info.epoch
        done = committed_partitions(
            config, settings.marker_topic, settings.marker_group, batch_id, plan,
            settings.operation_timeout_s, sink=settings.sink, span=span,
            lift=(repr(settings.pipeline), epoch + 1),
        )  # fmt: skip
        if not done:
            refuse_markers_elsewhere(config, settings, batch_id, max(plan.partitions, span))
        else:
            refuse_topic_change(config, settings, batch_id, [c.partition for c in done])
        return done
    except KafkaException as exc:
        raise TransientSinkError(
            f"cannot read the partition markers in {settings.marker_topic!r}: {exc}",
            sink=settings.sink, batch_id=batch_id,
        ) from exc  # fmt: skip
