"""Every pending sink's route over one batch, as one piece: the step between persist and
write (:meth:`fanout.fan_out.FanOut.process`).

For each pending sink it settles, before any sink writes, what that sink receives:

- an identity route: the batch itself, and the Arrow conversion shared by every sink that
  reads Arrow;
- a route whose sink has a dead-letter target: the route is evaluated once for all sinks
  sharing it (:func:`fanout.routes.rejects.check_route`); the rows failing it become dead
  letters, the others the sink's input;
- any other route: the routed DataFrame (evaluated lazily by the sink's write), with a way
  to name the expression that fails when the write does;
- a route Spark cannot resolve, or a dead-letter target that cannot be built: the sink is
  not written, and that error is its failure (:attr:`SinkInput.blocked`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from fanout.contract.batch import BatchInfo, SharedArrow
from fanout.contract.dead_letters import DeadLetter, DeadLetterTarget, RouteStamp
from fanout.contract.earlier_letters import EarlierLetters
from fanout.errors import RouteError
from fanout.routes.evaluate import explain_failure
from fanout.routes.rejects import CheckedRoute, check_route
from fanout.routes.route import Route
from fanout.routes.settings import Settings, session_settings
from fanout.sink_spec import SinkSpec

TargetOf = Callable[[str], "DeadLetterTarget | None"]
"""Looks up a sink's dead-letter target by sink name (``None``: the sink has none)."""

MayReplay = Callable[[str], bool]
"""Whether a sink's batch may be one an earlier process attempted (by sink name): its
dead-letter target may hold route letters of that attempt."""

EarlierOf = Callable[[str, BatchInfo], "EarlierLetters | None"]
"""What the earlier dead-letter targets of a sink (by name) hold of a batch an earlier
process may have attempted (``None``: none may hold any: the common path, read nothing);
raises :class:`fanout.DeadLetterMovedError` when one cannot tell
(:mod:`fanout.deadletters.moved`)."""


@dataclass(frozen=True)
class SinkInput:
    """What one sink receives for one batch.

    :param df: the routed batch DataFrame (the batch itself for an identity route).
    :param arrow: its Arrow conversion, shared with the other sinks of the same route.
    :param letters: rows that failed the route, for :attr:`dead_letters`.
    :param dead_letters: where :attr:`letters` go (written just before the sink's write).
    :param route: the route that chose :attr:`letters`, recorded with them (set whenever
        :attr:`dead_letters` is, even without letters: a replay under another route is
        refused, :mod:`fanout.deadletters.route_letters`; for an identity route only when
        the batch may be one an earlier process attempted, see :meth:`BatchRoutes.prepare`).
    :param earlier: what the sink's earlier dead-letter targets hold of the batch (set
        only on a batch an earlier process may have attempted under another target):
        handed to the sink in :attr:`fanout.Batch.earlier`.
    :param blocked: an error found before any write: the sink is not written, this is
        its failure.
    :param explain: turns the write's final error into one naming the route expression
        that fails (or ``None`` to keep it), for routes not evaluated in advance.
    """

    df: Any
    arrow: SharedArrow | None = None
    letters: tuple[DeadLetter, ...] = ()
    dead_letters: DeadLetterTarget | None = None
    route: RouteStamp | None = None
    earlier: EarlierLetters | None = None
    blocked: Exception | None = None
    explain: Callable[[BaseException], Exception | None] | None = None

    def stamp(self, route: Route) -> RouteStamp:
        """The stamp of ``route`` the sink's :class:`~fanout.contract.batch.Batch` carries:
        :attr:`route` (it covers the batch session's settings), else (an identity route,
        whose rows no setting changes, or a blocked sink) the route's own."""
        return self.route or route.stamp()


class BatchRoutes:
    """The routes of one batch's pending sinks; build with :meth:`prepare`, read each
    sink's :class:`SinkInput` with :meth:`input_for`, and :meth:`release` after the write.
    """

    def __init__(
        self,
        df: Any,
        info: BatchInfo,
        specs: Mapping[str, SinkSpec],
        may_replay: MayReplay | None = None,
    ) -> None:
        self.df = df
        self.info = info
        self.specs = specs
        self.may_replay = may_replay
        self._inputs: dict[str, SinkInput] = {}
        self._arrows: dict[Route, SharedArrow] = {}
        self._checked: dict[Route, CheckedRoute] = {}
        self._session: Settings | None = None

    @classmethod
    def prepare(
        cls,
        df: Any,
        info: BatchInfo,
        specs: Mapping[str, SinkSpec],
        pending: Sequence[str],
        target_of: TargetOf,
        may_replay: MayReplay | None = None,
        earlier_of: EarlierOf | None = None,
    ) -> BatchRoutes:
        """Settle every pending sink's input. First the routes of sinks with a dead-letter
        target are evaluated, once per distinct route, before any sink writes; then each
        sink's input is taken from them (also for a sink without a target that shares
        such a route) or built lazily.

        ``may_replay`` (``None``: every sink's may) tells which sinks' batch an earlier
        process may have attempted: only their targets are handed an identity route's
        stamp, whose one purpose is to refuse the letters such an attempt kept under a
        route since removed (one read of the target per sink and batch otherwise).
        ``earlier_of`` (``None``: no sink's target moved) is asked, for those sinks only,
        what the sink's earlier dead-letter targets hold of the batch; its error fails the
        sink unwritten."""
        routes = cls(df, info, specs, may_replay)
        targets = {name: routes._target(name, target_of) for name in pending}
        earlier: dict[str, EarlierLetters | Exception | None] = {}
        for name in pending:
            replay = may_replay is None or may_replay(name)
            earlier[name] = routes._earlier(name, earlier_of) if replay else None
            if isinstance(earlier[name], Exception):
                targets[name] = earlier[name]  # type: ignore[assignment]
        for name, target in targets.items():
            if target is not None and not isinstance(target, Exception):
                targets[name] = routes._check(name, pending, target)
        for name in pending:
            given = routes._settle(name, targets[name])
            held = earlier[name]
            if isinstance(held, EarlierLetters) and given.blocked is None:
                given = replace(given, earlier=held)
            routes._inputs[name] = given
        return routes

    def input_for(self, sink: str) -> SinkInput:
        """The input of one pending sink."""
        return self._inputs[sink]

    def batch_arrow(self) -> SharedArrow:
        """The whole batch as Arrow, shared with the sinks of an identity route that read
        Arrow (converted once, by whichever asks first): what the spool writes."""
        return self._shared(Route(), self.df)

    def release(self) -> None:
        """Drop the shared Arrow tables and the evaluated routes' caches."""
        for arrow in self._arrows.values():
            arrow.release()
        for checked in self._checked.values():
            checked.release()

    # -- one sink ---------------------------------------------------------------------------

    def _target(self, name: str, target_of: TargetOf) -> DeadLetterTarget | Exception | None:
        try:
            return target_of(name)
        except Exception as exc:  # the sink fails, named, unwritten
            return exc

    def _earlier(
        self, name: str, earlier_of: EarlierOf | None
    ) -> EarlierLetters | Exception | None:
        if earlier_of is None:
            return None
        try:
            return earlier_of(name, self.info)
        except Exception as exc:  # the sink fails, named, unwritten
            return exc

    def _check(
        self, name: str, pending: Sequence[str], target: DeadLetterTarget
    ) -> DeadLetterTarget | Exception:
        """Evaluate ``name``'s route in advance (unless a sink of the same route did);
        returns ``target``, or the error that fails the sink unwritten."""
        route = self.specs[name].route
        if route in self._checked or route.is_identity:  # nothing to evaluate
            return target
        try:  # an expression Spark cannot resolve fails this sink, named, unwritten
            route.resolve(self.df, sink=name, batch_id=self.info.batch_id)
        except RouteError as unresolved:
            return unresolved
        readers = {self.specs[s].sink.reads for s in pending if self.specs[s].route == route}
        self._checked[route] = check_route(
            self.df,
            route,
            arrow="arrow" in readers,
            dataframe="dataframe" in readers,
            sink=name,
            batch_id=self.info.batch_id,
        )
        return target

    def _settle(self, name: str, target: DeadLetterTarget | Exception | None) -> SinkInput:
        route = self.specs[name].route
        if isinstance(target, Exception):
            return SinkInput(self.df, blocked=target)
        checked = self._checked.get(route)
        if checked is not None:
            blocked = checked.blocked(name, self.info.batch_id, dead_letters=target is not None)
            if blocked is not None:
                return SinkInput(self.df, blocked=blocked)
            if checked.df is not None:  # evaluated already
                return SinkInput(
                    checked.df,
                    arrow=checked.arrow,
                    letters=checked.letters,
                    dead_letters=target,
                    # with the settings whether or not this sink has letters (a sink of
                    # the same route with a target had it evaluated)
                    route=route.stamp(self._settings()),
                )
        if route.is_identity:
            # no letters, but the target still refuses a replay whose letters an earlier
            # attempt kept under a route since removed (they would be in the sink too);
            # only an earlier process can have kept any: this one runs no other route
            replay = self.may_replay is None or self.may_replay(name)
            stamp = route.stamp() if target is not None and replay else None
            return SinkInput(
                self.df, arrow=self._shared(route, self.df), dead_letters=target, route=stamp
            )
        try:  # an expression Spark cannot resolve fails this sink, named, unwritten
            routed = route.resolve(self.df, sink=name, batch_id=self.info.batch_id)
        except RouteError as unresolved:
            return SinkInput(self.df, blocked=unresolved)
        explain = partial(explain_failure, self.df, route, sink=name, batch_id=self.info.batch_id)
        return SinkInput(
            routed,
            arrow=self._shared(route, routed),
            dead_letters=target,
            # the settings decide which rows a 'where' keeps, letters or not: a sink that
            # skips committed pieces on replay compares them (Sink.check_replay)
            route=route.stamp(self._settings()),
            explain=explain,
        )

    def _settings(self) -> Settings:
        """The batch session's settings a route's fingerprint covers (read once)."""
        if self._session is None:
            self._session = session_settings(self.df)
        return self._session

    def _shared(self, route: Route, routed: Any) -> SharedArrow:
        return self._arrows.setdefault(route, SharedArrow(routed))
