"""Rows the target refuses: a null key, a value too long for varchar(n), a value of the
wrong type. Without a dead-letter target the batch fails naming sink, batch, column and
value; with one, those rows are recorded there and every other row lands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fanout_postgres import PostgresSink
from pgcheck import execute, query

from fanout.contract.batch import Batch, BatchInfo
from fanout.deadletters.delta import DeltaDeadLetters
from fanout.delta_tables.io import read_delta
from fanout.errors import SinkWriteError
from fanout.testing import open_sink

DDL = "CREATE TABLE items (id bigint PRIMARY KEY, name varchar(5), qty integer)"
SCHEMA = "id LONG, name STRING, qty STRING"  # qty arrives as text, PostgreSQL parses it
GOOD = [(1, "ok", "10"), (2, "fine", "20"), (3, "x", None), (4, "abcde", "40")]
BAD = {
    "null key": ((None, "nokey", "5"), "id", "null", 'null value in column "id"'),
    "too long": ((5, "toolong", "50"), "name", "'toolong'", "value too long for type"),
    "wrong type": ((6, "typ", "12x"), "qty", "'12x'", "invalid input syntax for type integer"),
}


def _batch(spark: Any, rows: list[tuple[Any, ...]], batch_id: int) -> Batch:
    df = spark.createDataFrame(rows, SCHEMA)
    return Batch(df, BatchInfo("bad", batch_id, "q"), "pg", "fanout/bad/pg")


def _sink(url: str, **options: Any) -> PostgresSink:
    return open_sink(PostgresSink("pg", url=url, table="items", partitions=2, **options), "bad")


def _items(url: str) -> list[tuple[Any, ...]]:
    return query(url, "SELECT id, name, qty FROM items ORDER BY id")


GOOD_IN_TABLE = [(1, "ok", 10), (2, "fine", 20), (3, "x", None), (4, "abcde", 40)]


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_refused_row_fails_the_batch_naming_sink_batch_column_and_value(
    spark: Any, pg_url: str, case: str
) -> None:
    execute(pg_url, DDL)
    bad_row, column, shown, reason = BAD[case]
    sink = _sink(pg_url)
    with pytest.raises(SinkWriteError) as caught:
        sink.write(_batch(spark, [bad_row], 7))
    text = str(caught.value)
    assert text.startswith("sink 'pg', batch 7: table items, column ")
    assert f"column {column!r}, value {shown}" in text
    assert reason in text
    assert json.dumps(bad_row[1]) in text  # the row itself is shown
    assert _items(pg_url) == []


def test_refused_rows_go_to_a_postgres_dead_letter_table(spark: Any, pg_url: str) -> None:
    execute(pg_url, DDL)
    sink = _sink(pg_url, dead_letter="postgres:rejects")
    rows = GOOD + [bad for bad, *_ in BAD.values()]
    result = sink.write(_batch(spark, rows, 3))
    assert _items(pg_url) == GOOD_IN_TABLE
    assert (result.rows, result.dead_lettered) == (4, 3)
    dead = query(
        pg_url,
        "SELECT pipeline, sink, batch_id, column_name, value, row->>'name', "
        "reason FROM rejects ORDER BY column_name",
    )
    assert [d[:6] for d in dead] == [
        ("bad", "pg", 3, "id", None, "nokey"),
        ("bad", "pg", 3, "name", "toolong", "toolong"),
        ("bad", "pg", 3, "qty", "12x", "typ"),
    ]
    assert [r for *_, r in dead] == [
        'null value in column "id" violates not-null constraint',
        "value too long for type VARCHAR(5)",
        'invalid input syntax for type integer: "12x"',
    ]
    # a replay of the batch replaces its dead letters, never duplicates them
    sink.write(_batch(spark, rows, 3))
    assert query(pg_url, "SELECT count(*) FROM rejects") == [(3,)]
    assert _items(pg_url) == GOOD_IN_TABLE


class _DeltaDown(PostgresSink):
    """Fails writing the Delta dead letters, as if the driver died right there."""

    def write(self, batch: Batch) -> Any:
        real = DeltaDeadLetters.write
        DeltaDeadLetters.write = _boom  # type: ignore[method-assign]
        try:
            return super().write(batch)
        finally:
            DeltaDeadLetters.write = real  # type: ignore[method-assign]


def _boom(*args: Any, **kwargs: Any) -> int:
    raise RuntimeError("driver died before the dead letters were written")


@pytest.mark.parametrize("mode", ["upsert", "append"])
def test_refused_rows_go_to_a_delta_dead_letter_table_once(
    spark: Any, pg_url: str, tmp_path: Path, mode: str
) -> None:
    execute(pg_url, DDL)
    path = str(tmp_path / "rejects")
    rows = GOOD + [bad for bad, *_ in BAD.values()]
    crashed = _DeltaDown("pg", url=pg_url, table="items", partitions=2, mode=mode, dead_letter=path)
    open_sink(crashed, "bad")
    with pytest.raises(RuntimeError):
        crashed.write(_batch(spark, rows, 5))
    assert _items(pg_url) == GOOD_IN_TABLE  # the partitions committed, the rejects are pending

    sink = _sink(pg_url, mode=mode, dead_letter=path)
    result = sink.write(_batch(spark, rows, 5))  # the replay
    sink.write(_batch(spark, rows, 5))  # and once more: already recorded
    assert result.dead_lettered == 3
    if mode == "append":
        assert result.details["skipped_partitions"] == [0, 1]
    dead = read_delta(path).sort_by("column").to_pylist()
    assert [(d["sink"], d["batch_id"], d["column"], d["value"]) for d in dead] == [
        ("pg", 5, "id", None),
        ("pg", 5, "name", json.dumps("toolong")),
        ("pg", 5, "qty", json.dumps("12x")),
    ]
    assert {(d["source"], json.loads(d["details"])["target"]) for d in dead} == {
        ("refused", "items")
    }
    assert [json.loads(d["row"]) for d in dead] == [
        {"id": None, "name": "nokey", "qty": "5"},
        {"id": 5, "name": "toolong", "qty": "50"},
        {"id": 6, "name": "typ", "qty": "12x"},
    ]
    assert _items(pg_url) == GOOD_IN_TABLE


def test_a_foreign_key_violation_is_isolated_by_bisection(spark: Any, pg_url: str) -> None:
    execute(
        pg_url,
        "CREATE TABLE parents (id bigint PRIMARY KEY)",
        "INSERT INTO parents SELECT generate_series(1, 100)",
        "CREATE TABLE items (id bigint PRIMARY KEY, name varchar(5), "
        "qty integer REFERENCES parents (id))",
    )
    sink = _sink(pg_url, dead_letter="postgres:rejects")
    rows = [(i, f"n{i}", str(i if i != 37 else 999)) for i in range(1, 61)]
    result = sink.write(_batch(spark, rows, 1))
    assert result.dead_lettered == 1
    assert query(pg_url, "SELECT count(*), sum(id) FROM items") == [(59, sum(range(1, 61)) - 37)]
    dead = query(pg_url, "SELECT row->>'id', reason FROM rejects")
    assert dead == [
        (
            "37",
            'insert or update on table "items" violates foreign key constraint '
            '"items_qty_fkey" (Key (qty)=(999) is not present in table '
            '"parents".)',
        )
    ]


def test_a_refused_decimal_is_shown_as_its_number_not_a_json_string(
    spark: Any, pg_url: str
) -> None:
    """A decimal over the column's precision was named ``value '"123.45"'`` (its JSON
    text, quotes included) in the error, and kept so in a dead-letter table's ``value``,
    where an integer's is ``12``: now ``'123.45'``, its text as Spark prints it."""
    from decimal import Decimal

    execute(pg_url, "CREATE TABLE prices (id bigint PRIMARY KEY, amount numeric(4, 2))")
    df = spark.createDataFrame(
        [(1, Decimal("12.50")), (2, Decimal("123.45"))], "id LONG, amount DECIMAL(10, 2)"
    )
    batch = Batch(df, BatchInfo("bad", 4, "q"), "pg", "fanout/bad/pg")
    sink = open_sink(PostgresSink("pg", url=pg_url, table="prices", partitions=1), "bad")
    with pytest.raises(SinkWriteError) as caught:
        sink.write(batch)
    assert str(caught.value).startswith(
        "sink 'pg', batch 4: table prices, column 'amount', value '123.45': numeric field overflow"
    )
    assert '{"id": 2, "amount": "123.45"}' in str(caught.value)  # the row, as JSON
    lettered = PostgresSink(
        "pg", url=pg_url, table="prices", partitions=1, dead_letter="postgres:rejects"
    )
    result = open_sink(lettered, "bad").write(batch)
    assert (result.rows, result.dead_lettered) == (1, 1)
    assert query(pg_url, "SELECT id, amount FROM prices") == [(1, Decimal("12.50"))]
    assert query(pg_url, "SELECT batch_id, column_name, value FROM rejects") == [
        (4, "amount", "123.45")
    ]
