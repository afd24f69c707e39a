"""Per-sink settings the core applies around a sink: routing and retries.

A sink configured as a dict may carry, besides its own options:

- ``where``: a Spark SQL predicate; the sink receives only the rows matching it;
- ``select``: columns or Spark SQL expressions (``"amount * 100 AS cents"``); the sink
  receives that shape;
- ``retries`` and ``backoff_s``: its own retry policy for transient errors.

Routing is applied to the (persisted) batch DataFrame, so a routed sink is covered by the
same exactly-once machinery as any other: for a replayable source and deterministic
expressions, a replay routes the same rows.

An expression may raise on a row (ANSI mode: ``CAST('abc' AS INT)``). Such rows go to the
sink's dead-letter target when :meth:`fanout.Sink.route_dead_letters` names one, and fail
the batch for that sink with a :class:`fanout.RouteError` otherwise; see
:mod:`fanout.routes.rejects`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fanout.contract.sink import Sink
from fanout.errors import ConfigurationError, RouteError
from fanout.steps.retry import RetryPolicy

log = logging.getLogger("fanout")

CORE_OPTIONS = ("where", "select", "retries", "backoff_s")
"""Keys of a sink's dict configuration that fanout consumes itself."""


@dataclass(frozen=True)
class Route:
    """Which rows (``where``) and which shape (``select``) a sink receives."""

    where: str | None = None
    select: tuple[str, ...] | None = None

    @property
    def is_identity(self) -> bool:
        """True when the sink receives the batch as it is."""
        return self.where is None and self.select is None

    def apply(self, df: Any) -> Any:
        """The routed DataFrame (lazy in Spark: nothing runs until a sink reads it)."""
        if self.where is not None:
            df = df.where(self.where)
        if self.select is not None:
            df = df.selectExpr(*self.select)
        return df

    def resolve(self, df: Any, *, sink: str, batch_id: int | None) -> Any:
        """:meth:`apply`, raising :class:`fanout.RouteError` naming the sink, the batch and
        the expression when Spark cannot resolve it against ``df`` (a misspelt column, a
        type error): Spark analyses a DataFrame when it is built, before any row is read."""
        if self.where is not None:
            try:
                df = df.where(self.where)
            except Exception as exc:
                raise _unresolved("where", self.where, exc, sink, batch_id) from exc
        if self.select is not None:
            try:
                df = df.selectExpr(*self.select)
            except Exception as exc:
                culprit = _first_unresolved(df, self.select) or ", ".join(self.select)
                raise _unresolved("select", culprit, exc, sink, batch_id) from exc
        return df

    def validate(self, sink: str, spark: Any) -> None:
        """Check the expressions' syntax with Spark's parser, when a session is at hand
        (without one, say that they could not be checked)."""
        if self.is_identity:
            return
        if spark is None:
            log.warning(
                "sink %r: no active SparkSession, so its route (where=%r, select=%r) could not "
                "be parsed now; it is checked when the first batch arrives",
                sink,
                self.where,
                self.select,
            )
            return
        parser = spark._jsparkSession.sessionState().sqlParser()
        for kind, expression in [("where", self.where)] + [
            ("select", s) for s in self.select or ()
        ]:
            if expression is None:
                continue
            try:
                if kind == "select":
                    parser.parseExpression(_strip_alias(expression))
                else:
                    parser.parseExpression(expression)
            except Exception as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise ConfigurationError(
                    f"sink {sink!r}: {kind} expression {expression!r} does not parse: {first}"
                ) from None


def _first_unresolved(df: Any, expressions: Sequence[str]) -> str | None:
    """The first ``select`` expression Spark cannot resolve on its own against ``df``."""
    for expression in expressions:
        try:
            df.selectExpr(expression)
        except Exception:
            return expression
    return None


def _unresolved(
    kind: str, expression: str, exc: BaseException, sink: str, batch_id: int | None
) -> RouteError:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return RouteError(
        f"route {kind} {expression!r} cannot be applied to the batch: {first}",
        sink=sink,
        batch_id=batch_id,
        kind=kind,
        expression=expression,
    )


def _strip_alias(expression: str) -> str:
    head, sep, alias = expression.rpartition(" AS ")
    if not sep:
        head, sep, alias = expression.rpartition(" as ")
    return head if sep and alias.strip().replace("_", "").isalnum() else expression


@dataclass(frozen=True)
class SinkSpec:
    """A sink together with the settings fanout applies around it.

    Pass one to ``FanOut(sinks=[...])`` to route or tune a sink given as an instance:
    ``SinkSpec(MySink("x"), route=Route(where="amount > 0"), retry=RetryPolicy(5))``.
    """

    sink: Sink
    route: Route = field(default_factory=Route)
    retry: RetryPolicy | None = None

    @property
    def name(self) -> str:
        """The sink's name."""
        return self.sink.name


def split_core_options(
    name: str, options: Mapping[str, Any], default_retry: RetryPolicy
) -> tuple[dict[str, Any], Route, RetryPolicy | None]:
    """Separate ``where``/``select``/``retries``/``backoff_s`` from a sink's own options."""
    own = {k: v for k, v in options.items() if k not in CORE_OPTIONS}
    where = options.get("where")
    select = options.get("select")
    if where is not None and not (isinstance(where, str) and where.strip()):
        raise ConfigurationError(f"sink {name!r}: 'where' must be a non-empty SQL predicate")
    if select is not None:
        if isinstance(select, str):
            select = [select]
        if not (
            isinstance(select, Sequence)
            and select
            and all(isinstance(s, str) and s.strip() for s in select)
        ):
            raise ConfigurationError(
                f"sink {name!r}: 'select' must be a list of column names or SQL expressions"
            )
        select = tuple(select)
    retry = None
    if "retries" in options or "backoff_s" in options:
        try:
            retry = RetryPolicy(
                retries=int(options.get("retries", default_retry.retries)),
                backoff_s=float(options.get("backoff_s", default_retry.backoff_s)),
                max_backoff_s=default_retry.max_backoff_s,
                jitter=default_retry.jitter,
            )
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"sink {name!r}: bad retries/backoff_s: {exc}") from None
    return own, Route(where, select), retry
