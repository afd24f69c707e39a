"""With real Spark: the member column (low 32 bits of ``xxhash64`` of the partitioning
columns) that each partition sums into the digest it commits. Digests committed by one
release are compared with those a later one computes on a replay, so its values are
pinned here, for odd column names, nulls and several columns."""

from __future__ import annotations

from typing import Any

from fanout.partitioned.membership import MEMBER_COLUMN, with_member_column

ROWS = [(1, "x", 2.5), (2, None, None), (None, "y`z", -1.0)]
SCHEMA = "`k` BIGINT, `a``b c` STRING, `d.e` DOUBLE"


def test_member_values_are_the_low_32_bits_of_xxhash64(spark: Any) -> None:
    from pyspark.sql import functions as F

    df = spark.createDataFrame(ROWS, SCHEMA)
    for by in (["k"], ["a`b c", "d.e"], ["k", "a`b c", "d.e"]):
        got = [r[MEMBER_COLUMN] for r in with_member_column(df, by).orderBy("`d.e`").collect()]
        hashed = F.xxhash64(*[F.col("`" + c.replace("`", "``") + "`") for c in by])
        expected = df.withColumn("m", hashed.bitwiseAND(F.lit(0xFFFFFFFF))).orderBy("`d.e`")
        assert got == [r["m"] for r in expected.collect()]
        assert all(0 <= v <= 0xFFFFFFFF for v in got)
    pinned = with_member_column(df, ["k", "a`b c", "d.e"]).orderBy("`d.e`").collect()
    assert [r[MEMBER_COLUMN] for r in pinned] == PINNED
    assert pinned[1].asDict() == {"k": None, "a`b c": "y`z", "d.e": -1.0, MEMBER_COLUMN: PINNED[1]}


# rows ordered by `d.e` (nulls first); computed with 0.x's Column-built expression
PINNED = [45720525, 1450748723, 3848567154]
