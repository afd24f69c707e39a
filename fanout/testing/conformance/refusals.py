"""fanout's refusals of a kit's batch told to the sink's author.

At a run's first batch fanout asks the sink whether its target still holds the last batch
the ledger marks written (:class:`fanout.TargetLostError` on ``False``, or on a reason from
``target_replaced``), and at a new epoch's start whether it holds the batch after that
mark (:class:`fanout.UnmarkedBatchError` on ``True`` or a :class:`fanout.PartlyHeld`).
Their words are for an operator whose target was lost or whose driver died; in the kit
neither happened (it deletes no target before a batch and leaves no batch unmarked before
a new epoch), so the sink answered wrong: :func:`for_the_author` says which answer, and
what it should have been (docs/writing-sinks.md: ``holds_batch``)."""

from __future__ import annotations

from fanout.contract.batch import BatchInfo
from fanout.contract.sink import Sink
from fanout.errors import TargetLostError, UnmarkedBatchError
from fanout.ledger.entry import Ledger
from fanout.testing.conformance.case import NAME

HOLDS_BATCH = (
    "holds_batch(pipeline, epoch, batch_id) must look up the record write() keeps of that "
    "batch's idempotency key (app id txn_app_id(pipeline, self.name, epoch), from "
    "fanout.contract.batch, version batch_id): True when it finds it, False when not (a "
    "target not created yet holds nothing), None only when the sink cannot tell at all"
)
"""What ``holds_batch`` must answer, said by every check that finds it answered wrong."""

_ASKED = (
    "(docs/writing-sinks.md: holds_batch), and {said}\nfanout's refusal, for an operator: {refusal}"
)


def for_the_author(error: BaseException, sink: Sink, ledger: Ledger, info: BatchInfo) -> str | None:
    """What ``error``, raised by the kit's ``FanOut`` processing ``info``, says to the
    author of ``sink``: ``None`` for an error that is not such a refusal, and for an
    :class:`fanout.UnmarkedBatchError` whose attributes do not say that the kit's sink
    answered it holds a batch (a sink not asked; one raised without them): read from them,
    never from the message, whose words are for an operator."""
    if isinstance(error, TargetLostError) and error.batch_id is not None:
        return _lost(error, error.batch_id, sink, ledger, info)
    if isinstance(error, UnmarkedBatchError) and error.sink == NAME and error.holds is not None:
        if error.batch_id is not None and error.epoch is not None:
            return _unmarked(error, error.batch_id, error.epoch, sink, info)
    return None


def _lost(lost: TargetLostError, batch: int, sink: Sink, ledger: Ledger, info: BatchInfo) -> str:
    epoch = ledger.lookup(info.pipeline, [NAME]).epoch  # a refused start leaves it
    about = (
        f"about batch {batch} of epoch {epoch}, which the kit wrote to this target and left "
        "as it was"
    )
    held = sink.holds_batch(info.pipeline, epoch, batch)
    replaced = held is not False and type(sink).target_replaced is not Sink.target_replaced
    reason = sink.target_replaced(info.pipeline, epoch, batch) if replaced else None
    if reason is not None:
        said = (
            f"target_replaced returned {reason!r} {about}: expected None (a reason says the "
            "target was dropped and created again empty, and refuses the run)"
        )
    else:
        said = (
            f"holds_batch returned {held!r} {about}: expected True (False says the target "
            f"was deleted or replaced, and refuses the run): {HOLDS_BATCH}"
        )
    return (
        f"FanOut refused batch {info.batch_id} with TargetLostError: at a run's first batch "
        "fanout asks the sink whether its target still holds the last batch the ledger "
        "marks written " + _ASKED.format(said=said, refusal=lost)
    )


def _unmarked(
    unmarked: UnmarkedBatchError, batch: int, epoch: int, sink: Sink, info: BatchInfo
) -> str:
    held = sink.holds_batch(info.pipeline, epoch, batch)
    said = (
        f"holds_batch returned {held!r} about batch {batch} of epoch {epoch}, which the kit "
        "never wrote: expected False (True or a PartlyHeld says the sink wrote it and the "
        f"driver died before its mark, and refuses the new epoch): {HOLDS_BATCH}"
    )
    return (
        f"FanOut refused batch {info.batch_id} of a new epoch with UnmarkedBatchError: when "
        "a checkpoint reset starts a new epoch fanout asks the sink whether it holds the "
        "batch after its last mark " + _ASKED.format(said=said, refusal=unmarked)
    )
