"""Rows that fail a sink's route: found before any write, sent to its dead-letter target.

A route (``where``, ``select``) is a set of Spark SQL expressions evaluated on every row.
Under ANSI mode (Spark 4's default) an expression raises on a row it cannot evaluate —
``CAST('abc' AS INT)``, an overflow, a division by zero, an invalid date — and the whole
Spark job fails. For a routed sink with a dead-letter target (its ``dead_letter`` option,
:mod:`fanout.deadletters.target`), the dispatcher therefore evaluates the route before any
sink writes (:func:`check_route`):

1. the routed DataFrame is cached and evaluated once, or converted to Arrow once when only
   Arrow readers share the route: work the sinks would do anyway, done earlier;
2. when that raises a *data exception* (SQLSTATE class 22), :func:`isolate` finds exactly
   the failing rows: the batch is collected to the driver as Arrow (on this failure path
   only) and bisected over row ranges, evaluating the route on each slice; each failing
   row is then evaluated expression by expression to name the one that fails;
3. the sinks read the other rows, routed, and the failing rows become dead letters
   (reason, column, value, and the row as it was before the route).

Evaluating before writing matters for exactly-once: a sink writing partition by partition
(PostgreSQL, Kafka) that met the error half way would leave some partitions committed, and
a replay routing another set of rows would then mix the two.

The work is capped: more than :data:`REJECT_LIMIT` failing rows, or more than
:data:`EVALUATION_LIMIT` evaluations, fail the batch with a :class:`fanout.RouteError`.
Errors of other kinds (a lost executor, a Python UDF raising) are never isolated, and when
bisection finds no failing row (the error was transient) the original error is raised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fanout.contract.batch import SharedArrow
from fanout.contract.dead_letters import DeadLetter, letter_rows
from fanout.errors import RouteError
from fanout.observe.spark_errors import quiet_spark_errors
from fanout.routes.evaluate import (
    RouteFailure,
    data_error,
    data_error_of,
    evaluate,
    failing_expression,
    first_line,
    route_error,
)
from fanout.routes.route import Route

log = logging.getLogger("fanout")

REJECT_LIMIT = 1000
"""At most this many rows of one batch are dead-lettered for failing a route; more fail
the batch (the data, or the expression, needs a look rather than a dead-letter table)."""

EVALUATION_LIMIT = 4000
"""At most this many Spark evaluations are spent isolating the failing rows of one route
in one batch (bisection needs about ``2 * k * log2(n / k)`` for k failing rows of n)."""


@dataclass(frozen=True)
class Isolation:
    """What :func:`isolate` found.

    :param good: the routed DataFrame of every row that passes the route.
    :param letters: one dead letter per failing row, in batch order.
    :param first: the failure of the first failing row.
    :param evaluations: the Spark evaluations it took.
    """

    good: Any
    letters: tuple[DeadLetter, ...]
    first: RouteFailure | None
    evaluations: int


class _Budget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.spent = 0

    def spend(self) -> None:
        self.spent += 1
        if self.spent > self.limit:
            raise _OverBudget(f"more than {self.limit} evaluations")


class _OverBudget(Exception):
    pass


class _TooMany(Exception):
    pass


def isolate(
    df: Any,
    route: Route,
    *,
    sink: str,
    batch_id: int,
    reject_limit: int = REJECT_LIMIT,
    evaluation_limit: int = EVALUATION_LIMIT,
) -> Isolation:
    """Find exactly the rows of ``df`` (the batch before the route) that make ``route``
    raise a data exception, and the expression each fails.

    Collects ``df`` to the driver as Arrow, then bisects over row ranges, evaluating the
    route on ``spark.createDataFrame(slice, schema=df.schema)``. A range that evaluates is
    good; when the left half of a failing range evaluates, the right half is known to
    fail without evaluating it (expressions are row by row). Each row found is evaluated
    expression by expression (:func:`failing_expression`), which also confirms it.

    :param sink: the sink named in errors (with ``batch_id``).
    :raises fanout.RouteError: more than ``reject_limit`` rows fail, or the isolation
        needs more than ``evaluation_limit`` evaluations.
    :returns: the good rows routed and the letters; no letters means no row fails on its
        own (the caller raises the original error).
    """
    import pyarrow as pa

    spark, schema = df.sparkSession, df.schema
    table = df.toArrow()
    budget = _Budget(evaluation_limit)

    def frame(part: pa.Table) -> Any:
        return spark.createDataFrame(part, schema=schema)

    def fails(lo: int, hi: int) -> bool:
        budget.spend()
        return data_error_of(route.apply(frame(table.slice(lo, hi - lo)))) is not None

    suspects: list[int] = []

    def search(lo: int, hi: int, known_to_fail: bool) -> None:
        if hi <= lo or (not known_to_fail and not fails(lo, hi)):
            return
        if hi - lo == 1:
            suspects.append(lo)
            if len(suspects) > reject_limit:
                raise _TooMany
            return
        mid = (lo + hi) // 2
        if fails(lo, mid):
            search(lo, mid, True)
            search(mid, hi, False)
        else:
            search(mid, hi, True)

    letters: list[DeadLetter] = []
    rejected: list[int] = []
    first: RouteFailure | None = None
    try:
        search(0, table.num_rows, False)
        for index in suspects:
            row = table.slice(index, 1)
            failure = failing_expression(frame(row), route, spend=budget.spend)
            if failure is None:
                continue  # passes alone: the range failed for another reason
            first = first or failure
            rejected.append(index)
            letters.append(
                DeadLetter(
                    row=letter_rows(row)[0],
                    reason=failure.reason,
                    column=failure.column,
                    value=failure.value,
                )
            )
    except (_TooMany, _OverBudget) as over:
        failure = first or _first_failure(route, table, suspects, frame)
        limit = (
            f"more than {reject_limit} of the batch's {table.num_rows} rows fail the route"
            if isinstance(over, _TooMany)
            else f"isolating the rows failing the route took {over}"
        )
        detail = (
            f"{limit}, over what fanout dead-letters (fanout.routes.rejects.REJECT_LIMIT, "
            "EVALUATION_LIMIT): fix the data or the expression (e.g. try_cast)"
        )
        if failure is None:
            error = RouteError(f"route failed: {detail}", sink=sink, batch_id=batch_id)
            raise error from None
        raise route_error(failure, sink=sink, batch_id=batch_id, advice=detail)  # noqa: B904
    dropped = set(rejected)
    keep = pa.array([i not in dropped for i in range(table.num_rows)], pa.bool_())
    good = route.apply(frame(table.filter(keep)))
    return Isolation(good, tuple(letters), first, budget.spent)


def _first_failure(
    route: Route, table: Any, suspects: list[int], frame: Callable[[Any], Any]
) -> RouteFailure | None:
    """The failure of the first suspect row, to name an expression in a limit error."""
    for index in suspects[:3]:
        failure = failing_expression(frame(table.slice(index, 1)), route)
        if failure is not None:
            return failure
    return None


@dataclass
class CheckedRoute:
    """A route evaluated before any write (:func:`check_route`).

    :param route: the route.
    :param df: what the sinks with a dead-letter target read: the routed batch (cached
        when DataFrame readers share the route) or, when rows failed, the other rows.
    :param arrow: the shared Arrow conversion of ``df`` (converted when Arrow readers
        share the route).
    :param letters: the rows that failed, as dead letters.
    :param failure: the first failing expression, when rows of the batch fail the route.
    :param error: why sinks with a dead-letter target cannot be written this batch (too
        many failing rows, an error that is not a row's fault, a transient error).
    :param cached: DataFrames persisted for the sinks, unpersisted by :meth:`release`.
    """

    route: Route
    df: Any = None
    arrow: SharedArrow | None = None
    letters: tuple[DeadLetter, ...] = ()
    failure: RouteFailure | None = None
    error: Exception | None = None
    cached: list[Any] = field(default_factory=list)

    def blocked(self, sink: str, batch_id: int, *, dead_letters: bool) -> Exception | None:
        """The error that fails ``sink`` before it writes, or ``None`` to write it.

        A sink with a dead-letter target fails when the route could not be settled; one
        without fails when rows of the batch fail the route (it would fail reading them).
        """
        if dead_letters:
            if isinstance(self.error, RouteError) and self.error.sink != sink:
                return _retarget(self.error, sink)
            return self.error
        if self.failure is not None:
            return route_error(self.failure, sink=sink, batch_id=batch_id)
        return None

    def release(self) -> None:
        """Drop the cached DataFrames and the Arrow table (the settle step)."""
        if self.arrow is not None:
            self.arrow.release()
        for df in self.cached:
            df.unpersist()
        self.cached.clear()


def _retarget(error: RouteError, sink: str) -> RouteError:
    again = RouteError(
        error.detail,
        sink=sink,
        batch_id=error.batch_id,
        kind=error.kind,
        expression=error.expression,
    )
    again.__cause__ = error.__cause__
    return again


def check_route(
    df: Any,
    route: Route,
    *,
    arrow: bool,
    dataframe: bool,
    sink: str,
    batch_id: int,
    reject_limit: int = REJECT_LIMIT,
    evaluation_limit: int = EVALUATION_LIMIT,
) -> CheckedRoute:
    """Evaluate ``route`` over the batch ``df`` before any write; isolate failing rows.

    :param arrow: Arrow readers share the route: convert it (once, for all of them).
    :param dataframe: DataFrame readers share the route: cache it and evaluate it.
    :param sink: the sink named in errors (the first with a dead-letter target).
    Never raises for the route's own errors: they are in the result.
    """
    with quiet_spark_errors():  # fanout reports what it does not handle itself
        try:
            return _materialized(route, route.apply(df), arrow=arrow, dataframe=dataframe)
        except Exception as exc:
            original = exc
        if data_error(original) is None:
            return CheckedRoute(route, error=original)
        try:
            found = isolate(
                df,
                route,
                sink=sink,
                batch_id=batch_id,
                reject_limit=reject_limit,
                evaluation_limit=evaluation_limit,
            )
        except RouteError as too_many:
            failure = None
            if too_many.kind in ("where", "select") and too_many.expression is not None:
                cause = too_many.__cause__ or original
                failure = RouteFailure(too_many.kind, too_many.expression, cause)  # type: ignore[arg-type]
            return CheckedRoute(route, failure=failure, error=too_many)
        except Exception as exc:
            log.warning("route %s: cannot isolate the failing rows: %s", route, first_line(exc))
            return CheckedRoute(route, error=original)
        if not found.letters:
            log.warning(
                "route %s failed, but no row fails it on its own (a transient error?): %s",
                route,
                first_line(original),
            )
            return CheckedRoute(route, error=original)
        try:
            checked = _materialized(route, found.good, arrow=arrow, dataframe=dataframe)
        except Exception as exc:  # the other rows do not evaluate either: give up
            return CheckedRoute(route, failure=found.first, error=exc)
    checked.letters, checked.failure = found.letters, found.first
    return checked


def _materialized(route: Route, routed: Any, *, arrow: bool, dataframe: bool) -> CheckedRoute:
    cached = []
    if dataframe:
        routed.persist()
        cached.append(routed)
        try:
            evaluate(routed)
        except Exception:
            routed.unpersist()
            raise
    shared = SharedArrow(routed)
    if arrow:
        try:
            shared.get()
        except Exception:
            for df in cached:
                df.unpersist()
            raise
    return CheckedRoute(route, df=routed, arrow=shared, cached=cached)
