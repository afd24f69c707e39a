"""The SQL of the write path and the executor's encoding, without a server."""

from __future__ import annotations

import pytest

pytest.importorskip("fanout_postgres")

import pyarrow as pa
import sqlalchemy as sa
from fanout_postgres.encode import Check, precheck, to_csv
from fanout_postgres.identifiers import TableName, quote
from fanout_postgres.statements import build_statements
from fanout_postgres.types import COMPATIBLE, spark_kind, target_kind

ODD = TableName('Orders "2026"; drop table x', "s%1")


def _statements(**overrides: object) -> object:
    options: dict = {
        "target": ODD,
        "columns": [("Id", sa.BigInteger()), ("v", sa.Integer()), ("n", sa.String(5))],
        "keys": ["Id"],
        "order_by": ["v"],
        "upsert": True,
        "state_schema": "fanout",
        "dead_letter": None,
    }
    options.update(overrides)
    return build_statements(**options)  # type: ignore[arg-type]


def test_ties_on_order_by_sort_json_and_unknown_types_as_text() -> None:
    from sqlalchemy.dialects import postgresql as pg

    columns = [("Id", sa.BigInteger()), ("v", sa.Integer()), ("doc", pg.JSON()),
               ("shape", sa.types.NullType()), ("tags", pg.JSONB())]  # fmt: skip
    sql = _statements(columns=columns).write_from_stage  # type: ignore[attr-defined]
    assert (
        "pg_temp.fanout_stage.v DESC NULLS LAST, "
        "CAST(pg_temp.fanout_stage.doc AS TEXT) DESC NULLS LAST, "
        "CAST(pg_temp.fanout_stage.shape AS TEXT) DESC NULLS LAST, "
        "pg_temp.fanout_stage.tags DESC NULLS LAST, "
        # then the text of jsonb, whose = compares numbers as numeric ({"a": 1.0} = {"a": 1.00})
        'CAST(pg_temp.fanout_stage.tags AS TEXT) COLLATE "C" DESC NULLS LAST, '
        "pg_temp.fanout_stage.__fanout_row DESC" in sql
    )


def test_the_upsert_statement() -> None:
    sql = _statements().write_from_stage  # type: ignore[attr-defined]
    assert sql.startswith('INSERT INTO "s%%1"."Orders ""2026""; drop table x" ("Id", v, n) ')
    assert 'SELECT DISTINCT ON (pg_temp.fanout_stage."Id")' in sql
    assert (
        'ORDER BY pg_temp.fanout_stage."Id", pg_temp.fanout_stage.v DESC NULLS LAST, '
        "pg_temp.fanout_stage.n DESC NULLS LAST, pg_temp.fanout_stage.__fanout_row DESC" in sql
    )  # ties on order_by go to the other columns' greatest values, never to arrival order
    assert 'ON CONFLICT ("Id") DO UPDATE SET v = excluded.v, n = excluded.n WHERE ' in sql
    assert sql.endswith(
        '("s%%1"."Orders ""2026""; drop table x".v, "s%%1"."Orders ""2026""; drop table x".n) '
        "IS DISTINCT FROM (excluded.v, excluded.n)"
    )
    assert "WHERE w.__fanout_row BETWEEN %(lo)s AND %(hi)s" in sql


def test_copy_statements_quote_without_doubling_percent_signs() -> None:
    statements = _statements()
    assert statements.copy_target == (  # type: ignore[attr-defined]
        'COPY "s%1"."Orders ""2026""; drop table x" ("Id", v, n) FROM STDIN WITH (FORMAT csv)'
    )
    assert statements.copy_stage == (  # type: ignore[attr-defined]
        'COPY pg_temp.fanout_stage ("Id", v, n, __fanout_row) FROM STDIN WITH (FORMAT csv)'
    )


def test_without_order_by_no_dedupe_and_only_keys_means_do_nothing() -> None:
    plain = _statements(order_by=[]).write_from_stage  # type: ignore[attr-defined]
    assert "DISTINCT ON" not in plain
    keys_only = _statements(columns=[("Id", sa.BigInteger())], order_by=[]).write_from_stage  # type: ignore[attr-defined]
    assert keys_only.endswith('ON CONFLICT ("Id") DO NOTHING')
    append = _statements(upsert=False, order_by=[]).write_from_stage  # type: ignore[attr-defined]
    assert "ON CONFLICT" not in append


def test_identifiers_are_only_ever_quoted() -> None:
    assert quote("orders") == "orders"
    assert quote('x"; drop table y; --') == '"x""; drop table y; --"'
    assert quote("Select") == '"Select"'


def test_prechecks_find_null_keys_and_values_too_long() -> None:
    table = pa.table({"id": [1, None, 3, 4], "name": ["ok", "x", "toolong", "abcde   "]})
    checks = [Check("id", True, None, "bigint"), Check("name", False, 5, "varchar(5)")]
    found = [(r.row, r.column, r.sqlstate) for r in precheck(table, checks)]
    assert found == [(1, "id", "23502"), (2, "name", "22001")]  # trailing spaces: PG trims


def test_csv_for_copy_keeps_nulls_empty_strings_and_odd_text_apart() -> None:
    table = pa.table({"s": ["a,b", "", None, 'q"\nz'], "b": [b"\x00\xff", None, b"", b"A"]})
    assert to_csv(table) == b'"a,b","\\x00ff"\n"",\n,"\\x"\n"q""\nz","\\x41"\n'


def test_type_compatibility() -> None:
    from pyspark.sql import types as T
    from sqlalchemy.dialects import postgresql as pg

    assert (
        spark_kind(T.LongType()) == "int" and spark_kind(T.ArrayType(T.IntegerType())) == "nested"
    )
    assert target_kind(sa.Integer()) == "int" and target_kind(pg.UUID()) == "other"
    assert target_kind(pg.JSONB()) == "json" and target_kind(sa.String(5)) == "text"
    assert "string" in COMPATIBLE["other"] and "int" not in COMPATIBLE["bool"]
    assert "float" not in COMPATIBLE["int"] and "nested" in COMPATIBLE["json"]


def test_a_dead_letter_s_timestamp_or_date_value_is_iso_8601_an_instant_in_utc() -> None:
    import datetime as dt

    from fanout_postgres.encode import row_json, value_text

    at = dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC)
    table = pa.table(
        {
            # an instant in the Spark session's zone, as Arrow carries it
            "at": pa.array([at], pa.timestamp("us", tz="UTC")).cast(
                pa.timestamp("us", tz="Asia/Kolkata")
            ),
            "ntz": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5)], pa.timestamp("us")),
            "day": pa.array([dt.date(2024, 1, 2)], pa.date32()),
        }
    )
    assert [value_text(table, 0, c) for c in ("at", "ntz", "day")] == [
        "2024-01-02T03:04:05.123456+00:00",
        "2024-01-02T03:04:05",
        "2024-01-02",
    ]
    assert row_json(table, 0, {}) == (
        '{"at": "2024-01-02T03:04:05.123456+00:00", "ntz": "2024-01-02T03:04:05", '
        '"day": "2024-01-02"}'
    )


def test_a_route_letter_s_row_writes_timestamps_as_iso_8601_an_instant_in_utc() -> None:
    import datetime as dt
    from zoneinfo import ZoneInfo

    from fanout_postgres.deadletter import _jsonable

    # a route's refused row as Arrow's to_pylist gives it: instants in the session's zone
    at = dt.datetime(2024, 1, 2, 8, 34, 5, 123456, tzinfo=ZoneInfo("Asia/Kolkata"))
    row = {"at": at, "s": {"at": at, "day": dt.date(2024, 1, 2)}, "a": [at.replace(tzinfo=None)]}
    assert _jsonable(row) == {
        "at": "2024-01-02T03:04:05.123456+00:00",
        "s": {"at": "2024-01-02T03:04:05.123456+00:00", "day": "2024-01-02"},
        "a": ["2024-01-02T08:34:05.123456"],
    }
