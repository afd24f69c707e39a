"""Which attempt of a batch this is, and step 3c, the refusal of a replayed batch a sink
cannot prove it holds (docs/architecture.md §4, "Refused batches", and
docs/proposals/replay-detection.md)."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.locations import command_location
from fanout.errors import SinkRecordsGoneError
from fanout.ledger.entry import Ledger, ledger_location, now_utc
from fanout.ledger.refusals import record_admitted, refused_unwritten
from fanout.sink_spec import SinkSpec, write_timeouts
from fanout.spool.table import Spool
from fanout.steps.lag import Lagging
from fanout.steps.record import Recorder
from fanout.steps.refused import PreWrite
from fanout.steps.replay import ReplayCheck, RunMemory, refuse_unproven_replay
from fanout.steps.replay_lag import doubt
from fanout.steps.state import BatchState


class Attempts:
    """What tells a batch's first attempt from a replay (``runs``: the run memory;
    ``refusals``: this process's refusals before writing) and what a replay must pass
    before it writes.

    :param accepted: the sinks whose lost target this run accepts."""

    def __init__(
        self,
        pipeline: str,
        runs: RunMemory,
        refusals: PreWrite,
        ledger: Ledger,
        specs: Mapping[str, SinkSpec],
        lagging: Lagging,
        record: Recorder,
        spool: Spool | None,
        *,
        accepted: Collection[str],
        pipeline_file: str | None,
    ) -> None:
        self.pipeline = pipeline
        self.runs = runs
        self.refusals = refusals
        self.ledger = ledger
        self.specs = specs
        self.lagging = lagging
        self.record = record
        self.spool = spool
        self.accepted = accepted
        self.pipeline_file = pipeline_file

    def first(self, info: BatchInfo) -> bool:
        """Whether ``info`` is certainly its batch's first attempt, not a replay (``False``
        when unsure): only then may its refusal before any write be recorded
        (:mod:`fanout.steps.refused`), and only when not are the batch's refusal rows read
        (:meth:`refused_before_writing`). The one place to ask it; with the replay check
        (docs/proposals/replay-detection.md) this is "not replayed" by its run memory,
        and not raised before in this process (:meth:`PreWrite.first_attempt`)."""
        return self.runs.replayed(info) is False and self.refusals.first_attempt(info)

    def refuse_unproven_replay(self, state: BatchState) -> bool:
        """Step 3c: refuse a replayed batch to a pending sink that cannot tell whether it
        holds it while its own records are gone (:mod:`fanout.steps.replay`); one with
        ``on_failure="lag"`` lags with the refusal instead (:meth:`Lagging.lose`: the
        hold-back takes it out of the batch, which is spooled for it). Returns whether
        the batch records the attempt admitted before its first write
        (:meth:`admit_refused_replay`): whenever it is not certainly the batch's first
        (:meth:`first`), whatever the rows answered, so that a ``refused`` row of an
        earlier attempt landing late, from this process or one still ending beside this
        one, is outranked by it."""
        admit = not self.first(state.info)
        unwritten = self.refused_before_writing(state.info) if admit else False
        if not state.info.replayed:
            return admit
        unasked = self.lagging.unasked()
        opened = {n: s.sink for n, s in self.specs.items() if n not in unasked}
        timeouts = write_timeouts(self.specs, opened)
        check = ReplayCheck(
            self.runs,
            accepted=self.accepted,
            lags=[n for n in opened if self.specs[n].lag.lags],
            ledger=ledger_location(self.ledger),
            pipeline_file=self.pipeline_file,
            spool=None if self.spool is None else command_location(self.spool.path),
            refused_before_writing=unwritten is True,
        )
        try:
            lost = refuse_unproven_replay(state, opened, timeouts, check, ledger=self.ledger)
        except SinkRecordsGoneError as refused:  # the batch ran: its skip may name it
            name, epoch = str(refused.sink), state.info.epoch
            batch = Batch(state.df, state.info, name, txn_app_id(self.pipeline, name, epoch))
            self.record.failed(batch, 1, now_utc(), 0.0, refused)
            raise
        self.lagging.lose_each(lost)  # its failed attempt recorded at 3b (hold_back)
        doubt(state, opened, check)  # spooled so, its catch-up asks (steps/replay_lag)
        return admit

    def refused_before_writing(self, info: BatchInfo) -> bool | None:
        """Whether fanout refused every earlier attempt of the batch before any sink wrote
        it (:func:`fanout.ledger.refusals.refused_unwritten`), asked only when this attempt
        is not certainly the batch's first (:meth:`first`, asked by the caller): a
        replay by the run memory, or one it reads as new while an attempt of the batch
        raised before in this process (a ``FanOut`` reused across in-process restarts of its
        query, or built inside a foreachBatch call, refused that attempt before writing:
        planned after its birth, never begun writing). A first attempt reads nothing.

        ``None``: a ``refused`` row of the batch whose append this process gave up waiting
        for is still under way after a second wait (:meth:`PreWrite.settled`). Landing
        after this read, it would be the newest word about an attempt that wrote: so the
        rows exempt nothing now, and the attempt records itself admitted before writing
        all the same (numbered from a read after the late row's, it outranks it)."""
        if not self.refusals.settled(info.batch_id):
            return None
        return refused_unwritten(
            self.ledger, info.pipeline, info.epoch, info.batch_id, info.batch_timestamp_ms
        )

    def admit_refused_replay(self, info: BatchInfo) -> None:
        """Record that this attempt of a batch, not certainly its first, goes on to write
        it (:func:`fanout.ledger.refusals.record_admitted`), past every
        check that may still refuse it without writing: from here it may write, and if it is
        killed mid-write, the next replay must not pass behind the old refusal. Raises what
        the append raises (the batch must not write then)."""
        if info.batch_timestamp_ms is not None:  # always known: a refusal row names it
            record_admitted(self.ledger, info.pipeline, info.epoch, info.batch_id,
                            info.batch_timestamp_ms)  # fmt: skip
