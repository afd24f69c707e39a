"""The letters journal: which records a committed partition dead-lettered, committed with it.

A Kafka sink whose dead letters go to a target outside the cluster (a Delta table) cannot
write them in the partition's Kafka transaction. Written *before* the commit (fanout up to
this change), they stayed when the commit then failed, and the replay's letters were
skipped as already written while its records were produced again: a record the broker
refused in one attempt and took in the next ended in both places, one it took in the first
and refused in the next in neither (the broker's refusals depend on how records are
batched, and on settings a restart may change).

So the letters are parked only *after* the partition committed, and the transaction that
commits says which they are: one journal record on partition 0 of the marker topic,

- key: the letters group ``<marker group>.letters``;
- value: JSON ``{"batch": b, "reasons": [...], "letters": [[digest, reason index], ...]}``,
  one entry per dead-lettered record (the bad records and those the broker refused), each
  named by :func:`record_digest` of its key, value and headers;

and the journal record's offset committed for the letters group in the same transaction
(like the marker and the plan offset, :mod:`fanout_kafka.membership`). A replay that finds
the partition committed re-encodes the same rows (membership is checked before), reads the
journal at that offset, rebuilds the letters from its own records by digest and parks them
under the same Delta transaction id, which writes them once whether or not the attempt that
committed had parked them already.

A ``kafka:`` dead-letter topic needs no journal (its letters commit in the partition's own
transaction), but a replay still has to *count* them as the attempt that committed did:
its own bad records it finds again (unless its size check, raised since, lets one through),
the records the producer or broker refused it cannot. So a transaction with dead letters
also commits, for group ``<marker group>.refused``, the offset
``letters << 32 | (batch + 1) mod 2**32`` (:func:`pack_refused`), ``letters`` all the
partition's letters, its bad records and the refused ones; the replay takes that count
instead of its own when the batch bits are its own (:func:`unpack_refused`). The
total, not the refused records alone: a replay whose size check sets a refused record
aside itself (``max_record_bytes`` lowered since) would count it twice.

The count is committed for every transaction with letters, whatever the target: the
driver asks whether a batch's letters reached a Delta table (``holds_batch``) at a run's
start, by ``fanout recover`` and at a new epoch, and counts them from the partitions'
refused groups (:mod:`fanout_kafka.letters`) instead of reading their journals.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from fanout_kafka.records import BadRecord, Record

LETTERS_SUFFIX = ".letters"
"""The letters group is the marker group plus this suffix."""

REFUSED_SUFFIX = ".refused"
"""The group of a ``kafka:`` dead-letter topic's refused count: the marker group plus this."""

_REFUSED_BATCH_BITS = 32

DIGEST_BYTES = 12
"""A record's digest length: collisions among one partition's records are out of reach."""

MAX_JOURNAL_BYTES = 900_000
"""A journal larger than this (about 25,000 letters in one partition) is refused before the
transaction commits, under Kafka's default 1 MB record limit."""


class JournalTooLarge(Exception):
    """More dead letters in one partition than one journal record holds."""


class JournalGone(Exception):
    """The journal a committed partition's letters group points at is no longer in the
    marker topic (its retention or compaction removed it)."""


class JournalMismatch(Exception):
    """A journal names a record the replay's partition does not have."""


def letters_group(marker_group: str) -> str:
    """The group whose committed offset is the partition's journal record."""
    return marker_group + LETTERS_SUFFIX


def refused_group(marker_group: str) -> str:
    """The group whose committed offset counts the letters of a partition's committed
    transaction when it has any (bad records, records the producer or broker refused)."""
    return marker_group + REFUSED_SUFFIX


def pack_refused(batch_id: int, letters: int) -> int:
    """The refused group's offset: ``letters`` dead letters (bad and refused records) of
    batch ``batch_id``."""
    return (letters << _REFUSED_BATCH_BITS) | ((batch_id + 1) % 2**_REFUSED_BATCH_BITS)


def unpack_refused(offset: int, batch_id: int) -> int:
    """The letters count an offset of :func:`pack_refused` holds for ``batch_id``: 0 when
    none was committed (a negative offset) or it is another batch's (a committed count is
    never 0: it is committed only for a transaction with letters)."""
    if offset < 0 or offset % 2**_REFUSED_BATCH_BITS != (batch_id + 1) % 2**_REFUSED_BATCH_BITS:
        return 0
    return offset >> _REFUSED_BATCH_BITS


def record_digest(record: Record) -> str:
    """A record's identity: a digest of its key, value and headers (length-prefixed, a
    null key or value told apart from an empty one)."""
    digest = hashlib.blake2b(digest_size=DIGEST_BYTES)

    def part(data: bytes | None) -> None:
        if data is None:
            digest.update(b"\xff" * 8)
        else:
            digest.update(len(data).to_bytes(8, "big"))
            digest.update(data)

    part(record.key)
    part(record.value)
    for name, value in record.headers:
        part(name.encode())
        part(value)
    return digest.hexdigest()


def encode(batch_id: int, letters: Sequence[BadRecord]) -> bytes:
    """The journal record's value for ``letters`` of batch ``batch_id``.

    :raises JournalTooLarge: over :data:`MAX_JOURNAL_BYTES`.
    """
    reasons: dict[str, int] = {}
    entries = [
        [record_digest(b.record), reasons.setdefault(b.reason, len(reasons))] for b in letters
    ]
    value = json.dumps(
        {"batch": batch_id, "reasons": list(reasons), "letters": entries},
        separators=(",", ":"),
    ).encode()
    if len(value) > MAX_JOURNAL_BYTES:
        raise JournalTooLarge(
            f"{len(letters)} dead letters in one partition ({len(value)} bytes of journal, "
            f"at most {MAX_JOURNAL_BYTES}): raise the sink's 'partitions'"
        )
    return value


def decode(value: bytes, batch_id: int) -> list[tuple[str, str]] | None:
    """The ``(digest, reason)`` entries of a journal of batch ``batch_id``; ``None`` when
    the journal is another batch's (the committed attempt of this batch had no letters)."""
    data: dict[str, Any] = json.loads(value)
    if data.get("batch") != batch_id:
        return None
    reasons: list[str] = data["reasons"]
    return [(str(digest), reasons[index]) for digest, index in data["letters"]]


def summary(value: bytes) -> tuple[int, int]:
    """A journal's batch id and how many letters it names."""
    data: dict[str, Any] = json.loads(value)
    return int(data["batch"]), len(data["letters"])


def rebuild(
    entries: Sequence[tuple[str, str]], records: Sequence[Record], bad: Sequence[BadRecord]
) -> list[BadRecord]:
    """The letters a journal names, rebuilt from the replay's own records and bad records
    (each entry takes one record of its digest, so repeated records count as often as the
    journal says).

    :raises JournalMismatch: an entry no record of the partition matches.
    """
    wanted: dict[str, int] = {}
    for digest, _ in entries:
        wanted[digest] = wanted.get(digest, 0) + 1
    found: dict[str, list[Record]] = {}
    for record in [*(b.record for b in bad), *records]:
        digest = record_digest(record)
        if len(found.get(digest, ())) < wanted.get(digest, 0):
            found.setdefault(digest, []).append(record)
    letters = []
    for digest, reason in entries:
        candidates = found.get(digest)
        if not candidates:
            raise JournalMismatch(
                f"the committed partition dead-lettered a record (digest {digest}) that its "
                "replay does not have: the rows or the encoding changed since it committed"
            )
        letters.append(BadRecord(candidates.pop(0), reason))
    return letters


__all__ = [
    "JournalGone",
    "JournalMismatch",
    "JournalTooLarge",
    "decode",
    "encode",
    "letters_group",
    "pack_refused",
    "rebuild",
    "record_digest",
    "refused_group",
    "summary",
    "unpack_refused",
]
