"""The ledger's records of each sink's dead-letter target (docs/architecture.md §7, "A
``dead_letter`` moved between an attempt and its replay"): one ledger row per change
(status :data:`DEAD_LETTER`), and two transactions per sink whose versions say, without
reading rows, the digest of its last recorded target and the batch that record applies
from. What the records are for, and who writes them, is :mod:`fanout.deadletters.moved`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from fanout.contract.dead_letters import DELTA, split_target
from fanout.contract.locations import same_table_key, shown_location
from fanout.ledger.entry import LedgerEntry, now_utc

DEAD_LETTER: Final = "dead_letter"
"""The ledger status of a row recording a sink's dead-letter target from a batch on."""

BatchKey = tuple[int, int]
"""``(epoch, batch id)``, ordered as a sink receives its batches."""


def target_app_id(sink_app: str) -> str:
    """The ledger transaction whose version is the digest of the sink's last recorded
    target (:func:`target_digest`); ``sink_app``: :func:`fanout.contract.batch.txn_app_id`
    of epoch 0 (the record spans epochs)."""
    return f"{sink_app}#dead_letter"


def since_app_id(sink_app: str) -> str:
    """The ledger transaction whose version is the batch the last record applies from
    (:func:`since_code`)."""
    return f"{sink_app}#dead_letter_since"


def since_code(since: BatchKey | None) -> int:
    """A record's first batch as a transaction version: 0 for ``None`` (the sink had no
    mark), else ``1 + (epoch << 40 | batch)``."""
    return 0 if since is None else 1 + ((since[0] << 40) | since[1])


def since_of(code: int) -> BatchKey | None:
    """:func:`since_code` read back."""
    if code <= 0:
        return None
    code -= 1
    return code >> 40, code & ((1 << 40) - 1)


def target_digest(text: str | None) -> int:
    """A recorded target's digest, which two spellings of one target share (a Delta table
    by :func:`fanout.contract.locations.same_table_key`), and its secrets as written or
    masked alike (:func:`fanout.contract.locations.shown_location` of the location: a
    target recorded with its SAS ``?sig=`` as written by an earlier version, or another
    ``sig=`` of a rotated token, is the same target, not one the sink moved from): 0 for
    no target, else a positive 62-bit number."""
    if text is None:
        return 0
    kind, location = split_target(text)
    location = shown_location(location)
    key = f"{kind}:{same_table_key(location) if kind == DELTA else location}"
    digest = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") >> 2
    return digest or 1


@dataclass(frozen=True)
class TargetRecord:
    """One record of a sink's dead-letter target.

    :param number: its place in the sink's records (1, 2, ...).
    :param target: the target as recorded (:func:`recorded_text`; ``None``: none).
    :param since: the first batch it may have been handed: the sink's next batch when the
        record was made (``None``: the sink had no mark then, any batch may be).
    """

    number: int
    target: str | None
    since: BatchKey | None


def record_entry(pipeline: str, sink: str, record: TargetRecord) -> LedgerEntry:
    """The ledger row of ``record``: status :data:`DEAD_LETTER`, ``attempt`` its number,
    ``epoch`` and ``batch_id`` its first batch (-1: none), ``dead_letter`` its target."""
    epoch, batch = record.since if record.since is not None else (0, -1)
    at = now_utc()
    return LedgerEntry(
        pipeline=pipeline, sink=sink, batch_id=batch, status=DEAD_LETTER,
        attempt=record.number, started_at=at, finished_at=at, epoch=epoch,
        dead_letter=record.target,
    )  # fmt: skip


def records_of(entries: Sequence[LedgerEntry]) -> list[TargetRecord]:
    """The target records among ``entries`` (one sink's), in order."""
    found = [
        TargetRecord(e.attempt, e.dead_letter, None if e.batch_id < 0 else (e.epoch, e.batch_id))
        for e in entries
        if e.status == DEAD_LETTER
    ]
    return sorted(found, key=lambda r: r.number)
