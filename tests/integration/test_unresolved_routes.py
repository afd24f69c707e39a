"""A route Spark cannot resolve fails its sink as a RouteError naming sink, batch and
expression, recorded in the ledger like any failed attempt, before anything is written;
the other sinks commit (issue 14, item 4)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from fanout import BatchFailedError, FanOut, RouteError
from fanout.contract.batch import BatchInfo
from fanout.delta_tables.io import read_delta
from tests.integration.streams import delta_rows


@pytest.mark.parametrize(
    ("route", "kind", "expression"),
    [
        ({"where": "stauts = 'paid'"}, "where", "stauts = 'paid'"),
        ({"select": ["order_id", "amout * 100 AS cents"]}, "select", "amout * 100 AS cents"),
    ],
)
def test_an_unresolvable_route_is_a_route_error_in_the_ledger(
    spark: Any, tmp_path: Path, route: dict[str, Any], kind: str, expression: str
) -> None:
    df = spark.createDataFrame(
        [(1, "paid", 2.5), (2, "open", 1.0)], "order_id LONG, status STRING, amount DOUBLE"
    )
    sinks = [
        {"type": "delta", "name": "bronze", "path": str(tmp_path / "bronze")},
        {"type": "delta", "name": "paid", "path": str(tmp_path / "paid"), **route},
    ]
    fan = FanOut("routes", str(tmp_path / "ledger"), sinks, retries=0, spark=spark)
    with pytest.raises(BatchFailedError) as info:
        fan.process(df, BatchInfo("routes", 0, "q"))
    error = info.value.failures["paid"]
    assert isinstance(error, RouteError)
    assert (error.kind, error.expression) == (kind, expression)
    message = str(error)
    assert message.startswith(
        f"sink 'paid', batch 0: route {kind} {expression!r} cannot be applied to the batch: "
    )
    assert "UNRESOLVED_COLUMN" in message and len(message.splitlines()) == 1
    assert sorted(r["order_id"] for r in delta_rows(tmp_path / "bronze")) == [1, 2]
    assert not (tmp_path / "paid").exists()
    ledger = read_delta(str(tmp_path / "ledger")).to_pylist()
    failed = [(r["sink"], r["batch_id"], r["status"]) for r in ledger if r["status"] == "failed"]
    assert failed == [("paid", 0, "failed")]
    (row,) = [r for r in ledger if r["status"] == "failed"]
    assert f"route {kind} {expression!r} cannot be applied" in row["error"]


def test_without_a_session_a_route_is_said_to_be_unchecked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fanout.dispatch.opening

    monkeypatch.setattr(fanout.dispatch.opening, "active_spark", lambda: None)
    sinks = [{"type": "delta", "name": "paid", "path": str(tmp_path / "p"), "where": "x >"}]
    with caplog.at_level(logging.WARNING, logger="fanout"):
        FanOut("nosession", str(tmp_path / "ledger"), sinks)
    assert any(
        "no active SparkSession, so its route" in r.getMessage() and "'x >'" in r.getMessage()
        for r in caplog.records
    )


def test_with_a_session_a_route_that_does_not_parse_fails_at_construction(
    spark: Any, tmp_path: Path
) -> None:
    from fanout import ConfigurationError

    sinks = [{"type": "delta", "name": "paid", "path": str(tmp_path / "p"), "where": "x >"}]
    with pytest.raises(
        ConfigurationError, match="sink 'paid': where expression 'x >' does not parse"
    ):
        FanOut("parse", str(tmp_path / "ledger"), sinks, spark=spark)
