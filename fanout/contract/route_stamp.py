"""The route that chose a batch's route letters, as a dead-letter target records it and a
sink is handed it (:attr:`fanout.Batch.route`): a module of its own, so the batch and the
dead-letter contract both name it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RouteStamp:
    """The route that chose a batch's route letters, as a target records it with them
    (:meth:`fanout.routes.route.Route.stamp`).

    :param fingerprint: a hash of the route's expressions and of the Spark settings that
        change which rows they refuse (15 hex digits), stable across processes: two routes
        refusing rows alike have the same one.
    :param text: the route for people (``where 'a > 0', select ['id'] under
        spark.sql.ansi.enabled=true, ...``).
    :param earlier: the fingerprints older fanout versions recorded for the same
        expressions (of the expressions alone): letters kept under one of them are of this
        route under settings that were not recorded, kept with a warning, not refused.
    """

    fingerprint: str
    text: str
    earlier: tuple[str, ...] = ()

    @property
    def mark(self) -> str:
        """``<fingerprint> <text>``: what a sink committing a batch in pieces records with
        each piece (:attr:`fanout.partitioned.membership.CommittedPartition.route`), for
        :meth:`accepts` to compare on a replay and an error to name."""
        return f"{self.fingerprint} {self.text}"

    def accepts(self, mark: str | None) -> bool:
        """Whether a piece recorded under ``mark`` (a :attr:`mark`, or a bare fingerprint)
        went by this route: its fingerprint is this one or one of :attr:`earlier` (the
        same expressions, recorded by an older fanout). A piece that recorded no route
        (``None`` or empty: an older mark) is accepted: its route cannot be told."""
        if not mark:
            return True
        return mark.partition(" ")[0] in (self.fingerprint, *self.earlier)


__all__ = ["RouteStamp"]
