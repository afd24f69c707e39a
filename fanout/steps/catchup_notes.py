"""The catch-up's replay notes (docs/architecture.md §5.6, "A catch-up write killed before
its mark"): before a catch-up write that a crash could leave unmarked, note it (the spool's
index, :meth:`fanout.spool.table.Spool.note_replayed`; for a backfilled batch the ledger's
``begun`` row, :mod:`fanout.ledger.begun`) and, where a note is found, ask the sink first
(:class:`fanout.steps.replay_lag.SpooledReplays`).

:class:`ReplayNotes` is held by :class:`fanout.steps.catchup.CatchUp`, which calls it around
each write and records what it refuses or fails.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from fanout.contract.batch import BatchInfo
from fanout.errors import SinkRecordsGoneError
from fanout.ledger.begun import began, record_begun
from fanout.sink_spec import SinkSpec
from fanout.spool.index import BatchKey
from fanout.steps.lag import Lagging
from fanout.steps.replay import may_refuse
from fanout.steps.replay_lag import SpooledReplays

RecordLost = Callable[[str, BatchKey, SinkRecordsGoneError, BatchInfo | None], None]
"""Records a refused catch-up of a sink as a failed attempt of the batch
(:meth:`fanout.steps.catchup.CatchUp._record_lost`)."""
NotCaughtUp = Callable[[str, BatchKey, Exception], Exception]
"""Records and logs a catch-up that failed before its write began, and returns the error
(:meth:`fanout.steps.catchup.CatchUp._not_caught_up`)."""


class ReplayNotes:
    """One catch-up's notes of the writes it begins, and its questions to the sinks.

    :param lagging: the lag state (the spool, marks, source marks; a refused sink lags).
    :param specs: every sink's spec.
    :param replays: asks a sink about a noted batch; ``None``: nothing is noted or asked.
    :param record_lost: records a refusal as a failed attempt of the batch.
    :param not_caught_up: records a note that failed, and returns its error.
    """

    def __init__(
        self,
        lagging: Lagging,
        specs: Mapping[str, SinkSpec],
        replays: SpooledReplays | None,
        record_lost: RecordLost,
        not_caught_up: NotCaughtUp,
    ) -> None:
        self.lagging = lagging
        self.specs = specs
        self.replays = replays
        self._record_lost = record_lost
        self._not_caught_up = not_caught_up
        # the (sink, batch) pairs whose note (Spool.note_replayed) this catch-up wrote, each
        # write of them since returned here: not asked again in this process
        self._noted: set[tuple[str, BatchKey]] = set()

    def refused_replay(self, sink: str, key: BatchKey) -> SinkRecordsGoneError | None:
        """The refusal of batch ``key``, spooled for ``sink`` (open) from a replay its
        earlier attempt may have written, which the sink cannot tell it holds
        (:meth:`fanout.steps.replay_lag.SpooledReplays.refusal`): it then lags with it for
        the rest of the run, never written (:meth:`fanout.steps.lag.Lagging.lose`), as at
        step 3c, recorded as a failed attempt of the batch (a skip may name it)."""
        spool = self.lagging.spool
        if self.replays is None or spool is None or (sink, key) in self._noted:
            return None
        spooled = spool.get(key)
        refused = self.replays.refusal(sink, spooled, self.lagging.mark(sink, key[0]))
        if refused is not None:
            self.lagging.lose(sink, refused)
            self._record_lost(sink, key, refused, None)
        return refused

    def note_write(self, sink: str, key: BatchKey, info: BatchInfo) -> BaseException | None:
        """Before the first catch-up write of spooled batch ``key`` to ``sink``, record in
        the spool's index that it may begin (:meth:`fanout.spool.table.Spool.note_replayed`):
        a process killed in it, before the sink's mark, leaves the next run's catch-up no
        replay signal of Spark's, and with the sink's own records of its batches gone
        (:meth:`fanout.Sink.records_gone`) that run would write the batch a second time;
        with the note it asks the sink first (:meth:`refused_replay`). Its writes in this
        process that returned are not asked about: they are retried as a live batch's are,
        on the sink's idempotency. Recorded only where the question could refuse (a batch
        holding rows, a sink answering ``records_gone`` without a harmless rewrite) and not
        recorded yet: one index append per such batch and sink. A batch in no spool (a
        backfilled one, ``info`` as its source's mark has it) is noted in the ledger
        instead, and asked about there (:meth:`_note_backfill`). The note's failure fails
        the write, nothing written (the error)."""
        spool = self.lagging.spool
        spooled = None if spool is None else spool.get(key)
        if self.replays is None or (sink, key) in self._noted:
            return None
        if spooled is None:
            return self._note_backfill(sink, key, info)
        if spooled.rows == 0 or sink in spooled.replayed or not may_refuse(self.specs[sink].sink):
            return None
        assert spool is not None
        try:
            spool.note_replayed(key, sink)
        except Exception as exc:
            return self._not_caught_up(sink, key, exc)
        self._noted.add((sink, key))
        return None

    def _note_backfill(self, sink: str, key: BatchKey, info: BatchInfo) -> BaseException | None:
        """The ledger's ``begun`` note of backfilled batch ``key`` (:mod:`fanout.ledger.begun`),
        read before this process's first write of it to ``sink``: found (an earlier run, or
        an earlier ``FanOut`` of this process, began the write and did not mark it), the
        sink is asked first (:meth:`fanout.steps.replay_lag.SpooledReplays.backfill_refusal`),
        and a refusal is returned, the sink lagging with it for the rest of the run
        (:meth:`fanout.steps.lag.Lagging.lose`, recorded as a failed attempt of the batch);
        not found, it is appended. Only for a batch its source's mark says holds rows (or
        cannot say: a lost mark) and a sink that could be refused: one ledger read and one
        append per such batch and sink. A failed read or append fails the write, nothing
        written."""
        assert self.replays is not None
        origin = self.specs[sink].lag.backfill_from
        mark = self.lagging.source_mark(sink, key)
        empty = mark is not None and not mark.lost and mark.rows == 0 and not mark.dead_lettered
        if origin is None or empty or not may_refuse(self.specs[sink].sink):
            return None
        pipeline, (epoch, batch_id) = self.lagging.pipeline, key
        try:
            noted = began(self.lagging.ledger, pipeline, sink, epoch, batch_id)
            if not noted:
                record_begun(self.lagging.ledger, pipeline, sink, epoch, batch_id)
        except Exception as exc:
            return self._not_caught_up(sink, key, exc)
        if not noted:
            self._noted.add((sink, key))
            return None
        refused = self.replays.backfill_refusal(sink, info, self.lagging.mark(sink, epoch), origin)
        if refused is not None:
            self.lagging.lose(sink, refused)
            self._record_lost(sink, key, refused, info)
        return refused

    def marked(self, sink: str, key: BatchKey) -> None:
        """``sink``'s batch ``key`` is written and marked: never written again from here,
        so its note is forgotten."""
        self._noted.discard((sink, key))
