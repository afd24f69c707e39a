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


__all__ = ["RouteStamp"]
