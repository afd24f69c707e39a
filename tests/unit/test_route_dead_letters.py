"""Rows failing a route: the dead-letter targets, and how the route step and the runner use
a checked route (stand-ins for Spark; the real evaluation
and isolation are covered by tests/integration/test_route_rejects.py)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from fanout import BatchInfo, FanOut, RouteError, SinkResult, hookimpl
from fanout.contract.batch import SharedArrow
from fanout.contract.dead_letters import DeadLetter
from fanout.deadletters.delta import DeltaDeadLetters
from fanout.delta_tables.io import read_delta
from fanout.ledger.memory import MemoryLedger
from fanout.observe.spark_errors import quiet_spark_errors
from fanout.routes.evaluate import RouteFailure, data_error, route_error
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
    """A dead-letter target recording what it was given (idempotent per batch id)."""

    kind = "letters"

    def __init__(self) -> None:
        self.written: dict[int, list[DeadLetter]] = {}
        self.sources: list[str] = []
        self.calls = 0

    def describe(self) -> str:
        return "letters in memory"

    def write(self, batch: Any, letters: Any, *, source: str, partition: Any = None) -> int:
        self.calls += 1
        self.sources.append(source)
        self.written.setdefault(batch.batch_id, list(letters))
        return len(letters)


class WithLetters(RecordingSink):
    """A sink whose ``dead_letter`` names ``target`` (a :class:`Letters`), through the
    ``letters`` kind :class:`LetterKind` adds."""

    def __init__(self, name: str, target: Letters | None) -> None:
        super().__init__(name)
        self.target = target
        self.dead_letter = None if target is None else "letters:memory"


class LetterKind:
    """A plugin adding the ``letters`` kind: each sink's own :class:`Letters`."""

    @hookimpl
    def fanout_dead_letter_kinds(self) -> dict[str, Any]:
        return {"letters": lambda location, sink: sink.target}


KINDS = [LetterKind()]


def test_route_letters_and_the_sinks_own_letters_are_separate_transactions(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "dead")
    batch = make_batch([{"id": 1}], batch_id=3, pipeline="p", sink_name="s")
    target = DeltaDeadLetters(path)
    route, own = [DeadLetter({"id": 2}, "route where failed")], [DeadLetter({"id": 1}, "null key")]
    assert target.write(batch, route, source="route") == 1
    assert target.write(batch, own, source="refused") == 1
    assert target.write(batch, route, source="route") == 1  # replay
    assert target.write(batch, own, source="refused") == 1
    rows = sorted((r["reason"], r["source"]) for r in read_delta(path).to_pylist())
    assert rows == [("null key", "refused"), ("route where failed", "route")]


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
        backoff_s=0, retries=0, plugins=KINDS,
    )  # fmt: skip
    batch = Frame(pa.table({"x": [1, 2, 3]}))
    with pytest.raises(Exception) as caught:
        fan.process(batch, BatchInfo("rt", 5, "q"))

    assert calls == [
        {"route": ROUTE, "arrow": True, "dataframe": False, "sink": "kept", "batch_id": 5}
    ]  # once for the route, before any write
    assert kept.rows() == [{"x": 2}, {"x": 3}]
    assert [d.row for d in letters.written[5]] == [{"x": "bad"}]
    assert letters.sources == ["route"]
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
        def write(self, batch: Any, letters: Any, *, source: str, partition: Any = None) -> int:
            order.append(f"letters {batch.attempt}")
            return super().write(batch, letters, source=source)

    class Flaky(WithLetters):
        def write(self, batch: Any) -> SinkResult:
            order.append(f"write {batch.attempt}")
            if batch.attempt == 1:
                raise TransientSinkError("timeout", sink=self.name, batch_id=batch.batch_id)
            return super().write(batch)

    writer = Writer()
    spec = SinkSpec(Flaky("s", writer), ROUTE)
    results = FanOut("rt", MemoryLedger(), [spec], backoff_s=0, plugins=KINDS)
    result = results.process(Frame(pa.table({"x": [1, 2]})), BatchInfo("rt", 0, "q"))["s"]
    assert order == ["letters 1", "write 1", "letters 2", "write 2"]
    assert (result.rows, result.dead_lettered, result.details["route_dead_lettered"]) == (1, 1, 1)


def test_a_sink_refusing_the_replay_refuses_before_the_route_letters_are_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import fanout.routes.batch_routes as dispatcher
    from fanout.errors import SinkWriteError

    monkeypatch.setattr(
        dispatcher, "check_route", lambda df, r, **kw: _checked(pa.table({"x": [2]}))
    )
    seen: list[tuple[str, str | None]] = []

    class Refusing(WithLetters):
        def check_replay(self, batch: Any) -> None:
            seen.append(("check", batch.route.fingerprint))
            raise SinkWriteError("route changed mid-batch", sink=self.name, batch_id=1)

    letters = Letters()
    sink = Refusing("s", letters)
    fan = FanOut("rt", MemoryLedger(), [SinkSpec(sink, ROUTE)], backoff_s=0, retries=0,
                 plugins=KINDS)  # fmt: skip
    with pytest.raises(Exception) as caught:
        fan.process(Frame(pa.table({"x": [1, 2]})), BatchInfo("rt", 1, "q"))
    assert seen == [("check", ROUTE.stamp().fingerprint)]
    assert (letters.calls, letters.written, sink.calls) == (0, {}, [])
    error = caught.value.failures["s"]  # type: ignore[attr-defined]
    assert str(error) == "sink 's', batch 1: route changed mid-batch"


def test_every_sink_is_handed_its_route() -> None:
    class Routes(RecordingSink):
        def write(self, batch: Any) -> SinkResult:
            self.routes = [*getattr(self, "routes", []), batch.route]
            return super().write(batch)

    routed, plain = Routes("routed"), Routes("plain")
    fan = FanOut("rt", MemoryLedger(), [SinkSpec(routed, ROUTE), plain], backoff_s=0)
    fan.process(Frame(pa.table({"x": [1, 2]})), BatchInfo("rt", 0, "q"))
    assert routed.routes == [ROUTE.stamp()]
    assert plain.routes == [Route().stamp()]
    assert Route().stamp().text == "no route"


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
    specs = [SinkSpec(s, ROUTE) for s in (a, b, plain)]
    fan = FanOut("rt", MemoryLedger(), specs, retries=0, plugins=KINDS)
    with pytest.raises(Exception) as caught:
        fan.process(Frame(pa.table({"x": [1, 2]})), BatchInfo("rt", 2, "q"))
    failures = caught.value.failures  # type: ignore[attr-defined]
    assert sorted(failures) == ["a", "b"]
    assert str(failures["b"]) == "sink 'b', batch 2: route where 'x > 1' failed: too many"
    assert a.calls == b.calls == [] and plain.rows() == [{"x": 2}]
