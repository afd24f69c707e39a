"""Which upsert keys are hashed on a fold, which as they are, and which are refused
(``fanout_postgres.keyhash``; the folds' effect is in ``test_equal_keys.py``)."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from fanout_postgres.keyhash import KeyRefused, key_fold
from pyspark.sql import types as T
from sqlalchemy.dialects import postgresql as pg

STRING = T.StringType()
CASE = "regexp_replace(lower(regexp_replace({c}, '[^ -~]', '?')), '[ik?]+', '?')"


@pytest.mark.parametrize(
    ("spark_type", "sa_type", "fold"),
    [
        (STRING, sa.Text(), None),
        (STRING, sa.VARCHAR(), None),
        (STRING, sa.Enum("a", "b", name="e"), None),
        (STRING, sa.VARCHAR(10), "rtrim({c})"),
        (STRING, sa.CHAR(3), "rtrim({c})"),
        (STRING, pg.CITEXT(), CASE),
        (STRING, pg.UUID(), "lower(regexp_replace({c}, '[^0-9A-Fa-f]', ''))"),
        (T.LongType(), sa.BigInteger(), None),
        (T.LongType(), pg.CITEXT(), None),  # digits have no case
        (T.DoubleType(), pg.DOUBLE_PRECISION(), None),  # Spark's hash folds -0.0 itself
        (T.DecimalType(10, 2), sa.Numeric(12, 2), None),
        (T.TimestampType(), pg.TIMESTAMP(timezone=True), None),
        (T.ArrayType(T.LongType()), sa.ARRAY(sa.BigInteger()), None),
        (T.ArrayType(STRING), sa.ARRAY(sa.CHAR(2)), "transform({c}, x -> rtrim(x))"),
        (T.StructType([T.StructField("a", T.LongType())]), pg.JSONB(), None),
        (STRING, pg.DOMAIN("email", pg.CITEXT()), CASE),
    ],
)
def test_the_fold_of_a_key(spark_type: Any, sa_type: Any, fold: str | None) -> None:
    assert key_fold(spark_type, sa_type) == fold


@pytest.mark.parametrize(
    ("sa_type", "examples", "cast"),
    [
        (sa.BigInteger(), "'7', '07' and ' 7'", "bigint"),
        (sa.Integer(), "'7', '07' and ' 7'", "int"),
        (sa.SmallInteger(), "'7', '07' and ' 7'", "smallint"),
        (sa.Numeric(10, 2), "'1.5' and '1.50'", "decimal(10,2)"),
        (sa.Numeric(), "'1.5' and '1.50'", None),  # no Spark type keeps any scale
        (pg.REAL(), "'1.5' and '1.50'", "float"),
        (pg.DOUBLE_PRECISION(), "'1.5' and '1.50'", "double"),
        (sa.Boolean(), "'t', 'true' and 'yes'", "boolean"),
        (sa.Date(), "'2024-01-02' and '2024-1-2'", "date"),
        (pg.TIMESTAMP(timezone=True), "'2024-01-02 03:00+00' and '2024-01-02 04:00+01'",
         "timestamp"),
        (pg.TIMESTAMP(), "'2024-01-02 03:00+00' and '2024-01-02 04:00+01'", "timestamp_ntz"),
        (pg.JSONB(), "'{\"a\":1}' and '{ \"a\": 1 }'", None),
        (pg.INET(), "several spellings of one value", None),
    ],
)  # fmt: skip
def test_a_string_key_no_fold_covers_is_refused(
    sa_type: Any, examples: str, cast: str | None
) -> None:
    with pytest.raises(KeyRefused) as refused:
        key_fold(STRING, sa_type)
    assert (refused.value.examples, refused.value.cast) == (examples, cast)


def test_an_array_key_is_refused_with_the_array_cast() -> None:
    with pytest.raises(KeyRefused) as refused:
        key_fold(T.ArrayType(STRING), sa.ARRAY(sa.BigInteger()))
    assert refused.value.cast == "array<bigint>"


def test_a_map_key_is_refused() -> None:
    with pytest.raises(KeyRefused) as refused:
        key_fold(T.MapType(STRING, STRING), pg.JSONB())
    assert refused.value.cast is None
