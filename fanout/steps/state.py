"""The state of one micro-batch as it goes through the steps: one object, filled step by step.

:class:`fanout.fan_out.FanOut` creates a :class:`BatchState` when the guard admits a batch
and hands it to each step in turn; nothing else carries a batch's state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fanout.contract.batch import BatchInfo
from fanout.contract.sink import SinkResult

if TYPE_CHECKING:
    from fanout.contract.partitions import BatchPartitioning
    from fanout.routes.batch_routes import BatchRoutes
    from fanout.steps.lag import Backlog


@dataclass
class BatchState:
    """One micro-batch inside :meth:`fanout.fan_out.FanOut.process`.

    :param df: the batch DataFrame Spark handed to foreachBatch (repartitioned by step 4
        when sinks share a partitioning: every later step reads it from here).
    :param info: pipeline, batch id, query id, offsets and the epoch the guard admitted.
    :param marks: each sink's last committed batch in ``info.epoch`` (``None``: never), as
        read with the guard's ledger view; ``None`` when the epoch is new (no marks yet).
    """

    df: Any
    info: BatchInfo
    marks: Mapping[str, int | None] | None = None
    pending: list[str] = field(default_factory=list)
    """Sinks still to write (step 3), in configuration order."""
    skipped: list[str] = field(default_factory=list)
    """Sinks whose ledger mark already holds the batch (step 3)."""
    partitioning: BatchPartitioning | None = None
    """The hash partitioning step 4 gave ``df`` (then ``df`` is the repartitioned batch),
    shared by the sinks that would each have partitioned it so."""
    share_groups: list[tuple[str, ...]] = field(default_factory=list)
    """Pending sinks whose first attempt writes in one shared job, per group (step 4,
    :mod:`fanout.steps.share`): each group reads the batch once."""
    persisted: bool = False
    """Whether step 4 persisted ``df`` (so step 7 unpersists it)."""
    routes: BatchRoutes | None = None
    """Every pending sink's routed input (step 4b), released in step 7."""
    results: dict[str, SinkResult] = field(default_factory=dict)
    """Sinks written and marked in this call (steps 5 and 6)."""
    failures: dict[str, BaseException] = field(default_factory=dict)
    """Sinks that failed after their retries (steps 5 and 6) and fail the batch."""
    aborted: BaseException | None = None
    """What a sink's write raised that is not an Exception (``KeyboardInterrupt``,
    ``SystemExit``...), recorded as its failure and raised on, unchanged, at the end."""
    lagging: dict[str, Backlog] = field(default_factory=dict)
    """Sinks behind the batch (step 3b): not written live; the batch is spooled for them."""
    lagged: dict[str, BaseException] = field(default_factory=dict)
    """Sinks with ``on_failure="lag"`` that failed this batch (step 6b): they lag."""
    rows_in: int | None = None
    """The batch's input rows when a sink failed it, counted before step 7 released it
    (``None``: not counted, or the count failed)."""
    spooled: tuple[int, int] | None = None
    """``(epoch, batch_id)`` when step 6b spooled the batch."""
    doubted: bool = False
    """A batch Spark replays whose earlier attempt may have written it (step 3c: not one
    fanout refused before any write): spooled, it is recorded so, and its catch-up asks
    the sink first (:mod:`fanout.steps.replay_lag`)."""
    unchecked: frozenset[str] = frozenset()
    """The lag sinks step 3c could not ask about this doubted replay (not opened then):
    held back from it even once opened (step 3b), their catch-up asks them."""

    @property
    def batch_id(self) -> int:
        """Spark's micro-batch id."""
        return self.info.batch_id
