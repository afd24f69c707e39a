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
and where it reads the committed partitions before the partitions write. A sink that
records its route per piece without skipping them (PostgreSQL upsert) calls
:func:`check_routes` itself, with its records and its own ``why``: one rule, one message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from fanout.errors import RouteError
from fanout.routes.route import route_of

if TYPE_CHECKING:
    from fanout.contract.batch import Batch
    from fanout.partitioned.membership import CommittedPartition

SKIPS = (
    "A replay skips the committed partitions, so a row only the new route refuses would be "
    "both in a committed partition and in the dead letters, and one only the old route "
    "refuses in neither."
)
"""Why a sink skipping committed partitions on a replay refuses one under another route
(:func:`check_routes`' default ``why``)."""


def route_mark(batch: Batch) -> str:
    """What a partition of ``batch`` records of its route, with its rows:
    ``<fingerprint> <route>`` of :attr:`fanout.Batch.route` (the identity's for a batch
    built outside fanout), returned on a replay in
    :attr:`~fanout.partitioned.membership.CommittedPartition.route`."""
    return route_of(batch).mark


def recorded_routes(committed: Iterable[CommittedPartition]) -> dict[int, str | None]:
    """Partition -> the route it recorded (:attr:`CommittedPartition.route`), for
    :func:`check_routes`."""
    return {mark.partition: mark.route for mark in committed}


def check_routes(
    routes: Mapping[int, str | None], batch: Batch, *, sink: str, why: str = SKIPS
) -> None:
    """Refuse a replay of ``batch`` whose committed partitions recorded another route than
    the batch's (``routes``: partition -> recorded mark, :func:`recorded_routes` of the
    committed partitions, or a sink's own records). The comparison is
    :meth:`fanout.contract.route_stamp.RouteStamp.accepts`: the same fingerprint, or one
    an older fanout gave the same expressions; a partition that recorded none (``None``:
    a mark of an older version, or a sink that does not record it) is not compared. A
    batch built outside fanout (:attr:`~fanout.Batch.route` ``None``) is compared as the
    identity route it records (:func:`route_mark`).

    :param why: the sentence saying what the sink would get wrong writing the replay
        (default :data:`SKIPS`: a sink that skips committed partitions).
    :raises RouteError: naming the sink, the batch, the partitions, both routes with their
        fingerprints, ``why``, and what to do.
    """
    route = route_of(batch)
    other: dict[str, list[int]] = {}
    for partition, mark in sorted(routes.items()):
        if not route.accepts(mark):
            other.setdefault(_shown(mark or ""), []).append(partition)
    if not other:
        return
    then = ", ".join(
        f"partition(s) {parts}{' committed this batch' if i == 0 else ''} under {shown}"
        for i, (shown, parts) in enumerate(other.items())
    )
    raise RouteError(
        f"the route changed mid-batch: {then}, but the sink's route is now {route.text} "
        f"(fingerprint {route.fingerprint}). {why} Nothing was written. Restore the old "
        "route (its expressions and the Spark settings it names) until this batch "
        "completes, then change it (a change between batches is safe)",
        sink=sink,
        batch_id=batch.batch_id,
    )


def _shown(mark: str) -> str:
    """A recorded route for people: its text and fingerprint, or the fingerprint alone
    when only that is kept."""
    fingerprint, _, text = mark.partition(" ")
    return f"{text or 'another route'} (fingerprint {fingerprint})"
