"""Where and how a committed partition wrote its batch, and the replay's check of it.

A replay skips the partitions whose markers hold the batch. If what decides where a row
goes or what its record holds changed between the attempt that committed them and the
replay, the batch ends up split: rows only in the old ``topic`` (the new one misses them),
records in two encodings (``value``, ``headers``, ``key``), letters in two ``dead_letter``
targets, or, under a new route refusing rows a committed partition already wrote, a row
both in the topic and in the dead letters. So each partition's transaction also commits,
for group ``<marker group>.target`` on the marker topic, the *target offset*, 63 bits:

======  =====================================================================
bits    what
======  =====================================================================
43-62   20 bits of a digest of the topic name (the refusal finds the old topic
        among the cluster's topics by it)
22-42   21 bits of a digest of the rest: encoding, dead-letter target, route
16-21   2 bits of a digest of each of those three, to name which one changed
0-15    the low 16 bits of ``batch + 1``
======  =====================================================================

It commits atomically with the records and the marker, so it holds exactly when the
marker does, and is read only for partitions whose marker holds the batch: the batch bits
only tell this batch's offset from one an earlier batch left in a partition committed
since by a fanout that wrote none (a downgrade); 16 bits make that a 1-in-65536 chance.
One ``send_offsets_to_transaction`` per partition and batch, as before.

Last session's format (group ``<marker group>.topic``: 31 bits of topic digest above 32
bits of ``batch + 1``) is still read: a partition holding the batch with that offset and
no new one is compared on its topic only.

Why an offset and not the commit's ``metadata`` string: the embedded Tansu broker keeps no
offset-commit metadata (``committed()`` and ``list_consumer_group_offsets`` return
``None`` for it), as :mod:`fanout_kafka.membership` found for the plan offset.

A partition committed by a fanout that recorded neither (or whose offsets are another
batch's) is not compared, and the replay goes on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

TARGET_SUFFIX = ".target"
"""The target group is the marker group plus this suffix."""

TOPIC_SUFFIX = ".topic"
"""The group of last session's target offsets (topic only): read, no longer written."""

_BATCH_BITS, _TAG_BITS, _REST_BITS, _TOPIC_BITS = 16, 2, 21, 20
_TAGS_SHIFT = _BATCH_BITS
_REST_SHIFT = _TAGS_SHIFT + 3 * _TAG_BITS
_TOPIC_SHIFT = _REST_SHIFT + _REST_BITS
_LEGACY_BATCH_BITS, _LEGACY_TOPIC_BITS = 32, 31

ENCODING, DEAD_LETTER, ROUTE = "value/headers/key encoding", "dead_letter", "route"
ASPECTS = (ENCODING, DEAD_LETTER, ROUTE)
"""What the rest digest covers, in the order of the tags."""


def target_group(marker_group: str) -> str:
    """The group whose committed offset is the partition's target offset."""
    return marker_group + TARGET_SUFFIX


def legacy_target_group(marker_group: str) -> str:
    """The group of last session's (topic only) target offset."""
    return marker_group + TOPIC_SUFFIX


@dataclass(frozen=True)
class TargetStamp:
    """What a partition's batch went by: the topic, and the texts of the encoding
    (``value``, ``headers``, ``key``), the dead-letter target and the route fingerprint.
    Only their digests are committed (no secret leaves the process)."""

    topic: str
    encoding: str
    dead_letter: str
    route: str
    route_earlier: tuple[str, ...] = ()
    """Fingerprints older fanout versions gave the same route: a partition committed
    under one of them went by this route (not recorded, only compared)."""
    dead_letter_earlier: tuple[str, ...] = ()
    """The sink's earlier dead-letter targets fanout asked what they hold of the batch
    (:attr:`fanout.Batch.earlier`, when its ``dead_letter`` moved since an attempt of the
    batch), as :attr:`dead_letter` spells a target: a partition committed under one of
    them is accepted, its letters not parked twice (not recorded, only compared)."""
    dead_letter_written: tuple[str, ...] = field(default=(), repr=False)
    """:attr:`dead_letter` as older fanout versions spelled the same target (a Delta
    target's location with its password or SAS ``sig=`` as written, since masked): a
    partition committed under it went by this target (not recorded, only compared, not in
    the stamp's ``repr``: it may hold a secret)."""

    def aspects(self) -> tuple[str, str, str]:
        """The texts of :data:`ASPECTS`, in order."""
        return (self.encoding, self.dead_letter, self.route)


def encoding_text(key: Sequence[str] | None, value: str | None, headers: object) -> str:
    """The encoding options as one text: key columns, value column (``None``: the row as
    JSON) and headers (``True``/``False`` or the header columns)."""
    shown = list(headers) if isinstance(headers, tuple | list) else headers
    return json.dumps({"key": None if key is None else list(key), "value": value,
                       "headers": shown})  # fmt: skip


def _digest(text: str, bits: int) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> (64 - bits)


def topic_digest(topic: str) -> int:
    """20 bits of a SHA-256 of the topic name."""
    return _digest(topic, _TOPIC_BITS)


def legacy_topic_digest(topic: str) -> int:
    """31 bits of a SHA-256 of the topic name (last session's format)."""
    return int.from_bytes(hashlib.sha256(topic.encode()).digest()[:4], "big") >> 1


def _rest(stamp: TargetStamp) -> int:
    return _digest("\0".join(stamp.aspects()), _REST_BITS)


def _tags(stamp: TargetStamp) -> int:
    tags = 0
    for i, text in enumerate(stamp.aspects()):
        tags |= _digest(f"{ASPECTS[i]}\0{text}", _TAG_BITS) << (i * _TAG_BITS)
    return tags


def pack_target(stamp: TargetStamp, batch_id: int) -> int:
    """The target offset of a partition writing batch ``batch_id`` as ``stamp`` says."""
    return (
        (topic_digest(stamp.topic) << _TOPIC_SHIFT)
        | (_rest(stamp) << _REST_SHIFT)
        | (_tags(stamp) << _TAGS_SHIFT)
        | ((batch_id + 1) & ((1 << _BATCH_BITS) - 1))
    )


def pack_legacy_target(topic: str, batch_id: int) -> int:
    """Last session's target offset (for tests of reading it)."""
    return (legacy_topic_digest(topic) << _LEGACY_BATCH_BITS) | (
        (batch_id + 1) & ((1 << _LEGACY_BATCH_BITS) - 1)
    )


def _of_batch(offset: int, batch_id: int, bits: int) -> bool:
    mask = (1 << bits) - 1
    return offset >= 0 and offset & mask == (batch_id + 1) & mask


@dataclass(frozen=True)
class TargetCheck:
    """What the committed partitions of a batch say about where and how they wrote it.

    :param moved: per committed topic digest other than the current topic's, as
        ``(digest bits, digest)``, the partitions that committed there.
    :param changed: per tuple of aspects (:data:`ASPECTS`) that changed (all three when
        the digest cannot tell which), the partitions that committed under them.
    :param unknown: partitions that recorded nothing of this batch (an older fanout).
    """

    moved: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    changed: dict[tuple[str, ...], list[int]] = field(default_factory=dict)
    unknown: list[int] = field(default_factory=list)


def compare(
    holding: Sequence[int],
    offsets: Sequence[int],
    legacy: Sequence[int],
    stamp: TargetStamp,
    batch_id: int,
) -> TargetCheck:
    """Compare the target offsets ``offsets`` (and last session's ``legacy`` ones) of the
    partitions ``holding`` the batch with ``stamp``, the replay's."""
    check = TargetCheck()
    rest, tags = _rest(stamp), _tags(stamp)
    for partition, offset, old in zip(holding, offsets, legacy, strict=True):
        if _of_batch(offset, batch_id, _BATCH_BITS):
            digest = offset >> _TOPIC_SHIFT
            if digest != topic_digest(stamp.topic):
                check.moved.setdefault((_TOPIC_BITS, digest), []).append(partition)
            which = _changed(offset, rest, tags)
            if which and not _accepted(offset, stamp):
                check.changed.setdefault(which, []).append(partition)
        elif _of_batch(old, batch_id, _LEGACY_BATCH_BITS):
            digest = old >> _LEGACY_BATCH_BITS
            if digest != legacy_topic_digest(stamp.topic):
                check.moved.setdefault((_LEGACY_TOPIC_BITS, digest), []).append(partition)
        else:
            check.unknown.append(partition)
    return check


def _accepted(offset: int, stamp: TargetStamp) -> bool:
    """Whether a partition whose target offset differs from ``stamp``'s went by it all
    the same: committed under a fingerprint an older version gave the same route
    (:attr:`TargetStamp.route_earlier`), or under no dead-letter target and otherwise as
    ``stamp``. A partition without a target has no letters (a bad record fails its
    partition and a row the route refuses fails the batch), so a target added since splits
    nothing: it is how a batch stuck on a bad record is let through. Or under an earlier
    target fanout asked what it holds of the batch (:attr:`TargetStamp.dead_letter_earlier`):
    the letters it holds stay there, the replay parks the others once. Or under the
    target as an older version spelled it (:attr:`TargetStamp.dead_letter_written`)."""
    for same in (stamp, *(replace(stamp, route=old) for old in stamp.route_earlier)):
        alike = [same, replace(same, dead_letter="")] if same.dead_letter else [same]
        earlier = (*stamp.dead_letter_earlier, *stamp.dead_letter_written)
        alike += [replace(same, dead_letter=old) for old in earlier]
        if any(not _changed(offset, _rest(a), _tags(a)) for a in alike):
            return True
    return False


def _changed(offset: int, rest: int, tags: int) -> tuple[str, ...]:
    """The aspects whose tags differ; all of them when only the rest digest does."""
    then_tags = (offset >> _TAGS_SHIFT) & ((1 << 3 * _TAG_BITS) - 1)
    then_rest = (offset >> _REST_SHIFT) & ((1 << _REST_BITS) - 1)
    mask = (1 << _TAG_BITS) - 1
    named = tuple(
        a for i, a in enumerate(ASPECTS)
        if (then_tags >> (i * _TAG_BITS)) & mask != (tags >> (i * _TAG_BITS)) & mask
    )  # fmt: skip
    if named or then_rest == rest:
        return named
    return ASPECTS


_WHY = {
    ENCODING: "its records would be in two encodings",
    DEAD_LETTER: "its dead letters would be split across two targets",
    ROUTE: "a row the new route refuses would be both in the topic (written by a "
    "committed partition) and in the dead letters, and one only the old route refuses "
    "in neither",
}
_RESTORE = {
    ENCODING: "'value', 'headers' and 'key'",
    DEAD_LETTER: "'dead_letter'",
    ROUTE: "the route ('where', 'select')",
}


def refuse_moved(
    check: TargetCheck,
    topic: str,
    batch_id: int,
    topics: Callable[[], Iterable[str]],
    *,
    sink: str,
) -> None:
    """Raise :class:`fanout_kafka.errors.KafkaMarkerError` when partitions committed the
    batch to another topic than ``topic`` (naming it, found among ``topics()`` by its
    digest), or under another encoding, dead-letter target or route (naming which when the
    digest tells, else the candidates), and what to do. Nothing has been written when it
    is raised."""
    from fanout_kafka.errors import KafkaMarkerError

    if not check.moved and not check.changed:
        return
    parts, backs = [], []
    if check.moved:
        part, back = _moved_text(check, topic, batch_id, topics)
        parts.append(part)
        backs.append(back)
    for aspects, partitions in sorted(check.changed.items()):
        what = aspects[0] if len(aspects) == 1 else "one of: " + ", ".join(aspects)
        why = "; or ".join(_WHY[a] for a in aspects)
        parts.append(
            f"{what} changed in the middle of batch {batch_id}: partition(s) {partitions} "
            f"committed it under another {' / '.join(aspects)} than now, and a replay skips "
            f"them, so {why}"
        )
        backs.append("set " + " / ".join(_RESTORE[a] for a in aspects) + " back")
    back = "; ".join(backs)
    raise KafkaMarkerError(
        f"{'. '.join(parts)}. Nothing was written. {back[0].upper()}{back[1:]} until "
        "this batch completes, then change it (a change between batches is safe).",
        sink=sink,
        batch_id=batch_id,
    )


def _moved_text(
    check: TargetCheck, topic: str, batch_id: int, topics: Callable[[], Iterable[str]]
) -> tuple[str, str]:
    """The topic part of the refusal, and what to set back."""
    names: dict[tuple[int, int], str] = {}
    for name in topics():
        names[(_TOPIC_BITS, topic_digest(name))] = name
        names[(_LEGACY_TOPIC_BITS, legacy_topic_digest(name))] = name
    where = []
    for digest, partitions in sorted(check.moved.items()):
        old = names.get(digest)
        shown = (
            repr(old)
            if old is not None
            else f"a topic not in the cluster now (digest {digest[1]:08x})"
        )
        where.append(f"partition(s) {partitions} to {shown}")
    olds = sorted({names[d] for d in check.moved if d in names})
    back = "set 'topic' back to " + (repr(olds[0]) if len(olds) == 1 else "the old topic")
    text = (
        f"option 'topic' changed in the middle of batch {batch_id}: "
        f"{'; '.join(where)} committed it, and 'topic' is now {topic!r}. A replay skips "
        f"the committed partitions, so {topic!r} would miss their rows (they stay only in "
        "the old topic)"
    )
    return text, back


__all__ = [
    "ASPECTS",
    "DEAD_LETTER",
    "ENCODING",
    "ROUTE",
    "TargetCheck",
    "TargetStamp",
    "compare",
    "encoding_text",
    "legacy_target_group",
    "legacy_topic_digest",
    "pack_legacy_target",
    "pack_target",
    "refuse_moved",
    "target_group",
    "topic_digest",
]
