"""A sink's route: which rows (``where``) and what shape (``select``) it receives.

- ``where``: a Spark SQL predicate; the sink receives only the rows matching it;
- ``select``: columns or Spark SQL expressions (``"amount * 100 AS cents"``); the sink
  receives that shape.

Routing is applied to the (persisted) batch DataFrame, so a routed sink is covered by the
same exactly-once machinery as any other: for a replayable source and deterministic
expressions, a replay routes the same rows.

An expression may raise on a row (ANSI mode: ``CAST('abc' AS INT)``). Such rows go to the
sink's dead-letter target when its ``dead_letter`` option names one, and fail
the batch for that sink with a :class:`fanout.RouteError` otherwise; see
:mod:`fanout.routes.rejects`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fanout.contract.dead_letters import RouteStamp
from fanout.errors import ConfigurationError, RouteError
from fanout.routes.settings import Settings

log = logging.getLogger("fanout")


@dataclass(frozen=True)
class Route:
    """Which rows (``where``) and which shape (``select``) a sink receives."""

    where: str | None = None
    select: tuple[str, ...] | None = None

    @property
    def is_identity(self) -> bool:
        """True when the sink receives the batch as it is."""
        return self.where is None and self.select is None

    @property
    def expression_fingerprint(self) -> str:
        """A short hash of the expressions alone, stable across processes (15 hex digits):
        what fanout recorded with a batch's route letters before it also covered the Spark
        settings (:meth:`stamp`); a replay still accepts letters recorded under it."""
        text = json.dumps({"where": self.where, "select": list(self.select or ())})
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:15]

    def describe(self) -> str:
        """The route for people: ``where 'amount > 0', select ['id', 'amount * 100 AS
        cents']``, or ``no route``."""
        parts = [] if self.where is None else [f"where {self.where!r}"]
        if self.select is not None:
            parts.append(f"select {list(self.select)!r}")
        return ", ".join(parts) or "no route"

    def stamp(self, settings: Settings = ()) -> RouteStamp:
        """What a dead-letter target records with this route's letters: a hash of the
        expressions and of the Spark ``settings`` they are evaluated under (15 hex digits:
        60 bits, which a Kafka offset holds), so that a replay under another route, or
        under settings refusing other rows (:mod:`fanout.routes.settings`), is refused
        (:mod:`fanout.deadletters.route_letters`); the text names both."""
        return _stamp(self, tuple(settings))

    def apply(self, df: Any) -> Any:
        """The routed DataFrame (lazy in Spark: nothing runs until a sink reads it)."""
        if self.where is not None:
            df = df.where(self.where)
        if self.select is not None:
            df = df.selectExpr(*self.select)
        return df

    def resolve(self, df: Any, *, sink: str, batch_id: int | None, analyze: bool = False) -> Any:
        """:meth:`apply`, raising :class:`fanout.RouteError` naming the sink, the batch and
        the expression when Spark cannot resolve it against ``df`` (a misspelt column, a
        type error): Spark analyses a DataFrame when it is built, before any row is read.
        A Spark Connect DataFrame is analyzed only when asked for: ``analyze`` asks the
        server for each step's schema (a round trip each, so only before the stream
        starts; at a batch, a route that does not resolve fails the sink's write)."""
        analyzed = _analyzed if analyze else _as_is
        if self.where is not None:
            try:
                df = analyzed(df.where(self.where))
            except Exception as exc:
                raise _unresolved("where", self.where, exc, sink, batch_id) from exc
        if self.select is not None:
            try:
                df = analyzed(df.selectExpr(*self.select))
            except Exception as exc:
                culprit = _first_unresolved(df, self.select, analyzed) or ", ".join(self.select)
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
        parse = _parser(spark)
        for kind, expression in [("where", self.where)] + [
            ("select", s) for s in self.select or ()
        ]:
            if expression is None:
                continue
            try:
                parse(_strip_alias(expression) if kind == "select" else expression)
            except Exception as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise ConfigurationError(
                    f"sink {sink!r}: {kind} expression {expression!r} does not parse: {first}"
                ) from None


def _parser(spark: Any) -> Any:
    """A function parsing one SQL expression, raising on a syntax error only: Spark's own
    parser through the JVM, or under Spark Connect the server's (an analysis of the
    expression over an empty relation, whose only tolerated failures are about names)."""
    from fanout.contract.sessions import is_connect

    if not is_connect(spark):
        return spark._jsparkSession.sessionState().sqlParser().parseExpression

    def parse(expression: str) -> None:
        from fanout.observe.spark_errors import quiet_spark_errors

        try:
            with quiet_spark_errors():  # an unresolved name is expected: no columns yet
                _ = spark.range(0).selectExpr(expression).schema
        except Exception as exc:
            getter = getattr(exc, "getCondition", None) or getattr(exc, "getErrorClass", None)
            condition = str(getter() if getter is not None else "")
            if condition.startswith("PARSE") or "SYNTAX" in condition:
                raise

    return parse


def _first_unresolved(
    df: Any, expressions: Sequence[str], analyzed: Callable[[Any], Any]
) -> str | None:
    """The first ``select`` expression Spark cannot resolve on its own against ``df``."""
    for expression in expressions:
        try:
            analyzed(df.selectExpr(expression))
        except Exception:
            return expression
    return None


def _analyzed(df: Any) -> Any:
    """``df``, analyzed: a Spark Connect DataFrame's plan sent to the server for its
    schema (``df.schema`` would not do: the client keeps its parent's schema for a
    ``where``, without asking); a classic one was analyzed when built."""
    from fanout.contract.sessions import is_connect

    if is_connect(df):
        client = df.sparkSession.client
        client.schema(df._plan.to_proto(client))
    return df


def _as_is(df: Any) -> Any:
    return df


def _unresolved(
    kind: str, expression: str, exc: BaseException, sink: str, batch_id: int | None
) -> RouteError:
    text = str(exc).strip()
    first = text.splitlines()[0].rstrip("; ") if text else type(exc).__name__
    return RouteError(
        f"route {kind} {expression!r} cannot be applied to the batch: {first}; fix the "
        f"sink's '{kind}' against the batch's columns, or add to the stream what it names",
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


def route_of(batch: Any) -> RouteStamp:
    """The route a :class:`~fanout.contract.batch.Batch` went through (:attr:`Batch.route`),
    or the identity's when it carries none (a batch built outside fanout: a sink called
    directly), as fanout hands an unrouted sink: what a sink recording the route with each
    committed piece records and compares, so a direct replay compares equal."""
    route: RouteStamp | None = batch.route
    return route or Route().stamp()


@functools.lru_cache(maxsize=256)
def _stamp(route: Route, settings: Settings) -> RouteStamp:
    """:meth:`Route.stamp`, computed once per route and settings (every batch asks for
    each sink's)."""
    text = json.dumps(
        {"where": route.where, "select": list(route.select or ()), "settings": dict(settings)}
    )
    fingerprint = hashlib.sha256(text.encode("utf-8")).hexdigest()[:15]
    shown = ", ".join(f"{key}={value}" for key, value in settings)
    # a route's stamp without settings: what a sink without a dead-letter target was
    # handed before its stamp covered them too
    bare = (_stamp(route, ()).fingerprint,) if settings else ()
    return RouteStamp(
        fingerprint,
        f"{route.describe()} under {shown}" if shown else route.describe(),
        earlier=(route.expression_fingerprint, *bare),
    )
