"""Rows failing a route: the sink contract, the dead-letter writers, and how the
dispatcher and the runner use a checked route (stand-ins for Spark; the real evaluation
and isolation are covered by tests/integration/test_route_rejects.py)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from fanout import BatchInfo, FanOut, RouteError, Sink, SinkResult
from fanout.contract.batch import SharedArrow
from fanout.deadletters.model import ROUTE_LETTERS, DeadLetter, DeltaDeadLetters
from fanout.delta_tables.io import read_delta
from fanout.ledger.memory import MemoryLedger
from fanout.routes.evaluate import RouteFailure, data_error, quiet_spark_errors, route_error
from fanout.routes.rejects import CheckedRoute
from fanout.routes.route import Route
from fanout.sink_spec import SinkSpec
from fanout.testing import ArrowFrame, RecordingSink, make_batch

ROUTE = Route(where="x > 1")


class SparkLikeError(Exception):
    """What PySpark raises: a condition, a SQLSTATE and message parameters."""

    def __init__(self, message: str, state: str, parameters: dict[str, str]) -> None:
        super().__init__(message)
        self.state, self.parameters = state, parameters

    def getSqlState(self) -> str:  # PySpark's names
        return self.state

    def getMessageParameters(self) -> dict[str, str]:
        return self.parameters


CAST_ERROR = SparkLikeError(
    "[CAST_INVALID_INPUT] The value 'it''s' cannot be cast. SQLSTATE: 22018\n== SQL ==\n...",
    "22018",
    {"expression": "'it\\'s'", "sourceType": '"STRING"'},
)


class Frame(ArrowFrame):
    """An ArrowFrame that understands ``where("x > N")``."""

    def where(self, predicate: str) -> Frame:
        column, _, value = predicate.partition(" > ")
        return Frame(self.table.filter(pa.compute.greater(self.table[column], int(value))))


class Letters:
    """A dead-letter writer recording what it was given (idempotent per batch id)."""

    def __init__(self) -> None:
        self.written: dict[int, list[DeadLetter]] = {}
        self.calls = 0

    def write(self, batch: Any, letters: Any) -> int:
        self.calls += 1
        self.written.setdefault(batch.batch_id, list(letters))
        return len(letters)


class WithLetters(RecordingSink):
    """A sink whose route letters go to ``target`` (a :class:`Letters`)."""

    def __init__(self, name: str, target: Letters | None) -> None:
        super().__init__(name)
        self.target = target

    def route_dead_letters(self) -> Letters | None:  # type: ignore[override]
        return self.target


# -- the contract's default --------------------------------------------------------------


class Plain(Sink):
    def __init__(self, name: str, **options: Any) -> None:
        super().__init__(name)
        for key, value in options.items():
            setattr(self, key, value)


def test_the_default_serves_a_delta_dead_letter_option() -> None:
    writer = Plain("s", dead_letter="delta:/data/dead", storage_options={"k": "v"})
    target = writer.route_dead_letters()
    assert isinstance(target, DeltaDeadLetters)
    assert (target.path, target.storage_options, target.suffix) == (
        "/data/dead", {"k": "v"}, ROUTE_LETTERS,
    )  # fmt: skip
    assert Plain("s").route_dead_letters() is None
    assert Plain("s", dead_letter=None).route_dead_letters() is None
    assert Plain("s", dead_letter="kafka:dlq").route_dead_letters() is None  # not its kind
    assert Plain("s", dead_letter={"table": "x"}).route_dead_letters() is None


def test_route_letters_and_the_sinks_own_letters_are_separate_transactions(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "dead")
    batch = make_batch([{"id": 1}], batch_id=3, pipeline="p", sink_name="s")
    own = DeltaDeadLetters(path)
    route = DeltaDeadLetters(path, suffix=ROUTE_LETTERS)
    assert route.write(batch, [DeadLetter({"id": 2}, "route where failed")]) == 1
    assert own.write(batch, [DeadLetter({"id": 1}, "null key", "k")]) == 1
    assert route.write(batch, [DeadLetter({"id": 2}, "route where failed")]) == 1  # replay
    assert own.write(batch, [DeadLetter({"id": 1}, "null key", "k")]) == 1
    reasons = sorted(r["reason"] for r in read_delta(path).to_pylist())
    assert reasons == ["null key", "route where failed"]


# -- errors and values -------------------------------------------------------------------


def test_only_data_exceptions_count_as_a_rows_fault() -> None:
    wrapped = RuntimeError("sink failed")
    wrapped.__cause__ = CAST_ERROR
    assert data_error(wrapped) is CAST_ERROR
    assert data_error(SparkLikeError("[UDF] boom", "39000", {})) is None
    assert data_error(RuntimeError("no SQLSTATE")) is None


def test_a_failure_names_kind_expression_value_and_spark_first_line() -> None:
    failure = RouteFailure("select", "CAST(a AS INT) AS a", CAST_ERROR, column="a")
    assert failure.reason == (
        "route select 'CAST(a AS INT) AS a' failed: [CAST_INVALID_INPUT] The value 'it''s' "
        "cannot be cast. SQLSTATE: 22018"
    )
    assert failure.value == "it's"  # Spark's SQL literal, unquoted
    error = route_error(failure, sink="pg", batch_id=7)
    assert (error.sink, error.batch_id, error.kind, error.expression) == (
        "pg", 7, "select", "CAST(a AS INT) AS a",
    )  # fmt: skip
    assert str(error).startswith("sink 'pg', batch 7: route select 'CAST(a AS INT) AS a' failed")
    assert error.__cause__ is CAST_ERROR


def test_quieting_keeps_pysparks_logger_class() -> None:
    """PySpark logs with keywords only its own logger class takes; creating the loggers
    as plain ones first would make every later Spark error raise TypeError."""
    pytest.importorskip("pyspark")
    from pyspark.logger import PySparkLogger

    with quiet_spark_errors():
        logging.getLogger("SQLQueryContextLogger").error("dropped in this thread")
    assert isinstance(logging.getLogger("SQLQueryContextLogger"), PySparkLogger)
    assert isinstance(logging.getLogger("DataFrameQueryContextLogger"), PySparkLogger)


# -- the dispatcher with a checked route -------------------------------------------------


def _checked(good: pa.Table) -> CheckedRoute:
    frame = Frame(good)
    return CheckedRoute(
        ROUTE,
        df=frame,
        arrow=SharedArrow(frame),
        letters=(DeadLetter({"x": "bad"}, "route where 'x > 1' failed: boom"),),
        failure=RouteFailure("where", "x > 1", CAST_ERROR),
    )


def test_sinks_of_a_checked_route_get_the_good_rows_or_fail_unwritten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import fanout.routes.batch_routes as dispatcher

    good = pa.table({"x": [2, 3]})
    calls: list[dict[str, Any]] = []

    def check(df: Any, route: Route, **kw: Any) -> CheckedRoute:
        calls.append({"route": route, **kw})
        return _checked(good)

    monkeypatch.setattr(dispatcher, "check_route", check)
    letters = Letters()
    kept, failing, everything = (
        WithLetters("kept", letters),
        WithLetters("no_dlq", None),
        (WithLetters("all", None)),
    )
    ledger = MemoryLedger()
    fan = FanOut(
        "rt", ledger, [SinkSpec(kept, ROUTE), SinkSpec(failing, ROUTE), everything],
        backoff_s=0, retries=0,
    )  # fmt: skip
    batch = Frame(pa.table({"x": [1, 2, 3]}))
    with pytest.raises(Exception) as caught:
        fan.process(batch, BatchInfo("rt", 5, "q"))

    assert calls == [
        {"route": ROUTE, "arrow": True, "dataframe": False, "sink": "kept", "batch_id": 5}
    ]  # once for the route, before any write
    assert kept.rows() == [{"x": 2}, {"x": 3}]
    assert [d.row for d in letters.written[5]] == [{"x": "bad"}]
    assert everything.rows() == [{"x": 1}, {"x": 2}, {"x": 3}]
    assert failing.calls == []  # never written: its rows would fail the route
    error = caught.value.failures["no_dlq"]  # type: ignore[attr-defined]
    assert isinstance(error, RouteError) and error.expression == "x > 1"
    assert str(error).startswith("sink 'no_dlq', batch 5: route where 'x > 1' failed: ")
    marks = {e.sink: (e.rows, e.dead_lettered) for e in ledger.entries if e.status == "committed"}
    assert marks == {"kept": (2, 1), "all": (3, 0)}
    failed = [e for e in ledger.entries if e.status == "failed"]
    assert [(e.sink, e.error.split(":")[0]) for e in failed] == [("no_dlq", "RouteError")]


def test_letters_are_written_with_every_attempt_before_the_sink(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import fanout.routes.batch_routes as dispatcher
    from fanout.errors import TransientSinkError

    monkeypatch.setattr(
        dispatcher, "check_route", lambda df, r, **kw: _checked(pa.table({"x": [2]}))
    )
    order: list[str] = []

    class Writer(Letters):
        def write(self, batch: Any, letters: Any) -> int:
            order.append(f"letters {batch.attempt}")
            return super().write(batch, letters)

    class Flaky(WithLetters):
        def write(self, batch: Any) -> SinkResult:
            order.append(f"write {batch.attempt}")
            if batch.attempt == 1:
                raise TransientSinkError("timeout", sink=self.name, batch_id=batch.batch_id)
            return super().write(batch)

    writer = Writer()
    results = FanOut("rt", MemoryLedger(), [SinkSpec(Flaky("s", writer), ROUTE)], backoff_s=0)
    result = results.process(Frame(pa.table({"x": [1, 2]})), BatchInfo("rt", 0, "q"))["s"]
    assert order == ["letters 1", "write 1", "letters 2", "write 2"]
    assert (result.rows, result.dead_lettered, result.details["route_dead_lettered"]) == (1, 1, 1)


def test_a_route_that_cannot_be_settled_fails_its_dead_letter_sinks_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import fanout.routes.batch_routes as dispatcher

    too_many = RouteError("route where 'x > 1' failed: too many", sink="a", batch_id=2)
    monkeypatch.setattr(
        dispatcher, "check_route", lambda df, r, **kw: CheckedRoute(r, error=too_many)
    )
    a, b = WithLetters("a", Letters()), WithLetters("b", Letters())
    plain = WithLetters("plain", None)  # same route, no target: reads the batch itself
    fan = FanOut("rt", MemoryLedger(), [SinkSpec(s, ROUTE) for s in (a, b, plain)], retries=0)
    with pytest.raises(Exception) as caught:
        fan.process(Frame(pa.table({"x": [1, 2]})), BatchInfo("rt", 2, "q"))
    failures = caught.value.failures  # type: ignore[attr-defined]
    assert sorted(failures) == ["a", "b"]
    assert str(failures["b"]) == "sink 'b', batch 2: route where 'x > 1' failed: too many"
    assert a.calls == b.calls == [] and plain.rows() == [{"x": 2}]
