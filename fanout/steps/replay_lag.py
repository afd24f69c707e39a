"""A batch Spark replays that reaches a lagging sink from the spool, not live
(docs/architecture.md §5, "A batch Spark replays"; §14.4).

Step 3c (:mod:`fanout.steps.replay`) asks each open pending sink whether it can tell it
holds a replayed batch; one with ``on_failure="lag"`` that cannot, its own records gone,
lags with the refusal, and the batch is spooled for it. So is the batch for a lag sink
3c could not ask (not opened yet, or lost before). Spark then commits the batch, and the
next run no longer sees a replay: its catch-up would write the spooled batch with the
sink unable to tell whether the attempt before wrote it. So a doubted replay
(:func:`doubt`) is recorded in the spool's index for the sinks it is spooled for that the
attempt before could have written (:func:`fanout.steps.lag_steps.may_hold`;
:attr:`fanout.spool.index.SpooledBatch.replayed`, kept across runs), and so is a catch-up
write of a spooled batch before it begins (a process killed in it leaves the next run no
replay to see: :meth:`fanout.steps.catchup_notes.ReplayNotes.note_write`), and the
catch-up (the thread, a drain, the final catch-up: every write of a reopened sink) asks
the sink the same question before it writes such a batch (:meth:`SpooledReplays.refusal`): the same
:func:`fanout.steps.replay.unproven_sinks`, the same refusal with the same ways on, the
same ``accept_lost_targets``. A backfilled batch is in no spool: its catch-up write is
noted in the ledger instead (:mod:`fanout.ledger.begun`), and a later run's catch-up asks
the sink the same question before writing it again (:meth:`SpooledReplays.backfill_refusal`,
whose skip has no ``--spool``). A sink 3c could not ask that opens before step 3b is held
back from the batch (:attr:`fanout.steps.state.BatchState.unchecked`), so the catch-up
asks it too. Nothing of this runs on a batch that is not a replay.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

from fanout.contract.batch import BatchInfo
from fanout.errors import SinkRecordsGoneError, shell_word
from fanout.ledger.entry import Ledger
from fanout.ledger.gaps import release_command, skip_command
from fanout.observe.secrets import redact
from fanout.sink_spec import SinkSpec, write_timeouts
from fanout.spool.index import SpooledBatch
from fanout.steps.lost_target import target_text
from fanout.steps.replay import ReplayCheck, unproven_sinks
from fanout.steps.state import BatchState

log = logging.getLogger("fanout")


def doubt(state: BatchState, asked: Collection[str], check: ReplayCheck) -> None:
    """After step 3c passed: whether the batch is a replay its earlier attempt may have
    written (:attr:`BatchState.doubted`: Spark replays it, and fanout did not refuse that
    attempt before any write), and which of its pending sinks 3c did not ask, not being in
    ``asked`` (:attr:`BatchState.unchecked`)."""
    if not state.info.replayed or check.refused_before_writing:
        return
    state.doubted = True
    state.unchecked = frozenset(name for name in state.pending if name not in asked)


@dataclass(frozen=True)
class SpooledReplays:
    """What the catch-up needs to ask a sink about a spooled replay before writing it.

    :param specs: every sink's spec.
    :param store: the ledger, read for the sink's marks that wrote rows.
    :param accepted: ``accept_lost_targets``: written on, warned.
    :param ledger: the ledger as commands name it.
    :param spool: the spool as commands name it.
    :param pipeline_file: the pipeline file, for the ``fanout run`` the refusal names.
    """

    specs: Mapping[str, SinkSpec]
    store: Ledger
    accepted: Collection[str] = ()
    ledger: str | None = None
    spool: str | None = None
    pipeline_file: str | None = None

    def refusal(
        self, sink: str, spooled: SpooledBatch | None, mark: int | None
    ) -> SinkRecordsGoneError | None:
        """The refusal of writing ``spooled`` to ``sink`` (open; ``mark``: its last mark of
        the batch's epoch): a batch spooled for it from a doubted replay, holding rows,
        that the sink cannot tell it holds while its own records are gone
        (:func:`fanout.steps.replay.unproven_sinks`); ``None`` for any other batch, and for
        one of ``accepted`` (warned: written). Logged."""
        if spooled is None or sink not in spooled.replayed or spooled.rows == 0:
            return None
        return self._refusal(sink, spooled.info(), mark, None)

    def backfill_refusal(
        self, sink: str, info: BatchInfo, mark: int | None, origin: str
    ) -> SinkRecordsGoneError | None:
        """The refusal of writing batch ``info``, backfilled from sink ``origin``, to
        ``sink`` (open; ``mark``: its last mark of the batch's epoch), whose catch-up write
        an earlier run began (:mod:`fanout.ledger.begun`; the caller read the note and
        knows the batch may hold rows): the same question as :meth:`refusal`'s, the same
        ways on but the spool's (the batch is in none). ``None`` when the sink can tell,
        or is one of ``accepted`` (warned: written). Logged."""
        return self._refusal(sink, info, mark, origin)

    def _refusal(
        self, sink: str, info: BatchInfo, mark: int | None, origin: str | None
    ) -> SinkRecordsGoneError | None:
        """:meth:`refusal` and :meth:`backfill_refusal` (``origin``: the backfill source)."""
        spec = self.specs[sink]
        info = replace(info, replayed=True)
        state = BatchState(None, info, {sink: mark}, pending=[sink])
        timeouts = write_timeouts(self.specs, (sink,))
        gone = unproven_sinks(state, {sink: spec.sink}, timeouts, ledger=self.store, noted=True)
        reason = gone.get(sink)
        if reason is None:
            return None
        if sink in self.accepted:
            what = (
                "spooled for the sink from a replay or begun by an earlier run's catch-up"
                if origin is None
                else f"backfilled from sink {origin!r} and begun by an earlier run's catch-up"
            )
            log.warning(
                "pipeline %s, sink %s: batch %s of epoch %s, %s, is one it cannot tell its "
                "target holds (%s); accepted (accept_lost_targets): the catch-up writes it, a "
                "second time if the attempt before wrote it", info.pipeline, sink, info.batch_id,
                info.epoch, what, reason,
            )  # fmt: skip
            return None
        message = (
            self._message(info, sink, reason)
            if origin is None
            else self._backfill_message(info, sink, reason, origin)
        )
        error = SinkRecordsGoneError(
            redact(message, spec.sink.secret_values()), sink=sink, batch_id=info.batch_id
        )
        log.error("%s", error)
        return error

    def _accept(self, sink: str) -> str:
        """The ``--accept-lost-target`` way on for ``sink``, as the refusals name it."""
        run = f"fanout run {self.pipeline_file or 'PIPELINE.toml'}"
        accept = f"`{run} --accept-lost-target {shell_word(sink)}`"
        if self.pipeline_file is None:  # a FanOut of the caller's own
            accept += f" (FanOut(accept_lost_targets=[{sink!r}]))"
        return accept

    def _message(self, info: BatchInfo, sink: str, reason: str) -> str:
        """The refusal of spooled batch ``info`` to ``sink`` (``reason``: its
        ``records_gone``)."""
        batch, epoch = info.batch_id, info.epoch
        if self.ledger is not None and self.spool is not None:
            skip = release_command(self.ledger, info.pipeline, sink, batch, epoch, self.spool)
        else:
            skip = skip_command(self.ledger, info.pipeline, sink, batch, epoch)
        accept = self._accept(sink)
        offsets = info.source_offsets if info.source_offsets is not None else "unknown"
        return (
            f"pipeline {info.pipeline!r}, sink {sink!r}: batch {batch} of epoch {epoch} was "
            "spooled for the sink from a replay, or an earlier run's catch-up began writing "
            "it (an attempt that may have written it to "
            f"{target_text(self.specs[sink].sink)} died before the sink's ledger mark: Spark "
            "ran the batch again after it, or the catch-up's process ended in it), and the "
            "sink cannot tell whether its target holds it, "
            f"its own records of the epoch being gone: {reason}. Written from the spool, it "
            "could be there twice. Nothing of it is written: the sink stays behind "
            "(on_failure='lag'), its later batches waiting in the spool, and the other "
            f"sinks go on. The batch's source offsets: {offsets}.\n"
            "Ways on: look in the target for the batch's rows (the source offsets above name "
            "its input). If it holds them, record the batch as done for the sink and release "
            f"it from the spool: `{skip}`, then start again (the sink goes on with the batch "
            f"after it). If it does not, accept it for the next run: {accept}, whose "
            f"catch-up writes batch {batch} to it."
        )

    def _backfill_message(self, info: BatchInfo, sink: str, reason: str, origin: str) -> str:
        """The refusal of batch ``info``, backfilled from ``origin``, to ``sink``
        (``reason``: its ``records_gone``). The skip carries no ``--spool`` (the batch is
        in none) nor ``--config`` (whose check of the backfill source would refuse a batch
        the source holds: this one)."""
        batch, epoch = info.batch_id, info.epoch
        skip = skip_command(self.ledger, info.pipeline, sink, batch, epoch)
        offsets = info.source_offsets if info.source_offsets is not None else "unknown"
        return (
            f"pipeline {info.pipeline!r}, sink {sink!r}: batch {batch} of epoch {epoch}, "
            f"backfilled from sink {origin!r}, was begun by an earlier run's catch-up (an "
            f"attempt that may have written it to {target_text(self.specs[sink].sink)} died "
            "before the sink's ledger mark: the catch-up's process ended in it), and the sink "
            "cannot tell whether its target holds it, its own records of the epoch being "
            f"gone: {reason}. Read back from {origin!r} again, it could be there twice. "
            "Nothing of it is written: the sink stays behind, its backfill waiting at this "
            f"batch, and the other sinks go on. The batch's source offsets: {offsets}.\n"
            "Ways on: look in the target for the batch's rows (the source offsets above name "
            "its input). If it holds them, record the batch as done for the sink: "
            f"`{skip}`, then start again (the backfill goes on with the batch after it). If "
            f"it does not, accept it for the next run: {self._accept(sink)}, whose catch-up "
            f"writes batch {batch} to it."
        )
