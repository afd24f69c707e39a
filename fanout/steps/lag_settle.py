"""Whether Spark will never give a spooled batch up, so the catch-up may write it
(docs/architecture.md §14.4, "Settled"), or gave it up with its checkpoint.

:class:`Settlement` keeps what :class:`fanout.steps.lag.Lagging` learnt of it (the batches
found settled or given up, the newest batch of each epoch planned live), under the lag
state's lock, which ``Lagging`` shares with it; the sinks' marks, the current epoch and the
running query's checkpoint it asks of ``Lagging`` when it needs them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from fanout.sink_spec import SinkSpec
from fanout.spool.index import BatchKey, SpooledBatch
from fanout.spool.settled import every_sink_holds, settled_on_record
from fanout.spool.table import Spool
from fanout.steps.context import read_file_directly

log = logging.getLogger("fanout")


@dataclass
class Settlement:
    """Which batches of one pipeline are settled, or given up with a checkpoint reset.

    :param pipeline: the pipeline name.
    :param specs: every sink's spec (the configured sinks, each of which must hold a batch).
    :param spool: the pipeline's spool (``None`` when no sink lags or backfills).
    :param lock: the lag state's lock (:class:`fanout.steps.lag.Lagging`'s), held around
        each look at what is known, never across a ledger, spool or checkpoint read of its
        own (``mark``, the lag state's, may read the ledger under it, as it always did).
    :param mark: a sink's last committed batch of an epoch, as the lag state caches it.
    :param backfilled: whether a sink still backfills from a sink whose mark holds a batch
        (:meth:`fanout.steps.lag_backfill.BackfillMarks.holds`).
    :param epoch: the lag state's current epoch, read when it is needed (a batch's start
        moves it on).
    :param checkpoint: the running query's checkpoint and the epoch it owns, read when it
        is needed (:attr:`fanout.steps.lag.Lagging.checkpoint`, set once the query runs).
    """

    pipeline: str
    specs: Mapping[str, SinkSpec]
    spool: Spool | None
    lock: threading.RLock
    mark: Callable[[str, int], int | None]
    backfilled: Callable[[str, BatchKey], bool]
    epoch: Callable[[], int]
    checkpoint: Callable[[], tuple[int, str] | None]
    _settled: set[BatchKey] = field(default_factory=set, repr=False)
    _planned: dict[int, int] = field(default_factory=dict, repr=False)
    """Per epoch, the newest batch the lag state saw planned live."""
    _abandoned: set[BatchKey] = field(default_factory=set, repr=False)

    def saw_batch(self, key: BatchKey) -> None:
        """Batch ``key`` runs live: Spark planned it, so it committed every batch of the
        epoch before it."""
        with self.lock:
            self._planned[key[0]] = max(self._planned.get(key[0], -1), key[1])

    def settled(self, key: BatchKey) -> bool:
        """Whether batch ``key`` is settled (:meth:`fanout.steps.lag.Lagging.settled` says
        by what). Once settled, always settled."""
        with self.lock:
            if key in self._settled:
                return True
        if key[0] < self.epoch():
            found = self._settled_on_record(key)
        else:
            found = self._planned_after(key) or self._complete(key) or self._spark_committed(key)
        if found:
            with self.lock:
                self._settled.add(key)
            return True
        return False

    def abandoned(self, key: BatchKey) -> bool:
        """Whether batch ``key`` of an epoch before the current one was given up with its
        checkpoint (:meth:`fanout.steps.lag.Lagging.abandoned`); logged once, when found."""
        if key[0] >= self.epoch():
            return False
        with self.lock:
            if key in self._abandoned:
                return True  # final: the epoch runs no more batches
        if self.settled(key):
            return False
        with self.lock:
            self._abandoned.add(key)
        log.warning(
            "pipeline %s: batch %s of epoch %s was never committed by Spark before the "
            "checkpoint was replaced (epoch %s now): it is given up, not written from the "
            "spool to the sinks that lagged on it; the new checkpoint reads its rows again "
            "when it starts where `fanout recover` said",
            self.pipeline, key[1], key[0], self.epoch(),
        )  # fmt: skip
        return True

    def _planned_after(self, key: BatchKey) -> bool:
        epoch, batch_id = key
        with self.lock:
            if self._planned.get(epoch, -1) > batch_id:
                return True
        if any((m := self.mark(s, epoch)) is not None and m > batch_id for s in self.specs):
            return True
        held = [] if self.spool is None else self.spool.batches()
        return any(b.epoch == epoch and b.batch_id > batch_id for b in held)

    def _complete(self, key: BatchKey) -> bool:
        """Whether every configured sink holds batch ``key`` (see :meth:`settled`)."""
        spooled = None if self.spool is None else self.spool.get(key)
        return every_sink_holds(
            key[1],
            self.specs,
            frozenset() if spooled is None else spooled.needed_by,
            lambda sink: self.mark(sink, key[0]),
            lambda sink: self.backfilled(sink, key),
        )

    def _settled_on_record(self, key: BatchKey) -> bool:
        """:func:`settled_on_record` for batch ``key`` of an older epoch, with the lag
        state's cached marks (of the configured sinks and of the batch's party)."""
        epoch = key[0]
        marked = [s for s in self.specs if self.mark(s, epoch) is not None]
        return settled_on_record(
            key,
            [] if self.spool is None else self.spool.batches(),
            lambda sink: self.mark(sink, epoch),
            marked,
            lambda sink: self.backfilled(sink, key),
        )

    def _spark_committed(self, key: BatchKey) -> bool:
        checkpoint = self.checkpoint()
        if checkpoint is None or checkpoint[0] != key[0]:
            return False
        try:
            return read_file_directly(checkpoint[1], f"commits/{key[1]}") is not None
        except Exception:  # unreadable: the ledger or a later batch will tell
            return False


def spooled_through(
    epoch: int,
    spooled: Sequence[SpooledBatch],
    mark: Callable[[str], int | None],
    marked: Iterable[str],
    backfilled: Callable[[str, BatchKey], bool] | None = None,
) -> dict[str, int]:
    """Per sink, the last batch of ``epoch`` the spool holds for it and a catch-up writes
    to it once ``epoch`` is replaced by a reset: settled by :func:`settled_on_record`
    (only an epoch's last spooled batch can fail that; it is given up instead). Where a
    new checkpoint resumes counts the sink there (``fanout recover --spool``, the guard's
    refusals). ``mark``: a sink's last mark of ``epoch``; ``marked``: the sinks with one;
    ``backfilled``: whether a sink still backfills from a sink holding a batch."""
    marked = list(marked)
    through: dict[str, int] = {}
    for batch in spooled:
        if batch.epoch != epoch:
            continue
        holds = None if backfilled is None else _at(backfilled, batch.key)
        if settled_on_record(batch.key, spooled, mark, marked, holds):
            for sink in batch.needed_by:
                through[sink] = max(through.get(sink, -1), batch.batch_id)
    return through


def _at(backfilled: Callable[[str, BatchKey], bool], key: BatchKey) -> Callable[[str], bool]:
    return lambda sink: backfilled(sink, key)
