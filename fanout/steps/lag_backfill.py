"""The marks of each backfill source, as a sink with ``backfill_from`` reads its missed
batches from them (docs/architecture.md §14.5, "Which batches").

A sink configured with ``backfill_from`` does not need its missed batches spooled while its
source still holds them: they are the batches whose ledger mark the source has and the sink
has not. :class:`BackfillMarks` caches the source's marks for
:class:`fanout.steps.lag.Lagging`, which owns it and shares its lock with it; the sinks'
own marks it asks of ``Lagging`` (:attr:`BackfillMarks.mark`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from fanout.contract.sink import BackfillSource
from fanout.ledger.entry import Ledger, LedgerEntry
from fanout.ledger.gaps import entry_weight, is_skip
from fanout.sink_spec import SinkSpec
from fanout.spool.index import BatchKey


@dataclass
class BackfillMarks:
    """The ledger marks of the backfill sources of one pipeline's sinks, cached, and which
    sinks still read their missed batches from their source.

    :param pipeline: the pipeline name.
    :param specs: every sink's spec (its ``backfill_from``).
    :param ledger: where the marks are.
    :param sources: the backfill source of each sink configured with ``backfill_from``.
    :param lock: the lag state's lock (:class:`fanout.steps.lag.Lagging`'s), held around
        each look at the cache, never across a ledger read of its own (``mark``, the lag
        state's, may read the ledger under it, as it always did).
    :param mark: a sink's last committed batch of an epoch, as the lag state caches it.
    """

    pipeline: str
    specs: Mapping[str, SinkSpec]
    ledger: Ledger
    sources: Mapping[str, BackfillSource]
    lock: threading.RLock
    mark: Callable[[str, int], int | None]
    _finished: set[str] = field(default_factory=set, repr=False)
    """The sinks that no longer read their source (:meth:`finish`)."""
    _origin_marks: dict[tuple[str, int], dict[int, LedgerEntry]] = field(
        default_factory=dict, repr=False
    )
    """Per (backfill source sink, epoch), its ledger marks read so far, by batch id (a
    lost mark among them is read again before it is used: :meth:`source_mark`)."""
    _skips_read: set[tuple[str, int]] = field(default_factory=set, repr=False)
    """The (backfill source sink, epoch) pairs whose cached skip's marks were read since the
    last batch's start (:meth:`new_batch`) and since the lag state committed a batch of the
    source (:meth:`source_committed`): :meth:`marks_of` reads them again only for a pair
    not in it."""

    def new_batch(self) -> None:
        """A batch starts: a cached skip's mark is read again once."""
        with self.lock:
            self._skips_read.clear()

    def source_committed(self, sink: str, epoch: int) -> None:
        """``sink`` marked a batch of ``epoch``: a backfill source's write's mark may now be
        beside a skip's cached (also one a read running now caches), so the next look-up
        reads cached skips again."""
        with self.lock:
            self._skips_read.discard((sink, epoch))

    def missed(
        self, sink: str, epoch: int, needs: Callable[[str, BatchKey], bool]
    ) -> list[BatchKey]:
        """The batches ``sink``'s backfill source committed, by the source's ledger marks,
        through ``epoch`` (the current one), that ``sink`` still ``needs``: every one, also
        those that wrote no row to the source's table (an empty batch, or one whose rows
        all went to its dead letters), which its table has no commit of. The marks, not the
        table, say which batches ran: a mark is written after the batch's commit, so the
        table then shows whether it has one."""
        if sink not in self.sources or sink in self._finished:
            return []
        origin = self.specs[sink].lag.backfill_from
        assert origin is not None
        keys: list[BatchKey] = []
        for each in range(epoch + 1):
            if self._caught_up_with(sink, origin, each):
                continue
            for batch_id, entry in sorted(self.marks_of(sink, origin, each).items()):
                if not is_skip(entry) and needs(sink, (each, batch_id)):
                    keys.append((each, batch_id))
        return keys

    def marks_of(self, sink: str, origin: str, epoch: int) -> dict[int, LedgerEntry]:
        """``origin``'s ledger marks of ``epoch`` through its cached mark (the ledger is
        read only for the marks newer than those read before, and, when it is read, again
        for the cached lost marks: a write's own mark may have replaced them since).

        A cached skip's mark of a batch ``sink`` still needs is read again also when
        ``origin``'s mark did not move: a ``fanout ledger skip`` that landed between
        ``origin``'s write of the batch and its mark was cached before the write's own
        mark was recorded beside it (docs/architecture.md §14.1, "A skip racing a write");
        taken as final, ``sink`` would pass the batch without its rows. It is read again
        once per batch (the first look-up after :meth:`new_batch`) and once after each
        batch of ``origin`` the lag state committed (:meth:`source_committed`, called after
        the write's mark), not at every look-up: while such a skip is cached, one ledger
        read per batch and per catch-up write of ``origin`` (a live batch's start reads
        ``origin``'s moved mark anyway), none once ``sink``'s mark is past it, and none
        without a skip of ``origin`` in ``sink``'s backfill."""
        with self.lock:
            known = self._origin_marks.setdefault((origin, epoch), {})
            last = max(known, default=-1)
            lost = min((b for b, e in known.items() if e.lost), default=last + 1)
            fresh = (origin, epoch) in self._skips_read
            skipped = [] if fresh else [b for b, e in known.items() if is_skip(e)]
        done = self.mark(sink, epoch)
        skipped = [b for b in skipped if done is None or done < b]
        through = self.mark(origin, epoch)
        if skipped or (through is not None and through > last):
            with self.lock:  # before the read: a commit during it asks for another
                self._skips_read.add((origin, epoch))
            self.read_marks(origin, epoch, min([lost, last + 1, *skipped]))
        with self.lock:
            return dict(known)

    def read_marks(self, origin: str, epoch: int, first: int) -> None:
        """Cache ``origin``'s ledger marks of ``epoch`` from batch ``first`` on: a mark read
        before is kept unless it is a lost mark (docs/architecture.md §5, "A batch in
        flight": the ledger's readers leave a lost mark out once the batch's own mark
        replaced it) or a skip's a write's own mark was recorded beside (§14.1)."""
        found = self.ledger.committed_entries(self.pipeline, first, epoch=epoch)
        with self.lock:
            known = self._origin_marks.setdefault((origin, epoch), {})
            for entry in found:
                if entry.sink != origin or entry.epoch != epoch:
                    continue
                cached = known.get(entry.batch_id)
                if cached is None or _written_over(cached, entry):
                    known[entry.batch_id] = entry

    def source_mark(self, sink: str, key: BatchKey) -> LedgerEntry | None:
        """The ledger mark of batch ``key`` by ``sink``'s backfill source (``None``: the
        source has none). A cached mark is the answer unless it is a lost mark or a skip's:
        that one is read again, since the batch's own mark may have replaced it, or been
        recorded beside it, since it was cached (its counts then known)."""
        origin = self.specs[sink].lag.backfill_from
        if origin is None:
            return None
        with self.lock:
            found = self._origin_marks.get((origin, key[0]), {}).get(key[1])
        if found is not None and not found.lost and not is_skip(found):
            return found
        if found is not None:
            self.read_marks(origin, key[0], key[1])
            with self.lock:
                return self._origin_marks[(origin, key[0])].get(key[1], found)
        entries = self.ledger.committed_entries(self.pipeline, key[1], epoch=key[0])
        found = None
        for entry in entries:
            if entry.sink == origin and entry.batch_id == key[1]:
                found = entry if found is None or _written_over(found, entry) else found
        return found

    def _caught_up_with(self, sink: str, origin: str, epoch: int) -> bool:
        """Whether ``sink``'s mark of ``epoch`` is at or past its source ``origin``'s."""
        theirs = self.mark(origin, epoch)
        mine = self.mark(sink, epoch)
        return theirs is None or (mine is not None and mine >= theirs)

    def finish(self, sink: str) -> None:
        """``sink`` no longer reads its source
        (:meth:`fanout.steps.lag.Lagging.finished_backfill` says when)."""
        with self.lock:
            if sink in self.sources:
                self._finished.add(sink)

    def backfilling(self, sink: str) -> bool:
        """Whether ``sink`` still reads its missed batches from its backfill source (so a
        batch the source writes need not be spooled for it)."""
        with self.lock:
            return sink in self.sources and sink not in self._finished

    def holds(self, sink: str, key: BatchKey) -> bool:
        """Whether ``sink`` still backfills from a sink whose mark holds batch ``key``."""
        spec = self.specs.get(sink)
        origin = None if spec is None else spec.lag.backfill_from
        if origin is None or not self.backfilling(sink):
            return False
        through = self.mark(origin, key[0])
        return through is not None and through >= key[1]


def _written_over(cached: LedgerEntry, entry: LedgerEntry) -> bool:
    """Whether ``entry``, a mark of the same sink and batch as ``cached``, is the one to
    keep: the one believed more (:func:`fanout.ledger.gaps.mark_weight`: a write's own mark
    over a lost one, over a skip's made while the write ran)."""
    return entry_weight(entry) > entry_weight(cached)
