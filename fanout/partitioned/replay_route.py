"""The route each committed partition recorded, and the refusal of a replay under another
(docs/architecture.md §7, §8.0).

fanout writes the rows failing a sink's route to its dead-letter target at the start of
each attempt. A replay skips the partitions that committed, so under a route changed
between a partial attempt and its replay a row only the new route refuses would be both in
a committed partition and in the dead letters, and a row only the old route refuses in
neither. So each partition records the route its rows went through (:func:`route_mark`,
committed atomically with them), the sink returns it in
:attr:`~fanout.partitioned.membership.CommittedPartition.route`, and the kit refuses a
replay under another route (:func:`check_routes`) before anything of it is written: in
:meth:`~fanout.partitioned.sink.PartitionedSink.check_replay` (before the route letters)
and where it reads the committed partitions before the partitions write.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from fanout.errors import RouteError
from fanout.routes.route import route_of

if TYPE_CHECKING:
    from fanout.contract.batch import Batch
    from fanout.partitioned.membership import CommittedPartition


def route_mark(batch: Batch) -> str:
    """What a partition of ``batch`` records of its route, with its rows:
    ``<fingerprint> <route>`` of :attr:`fanout.Batch.route` (the identity's for a batch
    built outside fanout), returned on a replay in
    :attr:`~fanout.partitioned.membership.CommittedPartition.route`."""
    return route_of(batch).mark


def check_routes(committed: Sequence[CommittedPartition], batch: Batch, *, sink: str) -> None:
    """Refuse a replay of ``batch`` whose committed partitions recorded another route than
    the batch's (:meth:`fanout.contract.route_stamp.RouteStamp.accepts`: the same
    fingerprint, or one an older fanout gave the same expressions). A partition that
    recorded none (``route`` ``None``: a mark of an older version, or a sink that does not
    record it) is not compared.

    :raises RouteError: naming the sink, the batch, the partitions, both routes and what
        to do.
    """
    route = route_of(batch)
    other: dict[str, list[int]] = {}
    for mark in sorted(committed, key=lambda c: c.partition):
        if not route.accepts(mark.route):
            other.setdefault(_shown(mark.route), []).append(mark.partition)
    if not other:
        return
    then = ", ".join(
        f"partition(s) {parts}{' committed this batch' if i == 0 else ''} under {shown}"
        for i, (shown, parts) in enumerate(other.items())
    )
    raise RouteError(
        f"the route changed mid-batch: {then}, but the sink's route is now {route.text}. "
        "Nothing was written. Restore the old route until this batch completes, then "
        "change it (a change between batches is safe)",
        sink=sink,
        batch_id=batch.batch_id,
    )


def _shown(mark: str | None) -> str:
    """A recorded route for people: its text, or its fingerprint when only that is kept."""
    fingerprint, _, text = (mark or "").partition(" ")
    return text or f"another route (fingerprint {fingerprint})"
