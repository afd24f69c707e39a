"""Upsert keys PostgreSQL calls equal meet in one partition (``fanout_postgres.keyhash``).

A ``citext`` key ``Bob@x.com`` and ``bob@x.com`` is one key to PostgreSQL; hashed by
Spark's equality, the two rows went to two partitions, two transactions, and the one
committing last won whatever ``order_by`` said. Now such keys are hashed on a fold of their
values, and a key type no fold covers is refused unless the sink writes one partition.
"""

from __future__ import annotations

import itertools
from datetime import date, datetime
from typing import Any

import pytest
from fanout_postgres import PostgresSink
from pgcheck import execute, query

from fanout.contract.batch import Batch, BatchInfo
from fanout.contract.sink import SinkContext
from fanout.errors import SchemaMismatchError

KEYS = 24  # keys of three spellings each: the old hashing split nearly every one


def _upsert(spark: Any, url: str, table: str, rows: list[tuple[Any, ...]], schema: str,
            partitions: int = 8) -> None:  # fmt: skip
    sink = PostgresSink("pg", url=url, table=table, order_by="seq", partitions=partitions)
    sink.open(SinkContext("keys"))
    df = spark.createDataFrame(rows, schema).repartition(3)
    sink.write(Batch(df, BatchInfo("keys", 0, "q"), "pg", "fanout/keys/pg"))


def _spellings(rows: list[tuple[str, str, str]]) -> list[tuple[str, int]]:
    """Three spellings of each key; the middle one has the greatest ``seq`` and wins."""
    out: list[tuple[str, int]] = []
    for n, (first, winner, last) in enumerate(rows):
        out += [(first, 3 * n + 1), (winner, 3 * n + 3), (last, 3 * n + 2)]
    return out


def test_citext_keys_of_any_case_meet_and_order_by_picks_the_row(spark: Any, pg_url: str) -> None:
    execute(
        pg_url,
        "CREATE EXTENSION IF NOT EXISTS citext",
        "CREATE TABLE users_ci (email citext PRIMARY KEY, seq bigint NOT NULL)",
    )
    words = [(f"User{n}@X.com", f"user{n}@x.COM", f"USER{n}@X.COM") for n in range(KEYS)]
    _upsert(spark, pg_url, "users_ci", _spellings(words), "email string, seq bigint")

    stored = query(pg_url, "SELECT email::text, seq FROM users_ci ORDER BY seq")
    assert stored == [(winner, 3 * n + 3) for n, (_, winner, _) in enumerate(words)]


def test_char_n_keys_differing_in_trailing_spaces_meet(spark: Any, pg_url: str) -> None:
    execute(pg_url, "CREATE TABLE codes_char (code char(8) PRIMARY KEY, seq bigint NOT NULL)")
    words = [(f"c{n}", f"c{n}  ", f"c{n} ") for n in range(KEYS)]
    _upsert(spark, pg_url, "codes_char", _spellings(words), "code string, seq bigint")

    stored = query(pg_url, "SELECT rtrim(code), seq FROM codes_char ORDER BY seq")
    assert stored == [(f"c{n}", 3 * n + 3) for n in range(KEYS)]


def test_uuid_keys_in_any_spelling_meet(spark: Any, pg_url: str) -> None:
    execute(pg_url, "CREATE TABLE things_uuid (id uuid PRIMARY KEY, seq bigint NOT NULL)")
    ids = [f"{n:08x}-abcd-4ef0-8123-{n:012x}" for n in range(KEYS)]
    words = [(i.upper(), "{" + i + "}", i.replace("-", "")) for i in ids]
    _upsert(spark, pg_url, "things_uuid", _spellings(words), "id string, seq bigint")

    stored = query(pg_url, "SELECT id::text, seq FROM things_uuid ORDER BY seq")
    assert stored == [(i, 3 * n + 3) for n, i in enumerate(ids)]


def test_a_string_key_into_bigint_is_refused_naming_the_cast(spark: Any, pg_url: str) -> None:
    execute(pg_url, "CREATE TABLE ids_bigint (id bigint PRIMARY KEY, seq bigint NOT NULL)")
    with pytest.raises(SchemaMismatchError) as caught:
        _upsert(spark, pg_url, "ids_bigint", [("7", 1), ("07", 2)], "id string, seq bigint")

    assert str(caught.value) == (
        "sink 'pg', batch 0: key column 'id' (string) is written to column id of table "
        "ids_bigint (BIGINT), which reads '7', '07' and ' 7' as one key; Spark would hash "
        "them to different partitions, whose transactions commit in any order, so the last "
        "would win whatever order_by says; cast it in the query so that Spark sees the key "
        'PostgreSQL sees: F.col("id").cast("bigint") (in a sink\'s select: CAST(id AS '
        "bigint) AS id), or write it as one partition (option partitions: 1)"
    )
    assert query(pg_url, "SELECT count(*) FROM ids_bigint") == [(0,)]

    # one partition sees every row of a key: PostgreSQL's equality decides, order_by wins
    _upsert(spark, pg_url, "ids_bigint", [("7", 1), ("07", 2)], "id string, seq bigint", 1)
    assert query(pg_url, "SELECT id, seq FROM ids_bigint") == [(7, 2)]


def test_a_zone_less_key_into_timestamptz_is_refused_naming_the_cast(
    spark: Any, pg_url: str
) -> None:
    execute(pg_url, "CREATE TABLE at_tz (at timestamptz PRIMARY KEY, seq bigint NOT NULL)")
    rows = [(datetime(2024, 3, 10, 2, 30), 1), (datetime(2024, 3, 10, 3, 30), 2)]
    for partitions in (1, 8):  # one partition meets the gap's keys, not a zone change
        with pytest.raises(SchemaMismatchError) as caught:
            _upsert(spark, pg_url, "at_tz", rows, "at timestamp_ntz, seq bigint", partitions)

    assert str(caught.value) == (
        "sink 'pg', batch 0: key column 'at' (timestamp_ntz) is written to column at of "
        "table at_tz (TIMESTAMP WITH TIME ZONE): PostgreSQL reads a zone-less time in the "
        "connection's TimeZone, which fanout does not record, so a TimeZone change moves "
        "every key (the next write, or a replay, puts keys beside the old ones) and in a "
        "daylight-saving gap two times become one key (whichever commits last wins, "
        "whatever order_by says); cast it in the query to an instant read in the Spark "
        'session\'s time zone: F.col("at").cast("timestamp") (in a sink\'s select: '
        "CAST(at AS timestamp) AS at), or make the column timestamp (without time zone)"
    )
    assert query(pg_url, "SELECT count(*) FROM at_tz") == [(0,)]


def test_a_date_key_into_timestamptz_is_refused_naming_the_cast(spark: Any, pg_url: str) -> None:
    """A date is read as its midnight in the connection's TimeZone: written under UTC, then
    replayed under Asia/Kolkata, each key was in the table twice (4 rows for 2 keys)."""
    execute(pg_url, "CREATE TABLE days_tz (day timestamptz PRIMARY KEY, seq bigint NOT NULL)")
    rows = [(date(2024, 1, 1), 1), (date(2024, 1, 2), 2)]
    for partitions in (1, 8):
        with pytest.raises(SchemaMismatchError) as caught:
            _upsert(spark, pg_url, "days_tz", rows, "day date, seq bigint", partitions)

    assert str(caught.value) == (
        "sink 'pg', batch 0: key column 'day' (date) is written to column day of table "
        "days_tz (TIMESTAMP WITH TIME ZONE): PostgreSQL reads a date as its midnight in the "
        "connection's TimeZone, which fanout does not record, so a TimeZone change moves "
        "every key (the next write, or a replay, puts keys beside the old ones); cast it in "
        "the query to an instant read in the Spark session's time zone: "
        'F.col("day").cast("timestamp") (in a sink\'s select: CAST(day AS timestamp) AS '
        "day), or make the column date"
    )
    assert query(pg_url, "SELECT count(*) FROM days_tz") == [(0,)]


# Characters whose lowering differs between locales, ICU and Java, and their neighbours.
TRICKY = ["I", "i", "İ", "ı", "i̇", "K", "k", "\u212a", "S", "s", "ſ", "ß", "SS", "Σ", "σ", "ς",
          "ǅ", "ǆ", "Ǆ", "É", "é", "a", "A", "?", "??", "x", "X"]  # fmt: skip


def test_the_citext_fold_is_equal_wherever_postgresql_says_equal(spark: Any, pg_url: str) -> None:
    from fanout_postgres.keyhash import KeyHash, key_fold
    from pyspark.sql import types as T
    from sqlalchemy.dialects import postgresql as pg

    words = sorted({a + b for a, b in itertools.product(TRICKY, repeat=2)})
    execute(pg_url, "CREATE EXTENSION IF NOT EXISTS citext")
    equal = query(
        pg_url,
        "SELECT a, b FROM unnest(%s::text[]) a, unnest(%s::text[]) b "
        "WHERE a < b AND a::citext = b::citext",
        (words, words),
    )
    fold = KeyHash("w", key_fold(T.StringType(), pg.CITEXT())).over("w")
    folded = dict(
        spark.createDataFrame([(w,) for w in words], "w string").selectExpr("w", fold).collect()
    )

    assert len(equal) >= 2 * len(TRICKY)  # at least the ASCII case pairs
    assert [(a, b) for a, b in equal if folded[a] != folded[b]] == []
