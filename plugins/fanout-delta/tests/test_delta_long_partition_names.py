"""A partition value whose directory name ``<column>=<value>`` (escaped) is longer than the
255 bytes a file system allows for a name: a long string, or a float such as ``1e300``,
which delta-rs writes in full decimal digits (301 of them) and then panics on
(``File name too long``). Every writer of the sink refuses such a row before writing,
as it refuses an empty string: the batch fails naming sink, batch, column and value, or
the row goes to the dead-letter target. 255 bytes is written, 256 refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from arrow_batches import batch_of
from deltacheck import ids
from fanout_delta import DeltaSink
from fanout_delta.partition_values import split_unstorable_spark
from fanout_delta.spark_engine import write_spark

from fanout.contract.sink import SinkContext
from fanout.deadletters.delta import DeltaDeadLetters
from fanout.delta_tables.io import read_delta
from fanout.errors import SinkWriteError

WHAT_TO_DO = (
    ". Replace the value in the stream (e.g. with null), or set the sink's option "
    "'dead_letter' to set such rows aside"
)
WHY = (
    "more than the 255 a file system allows for a name (a float is written in full decimal "
    "digits, 1e300 as 301 of them; each byte of a character other than a letter, a digit "
    "or _.~- is written as 3, %XX)"
)
FLOAT_1E300 = (
    "partition column 'p' holds 1e+300 (written as 301 decimal characters), whose partition "
    f"directory name (p=<value>, escaped) would be 303 bytes, {WHY}{WHAT_TO_DO}"
)
STRING_256 = (
    f"partition column 'k' holds {'x' * 40 + '...'!r} (254 characters), whose partition "
    f"directory name (k=<value>, escaped) would be 256 bytes, {WHY}{WHAT_TO_DO}"
)


def opened(path: Path, dead: Path | None = None, spark: Any = None, **options: Any) -> DeltaSink:
    sink = DeltaSink(name="s", path=str(path), **options)
    letters = DeltaDeadLetters(str(dead)) if dead is not None else None
    sink.open(SinkContext(pipeline="p", spark=spark, dead_letters=letters))
    return sink


def letters_of(dead: Path) -> list[tuple[str, Any, int, str]]:
    rows = read_delta(str(dead)).to_pylist()
    return sorted(
        (r["column"], json.loads(r["value"]), json.loads(r["row"])["id"], r["reason"]) for r in rows
    )


def test_a_double_partition_value_of_1e300_fails_the_batch_naming_it(tmp_path):
    """Float partitions are written from the driver (delta-rs); before, delta-rs panicked."""
    path = tmp_path / "t"
    table = pa.table({"id": pa.array([1, 2], pa.int64()), "p": pa.array([1.5, 1e300])})
    sink = opened(path, write_from="driver", partition_by=["p"])

    with pytest.raises(SinkWriteError) as raised:
        sink.write(batch_of(table))

    assert str(raised.value) == f"sink 's', batch 0: 1 row(s): {FLOAT_1E300}"
    assert not (path / "_delta_log").exists()


@pytest.mark.parametrize("mode", ["append", "merge"])
def test_long_float_partition_values_go_to_the_dead_letter_target(tmp_path, mode):
    """A float32 of 3e38 (39 digits) and a double of 1e250 (255 bytes with ``p=``) fit;
    1e300 and -1e-300 do not."""
    path, dead = tmp_path / "t", tmp_path / "dead"
    keys = {"keys": ["id"]} if mode == "merge" else {}
    sink = opened(path, dead=dead, mode=mode, partition_by=["p"], **keys)
    table = pa.table(
        {
            "id": pa.array([1, 2, 3, 4], pa.int64()),
            "p": pa.array([1e250, 1e300, -1e-300, None], pa.float64()),
        }
    )
    small = pa.table({"id": pa.array([5], pa.int64()), "p": pa.array([3e38], pa.float32())})

    result = sink.write(batch_of(table))
    sink.write(batch_of(small.cast(table.schema), 1))

    assert (result.rows, result.dead_lettered) == (2, 2)
    assert ids(path) == [1, 4, 5]
    assert [(c, v, i) for c, v, i, _ in letters_of(dead)] == [("p", -1e-300, 3), ("p", 1e300, 2)]
    assert [r for _, _, i, r in letters_of(dead) if i == 2] == [FLOAT_1E300]


@pytest.mark.parametrize("write_from", ["driver", "executors"])
def test_a_string_partition_directory_of_256_bytes_is_refused_alike(tmp_path, write_from):
    """The same text from delta-rs (the driver) and the executors' writer, which before
    failed with delta-rs' panic and an OSError."""
    path = tmp_path / "t"
    table = pa.table({"id": pa.array([1, 2], pa.int64()), "k": ["x" * 253, "x" * 254]})
    sink = opened(path, write_from=write_from, partition_by=["k"])

    with pytest.raises(SinkWriteError) as raised:
        sink.write(batch_of(table))

    counted = "1 row(s): " if write_from == "driver" else ""
    assert str(raised.value) == f"sink 's', batch 0: {counted}{STRING_256}"
    assert not (path / "_delta_log").exists()


@pytest.mark.parametrize("write_from", ["driver", "executors"])
def test_escaped_characters_count_three_bytes_each(tmp_path, write_from):
    """``é`` is 2 bytes, written ``%C3%A9``: 42 of them make ``k=`` + 252 bytes (kept),
    43 make 260 (set aside); a 253-character ASCII value makes exactly 255 (kept)."""
    path, dead = tmp_path / "t", tmp_path / "dead"
    sink = opened(path, dead=dead, write_from=write_from, partition_by=["k"])
    values = ["é" * 42, "é" * 43, "x" * 253, "a b" * 85]  # the last: 85 spaces, 3 bytes each
    table = pa.table({"id": pa.array([1, 2, 3, 4], pa.int64()), "k": values})

    result = sink.write(batch_of(table))

    assert (result.rows, result.dead_lettered) == (2, 2)
    assert ids(path) == [1, 3]
    assert [(c, v, i) for c, v, i, _ in letters_of(dead)] == [
        ("k", "a b" * 85, 4),
        ("k", "é" * 43, 2),
    ]


@pytest.mark.integration
def test_the_executors_set_long_strings_aside_in_spark(spark, tmp_path):
    """Spark's condition and Arrow's agree on the escaped length (the split checks it)."""
    df = spark.createDataFrame(
        [(1, "é" * 42), (2, "é" * 43), (3, "x" * 253), (4, "x" * 254), (5, None)],
        "id long, k string",
    )

    kept, letters = split_unstorable_spark(df, ["k"], engine="rs")

    assert sorted(r.id for r in kept.collect()) == [1, 3, 5]
    assert sorted(letter.row["id"] for letter in letters) == [2, 4]
    assert [letter.reason for letter in letters if letter.row["id"] == 4] == [STRING_256]


# -- engine spark: delta-spark writes into the directories Spark names -----------------------

SPARK_WHY = (
    "more than the 255 a file system allows for a name (as Spark names it for delta-spark: "
    "each control character and each of \"#%'*/:=?\\{[]^ is written as 3 bytes, %XX, any "
    "other character as its UTF-8 bytes)"
)
SPARK_STRING_300 = (
    f"partition column 'k' holds {'a' * 40 + '...'!r} (300 characters), whose partition "
    f"directory name (k=<value>, escaped) would be 302 bytes, {SPARK_WHY}{WHAT_TO_DO}"
)
SPARK_STRING_256 = (
    f"partition column 'k' holds {'x' * 40 + '...'!r} (254 characters), whose partition "
    f"directory name (k=<value>, escaped) would be 256 bytes, {SPARK_WHY}{WHAT_TO_DO}"
)
# The longest of each kind Spark can name (255 bytes with "k="), and one byte more.
SPARK_FITS = ["x" * 253, "#" * 84 + "x", "é" * 126 + "x", "a\x01" * 63 + "x"]
SPARK_TOO_LONG = ["x" * 254, "#" * 85, "é" * 127]


@pytest.mark.integration
def test_spark_names_partition_directories_as_the_spark_engine_counts(spark, tmp_path):
    """delta-spark writes its files into the directories Spark's file writer names
    (``DelayedCommitProtocol`` under Spark's ``DynamicPartitionDataSingleWriter``): Spark
    itself, writing Parquet here, names them as
    ``directory_name(..., "spark")`` does, escaping a few ASCII characters and writing
    any other character raw (so ``é`` takes 2 bytes, where delta-rs writes 6), and names
    a double of 1e300 ``1.0E300``: 9 bytes, where delta-rs writes 303."""
    from fanout.delta_tables.values import directory_name

    df = spark.createDataFrame(
        [(i, v, 1e300) for i, v in enumerate(SPARK_FITS)], "id long, k string, d double"
    )
    df.write.partitionBy("k", "d").parquet(str(tmp_path / "t"))

    names = sorted(p.name for p in (tmp_path / "t").iterdir() if p.name.startswith("k="))
    assert names == sorted(directory_name("k", v, "spark") for v in SPARK_FITS)
    assert sorted(len(n.encode()) for n in names) == [255] * 4
    assert {p.name for p in (tmp_path / "t").glob("k=*/*") if p.is_dir()} == {"d=1.0E300"}
    assert directory_name("d", "1.0E300", "spark") == "d=1.0E300"


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["append", "merge"])
def test_the_spark_engine_refuses_a_long_string_before_spark_fails(spark, tmp_path, mode):
    """Before, delta-spark's task failed (``TASK_WRITE_FAILED``, caused by ``Mkdirs failed
    to create .../k=aaa...``, no commit, and the same again on every replay). Refused
    before Delta runs (so this needs no Delta jars), naming sink, batch, column and value;
    a double of 1e300 in another partition column is no fault of the row on this engine."""
    keys = {"keys": ["id"]} if mode == "merge" else {}
    sink = DeltaSink(
        name="s",
        path=str(tmp_path / "t"),
        engine="spark",
        mode=mode,
        partition_by=["d", "k"],
        **keys,
    )
    df = spark.createDataFrame(
        [(1, 1e300, "a" * 300), (2, 1e300, "x" * 253)], "id long, d double, k string"
    )

    with pytest.raises(SinkWriteError) as raised:
        write_spark(sink.target(), batch_of(df))

    assert str(raised.value) == f"sink 's', batch 0: 1 row(s): {SPARK_STRING_300}"
    assert not (tmp_path / "t").exists()


@pytest.mark.integration
def test_the_spark_engine_sets_aside_the_strings_spark_cannot_name(spark, tmp_path):
    """Spark's condition and Arrow's agree (the split checks it) on the escaped length as
    Spark makes it: the rows of :data:`SPARK_FITS` stay (the ``é`` one would be refused by
    delta-rs), those one byte longer go, and the double 1e300 stays."""
    values = [*SPARK_FITS, *SPARK_TOO_LONG, "", None]
    df = spark.createDataFrame(
        [(i, v, 1e300) for i, v in enumerate(values)], "id long, k string, d double"
    )

    kept, letters = split_unstorable_spark(df, ["k", "d"], engine="spark")

    assert sorted(r.id for r in kept.collect()) == [0, 1, 2, 3, 8]
    letters.sort(key=lambda letter: letter.row["id"])
    assert [(letter.column, letter.value, letter.row["id"]) for letter in letters] == [
        ("k", v, i) for i, v in enumerate(values) if i in (4, 5, 6, 7)
    ]
    assert letters[0].reason == SPARK_STRING_256


SPARK_NUL = (
    "partition column 'k' holds 'a\\x00b', whose NUL character (U+0000) Spark writes "
    "unescaped into the partition directory's name (as Spark names it for delta-spark), "
    f"which no file system allows in a name{WHAT_TO_DO}"
)


@pytest.mark.integration
def test_spark_cannot_name_a_partition_holding_a_nul(spark, tmp_path):
    """Spark's escaping starts at U+0001: its own Parquet writer fails on a NUL in a
    partition value (``Mkdirs failed to create .../k=a<NUL>b``), as delta-spark's task
    would, on every replay. So the spark engine refuses the row before Delta runs, naming
    the value, and sets it aside where the sink has a dead-letter target (Spark's
    condition and Arrow's agree); delta-rs escapes it (``%00``): no fault there."""
    df = spark.createDataFrame([(1, "a\x00b"), (2, "ab")], "id long, k string")
    with pytest.raises(Exception, match="Mkdirs failed to create"):
        df.write.partitionBy("k").parquet(str(tmp_path / "parquet"))

    sink = DeltaSink(name="s", path=str(tmp_path / "t"), engine="spark", partition_by=["k"])
    with pytest.raises(SinkWriteError) as raised:
        write_spark(sink.target(), batch_of(df))
    assert str(raised.value) == f"sink 's', batch 0: 1 row(s): {SPARK_NUL}"
    assert not (tmp_path / "t").exists()

    kept, letters = split_unstorable_spark(df, ["k"], engine="spark")
    assert [r.id for r in kept.collect()] == [2]
    assert [(x.column, x.value, x.row["id"], x.reason) for x in letters] == [
        ("k", "a\x00b", 1, SPARK_NUL)
    ]
    kept, letters = split_unstorable_spark(df, ["k"], engine="rs")
    assert (sorted(r.id for r in kept.collect()), letters) == ([1, 2], [])
