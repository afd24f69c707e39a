"""The texts of a new epoch's start refused for another reason than a batch held unmarked
(that one's: :mod:`fanout.steps.unmarked.held_text`): a sink that could not be asked
(:mod:`~fanout.steps.unmarked.asking`), a sink's records gone
(:mod:`~fanout.steps.unmarked.records_gone`), a sink that did not answer in time, and its
fences (:mod:`~fanout.steps.unmarked.epoch_fence`)."""

from __future__ import annotations

from collections.abc import Mapping

from fanout.contract.batch import BatchInfo
from fanout.contract.sink import Sink, lift_by_hand
from fanout.errors import shell_word
from fanout.observe.secrets import redact
from fanout.steps.lost_target import RESTORE_RECORDS, target_text

_RESTART = "restart that checkpoint"
"""What the operator does after lifting a fence by hand, in the core's refusals."""


def unasked_message(
    info: BatchInfo, unasked: Mapping[str, int | None], unopened: Mapping[str, BaseException]
) -> str:
    """The refusal of a start by a sink of ``unasked`` (each with its last mark) that would
    be asked but could not be opened (``unopened``: each with its error)."""
    epoch = info.epoch
    lines = [
        f"pipeline {info.pipeline!r}: query {info.query_id} cannot start epoch {epoch + 1}: "
        + "; ".join(_unasked_line(name, mark, epoch) for name, mark in unasked.items())
        + f". Nothing was written under epoch {epoch + 1}."
    ]
    lines += [
        f"Start the query again once sink {name} can be opened (its error: "
        f"{type(unopened[name]).__name__}: {unopened[name]}): it is then asked. Or start it "
        f"without the sink (it then gets nothing of epoch {epoch + 1})."
        for name in unasked
    ]
    return "\n".join(lines)


def _unasked_line(name: str, mark: int | None, epoch: int) -> str:
    """Why sink ``name`` (``mark``: its last mark in ``epoch``) refuses the start unasked."""
    what = (
        f"a batch of epoch {epoch} (it has no mark in that epoch)"
        if mark is None
        else f"batch {mark + 1} of epoch {epoch} (the batch after its mark {mark})"
    )
    return (
        f"sink {name} could not be opened, so it was not asked whether it holds {what} by "
        "its own records: the driver may have died between its write of that batch and its "
        f"mark, and epoch {epoch + 1} would write the batch's rows to it again"
    )


def gone_message(info: BatchInfo, sink: Sink, written: int, batch: int, gone: str) -> str:
    """The refusal of a new epoch's start by
    :func:`~fanout.steps.unmarked.records_gone.refuse_records_gone`."""
    new = info.epoch + 1
    return redact(
        f"pipeline {info.pipeline!r}: query {info.query_id} cannot start epoch {new}: the "
        f"records sink {sink.name!r} keeps of batch {written} of epoch {info.epoch}, which the "
        f"ledger marks written to {target_text(sink)}, are gone, and the target still holds "
        f"rows: {gone}. Without them its answer that it does not hold batch {batch} (the "
        "batch after its mark, written perhaps and never marked: the driver killed in "
        "between) tells nothing, and the new epoch would write that batch a second time. "
        f"Nothing was written under epoch {new}.\n"
        f"Ways on: {RESTORE_RECORDS}, then start this query again: the sink is asked "
        "again with them. Or, when they cannot be restored and the target holds no row of "
        f"batch {batch}, start it with `--accept-lost-target {shell_word(sink.name)}` "
        f"(FanOut(accept_lost_targets=[{sink.name!r}])): epoch {new} starts, and the next "
        "run's check accepts the records gone too.",
        sink.secret_values(),
    )


def holds_timeout_message(mark: int, epoch: int, timeout_s: float | None) -> str:
    """The refusal of a start by a sink whose ``holds_batch`` about batch ``mark + 1`` of
    ``epoch`` did not return within its ``write_timeout_s`` (``timeout_s``)."""
    return (
        f"cannot tell within its write_timeout_s={timeout_s:g} s whether it holds batch "
        f"{mark + 1} of epoch {epoch} (written but never marked: its holds_batch() did not "
        f"return): epoch {epoch + 1} does not start, since it could write that batch to the "
        "sink a second time. Find what holds the sink's target (a stalled connection, a "
        "server that does not answer) and restart the query, or raise write_timeout_s"
    )


def fence_timeout_message(info: BatchInfo, timeout_s: float) -> str:
    """The refusal of a start by a sink whose ``fence_earlier_epochs`` did not return
    within its ``write_timeout_s`` (``timeout_s``): its fence, not lifted, may be left."""
    new = info.epoch + 1
    return (
        f"could not close epoch {info.epoch} to its writes still in flight within "
        f"its write_timeout_s={timeout_s:g} s (fence_earlier_epochs() did not "
        f"return): epoch {new} does not start, since a task of the replaced query "
        "could then commit a batch the new epoch reads again. Find what holds the "
        "sink's target (a transaction of that query left open, a stalled "
        "connection) and restart the query, or raise write_timeout_s. The fence "
        "may still complete (it was not lifted, since a lift could be overtaken by "
        f"it): a restart of epoch {info.epoch}'s checkpoint may then be refused by "
        f"the sink; {lift_fence_by_hand(info.pipeline, new)}"
    )


def lift_fence_by_hand(pipeline: str, epoch: int) -> str:
    """How the operator lifts a fence closing the epoch before ``epoch`` that the start
    could not lift, and restarts the replaced epoch's checkpoint."""
    return lift_by_hand(repr(pipeline), epoch, _RESTART)


FENCE_NOT_LIFTED = (
    "pipeline %s, sink %s: epoch %s was refused, but the fence closing epoch "
    "%s to writes still in flight could not be lifted (%s): a restart of "
    "that epoch's checkpoint is refused by the sink until it is; %s"
)
"""The warning of a refused start's fence that could not be lifted; its arguments: the
pipeline, the sink, the new epoch, the replaced one, why, and
:func:`lift_fence_by_hand`."""

FENCES_STAY = (
    "pipeline %s: epoch %s's start was refused; the sinks' fences closing epoch %s "
    "to writes still in flight stay (%s). A restart of epoch %s's checkpoint is "
    "refused by those sinks; each refusal says how to lift its fence by hand"
)
"""The warning of a refused start whose fences are left for another query's start of the
epoch; its arguments: the pipeline, the new epoch, the replaced one, why, the replaced one."""
