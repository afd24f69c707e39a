"""Step 2 of a batch: refuse to write when the checkpoint does not match the ledger
(ARCHITECTURE §2.3).

Two ways a checkpoint stops matching, both of which would make the sinks skip rows:

- **reset**: the checkpoint was deleted or replaced. Spark starts a new query id and
  numbers batches from 0 again; the sinks' idempotency ids say "done" (skip) or, under new
  ids, the batches are written twice. Evidence: the ledger holds marks at or past the
  batch written by another query id (:class:`CheckpointResetError`).
- **rollback**: the checkpoint was restored from a backup or lost its newest ``offsets/``
  and ``commits/`` files. The query id is unchanged; Spark plans batch K+1 again, from
  the end of batch K to the newest input, and every sink whose mark is at or past K+1
  would skip rows it never received. Evidence (:class:`CheckpointRollbackError`): the
  ledger holds batches past the one Spark handed (a crash replay is always of the last
  batch: Spark plans N+1 only after committing N), or it recorded this batch with other
  source offsets or another planning time. A crash replay reads the same ``offsets/N``
  file, so both match; a re-planned batch gets a new ``batchTimestampMs`` even when a
  source's offsets repeat (a file source's ``{"logOffset": N}``).

Each epoch belongs to one streaming query id (Spark's query ``id``, which a restart on the
same checkpoint keeps; not its ``runId``): the query that started it (its ``epoch`` row;
epoch 0's is the claim of its first query, :mod:`fanout.steps.admit`), or, in epoch 0 of a
ledger from before claims, the query of its latest mark or failed attempt. A batch of
another known query id is a replaced checkpoint wherever its batch id falls
(:class:`CheckpointResetError`): above the high-water mark, or in an epoch without marks
yet, the sinks that received a batch id of the owner would skip the new query's batch of
that id or hold both queries' copies of the same input. A query that owned an *earlier*
epoch is an old checkpoint restored after a reset was accepted (:func:`superseded_message`);
the new epoch's query already wrote its input, so no new epoch may take it. Unknown query
ids, on either side, are no evidence.

The common path pays one log lookup: the epochs' owners are read once per guard (one
projected scan, when a FanOut starts) and again only when the epoch changes; only when the
pipeline's high-water mark is at or past the incoming batch (a replay, or a checkpoint
behind the ledger) does the guard scan the ledger's rows from that batch on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping

from fanout.contract.batch import BatchInfo
from fanout.errors import CheckpointResetError, CheckpointRollbackError
from fanout.ledger.entry import Ledger, LedgerEntry, ledger_location
from fanout.steps.guard_text import (
    LedgerFacts,
    by_hand_message,
    describe_plan,
    owner_message,
    reset_message,
    rollback_message,
    superseded_message,
)

log = logging.getLogger(__name__)

__all__ = [
    "CheckpointGuard",
    "check_checkpoint",
    "compare_plan",
    "describe_plan",
    "latest_per_sink",
    "owner_message",
    "reset_message",
    "rollback_message",
    "superseded_message",
]


class CheckpointGuard:
    """Checks each batch against the ledger before anything is written; warns once per
    kind of check it cannot make (unknown query id, unknown offsets).

    :param ledger: the pipeline's ledger.
    :param spooled: the last batch of an epoch the spool holds for each lagging sink
        (their missed batches reach them from the spool: the refusals say so).
    """

    def __init__(
        self, ledger: Ledger, spooled: Callable[[int], Mapping[str, int]] | None = None
    ) -> None:
        self.ledger = ledger
        self.spooled = spooled
        # how the refusals' `fanout recover --ledger ...` names it
        self.location = ledger_location(ledger)
        self.spool_location: str | None = None
        """The pipeline's spool as the refusals' `fanout recover --spool` names it."""
        self.pipeline_file: str | None = None
        """The pipeline file (``fanout run``'s), as the refusals' commands name it: they
        say ``fanout run ... --new-epoch`` and ``fanout recover --config``; ``None``: a
        ``FanOut`` built in code, told ``on_checkpoint_reset="new_epoch"``."""
        self._warned: set[str] = set()
        # per pipeline: the epoch at which the owners were read, and the owners
        self._owners: dict[str, tuple[int, dict[int, str]]] = {}

    def check(self, info: BatchInfo, high: int | None) -> None:
        """Raise :class:`CheckpointResetError` when ``info.epoch`` belongs to another query
        id or another query id committed batches of this pipeline at or after
        ``info.batch_id``, :class:`CheckpointRollbackError` when the checkpoint was rolled
        back; return quietly otherwise (including restarts of the same query and replays of
        the last batch after a crash). ``high`` is the pipeline's high-water mark in
        ``info.epoch``, as the ledger's lookup read it. A known query id admitted into an
        epoch without a known owner becomes its owner (for this guard)."""
        owner = self.owner(info.pipeline, info.epoch)
        if info.query_id is not None and owner is not None and owner != info.query_id:
            self.refuse_superseded(info)  # an old checkpoint: no way on offers a new epoch
            facts = self._facts(info)
            if high is not None and high >= info.batch_id:
                # rows of another query at or after the batch: the usual text
                raise CheckpointResetError(reset_message(info, facts))
            raise CheckpointResetError(owner_message(info, owner, high, facts))
        self._check_marks(info, high)
        if owner is None and info.query_id is not None:
            self._owners[info.pipeline][1][info.epoch] = info.query_id

    def owner(self, pipeline: str, epoch: int) -> str | None:
        """The query id ``epoch`` of ``pipeline`` belongs to (``None``: not known). Read
        from the ledger on first use and when the epoch changes, else from memory."""
        loaded = self._owners.get(pipeline)
        if loaded is None or loaded[0] != epoch:
            loaded = (epoch, dict(self.ledger.epoch_owners(pipeline)))
            self._owners[pipeline] = loaded
        return loaded[1].get(epoch)

    def superseded(self, info: BatchInfo) -> int | None:
        """The latest epoch before ``info.epoch`` that ``info.query_id`` owned (``None``:
        none, or the query id is unknown): the batch comes from an old checkpoint that a
        later epoch's query replaced."""
        if info.query_id is None:
            return None
        self.owner(info.pipeline, info.epoch)
        owned = [
            epoch
            for epoch, query in self._owners[info.pipeline][1].items()
            if query == info.query_id and epoch < info.epoch
        ]
        return max(owned, default=None)

    def refuse_superseded(self, info: BatchInfo) -> None:
        """Raise :class:`CheckpointResetError` when ``info.query_id`` owned an epoch before
        ``info.epoch`` (:meth:`superseded`): an old checkpoint, which no new epoch may
        take either."""
        owned = self.superseded(info)
        if owned is not None:
            owner = self.owner(info.pipeline, info.epoch)
            raise CheckpointResetError(superseded_message(info, owned, owner, self._facts(info)))

    def forget(self, pipeline: str) -> None:
        """Drop what was read of ``pipeline``'s owners: the next check reads them again."""
        self._owners.pop(pipeline, None)

    def started_epoch(self, info: BatchInfo) -> None:
        """Note that ``info.query_id`` started ``info.epoch`` (the ledger just recorded it)."""
        owners = dict(self._owners.get(info.pipeline, (0, {}))[1])
        if info.query_id is not None:
            owners[info.epoch] = info.query_id
        self._owners[info.pipeline] = (info.epoch, owners)

    def _check_marks(self, info: BatchInfo, high: int | None) -> None:
        if high is None or high < info.batch_id:
            return
        newer = self.ledger.committed_entries(info.pipeline, info.batch_id, epoch=info.epoch)
        if info.query_id is None:
            self._warn_once(
                "query id",
                "pipeline %s, batch %s: query id unknown; cannot tell a replay from a "
                "checkpoint reset",
                info,
            )
        else:
            # a row without a query id was written when the id could not be read: it is
            # no evidence of another query (the comparison of plans below still applies)
            foreign = [e for e in newer if e.query_id not in (None, info.query_id)]
            if foreign:
                raise CheckpointResetError(reset_message(info, self._facts(info)))
            if info.source_offsets is not None and newer and all(map(_by_hand, newer)):
                raise CheckpointResetError(by_hand_message(info, newer, self._facts(info)))
        same_batch = [e for e in newer if e.batch_id == info.batch_id]
        outcomes = [compare_plan(e, info) for e in same_batch]
        if high > info.batch_id or False in outcomes:
            raise CheckpointRollbackError(
                rollback_message(info, high, same_batch, self._facts(info))
            )
        if None in outcomes:
            self._warn_unknown_plan(
                info, [e for e, o in zip(same_batch, outcomes, strict=True) if o is None]
            )

    def _facts(self, info: BatchInfo) -> LedgerFacts:
        """What a refusal of ``info`` tells of the ledger: each sink's last mark in the
        epoch (and the batches the spool holds for the lagging ones), the commands' names
        of the ledger, the spool and the pipeline file."""
        latest = self._latest(info)
        spooled = {} if self.spooled is None else self.spooled(info.epoch)
        return LedgerFacts(latest, self.location, spooled, self.spool_location, self.pipeline_file)

    def _latest(self, info: BatchInfo) -> dict[str, LedgerEntry]:
        # every sink's last batch in the epoch, also of those behind info.batch_id: the
        # offsets of the sink furthest behind are where a recovery must start from; the
        # texts set apart the sinks no longer written (guard_text.sink_marks)
        return latest_per_sink(self.ledger.committed_entries(info.pipeline, epoch=info.epoch))

    def _warn_unknown_plan(self, info: BatchInfo, entries: list[LedgerEntry]) -> None:
        if info.source_offsets is None:
            self._warn_once(
                "offsets",
                "pipeline %s, batch %s: the batch's source offsets are unknown, so fanout "
                "cannot tell a crash replay from a rolled-back checkpoint; sinks holding the "
                "batch skip it",
                info,
            )
        else:
            self._warn_once(
                "recorded offsets",
                "pipeline %s, batch %s: the ledger recorded no source offsets for this batch "
                f"(sinks {', '.join(sorted({e.sink for e in entries}))}), so fanout cannot "
                "tell a crash replay from a rolled-back checkpoint; sinks holding the batch "
                "skip it",
                info,
            )

    def _warn_once(self, kind: str, message: str, info: BatchInfo) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(message, info.pipeline, info.batch_id)


def _by_hand(entry: LedgerEntry) -> bool:
    """A mark of a ``FanOut`` called outside a streaming query (``fo(df, 0)``): no query
    id, no plan, no note (a skip's or a recovery's marks carry one)."""
    return (
        entry.query_id is None
        and entry.source_offsets is None
        and entry.batch_timestamp_ms is None
        and entry.error is None
    )


def check_checkpoint(ledger: Ledger, info: BatchInfo, high: int | None) -> None:
    """One check by a fresh :class:`CheckpointGuard` (which warns once per instance)."""
    CheckpointGuard(ledger).check(info, high)


def compare_plan(entry: LedgerEntry, info: BatchInfo) -> bool | None:
    """Whether Spark planned ``info``'s batch as the ledger ``entry`` recorded it: ``True``
    (same source offsets, and the same planning time where both are known), ``False``
    (either differs), ``None`` (nothing known on both sides: cannot tell).

    Offsets alone can repeat for a re-planned batch (a file source's ``{"logOffset": N}``
    names a batch of its own log, whose files may differ), the planning time does not;
    rows written before fanout recorded planning times fall back to offsets only.
    """
    if info.source_offsets is None or entry.source_offsets is None:
        return None
    if entry.offsets() != _as_json(info.source_offsets):
        return False
    if entry.batch_timestamp_ms is not None and info.batch_timestamp_ms is not None:
        return entry.batch_timestamp_ms == info.batch_timestamp_ms
    return True


def _as_json(value: object) -> object:
    """``value`` as the ledger gives it back (JSON round trip: tuples become lists)."""
    return json.loads(json.dumps(value))


def latest_per_sink(entries: Iterable[LedgerEntry]) -> dict[str, LedgerEntry]:
    """The committed entry with the highest (epoch, batch id) of each sink."""
    latest: dict[str, LedgerEntry] = {}
    for entry in entries:
        current = latest.get(entry.sink)
        if current is None or (entry.epoch, entry.batch_id) > (current.epoch, current.batch_id):
            latest[entry.sink] = entry
    return latest
