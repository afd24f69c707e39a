"""Which topic a committed partition wrote its batch to, and the replay's check of it.

A replay skips the partitions whose markers hold the batch. If the sink's ``topic`` changed
between the attempt that committed them and the replay, their rows stay only in the old
topic and the new one silently misses them. So each partition's transaction also commits,
for group ``<marker group>.topic`` on the marker topic, the *target offset*: 31 bits of a
digest of the topic name above the low 32 bits of ``batch + 1`` (the batch part tells a
target offset of this batch from one an earlier batch left). It commits atomically with the
records and the marker, so it holds exactly when the marker does.

Why an offset and not the commit's ``metadata`` string (the natural place for a topic
name): the embedded Tansu broker keeps no offset-commit metadata (``committed()`` and
``list_consumer_group_offsets`` return ``None`` for it, transactional or not), as
:mod:`fanout_kafka.membership` found for the plan offset. Hence a digest: the refusal names
the old topic by finding a topic of the cluster with that digest.

A partition committed by a fanout that did not write target offsets (or whose target
offset is another batch's) has no known topic: it is not compared, and the replay goes on.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

TOPIC_SUFFIX = ".topic"
"""The target group is the marker group plus this suffix."""

_BATCH_BITS, _DIGEST_BITS = 32, 31
_BATCH_MASK = (1 << _BATCH_BITS) - 1


def target_group(marker_group: str) -> str:
    """The group whose committed offset is the partition's target offset."""
    return marker_group + TOPIC_SUFFIX


def topic_digest(topic: str) -> int:
    """31 bits of a SHA-256 of the topic name."""
    return int.from_bytes(hashlib.sha256(topic.encode()).digest()[:4], "big") >> 1


def pack_target(topic: str, batch_id: int) -> int:
    """The target offset of a partition writing batch ``batch_id`` to ``topic``."""
    return (topic_digest(topic) << _BATCH_BITS) | ((batch_id + 1) & _BATCH_MASK)


def committed_digest(offset: int, batch_id: int) -> int | None:
    """The topic digest a target offset holds for batch ``batch_id``; ``None`` when the
    group has no offset or the offset is another batch's."""
    if offset < 0 or offset & _BATCH_MASK != (batch_id + 1) & _BATCH_MASK:
        return None
    return offset >> _BATCH_BITS


@dataclass(frozen=True)
class TargetCheck:
    """What the committed partitions of a batch say about their topic.

    :param moved: per topic digest other than the current topic's, the partitions that
        committed there.
    :param unknown: partitions whose topic was not recorded (an older fanout).
    """

    moved: dict[int, list[int]] = field(default_factory=dict)
    unknown: list[int] = field(default_factory=list)


def compare(
    holding: Sequence[int], offsets: Sequence[int], topic: str, batch_id: int
) -> TargetCheck:
    """Compare the target offsets ``offsets`` of the partitions ``holding`` the batch
    with the current ``topic``."""
    check = TargetCheck()
    now = topic_digest(topic)
    for partition, offset in zip(holding, offsets, strict=True):
        digest = committed_digest(offset, batch_id)
        if digest is None:
            check.unknown.append(partition)
        elif digest != now:
            check.moved.setdefault(digest, []).append(partition)
    return check


def refuse_moved(
    check: TargetCheck,
    topic: str,
    batch_id: int,
    topics: Callable[[], Iterable[str]],
    *,
    sink: str,
) -> None:
    """Raise :class:`fanout_kafka.errors.KafkaMarkerError` when partitions committed the
    batch to another topic than ``topic``, naming it (found among ``topics()`` by its
    digest) and what to do. Nothing has been written when it is raised."""
    from fanout_kafka.errors import KafkaMarkerError

    if not check.moved:
        return
    names = {topic_digest(t): t for t in topics()}
    where = []
    for digest, partitions in sorted(check.moved.items()):
        old = names.get(digest)
        shown = (
            repr(old)
            if old is not None
            else f"a topic not in the cluster now (digest {digest:08x})"
        )
        where.append(f"partition(s) {partitions} to {shown}")
    olds = [names[d] for d in sorted(check.moved) if d in names]
    back = (
        f"Set 'topic' back to {olds[0]!r}"
        if len(olds) == 1
        else "Set 'topic' back to the old topic"
    )
    raise KafkaMarkerError(
        f"option 'topic' changed in the middle of batch {batch_id}: "
        f"{'; '.join(where)} committed it, and 'topic' is now {topic!r}. A replay skips "
        f"the committed partitions, so {topic!r} would miss their rows (they stay only in "
        f"the old topic). Nothing was written. {back} until this batch completes, then "
        "change it (a change between batches is safe).",
        sink=sink,
        batch_id=batch_id,
    )


__all__ = [
    "TargetCheck",
    "committed_digest",
    "compare",
    "pack_target",
    "refuse_moved",
    "target_group",
    "topic_digest",
]
