"""Upsert with ``order_by``: a key's winner is chosen among all the batch's rows of the key,
refused or not, whichever check refuses it (the executor's NOT NULL and varchar(n)
checks, the staging COPY, or the server's CHECK and foreign key at the INSERT).

A refused winner is dead-lettered (or fails the batch) and its key keeps its value in the
table: the older rows of the key in the batch are superseded by it, neither written nor
dead-lettered. A refused row that loses to a newer valid row is superseded too: the
valid row is written and nothing is dead-lettered.
"""

from __future__ import annotations

from typing import Any

import pytest
from fanout_postgres import PostgresSink
from pgcheck import execute, query

from fanout.contract.batch import Batch, BatchInfo
from fanout.errors import SinkWriteError
from fanout.testing import open_sink

DDL = (
    "CREATE TABLE parents (id integer PRIMARY KEY)",
    "INSERT INTO parents SELECT generate_series(1, 100)",
    "CREATE TABLE items (id bigint PRIMARY KEY, name varchar(5) NOT NULL, "
    "qty integer CHECK (qty >= 0), parent integer REFERENCES parents (id), version bigint)",
)
SCHEMA = "id LONG, name STRING, qty STRING, parent INT, version LONG"  # qty parsed by COPY
BEFORE = (1, "old", 1, 1, 0)
"""Key 1's row in the table before the batch."""
# kind -> (the refused row of key 1 at a given version, refused column and value as
# recorded, the reason)
REFUSED: dict[str, tuple[Any, str, str | None, str]] = {
    "not null": (lambda v: (1, None, "3", 3, v), "name", None, "violates not-null constraint"),
    "too long": (lambda v: (1, "toolong", "3", 3, v), "name", "toolong", "value too long"),
    "not an integer": (lambda v: (1, "nan", "x", 3, v), "qty", "x", "invalid input syntax"),
    "check": (lambda v: (1, "neg", "-1", 3, v), "qty", "-1", 'check constraint "items_qty_check"'),
    "foreign key": (lambda v: (1, "fk", "3", 999, v), "parent", "999", "items_parent_fkey"),
}
OTHERS = [(2, "two", "5", 5, 1), (3, "three", "6", 6, 1), (3, "tri", "7", 7, 2)]
"""Rows of other keys, written whatever happens to key 1."""
OTHERS_IN_TABLE = [(2, "two", 5, 5, 1), (3, "tri", 7, 7, 2)]


def _sink(url: str, **options: Any) -> PostgresSink:
    sink = PostgresSink("pg", url=url, table="items", order_by="version", partitions=1, **options)
    return open_sink(sink, "refused")


def _write(spark: Any, sink: PostgresSink, rows: list[tuple[Any, ...]], batch_id: int) -> Any:
    df = spark.createDataFrame(rows, SCHEMA).coalesce(1)
    return sink.write(Batch(df, BatchInfo("refused", batch_id, "q"), "pg", "fanout/refused/pg"))


def _items(url: str) -> list[tuple[Any, ...]]:
    return query(url, "SELECT id, name, qty, parent, version FROM items ORDER BY id")


def _letters(url: str) -> list[tuple[Any, ...]]:
    return query(
        url,
        "SELECT sink, batch_id, column_name, value, row, reason FROM rejects "
        "ORDER BY batch_id, row->>'version'",
    )


def _as_letter(row: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip(["id", "name", "qty", "parent", "version"], row, strict=True))


@pytest.mark.parametrize("held", [True, False], ids=["key in table", "new key"])
@pytest.mark.parametrize("kind", list(REFUSED))
def test_a_refused_newest_row_keeps_its_key_as_it_was(
    spark: Any, pg_url: str, kind: str, held: bool
) -> None:
    """The newer refused row wins key 1: the older valid row is not written, key 1 keeps
    its value (or stays absent: a new key takes the direct COPY first), and the dead
    letters hold exactly the refused row."""
    execute(pg_url, *DDL)
    if held:
        execute(pg_url, "INSERT INTO items VALUES (1, 'old', 1, 1, 0)")
    make, column, value, reason = REFUSED[kind]
    older, newer = (1, "new", "2", 2, 1), make(2)
    sink = _sink(pg_url, dead_letter="postgres:rejects")
    # the refused row arrives first and last: the winner never depends on arrival order
    for batch_id, rows in enumerate([[newer, older, *OTHERS], [*OTHERS, older, newer]]):
        result = _write(spark, sink, rows, batch_id)
        assert _items(pg_url) == ([BEFORE] if held else []) + OTHERS_IN_TABLE
        letters = [letter for letter in _letters(pg_url) if letter[1] == batch_id]
        assert [letter[:5] for letter in letters] == [
            ("pg", batch_id, column, value, _as_letter(newer))
        ]
        assert reason in letters[0][5]
        assert (result.rows, result.dead_lettered) == (4, 1)


@pytest.mark.parametrize("kind", list(REFUSED))
def test_without_dead_letters_the_batch_fails_naming_the_refused_winner(
    spark: Any, pg_url: str, kind: str
) -> None:
    execute(pg_url, *DDL, "INSERT INTO items VALUES (1, 'old', 1, 1, 0)")
    make, column, value, reason = REFUSED[kind]
    with pytest.raises(SinkWriteError) as caught:
        _write(spark, _sink(pg_url), [(1, "new", "2", 2, 1), make(2), *OTHERS], 4)
    text = str(caught.value)
    shown = "null" if value is None else repr(value)
    assert text.startswith(f"sink 'pg', batch 4: table items, column {column!r}, value {shown}")
    assert reason in text
    assert '"version": 2' in text  # the row named is the newer one
    assert _items(pg_url) == [BEFORE]


@pytest.mark.parametrize("dead_letter", [True, False], ids=["dead letters", "none"])
@pytest.mark.parametrize("kind", list(REFUSED))
def test_a_refused_row_superseded_by_a_newer_valid_row_is_not_dead_lettered(
    spark: Any, pg_url: str, kind: str, dead_letter: bool
) -> None:
    """The newer valid row wins key 1 and is written; the older refused row would never
    have been written: it is neither dead-lettered nor failing the batch."""
    execute(pg_url, *DDL, "INSERT INTO items VALUES (1, 'old', 1, 1, 0)")
    make = REFUSED[kind][0]
    options = {"dead_letter": "postgres:rejects"} if dead_letter else {}
    sink = _sink(pg_url, **options)
    result = _write(spark, sink, [make(1), (1, "new", "2", 2, 2), *OTHERS], 5)
    assert _items(pg_url) == [(1, "new", 2, 2, 2), *OTHERS_IN_TABLE]
    assert (result.rows, result.dead_lettered) == (5, 0)
    if dead_letter:
        assert _letters(pg_url) == []


def test_refused_rows_of_one_key_only_the_winner_is_dead_lettered(spark: Any, pg_url: str) -> None:
    """Three refused rows of key 1, refused by three different checks: the newest is the
    one dead letter, the others are superseded by it; the valid oldest row is not written."""
    execute(pg_url, *DDL, "INSERT INTO items VALUES (1, 'old', 1, 1, 0)")
    rows = [(1, "new", "2", 2, 1), REFUSED["foreign key"][0](2), REFUSED["not null"][0](3)]
    rows += [REFUSED["not an integer"][0](4), *OTHERS]
    result = _write(spark, _sink(pg_url, dead_letter="postgres:rejects"), rows, 6)
    assert _items(pg_url) == [BEFORE, *OTHERS_IN_TABLE]
    assert [letter[:5] for letter in _letters(pg_url)] == [
        ("pg", 6, "qty", "x", _as_letter(rows[3]))
    ]
    assert (result.rows, result.dead_lettered) == (6, 1)


@pytest.mark.parametrize("kind", ["not null", "too long", "not an integer"])
def test_without_order_by_a_refused_row_still_makes_its_key_occur_twice(
    spark: Any, pg_url: str, kind: str
) -> None:
    """Without ``order_by`` no row of a key outranks another: a batch holding a key twice
    fails naming the key, also when one of the two rows is refused before the INSERT (it
    used to be set aside, and the other row written as if it were the key's only one)."""
    execute(pg_url, *DDL, "INSERT INTO items VALUES (1, 'old', 1, 1, 0)")
    options = {"partitions": 1, "dead_letter": "postgres:rejects"}
    sink = open_sink(PostgresSink("pg", url=pg_url, table="items", **options), "refused")
    refused = REFUSED[kind][0](2)
    with pytest.raises(SinkWriteError) as failed:
        _write(spark, sink, [(1, "new", "2", 2, 1), refused, (2, "two", "5", 5, 1)], 0)

    assert "key {\"id\": 1} occurs 2 times in this batch; set option 'order_by'" in str(
        failed.value
    )
    assert _items(pg_url) == [BEFORE]
    assert _letters(pg_url) == []
    # the same refused row on a key of its own: dead-lettered, the rest written
    alone = (4, *refused[1:])
    result = _write(spark, sink, [(1, "new", "2", 2, 1), alone, (2, "two", "5", 5, 1)], 1)
    assert (result.rows, result.dead_lettered) == (2, 1)  # rows: those written
    assert _items(pg_url) == [(1, "new", 2, 2, 1), (2, "two", 5, 5, 1)]
    assert [(r[1], r[2], r[4]["id"]) for r in _letters(pg_url)] == [(1, REFUSED[kind][1], 4)]
