"""Isolating the rows that fail a route (fanout.routes.rejects) with a real SparkSession.

They need the JVM, so they live with the integration tests; they need no service.
"""

from __future__ import annotations

from typing import Any

import pytest

from fanout import RouteError
from fanout.contract.dead_letters import DeadLetter
from fanout.routes.evaluate import data_error, evaluate, explain_failure
from fanout.routes.rejects import CheckedRoute, check_route, isolate
from fanout.routes.route import Route

N = 1000
BAD_AMOUNT = {3: "abc", 999: "1e"}  # fail the where
BAD_QTY = {500: "x7"}  # passes the where, fails the select
ROUTE = Route(
    where="CAST(amount AS INT) >= 0",
    select=("id", "CAST(qty AS INT) AS qty", "upper(note) AS note"),
)
CAST = '[CAST_INVALID_INPUT] The value \'{value}\' of the type "STRING" cannot be cast to "INT"'


def _rows() -> list[dict[str, Any]]:
    return [
        {
            "id": i,
            "amount": BAD_AMOUNT.get(i, str(i)),
            "qty": BAD_QTY.get(i, str(i % 10)),
            "note": f"n{i}",
        }
        for i in range(N)
    ]


@pytest.fixture
def batch(spark: Any) -> Any:
    return spark.createDataFrame(_rows(), "id LONG, amount STRING, qty STRING, note STRING")


def test_ansi_mode_is_on_and_a_malformed_cast_fails_the_route(spark: Any, batch: Any) -> None:
    assert spark.conf.get("spark.sql.ansi.enabled") == "true"  # Spark 4's default
    with pytest.raises(Exception) as caught:
        evaluate(ROUTE.apply(batch))
    cause = data_error(caught.value)
    assert cause is not None and cause.getCondition() == "CAST_INVALID_INPUT"  # type: ignore[attr-defined]


def test_isolate_finds_exactly_the_failing_rows_with_reason_column_and_value(batch: Any) -> None:
    found = isolate(batch, ROUTE, sink="s", batch_id=4)

    rows = {r["id"]: r for r in _rows()}
    letters = [(dict(d.row), d.column, d.value) for d in found.letters]
    assert letters == [(rows[3], None, "abc"), (rows[500], "qty", "x7"), (rows[999], None, "1e")]
    where = "route where 'CAST(amount AS INT) >= 0' failed: "
    select = "route select 'CAST(qty AS INT) AS qty' failed: "
    reasons = [d.reason for d in found.letters]
    assert reasons[0].startswith(where + CAST.format(value="abc"))
    assert reasons[1].startswith(select + CAST.format(value="x7"))
    assert reasons[2].startswith(where + CAST.format(value="1e"))
    assert all(r.endswith("SQLSTATE: 22018") for r in reasons)  # the first line only
    assert found.first is not None and found.first.kind == "where"

    good = sorted(found.good.collect(), key=lambda r: r["id"])
    assert [r.asDict() for r in good] == [
        {"id": i, "qty": i % 10, "note": f"N{i}"} for i in range(N) if i not in (3, 500, 999)
    ]
    # bisection, not one evaluation per row: about 2 k log2(n / k) plus the rows' own
    assert found.evaluations <= 50  # 44 to bisect, 5 to name the expressions


def test_more_failing_rows_than_the_limit_fail_naming_sink_batch_and_expression(
    batch: Any,
) -> None:
    with pytest.raises(RouteError) as caught:
        isolate(batch, ROUTE, sink="s", batch_id=4, reject_limit=2)
    error = caught.value
    assert (error.sink, error.batch_id, error.kind) == ("s", 4, "where")
    assert error.expression == "CAST(amount AS INT) >= 0"
    assert str(error).startswith(
        "sink 's', batch 4: route where 'CAST(amount AS INT) >= 0' failed: "
        + CAST.format(value="abc")
    )
    assert "more than 2 of the batch's 1000 rows fail the route" in str(error)
    assert data_error(error.__cause__) is not None


def test_too_many_evaluations_fail_the_same_way(batch: Any) -> None:
    with pytest.raises(RouteError) as caught:
        isolate(batch, ROUTE, sink="s", batch_id=4, evaluation_limit=5)
    assert "isolating the rows failing the route took more than 5 evaluations" in str(caught.value)


def test_check_route_hands_out_the_good_rows_and_the_letters(batch: Any) -> None:
    checked = check_route(batch, ROUTE, arrow=True, dataframe=True, sink="s", batch_id=4)
    try:
        assert checked.error is None
        assert [d.row["id"] for d in checked.letters] == [3, 500, 999]
        assert checked.arrow is not None
        assert checked.arrow.get().num_rows == checked.df.count() == N - 3
        assert len(checked.cached) == 1  # DataFrame readers read the cached good rows
        blocked = checked.blocked("other", 4, dead_letters=False)
        assert isinstance(blocked, RouteError)  # a sink without a target: fails unwritten
        assert str(blocked).startswith(
            "sink 'other', batch 4: route where 'CAST(amount AS INT) >= 0' failed: "
        )
        assert "the sink has no dead-letter target" in str(blocked)
        assert checked.blocked("s", 4, dead_letters=True) is None
    finally:
        checked.release()
    assert checked.cached == []


def test_a_clean_route_is_evaluated_once_and_cached(spark: Any) -> None:
    df = spark.createDataFrame([(1, "5"), (2, "6")], "id LONG, amount STRING")
    checked = check_route(
        df, Route(where="CAST(amount AS INT) > 5"), arrow=False, dataframe=True, sink="s",
        batch_id=0,
    )  # fmt: skip
    try:
        assert (checked.error, checked.letters) == (None, ())
        assert checked.df.is_cached
        assert [r["id"] for r in checked.df.collect()] == [2]
    finally:
        checked.release()
    assert not checked.df.is_cached


def test_an_error_no_row_causes_on_its_own_is_raised_as_it_was(
    batch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transient failure: the first evaluation fails, the bisection finds no row."""
    import fanout.routes.rejects as module

    with pytest.raises(Exception) as spark_error:
        evaluate(ROUTE.apply(batch))
    clean = Route(where="id >= 0")
    real = module._materialized
    calls = []

    def flaky(route: Route, routed: Any, **kw: Any) -> CheckedRoute:
        calls.append(route)
        if len(calls) == 1:
            raise spark_error.value
        return real(route, routed, **kw)

    monkeypatch.setattr(module, "_materialized", flaky)
    checked = check_route(batch, clean, arrow=True, dataframe=False, sink="s", batch_id=4)
    assert checked.error is spark_error.value
    assert checked.letters == ()


def test_errors_that_are_not_a_rows_fault_are_not_isolated(spark: Any) -> None:
    df = spark.createDataFrame([(1,)], "id LONG")
    checked = check_route(
        df, Route(where="raise_error('boom') IS NULL"), arrow=True, dataframe=False, sink="s",
        batch_id=0,
    )  # fmt: skip
    assert checked.error is not None and "boom" in str(checked.error)
    assert data_error(checked.error) is None
    assert checked.letters == ()


def test_explain_names_the_expression_for_a_sink_without_a_target(batch: Any) -> None:
    with pytest.raises(Exception) as caught:
        ROUTE.apply(batch).toArrow()
    explained = explain_failure(batch, ROUTE, caught.value, sink="pg", batch_id=9)
    assert isinstance(explained, RouteError)
    assert explained.__cause__ is caught.value
    assert (explained.kind, explained.expression) == ("where", "CAST(amount AS INT) >= 0")
    text = str(explained)  # whichever failing row Spark's parallel tasks meet first:
    assert any(
        text.startswith(
            "sink 'pg', batch 9: route where 'CAST(amount AS INT) >= 0' failed: "
            + CAST.format(value=value)
        )
        for value in BAD_AMOUNT.values()
    ), text
    assert explain_failure(batch, ROUTE, RuntimeError("other"), sink="pg", batch_id=9) is None


def test_values_of_many_types_survive_the_round_trip(spark: Any) -> None:
    """The good rows are rebuilt from the collected Arrow table with the batch schema."""
    schema = "id LONG, at TIMESTAMP, day DATE, price DECIMAL(10,2), tags ARRAY<STRING>, raw STRING"
    df = spark.sql(
        "SELECT id, TIMESTAMP'2026-01-02 03:04:05' AS at, DATE'2026-01-02' AS day, "
        "CAST(1.25 AS DECIMAL(10,2)) AS price, array('a', 'b') AS tags, "
        "CASE WHEN id = 2 THEN 'bad' ELSE CAST(id AS STRING) END AS raw FROM range(4)"
    )
    assert df.schema.simpleString() == spark.createDataFrame([], schema).schema.simpleString()
    found = isolate(df, Route(where="CAST(raw AS INT) >= 0"), sink="s", batch_id=0)
    assert [d.row["id"] for d in found.letters] == [2]
    assert isinstance(found.letters[0], DeadLetter)
    good = sorted(found.good.collect(), key=lambda r: r["id"])
    original = sorted(df.where("id != 2").collect(), key=lambda r: r["id"])
    assert good == original
