"""Rows that fail a sink's route: found before any write, sent to its dead-letter target.

A route (``where``, ``select``) is a set of Spark SQL expressions evaluated on every row.
Under ANSI mode (Spark 4's default) an expression raises on a row it cannot evaluate —
``CAST('abc' AS INT)``, an overflow, a division by zero, an invalid date — and the whole
Spark job fails. For a routed sink with a dead-letter target
(:meth:`fanout.Sink.route_dead_letters`), the dispatcher therefore evaluates the route
before any sink writes (:func:`check_route`):

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
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from fanout.deadletter import DeadLetter
from fanout.errors import RouteError
from fanout.routing import Route
from fanout.sink import SharedArrow

log = logging.getLogger("fanout")

REJECT_LIMIT = 1000
"""At most this many rows of one batch are dead-lettered for failing a route; more fail
the batch (the data, or the expression, needs a look rather than a dead-letter table)."""

EVALUATION_LIMIT = 4000
"""At most this many Spark evaluations are spent isolating the failing rows of one route
in one batch (bisection needs about ``2 * k * log2(n / k)`` for k failing rows of n)."""

DATA_EXCEPTION = "22"
"""The SQLSTATE class of errors caused by a value (SQL's "data exception"): only these are
a row's own fault and isolated."""

_SPARK_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")

Kind = Literal["where", "select"]


def evaluate(df: Any) -> None:
    """Evaluate every expression of ``df`` on every row, keeping nothing (Spark's
    ``noop`` data source)."""
    df.write.format("noop").mode("overwrite").save()


def data_error(error: BaseException | None) -> BaseException | None:
    """The Spark data exception (SQLSTATE class 22) in ``error``'s chain, if any."""
    seen: list[BaseException] = []
    while error is not None and error not in seen:
        seen.append(error)
        state = _call(error, "getSqlState")
        if isinstance(state, str) and state.startswith(DATA_EXCEPTION):
            return error
        error = error.__cause__ or error.__context__
    return None


@dataclass(frozen=True)
class RouteFailure:
    """One expression of a route failing, with Spark's error.

    :param kind: ``"where"`` or ``"select"``.
    :param expression: the expression as configured.
    :param error: Spark's error.
    :param column: for a ``select`` expression, the column it produces.
    """

    kind: Kind
    expression: str
    error: BaseException
    column: str | None = None

    @property
    def reason(self) -> str:
        """``route <kind> <expression> failed: <Spark's first line>``."""
        return f"route {self.kind} {self.expression!r} failed: {first_line(self.error)}"

    @property
    def value(self) -> Any:
        """The offending value when Spark's error names it (e.g. ``abc`` of
        ``CAST_INVALID_INPUT``), else ``None``."""
        parameters = _call(self.error, "getMessageParameters") or {}
        for key in ("expression", "value"):
            if key in parameters:
                return _unquote(str(parameters[key]))
        return None


def first_line(error: BaseException) -> str:
    """The first line of an error's message (Spark's carry a long query context)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def failing_expression(
    df: Any, route: Route, *, spend: Callable[[], None] | None = None
) -> RouteFailure | None:
    """Evaluate the route's expressions one at a time over ``df``: ``where`` first, then
    each ``select`` expression over the rows ``where`` keeps. The first to raise a data
    exception, or ``None``. Other errors propagate.

    :param spend: called before each evaluation (a budget that may raise).
    """
    if route.where is not None:
        failure = _attempt(df.where(route.where), "where", route.where, spend)
        if failure is not None:
            return failure
        df = df.where(route.where)
    for expression in route.select or ():
        selected = df.selectExpr(expression)
        failure = _attempt(selected, "select", expression, spend)
        if failure is not None:
            column = next(iter(selected.columns), None)
            return RouteFailure("select", expression, failure.error, column)
    return None


def _attempt(
    df: Any, kind: Kind, expression: str, spend: Callable[[], None] | None
) -> RouteFailure | None:
    if spend is not None:
        spend()
    cause = _data_error_of(df)
    return None if cause is None else RouteFailure(kind, expression, cause)


def _data_error_of(df: Any) -> BaseException | None:
    """The data exception evaluating ``df`` raises, or ``None`` when it evaluates; other
    errors propagate."""
    try:
        evaluate(df)
    except Exception as exc:
        cause = data_error(exc)
        if cause is None:
            raise
        return cause
    return None


def route_error(
    failure: RouteFailure, *, sink: str, batch_id: int, advice: str | None = None
) -> RouteError:
    """A :class:`fanout.RouteError` for ``failure``, chained from Spark's error."""
    advice = advice or (
        "the sink has no dead-letter target: fix the data or the expression (e.g. try_cast), "
        "or give the sink a dead_letter target for such rows"
    )
    error = RouteError(
        f"{failure.reason}; {advice}",
        sink=sink,
        batch_id=batch_id,
        kind=failure.kind,
        expression=failure.expression,
    )
    error.__cause__ = failure.error
    return error


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
        return _data_error_of(route.apply(frame(table.slice(lo, hi - lo)))) is not None

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
                    row=row.to_pylist()[0],
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
            f"{limit}, over what fanout dead-letters (fanout.route_rejects.REJECT_LIMIT, "
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


@contextmanager
def quiet_spark_errors() -> Iterator[None]:
    """Keep PySpark from logging every error this thread provokes on purpose (each
    bisection step would log a full query context and stack trace at ERROR)."""
    thread = threading.get_ident()

    def other_threads(record: logging.LogRecord) -> bool:
        return record.thread != thread

    try:  # PySpark's own logger class: its calls pass keywords a plain Logger refuses
        from pyspark.logger import PySparkLogger

        loggers: list[logging.Logger] = [PySparkLogger.getLogger(n) for n in _SPARK_LOGGERS]
    except ImportError:
        loggers = []
    for logger in loggers:
        logger.addFilter(other_threads)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(other_threads)


def _call(obj: Any, method: str) -> Any:
    function = getattr(obj, method, None)
    if function is None:
        return None
    try:
        return function()
    except Exception:
        return None


def _unquote(text: str) -> str:
    """Spark shows a string value as a SQL literal (``'abc'``); return the value."""
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1].replace("\\'", "'").replace("\\\\", "\\")
    return text


def explain_failure(
    df: Any, route: Route, error: BaseException, *, sink: str, batch_id: int
) -> RouteError | None:
    """For a routed sink without a checked route: when its write failed with a Spark data
    exception, find which route expression raises over ``df`` (the batch before the
    route) and return a :class:`fanout.RouteError` naming sink, batch and expression,
    chained from ``error``. ``None`` when the route is not at fault. Failure path only:
    it costs one evaluation of the batch per expression tried."""
    if data_error(error) is None:
        return None
    try:
        with quiet_spark_errors():
            failure = failing_expression(df, route)
    except Exception as exc:
        log.debug("sink %r: cannot tell whether its route failed: %s", sink, exc)
        return None
    if failure is None:
        return None
    explained = route_error(failure, sink=sink, batch_id=batch_id)
    explained.__cause__ = error
    return explained
