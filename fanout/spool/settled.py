"""When a batch of an epoch before the current one is settled, by the ledger's marks and the
spool alone (its checkpoint was replaced): the rule the catch-up
(:class:`fanout.steps.lag.Lagging`), ``fanout status``, ``fanout recover`` and
``fanout ledger skip`` (:func:`fanout.ledger.gaps.older_epoch_missed`) share
(docs/architecture.md §14.4, "An older epoch"). Pure functions of the spool's records and
the sinks' marks, below the ledger and the steps that use them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fanout.spool.index import BatchKey, SpooledBatch


def party_of(batch: SpooledBatch | None, marked: Iterable[str]) -> frozenset[str]:
    """The sinks that took part in a batch of an epoch before the current one, each of which
    must hold it for it to be settled (docs/architecture.md §14.4, "An older epoch"): the
    sinks configured when it was spooled, as the spool recorded them; a sink added since
    took no part. For a batch the spool holds without that record (spooled by an older
    version) or does not hold (a backfill source's), the sinks it is spooled for and those
    with a mark in its epoch (``marked``): a sink without ``on_failure="lag"`` that failed
    the epoch's first batch has no mark there, and is then not counted."""
    if batch is not None and batch.party is not None:
        return batch.party
    return frozenset(marked) | (frozenset() if batch is None else batch.needed_by)


def every_sink_holds(
    batch_id: int,
    sinks: Iterable[str],
    spooled_for: frozenset[str],
    mark: Callable[[str], int | None],
    backfilled: Callable[[str], bool] | None = None,
) -> bool:
    """Whether each of ``sinks`` holds batch ``batch_id`` of one epoch: its ``mark`` of the
    epoch is at or past it, the spool holds it for the sink (``spooled_for``), or the sink
    still backfills from a sink that holds it (``backfilled``)."""
    for name in sinks:
        if name in spooled_for:
            continue
        done = mark(name)
        if done is not None and done >= batch_id:
            continue
        if backfilled is not None and backfilled(name):
            continue
        return False
    return True


def settled_on_record(
    key: BatchKey,
    spooled: Sequence[SpooledBatch],
    mark: Callable[[str], int | None],
    marked: Iterable[str],
    backfilled: Callable[[str], bool] | None = None,
) -> bool:
    """Whether batch ``key`` of an epoch before the current one was settled, by the ledger
    and the spool alone (its checkpoint was replaced, and its query is refused from now
    on): Spark planned a later batch of its epoch (a sink's mark of the epoch, among
    ``marked``, the sinks with one, is past it, or the spool holds a later batch of it), or
    every sink that took part in it holds it (:func:`party_of`). The catch-up writes such a
    batch; any other is given up (:meth:`Lagging.abandoned`), and ``fanout status`` and
    ``fanout recover`` judge it by this same rule. ``spooled``: the pipeline's spooled
    batches; ``mark``: a sink's last mark of the batch's epoch."""
    epoch, batch_id = key
    marked = list(marked)
    if any((m := mark(s)) is not None and m > batch_id for s in marked):
        return True
    if any(b.epoch == epoch and b.batch_id > batch_id for b in spooled):
        return True
    batch = next((b for b in spooled if b.key == key), None)
    # a batch whose rows never reached the spool holds nothing for its sinks
    spooled_for = frozenset() if batch is None or batch.rows_missing else batch.needed_by
    party = party_of(batch, marked)
    return every_sink_holds(batch_id, party, spooled_for, mark, backfilled)
