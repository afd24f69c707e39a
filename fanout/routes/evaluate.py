"""Evaluating a sink's route over a batch, and naming what fails in it.

The building blocks of :mod:`fanout.routes.rejects`: force a routed DataFrame's evaluation
(:func:`evaluate`), tell a value's fault (SQL's *data exception*, SQLSTATE class 22) from
other errors (:func:`data_error`), find which expression of a route raises
(:func:`failing_expression`) and turn that into a :class:`fanout.RouteError`
(:func:`route_error`, :func:`explain_failure`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from fanout.errors import RouteError
from fanout.observe.spark_errors import quiet_spark_errors
from fanout.routes.route import Route

log = logging.getLogger("fanout")

DATA_EXCEPTION = "22"
"""The SQLSTATE class of errors caused by a value (SQL's "data exception"): only these are
a row's own fault and isolated."""


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
    cause = data_error_of(df)
    return None if cause is None else RouteFailure(kind, expression, cause)


def data_error_of(df: Any) -> BaseException | None:
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
