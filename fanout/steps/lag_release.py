"""Which spooled batches may leave the spool, and their removal (docs/architecture.md §14.3).

A spooled batch stays while a sink needs it. One every sink that needed it holds may go,
unless a sink's mark holds it only by a ``fanout ledger skip`` made without the spool: that
skip could not see the rows still there, so they are kept for it (``fanout status`` names
them). :class:`SpoolRelease` chooses and removes them for :class:`fanout.steps.lag.Lagging`,
which owns it, shares its lock with it and says which batches a sink still needs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from fanout.ledger.entry import Ledger
from fanout.ledger.gaps import held_by_skip, is_skip
from fanout.spool.index import BatchKey, SpooledBatch
from fanout.spool.table import Spool

log = logging.getLogger("fanout")


@dataclass
class SpoolRelease:
    """The spool's upkeep for one pipeline's lag state.

    :param pipeline: the pipeline name.
    :param ledger: where the marks are (a skip's among them).
    :param spool: the pipeline's spool (``None`` when no sink lags or backfills: nothing
        to release).
    :param lock: the lag state's lock (:class:`fanout.steps.lag.Lagging`'s), held around
        each look at what is known, never across a ledger or spool read.
    :param needs: whether a sink still needs a batch
        (:meth:`fanout.steps.lag.Lagging.needs`).
    """

    pipeline: str
    ledger: Ledger
    spool: Spool | None
    lock: threading.RLock
    needs: Callable[[str, BatchKey], bool]
    _written: set[tuple[str, BatchKey]] = field(default_factory=set, repr=False)
    """The (sink, batch) pairs the lag state saw committed: written, not skipped."""
    _given_up: dict[tuple[str, BatchKey], bool] = field(default_factory=dict, repr=False)
    """Per spooled (sink, batch) its mark holds, whether that mark is a ledger skip's."""

    def wrote(self, sink: str, key: BatchKey) -> None:
        """``sink`` marked spooled batch ``key``, written, not skipped: :meth:`given_up` need
        not read it."""
        with self.lock:
            self._written.add((sink, key))

    def held_by_all(self) -> dict[BatchKey, frozenset[str]]:
        """Spooled batches every sink that needed them holds, each with the sinks that
        needed it and whose mark holds it by more than a skip made without the spool
        (:meth:`fanout.steps.lag.Lagging.held_by_all`)."""
        if self.spool is None:
            return {}
        done = {}
        for batch in self.spool.batches():
            if all(not self.needs(s, batch.key) for s in batch.needed_by):
                done[batch.key] = batch.needed_by
        given_up = self.given_up([(s, k) for k, sinks in done.items() for s in sinks])
        chosen = {
            k: frozenset(s for s in sinks if (s, k) not in given_up) for k, sinks in done.items()
        }
        return {k: sinks for k, sinks in chosen.items() if sinks}

    def given_up(self, pairs: Iterable[tuple[str, BatchKey]]) -> set[tuple[str, BatchKey]]:
        """Those of ``pairs`` the sink's mark holds only by a ``fanout ledger skip``
        (:meth:`fanout.steps.lag.Lagging.given_up`). Pairs the lag state saw committed are
        not read; the others are read from the ledger once (one scan per sink and epoch)."""
        pairs = list(pairs)
        with self.lock:
            unknown = sorted(
                {p for p in pairs if p not in self._written and p not in self._given_up}
            )
        by_sink: dict[tuple[str, int], list[int]] = {}
        for sink, (epoch, batch_id) in unknown:
            by_sink.setdefault((sink, epoch), []).append(batch_id)
        for (sink, epoch), ids in by_sink.items():
            marks = sorted(
                (e.batch_id, is_skip(e))
                for e in self.ledger.committed_entries(self.pipeline, min(ids), epoch=epoch)
                if e.sink == sink and e.epoch == epoch
            )
            for batch_id in ids:
                given_up = held_by_skip(batch_id, marks)
                with self.lock:
                    self._given_up[(sink, (epoch, batch_id))] = given_up
        with self.lock:
            return {p for p in pairs if self._given_up.get(p, False)}

    def kept_given_up(self) -> dict[tuple[str, int], list[SpooledBatch]]:
        """Per (sink, epoch), the spooled batches kept for the sink although a ledger skip
        made without the spool gave them up (see :meth:`held_by_all`)."""
        if self.spool is None:
            return {}
        pairs = [(s, b.key) for b in self.spool.batches() for s in b.needed_by]
        given_up = self.given_up(p for p in pairs if not self.needs(*p))
        kept: dict[tuple[str, int], list[SpooledBatch]] = {}
        for batch in self.spool.batches():
            for sink in sorted(batch.needed_by):
                if (sink, batch.key) in given_up:
                    kept.setdefault((sink, batch.epoch), []).append(batch)
        return kept

    def release(self, chosen: Callable[[], dict[BatchKey, frozenset[str]]]) -> int:
        """Remove from the spool the index rows ``chosen`` names, chosen and removed under
        the spool's lock (:meth:`fanout.steps.lag.Lagging.release_held` says why), then
        forget what :meth:`given_up` knows of batches no longer spooled."""
        if self.spool is None:
            return 0
        removed = self.spool.release(chosen)
        self._forget_unspooled({b.key for b in self.spool.batches()})
        if removed:
            log.info(
                "pipeline %s: removed %s batch(es) every sink holds from the spool",
                self.pipeline,
                removed,
            )
        return removed

    def _forget_unspooled(self, spooled: set[BatchKey]) -> None:
        """Drop what :meth:`given_up` knows of batches no longer in the spool: the sets stay
        as small as the spool, however long the pipeline runs."""
        with self.lock:
            self._written = {p for p in self._written if p[1] in spooled}
            self._given_up = {p: v for p, v in self._given_up.items() if p[1] in spooled}

    def release_orphans(self, sinks: Iterable[str]) -> int:
        """Remove the spooled rows of batches that have no index row and that none of
        ``sinks`` (the lag-capable ones) needs
        (:meth:`fanout.steps.lag.Lagging.release_orphans`)."""
        if self.spool is None:
            return 0
        sinks = list(sinks)
        removed = self.spool.remove_orphans(lambda key: all(not self.needs(s, key) for s in sinks))
        if removed:
            log.info(
                "pipeline %s: removed the rows of %s batch(es) no index row names and every "
                "lagging sink holds from the spool: %s",
                self.pipeline,
                len(removed),
                ", ".join(f"{b} (epoch {e})" for e, b in removed),
            )
        return len(removed)
