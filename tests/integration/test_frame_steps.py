"""With real Spark: a partitioned frame built from column lists kept in the JVM
(:mod:`fanout.partitioned.frame_steps`) is pyspark's own frame, and a frame over the next
batch costs three py4j round trips."""

from __future__ import annotations

from typing import Any

from fanout.partitioned.frame_steps import frame_steps
from fanout.partitioned.membership import (
    MEMBER_COLUMN,
    partitioned_frame,
    quoted,
    with_member_column,
)
from tests.integration.py4j_calls import round_trips

ROWS = [(i, f"c{i % 5}" if i % 7 else None, i * 0.5) for i in range(40)]
SCHEMA = "`k` BIGINT, `a``b c` STRING, `d.e` DOUBLE"
BY = ["a`b c", "k"]
COLUMNS = ["d.e", "k", "a`b c"]


def _by_partition(df: Any) -> list[list[tuple[Any, ...]]]:
    return df.rdd.glom().map(lambda rows: [tuple(r) for r in rows]).collect()


def test_a_partitioned_frame_is_pyspark_own_frame_row_for_row(spark: Any) -> None:
    df = spark.createDataFrame(ROWS[::-1], SCHEMA)  # not in `d.e`'s order: the sort shows
    got = partitioned_frame(df, 3, BY, columns=COLUMNS, member=True, sort=["d.e"])
    picked = [quoted(c) for c in COLUMNS] + [
        f"xxhash64({quoted(BY[0])}, {quoted(BY[1])}) & 4294967295 AS {quoted(MEMBER_COLUMN)}"
    ]
    expected = df.selectExpr(*picked).repartition(3, *map(quoted, BY)).sortWithinPartitions("`d.e`")
    assert got.columns == ["d.e", "k", "a`b c", MEMBER_COLUMN]
    assert got.schema == expected.schema
    parts = _by_partition(got)
    assert parts == _by_partition(expected)
    assert len(parts) == 3 and sum(len(p) for p in parts) == 40
    for part in parts:  # sorted within each partition by `d.e`
        assert [row[0] for row in part] == sorted(row[0] for row in part)


def test_every_step_is_optional_and_none_reorders_rows(spark: Any) -> None:
    df = spark.createDataFrame(ROWS, SCHEMA)
    selected = frame_steps(df, select=["`k`", "`d.e` * 2 AS twice"])
    assert [tuple(r) for r in selected.collect()] == [(i, i * 1.0) for i in range(40)]
    spread = frame_steps(df, partitions=4)  # no columns: Spark's round-robin repartition
    assert spread.rdd.getNumPartitions() == 4
    assert sorted(r.k for r in spread.collect()) == list(range(40))
    keyed = frame_steps(df, partitions=2, by=["`k`"], sort=["k"])
    assert _by_partition(keyed) == _by_partition(df.repartition(2, "k").sortWithinPartitions("k"))


def test_the_next_batch_frame_costs_three_round_trips(spark: Any) -> None:
    first = spark.createDataFrame(ROWS, SCHEMA)
    partitioned_frame(first, 3, BY, columns=COLUMNS, member=True, sort=["d.e"])
    batch = spark.createDataFrame(ROWS[:10], SCHEMA)
    with round_trips() as counted:
        framed = partitioned_frame(batch, 3, BY, columns=COLUMNS, member=True, sort=["d.e"])
    assert counted[0] == 3  # selectExpr, repartition, sortWithinPartitions
    assert sorted(r.k for r in framed.collect()) == list(range(10))
    with round_trips() as counted:
        batch.selectExpr(*map(quoted, COLUMNS)).repartition(3, *map(quoted, BY))
    assert counted[0] > 3 + len(COLUMNS)  # pyspark's own: a round trip per list element


def test_a_sinks_own_frame_with_the_member_column_is_pyspark_own_frame(spark: Any) -> None:
    df = spark.createDataFrame(ROWS[::-1], SCHEMA)  # not in `d.e`'s order: the sort shows
    got = partitioned_frame(df, 3, BY, member=True, sort=["d.e"])
    parted = df.repartition(3, *map(quoted, BY))
    expected = with_member_column(parted, BY).sortWithinPartitions("`d.e`")
    assert got.columns == ["k", "a`b c", "d.e", MEMBER_COLUMN]
    parts = _by_partition(got)
    assert parts == _by_partition(expected)
    assert len(parts) == 3 and sum(len(p) for p in parts) == 40
    for part in parts:  # sorted within each partition by `d.e`
        assert [row[2] for row in part] == sorted(row[2] for row in part)
