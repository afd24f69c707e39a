"""The target topic's id, recorded once per run: a topic deleted and created again is not
the one the markers were written to.

The markers (:mod:`fanout_kafka.membership`) are offsets of groups on the marker topic and
outlive the target topic: a topic deleted and created again by hand (or by a deploy script)
between two runs holds none of the batches they say it holds, and the run's lost-target
check (:meth:`fanout_kafka.sink.KafkaSink.holds_batch`) took their word. A topic has an id
(KIP-516) that its re-creation changes, so the driver commits (and
:meth:`~fanout_kafka.sink.KafkaSink.target_replaced` compares), for group
``fanout/<scope>/<sink>/topic-id/<topic>`` on partition 0 of the marker topic, the
*topic-id offset*, 63 bits:

======  ==============================================================================
bits    what
======  ==============================================================================
43-62   20 bits of a digest of the topic name
0-42    43 bits of a digest of the topic id
======  ==============================================================================

The group names the topic whole: an id recorded for another topic, before option
``topic`` changed, is no record of this one. Up to this version the group was
``fanout/<scope>/<sink>/topic-id`` (:func:`legacy_topic_id_group`) and only the name's 20
bits told the topics apart, so a renamed ``topic`` compared against the other topic's id
once in 2^20 (a false refusal). That group is still read, in the same request, while the
new one has no offset (until the first batch of the first run of this version records
it), and compared on the name's bits as before.

It is committed by the driver after the first batch of each ``open()`` whose partitions
all committed or were skipped (:meth:`~fanout_kafka.sink.KafkaSink.after_partitions`), and
again after a batch every hour of the run (``topic_id_refresh_s``): the broker forgets a
group's offset ``offsets.retention.minutes`` after its last commit (7 days by default),
and the markers, committed every batch, would outlive it. No request in the partitions'
transactions, none in the other batches. The check runs before it, so a run refused for a
replaced topic records nothing, and one accepted (``--accept-lost-target``) records the
new id once it wrote into the topic. A run commits again the id it recorded first: a
topic re-created during the run keeps the old one, and the next run is refused.

No offset, one of another topic, or a broker that gives no topic id (older than Kafka
2.8, or a zero id): nothing is compared, the markers answer alone.

It cannot be a marker group (``fanout/<scope>/<sink>/p<n>``) or a group of one
(``<marker group>.<what>``): it has one part more between its ``/``, and no pipeline,
sink or topic name holds a ``/``.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("fanout_kafka")

_NAME_BITS, _ID_BITS = 20, 43


def topic_id_group(scope: str, sink: str, topic: str) -> str:
    """The group whose committed offset is the sink's topic-id offset of ``topic`` in
    ``scope``."""
    return f"fanout/{scope}/{sink}/topic-id/{topic}"


def legacy_topic_id_group(scope: str, sink: str) -> str:
    """The group an older fanout committed the sink's topic-id offset for, whatever its
    topic (read while :func:`topic_id_group` has none)."""
    return f"fanout/{scope}/{sink}/topic-id"


def _digest(text: str, bits: int) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> (64 - bits)


def pack_topic_id(topic: str, topic_id: str) -> int:
    """The topic-id offset of topic ``topic`` whose id is ``topic_id``."""
    return (_digest(topic, _NAME_BITS) << _ID_BITS) | _digest(topic_id, _ID_BITS)


def replaced(offset: int, topic: str, topic_id: str | None) -> bool | None:
    """Whether the topic-id offset ``offset`` was recorded for topic ``topic`` under
    another id than ``topic_id``, its id now: ``None`` when it cannot tell (no offset, one
    recorded for another topic name, no id now)."""
    if offset < 0 or topic_id is None or offset >> _ID_BITS != _digest(topic, _NAME_BITS):
        return None
    return offset & ((1 << _ID_BITS) - 1) != _digest(topic_id, _ID_BITS)


def current_topic_id(admin: Any, topic: str, timeout_s: float) -> str | None:
    """The id of ``topic`` (one describe request), ``None`` when the broker gives none
    (an older broker, a zero id) or cannot describe it."""
    from confluent_kafka import KafkaException

    try:
        return described_topic_id(admin, topic, timeout_s)
    except (KafkaException, TimeoutError) as exc:
        log.debug("cannot describe topic %r for its id: %s", topic, exc)
        return None


def described_topic_id(admin: Any, topic: str, timeout_s: float) -> str | None:
    """The id of ``topic`` (one describe request), ``None`` when the broker gives none (an
    older broker, a zero id); a describe that fails raises (``KafkaException``,
    ``TimeoutError``): its id is unknown, not absent."""
    from confluent_kafka import TopicCollection

    future = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout_s)
    described = future[topic].result(timeout_s)
    uuid = getattr(described, "topic_id", None)
    if uuid is None or (
        uuid.get_most_significant_bits() == 0 and uuid.get_least_significant_bits() == 0
    ):
        return None
    return str(uuid)


def holds_records(admin: Any, topic: str, timeout_s: float) -> bool:
    """Whether any partition of ``topic`` holds a record (its latest offset past its
    earliest: one describe, two list-offsets requests); ``False`` when it cannot tell. A
    topic under another id that holds records was restored from a mirror, not created
    again empty. Tansu's latest offset can stand inside a partition's last record batch
    (``plugins/fanout-kafka/README.md``): one whose records are all in one batch may read
    as empty, which only keeps the refusal."""
    from confluent_kafka import KafkaException, TopicCollection, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    try:
        future = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout_s)
        partitions = [p.id for p in future[topic].result(timeout_s).partitions]
        ends = []
        for spec in (OffsetSpec.earliest(), OffsetSpec.latest()):
            asked = {TopicPartition(topic, p): spec for p in partitions}
            found = admin.list_offsets(asked, request_timeout=timeout_s)
            ends.append({tp.partition: f.result(timeout_s).offset for tp, f in found.items()})
    except (KafkaException, TimeoutError) as exc:
        log.debug("cannot read the offsets of topic %r: %s", topic, exc)
        return False
    earliest, latest = ends
    return any(latest[p] > max(earliest[p], 0) for p in partitions)


def record_topic_id(
    admin: Any, marker_topic: str, group: str, topic: str, topic_id: str, timeout_s: float
) -> None:
    """Commit the topic-id offset of ``topic`` for ``group`` (one offset commit of a
    group without members, outside any transaction)."""
    from fanout_kafka.membership import commit_offset

    commit_offset(admin, marker_topic, group, pack_topic_id(topic, topic_id), timeout_s)


def topic_replaced(
    admin_config: Mapping[str, Any],
    marker_topic: str,
    scope: str,
    sink: str,
    topic: str,
    timeout_s: float,
) -> tuple[bool | None, str | None, str | None]:
    """Whether ``topic`` now has another id than the one recorded for it (see
    :func:`replaced`; the group of an older fanout when this one's has none), its id now,
    and the group the recorded id was read from (``None``: neither has one). One offset
    request per group, sent together."""
    from fanout_kafka.driver_admins import ADMINS
    from fanout_kafka.membership import read_offsets

    groups = [topic_id_group(scope, sink, topic), legacy_topic_id_group(scope, sink)]
    offsets = read_offsets(admin_config, marker_topic, groups, timeout_s)
    recorded = next(((g, o) for g, o in zip(groups, offsets, strict=True) if o >= 0), None)
    if recorded is None:
        return None, None, None
    group, offset = recorded
    now = current_topic_id(ADMINS.client(admin_config), topic, timeout_s)
    return replaced(offset, topic, now), now, group


def recorded_for(
    admin_config: Mapping[str, Any], marker_topic: str, scope: str, sink: str, topic: str,
    timeout_s: float,
) -> bool | None:  # fmt: skip
    """Whether sink ``sink``'s topic-id offset in ``scope`` was recorded for ``topic`` (its
    group of that topic, or an older fanout's group whose offset names it): ``False`` when
    only the older group has one and it names another topic, ``None`` when none was
    recorded. One offset request per group, sent together."""
    from fanout_kafka.membership import read_offsets

    groups = [topic_id_group(scope, sink, topic), legacy_topic_id_group(scope, sink)]
    ours, legacy = read_offsets(admin_config, marker_topic, groups, timeout_s)
    if ours >= 0:
        return True
    if legacy >= 0:
        return legacy >> _ID_BITS == _digest(topic, _NAME_BITS)
    return None


def replaced_since(
    admin_config: dict[str, Any],
    marker_topic: str,
    scope: str,
    sink: str,
    topic: str,
    timeout_s: float,
) -> str | None:
    """Why ``topic`` was deleted and created again since: its id is not the one recorded in
    ``scope`` (:func:`topic_replaced`: one offset read, one describe request) and it holds
    no record (:func:`holds_records`). One under another id that holds records was
    restored from a mirror (the refusal's own way on): ``None``, its markers answer (the
    sink's :meth:`~fanout_kafka.sink.KafkaSink.target_replaced`)."""
    from fanout_kafka.driver_admins import ADMINS

    replaced_, now, group = topic_replaced(admin_config, marker_topic, scope, sink, topic,
                                           timeout_s)  # fmt: skip
    if replaced_ and holds_records(ADMINS.client(admin_config), topic, timeout_s):
        log.info(
            "sink %r: topic %r has id %s now, not the one recorded when its marked "
            "batches were written (group %r), but holds records (restored from a "
            "mirror?): its markers answer", sink, topic, now, group,
        )  # fmt: skip
        return None
    if not replaced_:
        return None
    log.warning(
        "sink %r: topic %r has id %s now, not the one recorded when its marked "
        "batches were written (group %r): it was deleted and created again since",
        sink, topic, now, group,
    )  # fmt: skip
    return (
        f"topic {topic!r} has id {now} now, not the one recorded when its marked batches "
        f"were written (group {group!r} on marker topic {marker_topic!r}), and holds "
        "no record"
    )


def commit_run_topic_id(
    admin_config: dict[str, Any],
    marker_topic: str,
    scope: str,
    sink: str,
    topic: str,
    kept: str | None,
    batch_id: int,
    timeout_s: float,
) -> tuple[bool, str | None]:
    """Commit the id of ``topic`` for sink ``sink`` in ``scope`` (:func:`record_topic_id`),
    after a batch (``batch_id``) whose partitions all committed or were skipped
    (:meth:`~fanout_kafka.sink.KafkaSink.after_partitions`): the id the run recorded first
    (``kept``), else the broker's now. An id other than ``kept`` (the topic re-created
    during the run) is logged and not committed: the old one refuses the next run.
    Whether it was committed (a failure is logged: the caller tries again after the next
    batch, as the batch committed, nothing is raised), and the id committed."""
    from confluent_kafka import KafkaException

    from fanout_kafka.driver_admins import ADMINS

    admin = ADMINS.client(admin_config)
    group = topic_id_group(scope, sink, topic)
    try:
        # a describe that failed is tried again: the old id left would refuse the
        # next run after an accepted re-creation; the batch committed, so no raise
        now = described_topic_id(admin, topic, timeout_s)
        if kept is not None and now is not None and now != kept:
            log.warning(
                "sink %r, batch %d: topic %r has id %s now, not %s, recorded after this "
                "run's first batch: it was deleted and created again during the run; the "
                "old id is kept in group %r, so the next run's lost-target check refuses it",
                sink, batch_id, topic, now, kept, group,
            )  # fmt: skip
        now = kept or now
        if now is not None:
            record_topic_id(admin, marker_topic, group, topic, now, timeout_s)
    except (KafkaException, TimeoutError) as exc:
        log.warning(
            "sink %r, batch %d: cannot record the id of topic %r in group %r (tried "
            "again after the next batch): %s",
            sink, batch_id, topic, group, exc,
        )  # fmt: skip
        return False, None
    return True, now


__all__ = [
    "commit_run_topic_id",
    "current_topic_id",
    "described_topic_id",
    "holds_records",
    "legacy_topic_id_group",
    "pack_topic_id",
    "record_topic_id",
    "recorded_for",
    "replaced",
    "replaced_since",
    "topic_id_group",
    "topic_replaced",
]
