"""Closing the replaced epoch to a sink's writes still in flight before the sinks are
asked about the batch after their mark (:func:`fence_epochs`), and opening it again when
the start is refused after all (:func:`lift_fences`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import partial

from fanout.contract.batch import BatchInfo
from fanout.contract.sink import Sink
from fanout.errors import SinkTimeoutError
from fanout.ledger.entry import Ledger
from fanout.observe.logs import batch_fields
from fanout.observe.secrets import redact
from fanout.steps.holds import NoAnswer, bounded
from fanout.steps.unmarked.start_text import (
    FENCE_NOT_LIFTED,
    FENCES_STAY,
    fence_timeout_message,
    lift_fence_by_hand,
)

log = logging.getLogger("fanout")


def fences(sink: Sink) -> bool:
    """Whether ``sink``'s type closes earlier epochs to its writes in flight
    (overrides :meth:`fanout.Sink.fence_earlier_epochs`)."""
    return type(sink).fence_earlier_epochs is not Sink.fence_earlier_epochs


def fence_epochs(
    info: BatchInfo,
    sinks: Mapping[str, Sink],
    bounds: Mapping[str, float],
    ledger: Ledger | None = None,
) -> list[Sink]:
    """Before a new epoch's sinks are asked whether they hold the replaced epoch's batch
    after their mark: have each of ``sinks`` that fences (:func:`fences`) close the epochs
    before the new one to its writes still in flight (a task of the replaced query still
    running, :meth:`fanout.Sink.fence_earlier_epochs`), so that none commits the batch
    after the question, to be read again by the new epoch and written twice. In turn, each
    bounded by its ``write_timeout_s`` (``bounds``); one that raises or does not answer in
    time refuses the start, after the fences already made are lifted (unless ``ledger``
    says another query started the epoch, :func:`lift_fences`). One that raised is lifted
    too: it may have closed some of its records before it failed (a scope, a partition),
    and the replaced epoch's checkpoint, which the next start may be refused to, would meet
    them. One that did not answer in time is not (nor one whose wait was interrupted while
    it ran): its call may still be fencing, and would close again what a lift opened; the
    refusal says a fence may be left and names the lift by hand
    (:func:`fanout.contract.sink.lift_by_hand`). The sinks fenced."""
    new = info.epoch + 1
    done: list[Sink] = []
    for name, sink in sinks.items():
        if not fences(sink):
            continue
        returned = threading.Event()  # the fence ended (returned or raised)
        try:
            call = bounded(
                sink, info.pipeline, partial(_ended, returned, sink.fence_earlier_epochs,
                                             info.pipeline, new),
                bounds.get(name), hook="fence",
            )  # fmt: skip
        except BaseException:  # it may have fenced part of its records: lifted too, unless
            # the wait for it was interrupted (KeyboardInterrupt) while it still runs
            lift_fences(info, [*done, sink] if returned.is_set() else done, bounds, ledger)
            raise
        if isinstance(call, NoAnswer):  # still fencing, perhaps: a lift could be overtaken
            lift_fences(info, done, bounds, ledger)
            raise SinkTimeoutError(fence_timeout_message(info, bounds[name]), sink=name)
        done.append(sink)
    return done


def _ended(ended: threading.Event, call: Callable[[str, int], None], pipeline: str,
           epoch: int) -> None:  # fmt: skip
    """``call(pipeline, epoch)``, then ``ended`` set, whether it returned or raised."""
    try:
        call(pipeline, epoch)
    finally:
        ended.set()


def lift_fences(
    info: BatchInfo,
    fenced: Sequence[Sink],
    bounds: Mapping[str, float],
    ledger: Ledger | None = None,
) -> None:
    """The start of ``info``'s new epoch was refused: have each sink of ``fenced`` open
    the replaced epoch again (:meth:`fanout.Sink.lift_epoch_fence`), whose checkpoint the
    refusal may say to restart. What fails is logged: the refusal stands. Nothing is
    lifted when ``ledger`` records that another query started that epoch meanwhile (two
    starts at once: the fence is the same record, and that query, running the epoch,
    relies on it), nor when the ledger cannot tell (:func:`_epoch_taken`)."""
    new = info.epoch + 1
    if fenced and ledger is not None and _epoch_taken(info, ledger):
        return
    for sink in fenced:
        try:
            call = bounded(
                sink, info.pipeline, partial(sink.lift_epoch_fence, info.pipeline, new),
                bounds.get(sink.name), hook="lift-fence",
            )  # fmt: skip
            lifted = not isinstance(call, NoAnswer)
            why = "it did not return within write_timeout_s"
        except Exception as exc:
            lifted, why = False, f"{type(exc).__name__}: {redact(str(exc), sink.secret_values())}"
        if not lifted:
            log.warning(
                FENCE_NOT_LIFTED,
                info.pipeline, sink.name, new, info.epoch, why,
                lift_fence_by_hand(info.pipeline, new),
                extra=batch_fields(info.pipeline, info.batch_id, sink.name),
            )  # fmt: skip


def _epoch_taken(info: BatchInfo, ledger: Ledger) -> bool:
    """Whether the epoch after ``info``'s was started (by another query: this one's start
    was refused) or the ledger cannot say: then the fences stay, logged. A read of the
    epoch rows, on a refused start only."""
    new = info.epoch + 1
    try:
        taken = ledger.epoch_start(info.pipeline, new) is not None
        why = f"another query started epoch {new} meanwhile and relies on them"
    except Exception as exc:
        taken = True  # the type only: a ledger's error may spell its location's secrets
        why = f"the ledger cannot tell whether epoch {new} started: {type(exc).__name__}"
    if taken:
        log.warning(
            FENCES_STAY, info.pipeline, new, info.epoch, why, info.epoch,
            extra=batch_fields(info.pipeline, info.batch_id),
        )  # fmt: skip
    return taken
