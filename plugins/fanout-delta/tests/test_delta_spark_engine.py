"""The Delta sink with the delta-spark engine, in a local SparkSession.

Needs the Delta JVM classes on the session's classpath (the delta-spark jars, resolved from
Maven by ``configure_spark_with_delta_pip``). Where they cannot be loaded every test skips,
naming the missing class. The table is read back through delta-rs, which also shows that
both engines write the same transactions.
"""

from __future__ import annotations

import json

import pytest
from deltalake import DeltaTable
from fanout_delta import DeltaSink, spark_engine
from fanout_delta.spark_engine import delta_jvm_missing

from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.sink import SinkContext
from fanout.delta_tables.io import read_delta
from fanout.errors import SinkWriteError

pytestmark = pytest.mark.integration

APP_ID = txn_app_id("p", "s")


@pytest.fixture
def delta_spark(spark):
    """The session-scoped ``spark`` fixture, or a skip when Delta's classes are missing."""
    reason = delta_jvm_missing(spark)
    if reason is not None:
        pytest.skip(f"delta-spark engine unavailable: {reason}")
    return spark


def make_batch(df, batch_id: int) -> Batch:
    return Batch(
        df=df, info=BatchInfo(pipeline="p", batch_id=batch_id), sink_name="s", txn_app_id=APP_ID
    )


def opened(spark, path, **options) -> DeltaSink:
    sink = DeltaSink(name="s", path=str(path), engine="spark", **options)
    sink.open(SinkContext(pipeline="p", spark=spark))
    assert sink.resolved_engine == "spark"
    return sink


def rows(path) -> list[dict]:
    return read_delta(str(path)).sort_by("id").to_pylist()


def test_auto_engine_picks_spark_when_delta_loads(delta_spark, tmp_path):
    sink = DeltaSink(name="s", path=str(tmp_path / "t"), engine="auto")
    sink.open(SinkContext(pipeline="p", spark=delta_spark))
    assert (sink.resolved_engine, sink.reads) == ("spark", "dataframe")


def test_append_is_idempotent_per_batch(delta_spark, tmp_path, monkeypatch):
    path = tmp_path / "t"
    sink = opened(delta_spark, path)
    first = delta_spark.createDataFrame([(0, "a"), (1, "b"), (2, "c")], "id long, v string")
    assert sink.write(make_batch(first, 0)).rows == 3
    assert sink.write(make_batch(first, 0)).already_written is True
    # Without the delta-rs pre-check, Delta's own txnAppId/txnVersion check must skip too.
    monkeypatch.setattr(spark_engine, "_open_with_rs", lambda sink: None)
    sink.write(make_batch(first, 0))
    assert [r["id"] for r in rows(path)] == [0, 1, 2]
    assert DeltaTable(str(path)).transaction_version(APP_ID) == 0

    second = delta_spark.createDataFrame([(3, "d")], "id long, v string")
    sink.write(make_batch(second, 1))
    assert [r["id"] for r in rows(path)] == [0, 1, 2, 3]
    assert DeltaTable(str(path)).transaction_version(APP_ID) == 1


def test_merge_upserts_dedupes_and_replays_as_no_op(delta_spark, tmp_path, monkeypatch):
    path = tmp_path / "t"
    sink = opened(delta_spark, path, mode="merge", keys=["id"], order_by=["seq"])
    schema = "id long, seq long, v string"
    sink.write(make_batch(delta_spark.createDataFrame([(0, 1, "a"), (1, 1, "b")], schema), 0))
    batch = delta_spark.createDataFrame([(1, 3, "B3"), (1, 2, "B2"), (5, 1, "f")], schema)
    result = sink.write(make_batch(batch, 1))
    assert result.rows == 2
    assert rows(path) == [
        {"id": 0, "seq": 1, "v": "a"},
        {"id": 1, "seq": 3, "v": "B3"},
        {"id": 5, "seq": 1, "v": "f"},
    ]
    assert DeltaTable(str(path)).transaction_version(APP_ID) == 1
    version = DeltaTable(str(path)).version()

    # A replay with other values must change nothing, even without the delta-rs pre-check.
    monkeypatch.setattr(spark_engine, "_open_with_rs", lambda sink: None)
    replay = delta_spark.createDataFrame([(1, 9, "X")], schema)
    sink.write(make_batch(replay, 1))
    assert DeltaTable(str(path)).version() == version
    assert rows(path)[1] == {"id": 1, "seq": 3, "v": "B3"}


def test_merge_duplicates_without_order_by_fail_naming_the_key(delta_spark, tmp_path):
    sink = opened(delta_spark, tmp_path / "t", mode="merge", keys=["id"])
    df = delta_spark.createDataFrame([(7, "a"), (7, "b")], "id long, v string")
    with pytest.raises(SinkWriteError, match=r"\{'id': 7\}.*order_by"):
        sink.write(make_batch(df, 0))


@pytest.mark.parametrize("mode", ["append", "merge"])
def test_long_strings_go_to_the_dead_letter_target_and_1e300_is_written(
    delta_spark, tmp_path, mode
):
    """The row whose string Spark cannot name as a directory (302 bytes) is set aside;
    the double 1e300, which Spark names ``d=1.0E300``, is written, and delta-rs reads it
    back. (Unrun where the Delta jars are missing.)"""
    from fanout.deadletters.delta import DeltaDeadLetters

    path, dead = tmp_path / "t", tmp_path / "dead"
    keys = {"keys": ["id"]} if mode == "merge" else {}
    sink = DeltaSink(name="s", path=str(path), engine="spark", mode=mode,
                     partition_by=["d", "k"], **keys)  # fmt: skip
    sink.open(SinkContext(pipeline="p", spark=delta_spark,
                          dead_letters=DeltaDeadLetters(str(dead))))  # fmt: skip
    df = delta_spark.createDataFrame(
        [(1, 1e300, "a" * 300), (2, 1e300, "x" * 253)], "id long, d double, k string"
    )

    result = sink.write(make_batch(df, 0))

    assert (result.rows, result.dead_lettered) == (1, 1)
    assert rows(path) == [{"id": 2, "d": 1e300, "k": "x" * 253}]
    assert [(r["column"], json.loads(r["value"])) for r in read_delta(str(dead)).to_pylist()] == [
        ("k", "a" * 300)
    ]


ROUND_TRIP_COLUMNS = (
    "id long, b binary, s struct<x: binary, n: double>, l array<binary>, f array<double>, "
    "d decimal(5,2), ts timestamp, ntz timestamp_ntz, day date, m map<string, binary>, "
    "e map<string, string>"
)


def test_null_key_letters_read_back_with_from_json_as_the_batch_had_them(spark):
    """Both engines' null-key letters (collected as Arrow) keep every value: Spark's
    ``from_json`` with the batch's schema reads each letter's ``row`` back to the batch's
    row: bytes (base64), NaN and infinities, -0.0, decimals, an instant (in UTC) and a
    local timestamp, a date before year 1000, maps. ``collect()`` handed the engine a
    timestamp as a naive local time of the driver's zone."""
    from fanout_delta.spark_engine import split_null_keys_spark
    from pyspark.sql import functions as F

    from fanout.deadletters.layout import letter_json

    df = spark.sql(
        """select cast(null as long) as id, X'FF00' as b,
            named_struct('x', X'FE', 'n', double('NaN')) as s, array(X'FD', null) as l,
            array(double('Infinity'), double('-Infinity'), -0.0D) as f, 1.50BD as d,
            timestamp'2024-11-03 01:30:00.000001 America/New_York' as ts,
            timestamp_ntz'2024-05-01 08:00:00' as ntz, date'0999-01-02' as day,
            map('k', X'01') as m, cast(map() as map<string, string>) as e
        union all
        select 2, X'', null, null, null, null, null, null, null, null, null"""
    ).to(spark.createDataFrame([], ROUND_TRIP_COLUMNS).schema)
    kept, letters = split_null_keys_spark(df, ["id"])

    assert kept.count() == 1
    assert [letter.column for letter in letters] == ["id"]
    text = letter_json(dict(letters[0].row))
    assert json.loads(text)["b"] == "/wA="
    assert json.loads(text)["ts"] == "2024-11-03T05:30:00.000001+00:00"
    back = spark.createDataFrame([(text,)], "row string").select(
        F.from_json("row", ROUND_TRIP_COLUMNS).alias("r")
    )
    original = df.filter("id is null").toArrow().to_pylist()
    assert repr(back.select("r.*").toArrow().to_pylist()) == repr(original)
