"""The Delta sink with the delta-rs engine: no Spark, no JVM.

Batches are built around a fake DataFrame whose ``toArrow()`` returns a fixed table, so
every assertion is on exact ids, values, row counts and transaction versions.
"""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pyarrow as pa
import pytest
from arrow_batches import APP_ID, FakeFrame
from arrow_batches import batch_of as make_batch_of
from deltalake import DeltaTable, write_deltalake
from fanout_delta import DeltaSink
from fanout_delta.plugin import fanout_sink_types

from fanout.contract.batch import Batch, BatchInfo
from fanout.contract.sink import SinkContext, SinkResult
from fanout.delta_tables.io import read_delta
from fanout.errors import ConfigurationError, SchemaMismatchError, SinkWriteError
from fanout.hooks.registry import load_registry


def make_batch(data: dict | pa.Table, batch_id: int) -> Batch:
    table = data if isinstance(data, pa.Table) else pa.table(data)
    return Batch(
        df=FakeFrame(table),
        info=BatchInfo(pipeline="p", batch_id=batch_id),
        sink_name="s",
        txn_app_id=APP_ID,
    )


def opened(path: Path | str | None, **options) -> DeltaSink:
    sink = DeltaSink(name="s", path=str(path) if path is not None else None, **options)
    sink.open(SinkContext(pipeline="p"))
    return sink


def rows(path: Path, sort: str = "id") -> list[dict]:
    return read_delta(str(path)).sort_by(sort).to_pylist()


def ids(n: int, start: int = 0) -> pa.Array:
    return pa.array(range(start, start + n), pa.int64())


# -- plugin and options -------------------------------------------------------------------


def test_plugin_provides_the_delta_type_and_sink_is_transactional():
    assert fanout_sink_types() == {"delta": "fanout_delta.sink:DeltaSink"}  # imported when used
    assert load_registry().sink_types()["delta"].sink_class is DeltaSink
    assert DeltaSink.guarantees == ("transactional",)
    assert DeltaSink("s", path="/x").reads == "arrow"
    # The executors' append reads the DataFrame in Spark tasks.
    assert DeltaSink("s", path="/x", write_from="executors").reads == "dataframe"
    assert DeltaSink("s", path="/x", mode="merge", keys=["id"]).reads == "arrow"
    assert DeltaSink("s", path="/x", engine="spark").reads == "dataframe"


def test_unknown_option_is_a_type_error():
    with pytest.raises(TypeError):
        DeltaSink(name="s", path="/x", pathh="/y")


def test_sink_pickles_after_open(tmp_path):
    sink = opened(tmp_path / "t", mode="merge", keys=["id"])
    clone = pickle.loads(pickle.dumps(sink))
    assert (clone.path, clone.keys, clone.resolved_engine) == (sink.path, ["id"], "rs")


@pytest.mark.parametrize(
    ("options", "fragments"),
    [
        ({"path": None}, ["'s'", "'path' is required"]),
        ({"mode": "upsert"}, ["unknown mode 'upsert'", "append, merge"]),
        ({"mode": "merge"}, ["'merge' needs option 'keys'"]),
        ({"mode": "merge", "keys": []}, ["'keys' must be a non-empty list"]),
        ({"mode": "merge", "keys": ["id", 3]}, ["'keys' must be a non-empty list"]),
        ({"mode": "merge", "keys": ["id"], "order_by": []}, ["'order_by' must be"]),
        ({"keys": ["id"]}, ["only apply to mode 'merge'"]),
        ({"engine": "jvm"}, ["unknown engine 'jvm'", "rs, spark, auto"]),
        ({"compact_every": 0}, ["'compact_every' must be a positive integer", "0"]),
        ({"compact_every": "2"}, ["'compact_every' must be a positive integer"]),
        ({"engine": "spark"}, ["engine 'spark' cannot be used", "no active SparkSession"]),
    ],
)
def test_open_rejects_bad_options(tmp_path, options, fragments):
    options = {"path": str(tmp_path / "t"), **options}
    sink = DeltaSink(name="s", **options)
    with pytest.raises(ConfigurationError) as info:
        sink.open(SinkContext(pipeline="p"))
    message = str(info.value)
    assert "Delta sink 's'" in message
    for fragment in fragments:
        assert fragment in message


class NoDeltaJvm:
    """A SparkSession stand-in whose JVM cannot load the Delta classes."""

    class _Jvm:
        class java:
            class lang:
                class Thread:
                    @staticmethod
                    def currentThread():
                        class T:
                            def getContextClassLoader(self):
                                return None

                        return T()

                class Class:
                    @staticmethod
                    def forName(name, *args):
                        raise RuntimeError(f"java.lang.ClassNotFoundException: {name}")

    _jvm = _Jvm()


def test_engine_spark_without_delta_jars_fails_at_open_and_auto_falls_back(tmp_path):
    sink = DeltaSink(name="s", path=str(tmp_path / "t"), engine="spark")
    with pytest.raises(ConfigurationError, match="io.delta.tables.DeltaTable cannot be loaded"):
        sink.open(SinkContext(pipeline="p", spark=NoDeltaJvm()))
    auto = DeltaSink(name="s", path=str(tmp_path / "t"), engine="auto")
    auto.open(SinkContext(pipeline="p", spark=NoDeltaJvm()))
    # a session that cannot say its master, a local path: the driver writes
    assert (auto.resolved_engine, auto.resolved_write_from, auto.reads) == (
        "rs", "driver", "arrow")  # fmt: skip


def test_open_checks_columns_and_partitioning_of_an_existing_table(tmp_path):
    path = tmp_path / "t"
    write_deltalake(str(path), pa.table({"id": ids(2), "day": ["a", "b"]}), partition_by=["day"])
    with pytest.raises(ConfigurationError, match=r"'keys' names column\(s\) 'key'.*: day, id"):
        opened(path, mode="merge", keys=["key"])
    with pytest.raises(ConfigurationError, match=r"'order_by' names column\(s\) 'ts'"):
        opened(path, mode="merge", keys=["id"], order_by=["ts"])
    with pytest.raises(ConfigurationError, match=r"partitioned by \['day'\]"):
        opened(path, partition_by=["id"])
    assert opened(path, mode="merge", keys=["id"], partition_by=["day"]).resolved_engine == "rs"


def test_a_merge_key_holding_a_backtick_is_refused_at_open_with_engine_rs(tmp_path):
    """delta-rs parses the MERGE condition with no quoting of a backtick: unrefused, the
    first batch created the table and every later batch failed on a parse error
    ("Expected close delimiter"), replay after replay. Dots and spaces are quoted."""
    path = tmp_path / "t"
    with pytest.raises(ConfigurationError) as refused:
        opened(path, mode="merge", keys=["id", "a`b"])
    assert str(refused.value) == (
        "Delta sink 's': merge key column(s) 'a`b' hold a backtick, which delta-rs cannot "
        "quote in the MERGE condition; rename the column in the stream (withColumnRenamed) "
        "or use engine='spark'"
    )
    assert not path.exists()
    sink = opened(path, mode="merge", keys=["a.b", "c d"])
    sink.write(make_batch({"a.b": [1, 2], "c d": ["x", "y"], "v": [1, 2]}, 0))
    sink.write(make_batch({"a.b": [2, 3], "c d": ["y", "y"], "v": [20, 30]}, 1))
    assert rows(path, "a.b") == [
        {"a.b": 1, "c d": "x", "v": 1},
        {"a.b": 2, "c d": "y", "v": 20},
        {"a.b": 3, "c d": "y", "v": 30},
    ]


# -- append ---------------------------------------------------------------------------------


def test_append_writes_rows_and_records_the_transaction(tmp_path):
    path = tmp_path / "t"
    sink = opened(path)
    result = sink.write(make_batch({"id": ids(3), "v": ["a", "b", "c"]}, batch_id=0))
    assert result.rows == 3
    assert result.details["mode"] == "append"
    assert result.details["version"] == 0
    assert rows(path) == [{"id": 0, "v": "a"}, {"id": 1, "v": "b"}, {"id": 2, "v": "c"}]
    assert DeltaTable(str(path)).transaction_version(APP_ID) == 0

    sink.write(make_batch({"id": ids(2, 3), "v": ["d", "e"]}, batch_id=1))
    assert [r["id"] for r in rows(path)] == [0, 1, 2, 3, 4]
    assert DeltaTable(str(path)).transaction_version(APP_ID) == 1


def test_append_replay_writes_one_copy(tmp_path):
    path = tmp_path / "t"
    sink = opened(path)
    first = sink.write(make_batch({"id": ids(3)}, batch_id=4))
    again = sink.write(make_batch({"id": ids(3)}, batch_id=4))
    older = sink.write(make_batch({"id": ids(3)}, batch_id=2))
    assert first.already_written is False
    assert again == SinkResult(rows=3, already_written=True)
    assert older.already_written is True
    assert [r["id"] for r in rows(path)] == [0, 1, 2]
    assert DeltaTable(str(path)).version() == 0
    assert DeltaTable(str(path)).transaction_version(APP_ID) == 4


def test_replay_of_batch_zero_is_skipped(tmp_path):
    # Version 0 is a valid recorded version (a falsy value must not read as "nothing").
    path = tmp_path / "t"
    sink = opened(path)
    sink.write(make_batch({"id": ids(2)}, batch_id=0))
    assert sink.write(make_batch({"id": ids(2)}, batch_id=0)).already_written is True
    assert len(rows(path)) == 2


def test_empty_batch_commits_nothing(tmp_path):
    path = tmp_path / "t"
    sink = opened(path)
    sink.write(make_batch({"id": ids(1)}, batch_id=0))
    result = sink.write(make_batch(pa.table({"id": pa.array([], pa.int64())}), batch_id=1))
    assert result == SinkResult(rows=0, details={"empty": True, "mode": "append"})
    assert DeltaTable(str(path)).version() == 0
    assert DeltaTable(str(path)).transaction_version(APP_ID) == 0


def test_append_fills_columns_missing_from_the_batch_with_nulls(tmp_path):
    path = tmp_path / "t"
    sink = opened(path)
    sink.write(make_batch({"id": ids(1), "v": ["a"]}, batch_id=0))
    sink.write(make_batch({"id": ids(1, 1)}, batch_id=1))
    assert rows(path) == [{"id": 0, "v": "a"}, {"id": 1, "v": None}]


def test_partition_by_creates_partition_columns(tmp_path):
    path = tmp_path / "t"
    sink = opened(path, partition_by=["day"])
    sink.write(make_batch({"id": ids(3), "day": ["d1", "d2", "d1"]}, batch_id=0))
    table = DeltaTable(str(path))
    assert table.metadata().partition_columns == ["day"]
    assert sorted(p.parent.name for p in path.rglob("*.parquet")) == ["day=d1", "day=d2"]
    assert [r["day"] for r in rows(path)] == ["d1", "d2", "d1"]


def test_configuration_is_set_on_create(tmp_path):
    path = tmp_path / "t"
    sink = opened(path, configuration={"delta.appendOnly": "true"})
    sink.write(make_batch({"id": ids(1)}, batch_id=0))
    assert DeltaTable(str(path)).metadata().configuration["delta.appendOnly"] == "true"


def test_compact_every_two_batches_adds_optimize_commits(tmp_path):
    path = tmp_path / "t"
    sink = opened(path, compact_every=2)
    for batch_id in range(4):
        sink.write(make_batch({"id": ids(1, batch_id)}, batch_id=batch_id))
    operations = [h["operation"] for h in reversed(DeltaTable(str(path)).history())]
    # the first compaction's mark of the table: a WRITE of no file
    assert operations == ["WRITE", "WRITE", "WRITE", "OPTIMIZE", "WRITE", "WRITE", "OPTIMIZE"]
    assert [r["id"] for r in rows(path)] == [0, 1, 2, 3]
    assert DeltaTable(str(path)).transaction_version(APP_ID) == 3


def test_failed_compaction_is_logged_not_raised(tmp_path, monkeypatch, caplog):
    import fanout_delta.rs_engine as rs_engine

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(rs_engine, "compact_rs", broken)
    sink = opened(tmp_path / "t", compact_every=1)
    with caplog.at_level(logging.WARNING, logger="fanout_delta.sink"):
        result = sink.write(make_batch({"id": ids(1)}, batch_id=0))
    assert result.rows == 1
    assert "compaction of" in caplog.text and "disk full" in caplog.text


def test_the_records_of_the_sinks_modules_keep_the_sinks_logger(tmp_path, monkeypatch, caplog):
    """What the sink logs at its open, its write and its fence hooks, whichever module of
    the package does it (``table_checks``, ``compactions``, ``epoch_fencing``), is logged
    under ``fanout_delta.sink``, the logger users' logging settings name."""
    import fanout_delta.rs_engine as rs_engine

    from fanout.delta_tables import retention

    def broken(*args, **kwargs):
        raise OSError("disk full")

    path = tmp_path / "t"
    monkeypatch.setattr(rs_engine, "compact_rs", broken)
    monkeypatch.setattr(retention, "LONG_LOG_FILES", 1)
    kept = {"delta.setTransactionRetentionDuration": "interval 30 days"}
    with caplog.at_level(logging.INFO, logger="fanout_delta.sink"):
        sink = opened(path, compact_every=1, configuration=kept)
        sink.write(make_batch({"id": ids(1)}, batch_id=0))
        opened(path, compact_every=1)
        sink.fence_earlier_epochs("p", 1)
        assert sink.lift_epoch_fence("p", 1) is True
    said = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    mine = [(n, level, m) for n, level, m in said if m.startswith(("sink 's'", "Delta sink 's'"))]
    retention_said = f"Delta sink 's' (table {str(path)!r})"
    assert [(n, level, m.split(":")[0]) for n, level, m in mine] == [
        ("fanout_delta.sink", "WARNING", retention_said),  # the configuration's, no table yet
        ("fanout_delta.sink", "INFO", "sink 's'"),  # the open: created by the first batch
        ("fanout_delta.sink", "WARNING", "sink 's', batch 0"),  # the compaction failed
        ("fanout_delta.sink", "WARNING", "Delta sink 's'"),  # a long log
        ("fanout_delta.sink", "WARNING", retention_said),  # the table's
        ("fanout_delta.sink", "INFO", "sink 's'"),  # the open
        ("fanout_delta.sink", "INFO", "sink 's'"),  # fenced
        ("fanout_delta.sink", "INFO", "sink 's'"),  # lifted
    ]
    assert "compaction of" in mine[2][2] and "disk full" in caplog.text
    assert "_delta_log" in mine[3][2] and "setTransactionRetentionDuration" in mine[4][2]
    assert "fenced 1 app transaction(s) of epochs before 1" in mine[6][2]
    assert mine[7][2] == f"sink 's': lifted the fence of fanout/p/s in {path}"


# -- merge ----------------------------------------------------------------------------------


def test_merge_inserts_and_updates_exact_values(tmp_path):
    path = tmp_path / "t"
    sink = opened(path, mode="merge", keys=["id"])
    sink.write(make_batch({"id": ids(3), "v": ["a", "b", "c"]}, batch_id=0))
    result = sink.write(
        make_batch({"id": pa.array([1, 5], pa.int64()), "v": ["B", "f"]}, batch_id=1)
    )
    assert result.rows == 2
    assert (result.details["inserted"], result.details["updated"]) == (1, 1)
    assert rows(path) == [
        {"id": 0, "v": "a"},
        {"id": 1, "v": "B"},
        {"id": 2, "v": "c"},
        {"id": 5, "v": "f"},
    ]
    assert DeltaTable(str(path)).transaction_version(APP_ID) == 1


def test_merge_replay_is_a_no_op(tmp_path):
    path = tmp_path / "t"
    sink = opened(path, mode="merge", keys=["id"])
    sink.write(make_batch({"id": ids(2), "v": ["a", "b"]}, batch_id=0))
    sink.write(make_batch({"id": ids(1), "v": ["A"]}, batch_id=1))
    version = DeltaTable(str(path)).version()
    # A replay of batch 1 carrying other values would overwrite them if it were written.
    result = sink.write(make_batch({"id": ids(1), "v": ["X"]}, batch_id=1))
    assert result.already_written is True
    assert DeltaTable(str(path)).version() == version
    assert rows(path) == [{"id": 0, "v": "A"}, {"id": 1, "v": "b"}]


def test_merge_with_composite_and_odd_key_names(tmp_path):
    path = tmp_path / "t"
    sink = opened(path, mode="merge", keys=["tenant id", "k-1"])
    sink.write(make_batch({"tenant id": [1, 1], "k-1": ["a", "b"], "v": [1, 2]}, batch_id=0))
    sink.write(make_batch({"tenant id": [1, 2], "k-1": ["b", "b"], "v": [20, 30]}, batch_id=1))
    got = read_delta(str(path)).sort_by([("tenant id", "ascending"),
                                                            ("k-1", "ascending")])  # fmt: skip
    assert got.to_pylist() == [
        {"tenant id": 1, "k-1": "a", "v": 1},
        {"tenant id": 1, "k-1": "b", "v": 20},
        {"tenant id": 2, "k-1": "b", "v": 30},
    ]


def test_merge_dedupes_by_order_by_greatest_wins(tmp_path):
    path = tmp_path / "t"
    sink = opened(path, mode="merge", keys=["id"], order_by=["seq"])
    batch = make_batch(
        {
            "id": pa.array([1, 2, 1, 1, 2, 3, 3], pa.int64()),
            "seq": pa.array([5, 1, 9, 2, None, 4, 4], pa.int64()),
            "v": ["1@5", "2@1", "1@9", "1@2", "2@null", "3@4-first", "3@4-last"],
        },
        batch_id=0,
    )
    result = sink.write(batch)
    assert result.rows == 3
    assert rows(path) == [
        {"id": 1, "seq": 9, "v": "1@9"},
        {"id": 2, "seq": 1, "v": "2@1"},
        {"id": 3, "seq": 4, "v": "3@4-last"},
    ]
    # Same through an existing table (MERGE rather than create).
    sink.write(make_batch({"id": pa.array([1, 1], pa.int64()), "seq": pa.array([11, 10],
                           pa.int64()), "v": ["1@11", "1@10"]}, batch_id=1))  # fmt: skip
    assert rows(path)[0] == {"id": 1, "seq": 11, "v": "1@11"}


def test_merge_float_keys_keep_one_row_per_key_as_the_merge_matches_them(tmp_path):
    """NaN keys and zero keys of either sign: one row per key in the table, the winner by
    ``order_by`` (NaN greatest) with the batch's values, and a later batch's ``-0.0`` and
    NaN update those rows (delta-rs' MERGE matches them)."""
    path = tmp_path / "t"
    sink = opened(path, mode="merge", keys=["k"], order_by=["seq"])
    nan = float("nan")
    first = {"k": [nan, nan, 0.0, -0.0], "seq": [1.0, nan, 2.0, 1.0], "v": ["a", "b", "c", "d"]}
    sink.write(make_batch(first, batch_id=0))
    assert sorted(map(str, read_delta(str(path)).to_pylist())) == [
        "{'k': 0.0, 'seq': 2.0, 'v': 'c'}",
        "{'k': nan, 'seq': nan, 'v': 'b'}",
    ]

    result = sink.write(make_batch({"k": [-0.0, nan], "seq": [0.0, 0.0], "v": ["e", "f"]}, 1))

    assert (result.details["inserted"], result.details["updated"]) == (0, 2)
    assert sorted(map(str, read_delta(str(path)).to_pylist())) == [
        "{'k': -0.0, 'seq': 0.0, 'v': 'e'}",
        "{'k': nan, 'seq': 0.0, 'v': 'f'}",
    ]


def test_merge_duplicate_keys_without_order_by_fail_naming_the_key(tmp_path):
    path = tmp_path / "t"
    sink = opened(path, mode="merge", keys=["id"])
    batch = make_batch({"id": pa.array([1, 7, 7], pa.int64()), "v": ["a", "b", "c"]}, 3)
    with pytest.raises(SinkWriteError) as info:
        sink.write(batch)
    message = str(info.value)
    assert (info.value.sink, info.value.batch_id) == ("s", 3)
    assert "{'id': 7}" in message and "order_by" in message and "batch 3" in message
    assert not path.exists()


def test_merge_null_key_fails_naming_the_column(tmp_path):
    path = tmp_path / "t"
    sink = opened(path, mode="merge", keys=["id", "region"])
    batch = make_batch({"id": pa.array([1, 2], pa.int64()), "region": ["eu", None]}, 2)
    with pytest.raises(SinkWriteError) as info:
        sink.write(batch)
    assert (info.value.sink, info.value.batch_id) == ("s", 2)
    assert "key column 'region'" in str(info.value) and "1 row(s)" in str(info.value)


def test_a_refused_batch_error_is_not_its_own_cause(tmp_path):
    """A SinkError raised while committing to an existing table was re-raised ``from``
    itself (``raise translate_error(exc) from exc``, which returns a SinkError as it is):
    its ``__cause__`` was the error itself, so the usual root-cause loop
    (``while e.__cause__: e = e.__cause__``) never ended."""
    path = tmp_path / "t"
    sink = opened(path)
    sink.write(make_batch({"id": ids(1)}, batch_id=0))
    with pytest.raises(SchemaMismatchError) as info:
        sink.write(make_batch({"id": ids(1, 1), "x": [1]}, batch_id=1))
    assert str(info.value) == (
        "sink 's', batch 1: the batch does not fit the Delta table: column(s) 'x' not in "
        "the table; set merge_schema=True to add them, or drop them from the stream"
    )
    assert info.value.__cause__ is not info.value
    seen, cause = [], info.value.__cause__
    while cause is not None and len(seen) < 10:
        seen.append(cause)
        cause = cause.__cause__
    assert cause is None, f"a loop in the __cause__ chain: {seen}"
    assert DeltaTable(str(path)).version() == 0


def test_merge_schema_adds_a_non_nullable_batch_column_as_nullable(tmp_path):
    """A new column of a non-nullable batch field (``F.lit(1)``, ``current_timestamp()``)
    was added as NOT NULL over rows that hold no value there: the table could no longer
    be read ("Non-nullable column 'extra' is missing from the physical schema") and a
    later batch without the column failed ("NOT NULL column(s) 'extra' missing"). Delta
    on Spark adds every new column as nullable; so does the sink now (an append: a
    ``merge`` already added it nullable)."""
    path = tmp_path / "t"
    sink = opened(path, merge_schema=True)
    sink.write(make_batch({"id": ids(1)}, batch_id=0))
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("extra", pa.int32(), False)])
    added = pa.Table.from_pydict({"id": [1], "extra": [9]}, schema=schema)
    sink.write(make_batch(added, batch_id=1))
    sink.write(make_batch({"id": ids(1, 2)}, batch_id=2))
    assert rows(path) == [
        {"id": 0, "extra": None},
        {"id": 1, "extra": 9},
        {"id": 2, "extra": None},
    ]
    field = pa.schema(DeltaTable(str(path)).schema().to_arrow()).field("extra")
    assert (field.type, field.nullable) == (pa.int32(), True)


def test_merge_keeps_target_values_of_columns_missing_from_the_batch(tmp_path):
    path = tmp_path / "t"
    sink = opened(path, mode="merge", keys=["id"])
    sink.write(make_batch({"id": ids(1), "v": ["a"], "w": [1]}, batch_id=0))
    sink.write(make_batch({"id": ids(1), "w": [2]}, batch_id=1))
    assert rows(path) == [{"id": 0, "v": "a", "w": 2}]


# -- schema -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["append", "merge"])
def test_type_conflict_is_a_schema_mismatch(tmp_path, mode):
    path = tmp_path / "t"
    options = {"mode": mode, "keys": ["id"]} if mode == "merge" else {}
    sink = opened(path, **options)
    sink.write(make_batch({"id": ids(1), "amount": pa.array([1], pa.int64())}, batch_id=0))
    bad = make_batch({"id": ids(1, 1), "amount": pa.array([2.5], pa.float64())}, batch_id=1)
    with pytest.raises(SchemaMismatchError) as info:
        sink.write(bad)
    error = info.value
    assert error.columns == ["amount"]
    assert (error.sink, error.batch_id) == ("s", 1)
    message = str(error)
    assert "sink 's', batch 1" in message
    assert "'amount' (table int64, batch double)" in message
    assert DeltaTable(str(path)).version() == 0


@pytest.mark.parametrize("mode", ["append", "merge"])
def test_extra_column_without_merge_schema_is_a_schema_mismatch(tmp_path, mode):
    path = tmp_path / "t"
    options = {"mode": mode, "keys": ["id"]} if mode == "merge" else {}
    sink = opened(path, **options)
    sink.write(make_batch({"id": ids(1)}, batch_id=0))
    with pytest.raises(SchemaMismatchError) as info:
        sink.write(make_batch({"id": ids(1, 1), "extra": ["x"]}, batch_id=1))
    assert info.value.columns == ["extra"]
    assert str(info.value) == (
        "sink 's', batch 1: the batch does not fit the Delta table: column(s) 'extra' not in "
        "the table; set merge_schema=True to add them, or drop them from the stream"
    )  # a column spelt as the table's in another case: test_delta_struct_fields_and_case
    assert DeltaTable(str(path)).version() == 0


@pytest.mark.parametrize("mode", ["append", "merge"])
def test_merge_schema_accepts_an_extra_column(tmp_path, mode):
    path = tmp_path / "t"
    options = {"mode": mode, "keys": ["id"]} if mode == "merge" else {}
    sink = opened(path, merge_schema=True, **options)
    sink.write(make_batch({"id": ids(1)}, batch_id=0))
    sink.write(make_batch({"id": ids(1, 1), "extra": ["x"]}, batch_id=1))
    assert rows(path) == [{"id": 0, "extra": None}, {"id": 1, "extra": "x"}]


def test_benign_type_differences_are_accepted(tmp_path):
    path = tmp_path / "t"
    sink = opened(path)
    first = pa.table({
        "id": pa.array([0], pa.int64()),
        "s": pa.array(["a"], pa.string()),
        "ts": pa.array([0], pa.timestamp("us", tz="UTC")),
        "f": pa.array([0.5], pa.float64()),
    })  # fmt: skip
    sink.write(make_batch(first, batch_id=0))
    second = pa.Table.from_arrays(
        [
            pa.array([1], pa.int32()),
            pa.array(["b"], pa.large_string()),
            pa.array([1_000_000_000], pa.timestamp("ns", tz="Europe/Paris")),
            pa.array([2], pa.int16()),
        ],
        schema=pa.schema([
            pa.field("id", pa.int32(), nullable=False),
            pa.field("s", pa.large_string()),
            pa.field("ts", pa.timestamp("ns", tz="Europe/Paris")),
            pa.field("f", pa.int16()),
        ]),
    )  # fmt: skip
    sink.write(make_batch(second, batch_id=1))
    got = rows(path)
    assert [(r["id"], r["s"], r["f"]) for r in got] == [(0, "a", 0.5), (1, "b", 2.0)]
    assert got[1]["ts"].timestamp() == 1.0


@pytest.mark.parametrize(
    ("table_type", "batch_type", "accepted"),
    [
        (pa.float64(), pa.int8(), True),
        (pa.float64(), pa.int16(), True),
        (pa.float64(), pa.int32(), True),
        (pa.float64(), pa.uint32(), True),
        (pa.float64(), pa.int64(), False),
        (pa.float64(), pa.uint64(), False),
        (pa.float64(), pa.dictionary(pa.int8(), pa.int64()), False),
        (pa.float32(), pa.int16(), True),
        (pa.float32(), pa.uint16(), True),
        (pa.float32(), pa.int32(), False),
        (pa.float32(), pa.int64(), False),
    ],
)
def test_integers_fit_a_float_column_only_when_it_holds_every_value(
    table_type, batch_type, accepted
):
    from fanout_delta.schema import fits

    assert fits(table_type, batch_type) is accepted


def test_check_schema_refuses_an_int_the_float_column_would_round(tmp_path):
    """``fanout validate``'s check of an existing table: an ``int`` into a ``float``
    column (24 significand bits) is refused with the cast that accepts the rounding."""
    path = tmp_path / "t"
    write_deltalake(str(path), pa.table({"id": ids(1), "x y": pa.array([0.5], pa.float32())}))
    sink = opened(path)

    with pytest.raises(SchemaMismatchError) as info:
        sink.check_schema(pa.schema([("id", pa.int64()), ("x y", pa.int32())]))

    assert info.value.columns == ["x y"]
    assert str(info.value) == (
        "sink 's': the batch does not fit the Delta table: column 'x y' (table float, batch "
        "int32) cannot be written without loss: a float holds integers exactly only up to "
        "2**24, delta-rs would round larger ones; cast it in the query so the rounding is "
        'yours: F.col("x y").cast("float") (in a sink\'s select: CAST(`x y` AS float) AS '
        "`x y`), or write it to an integer column"
    )
    sink.check_schema(pa.schema([("id", pa.int64()), ("x y", pa.int16())]))


def test_timestamp_without_time_zone_conflicts_with_timestamp(tmp_path):
    path = tmp_path / "t"
    sink = opened(path)
    sink.write(make_batch({"ts": pa.array([0], pa.timestamp("us", tz="UTC"))}, batch_id=0))
    with pytest.raises(SchemaMismatchError) as info:
        sink.write(make_batch({"ts": pa.array([0], pa.timestamp("us"))}, batch_id=1))
    assert info.value.columns == ["ts"]


def test_merge_keys_missing_from_the_batch_are_a_schema_mismatch(tmp_path):
    sink = opened(tmp_path / "t", mode="merge", keys=["id"], order_by=["seq"])
    with pytest.raises(SchemaMismatchError) as info:
        sink.write(make_batch({"id": ids(1), "v": ["a"]}, batch_id=0))
    assert info.value.columns == ["seq"]
    assert "'seq'" in str(info.value) and "batch 0" in str(info.value)


@pytest.mark.parametrize("write_from", ["driver", "executors"])
def test_a_batch_lacking_a_partition_column_is_refused_naming_the_option(tmp_path, write_from):
    """The first batch, which creates the table, and a later one: a ``partition_by``
    column the batch lacks fails naming the option and the column, not delta-rs' error
    (and, for an existing table, not a batch written to the null partition)."""
    path = tmp_path / "t"
    sink = opened(path, partition_by=["day"], write_from=write_from)
    message = (
        "option 'partition_by' names column(s) 'day' not in the batch ['day' (the batch has "
        "'Day'; names are case-sensitive)] (the batch's columns: id, Day); fix the option or "
        "add the column(s) to the stream"
    )

    with pytest.raises(SchemaMismatchError) as first:
        sink.write(make_batch({"id": ids(1), "Day": ["a"]}, batch_id=0))
    assert first.value.columns == ["day"]
    assert str(first.value) == f"sink 's', batch 0: {message}"
    assert not path.exists()

    sink.write(make_batch({"id": ids(1), "day": ["a"]}, batch_id=0))
    with pytest.raises(SchemaMismatchError) as later:
        sink.write(make_batch({"id": ids(1, 1), "Day": ["b"]}, batch_id=1))
    assert str(later.value) == f"sink 's', batch 1: {message}"
    assert rows(path) == [{"id": 0, "day": "a"}]


def test_variant_columns_are_refused_wherever_they_nest(tmp_path):
    """A ``VARIANT`` at the top, in a struct, in an array or a map's value (Spark's own
    Arrow schema of them, no JVM), for ``fanout validate`` and for a batch; engine
    ``spark`` (delta-spark writes variants) is not refused."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import (
        ArrayType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
        VariantType,
    )

    schema = to_arrow_schema(
        StructType([
            StructField("id", LongType()),
            StructField("v", VariantType()),
            StructField("s", StructType([StructField("x", VariantType())])),
            StructField("a b", ArrayType(VariantType())),
            StructField("m", MapType(StringType(), VariantType())),
        ]),
        timezone="UTC",
    )  # fmt: skip
    sink = opened(tmp_path / "t")

    with pytest.raises(SchemaMismatchError) as info:
        sink.check_schema(schema)

    assert info.value.columns == ["v", "s", "a b", "m"]
    assert str(info.value) == (
        "sink 's': column(s) 'v', 's' (at s.x), 'a b' (at a b[]), 'm' (at m.value) hold a "
        "Spark VARIANT, which delta-rs cannot write as Delta's variant type (it would store "
        "struct<value: binary, metadata: binary>, which no reader takes for a variant); "
        'write it as JSON text: F.to_json(F.col("v")) (in a sink\'s select: to_json(v) AS '
        'v); F.to_json(F.col("s")) (in a sink\'s select: to_json(s) AS s); '
        'F.to_json(F.col("a b")) (in a sink\'s select: to_json(`a b`) AS `a b`); '
        'F.to_json(F.col("m")) (in a sink\'s select: to_json(m) AS m), or use engine '
        "'spark' (delta-spark writes variants)"
    )
    data = pa.table({"id": ids(1)}).append_column(
        schema.field("v"),
        pa.array([{"value": b"\x0c\x01", "metadata": b"\x01\x00\x00"}], schema.field("v").type),
    )
    with pytest.raises(SchemaMismatchError) as written:
        sink.write(make_batch(data, batch_id=0))
    assert written.value.columns == ["v"]
    assert not (tmp_path / "t").exists()
    # a struct of two binaries Spark did not mark as a variant is an ordinary struct
    plain = pa.table({"id": ids(1), "v": pa.array([{"value": b"a", "metadata": b"b"}])})
    sink.write(make_batch(plain, batch_id=0))
    assert rows(tmp_path / "t") == [{"id": 0, "v": {"value": b"a", "metadata": b"b"}}]
    spark_sink = DeltaSink(name="s", path=str(tmp_path / "u"), engine="spark")
    spark_sink.resolved_engine = "spark"
    spark_sink.check_schema(schema)


GEO_REFUSED = (
    "column(s) 'g', 'h', 's' (at s.x), 'a' (at a[]), 'm' (at m.value) hold a Spark GEOMETRY "
    "or GEOGRAPHY, which delta-rs cannot write as one (it would store struct<srid: int, wkb: "
    "binary>, which no reader takes for a geometry); write its WKB as binary in the query: "
    'F.st_asbinary(F.col("g")) (in a sink\'s select: ST_AsBinary(g) AS g); '
    'F.st_asbinary(F.col("h")) (in a sink\'s select: ST_AsBinary(h) AS h); ST_AsBinary of '
    "the value at s.x; ST_AsBinary of the value at a[]; ST_AsBinary of the value at m.value "
    "(and its SRID, ST_SRID, in a column of its own when it matters)"
)


def test_geometry_and_geography_columns_are_refused_wherever_they_nest(tmp_path):
    """A ``GEOMETRY`` or ``GEOGRAPHY`` (Spark 4.1+) at the top, in a struct, an array or a
    map's value (Spark's own Arrow schema of them, no JVM), for ``fanout validate`` and for
    a batch: delta-rs wrote the ``struct<srid, wkb>`` Spark's Arrow conversion makes of
    it. Engine ``spark`` is not checked."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import (
        ArrayType,
        GeographyType,
        GeometryType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
    )

    schema = to_arrow_schema(
        StructType([
            StructField("id", LongType()),
            StructField("g", GeometryType(0)),
            StructField("h", GeographyType(4326)),
            StructField("s", StructType([StructField("x", GeometryType(3857))])),
            StructField("a", ArrayType(GeographyType(4326))),
            StructField("m", MapType(StringType(), GeometryType(0))),
        ]),
        timezone="UTC",
    )  # fmt: skip
    sink = opened(tmp_path / "t")

    with pytest.raises(SchemaMismatchError) as info:
        sink.check_schema(schema)

    assert info.value.columns == ["g", "h", "s", "a", "m"]
    assert str(info.value) == f"sink 's': {GEO_REFUSED}"
    point = b"\x01\x01\x00\x00\x00" + bytes(8) + bytes(8)
    data = pa.table({"id": ids(1)}).append_column(
        schema.field("g"), pa.array([{"srid": 0, "wkb": point}], schema.field("g").type)
    )
    with pytest.raises(SchemaMismatchError) as written:
        sink.write(make_batch(data, batch_id=0))
    assert str(written.value) == (
        "sink 's', batch 0: column(s) 'g' hold a Spark GEOMETRY or GEOGRAPHY, which delta-rs "
        "cannot write as one (it would store struct<srid: int, wkb: binary>, which no reader "
        "takes for a geometry); write its WKB as binary in the query: "
        'F.st_asbinary(F.col("g")) (in a sink\'s select: ST_AsBinary(g) AS g) (and its SRID, '
        "ST_SRID, in a column of its own when it matters)"
    )
    assert not (tmp_path / "t").exists()
    # a struct<srid, wkb> Spark did not mark is an ordinary struct
    plain = pa.table({"id": ids(1), "g": pa.array([{"srid": 0, "wkb": point}])})
    sink.write(make_batch(plain, batch_id=0))
    assert rows(tmp_path / "t") == [{"id": 0, "g": {"srid": 0, "wkb": point}}]
    spark_sink = DeltaSink(name="s", path=str(tmp_path / "u"), engine="spark")
    spark_sink.resolved_engine = "spark"
    spark_sink.check_schema(schema)


@pytest.mark.integration
@pytest.mark.parametrize("write_from", ["driver", "executors"])
def test_a_spark_geometry_batch_is_refused_before_any_write(spark, tmp_path, write_from):
    """The same refusal for a real Spark batch (its own ``toArrow`` schema), on both of
    engine ``rs``'s write paths."""
    wkb = "X'0101000000000000000000F03F0000000000000040'"  # POINT (1 2)
    df = spark.sql(f"SELECT 1L AS id, ST_GeomFromWKB({wkb}) AS g")
    sink = opened(tmp_path / "t", write_from=write_from)

    with pytest.raises(SchemaMismatchError) as info:
        sink.write(make_batch_of(df))

    assert info.value.columns == ["g"]
    assert "'g' hold a Spark GEOMETRY or GEOGRAPHY" in str(info.value)
    assert not (tmp_path / "t").exists()


def test_bad_delta_options_fail_when_the_fanout_is_built(tmp_path: Path) -> None:
    from fanout import ConfigurationError, FanOut
    from fanout.ledger.memory import MemoryLedger

    with pytest.raises(ConfigurationError) as missing:
        FanOut("p", MemoryLedger(), [{"type": "delta", "name": "bronze"}])
    assert "sink 'bronze'" in str(missing.value) and "path" in str(missing.value)

    with pytest.raises(ConfigurationError) as misspelt:
        FanOut("p", MemoryLedger(), [{"type": "delta", "name": "bronze", "pth": str(tmp_path)}])
    message = str(misspelt.value)
    assert "sink 'bronze' (type 'delta')" in message and "'pth'" in message
    assert "valid options: path, mode, keys, order_by, engine" in message

    with pytest.raises(ConfigurationError) as keyless:
        FanOut(
            "p",
            MemoryLedger(),
            [{"type": "delta", "name": "latest", "path": str(tmp_path), "mode": "merge"}],
        )
    assert "sink 'latest'" in str(keyless.value) and "keys" in str(keyless.value)


def test_a_table_with_a_long_log_is_a_warning_naming_the_fix(tmp_path, monkeypatch, caplog):
    from fanout.delta_tables import retention

    path = tmp_path / "t"
    sink = opened(path)
    for batch in range(4):  # versions 0-3: four files in _delta_log
        sink.write(make_batch({"id": [batch]}, batch_id=batch))
    monkeypatch.setattr(retention, "LONG_LOG_FILES", 5)
    with caplog.at_level(logging.WARNING, logger="fanout_delta.sink"):
        opened(path)  # 4 files: below
    assert "_delta_log" not in caplog.text

    sink.write(make_batch({"id": [4]}, batch_id=4))
    with caplog.at_level(logging.WARNING, logger="fanout_delta.sink"):
        opened(path)
    (warning,) = [r.getMessage() for r in caplog.records if "_delta_log" in r.getMessage()]
    assert warning.startswith(f"Delta sink 's': the table {str(path)!r} keeps 5 files in its ")
    assert "delta.logRetentionDuration unset: Delta keeps 30 days" in warning
    assert "ALTER TABLE ... SET TBLPROPERTIES ('delta.logRetentionDuration' = " in warning


def test_only_a_log_on_disk_is_counted(tmp_path, monkeypatch):
    from fanout.delta_tables.retention import log_files_on_disk

    for table in (tmp_path, tmp_path / "s3:" / "bucket" / "table"):
        (table / "_delta_log").mkdir(parents=True)
        for version in range(3):
            (table / "_delta_log" / f"{version:020d}.json").write_text("{}")
    assert log_files_on_disk(str(tmp_path)) == 3
    assert log_files_on_disk(f"file://{tmp_path}") == 3
    assert log_files_on_disk(str(tmp_path / "missing")) is None
    # an object store is not listed, even where the URI reads as a local relative path
    monkeypatch.chdir(tmp_path)
    assert log_files_on_disk("s3://bucket/table") is None


def test_compact_every_takes_back_a_compaction_another_program_made_first(
    tmp_path, monkeypatch, caplog
):
    """Another program's OPTIMIZE of the same files commits between the sink's snapshot and
    its own OPTIMIZE: delta-rs commits both (each row twice); the sink takes its own back
    at once (architecture §4)."""
    from deltalake.table import TableOptimizer

    path = str(tmp_path / "t")
    real = TableOptimizer.compact
    racing = {"now": False}

    def compact(self, *args, **kwargs):
        if racing["now"]:
            racing["now"] = False
            real(DeltaTable(path).optimize)  # the other program's, first
        return real(self, *args, **kwargs)

    monkeypatch.setattr(TableOptimizer, "compact", compact)
    sink = opened(path, compact_every=3)
    sink.write(make_batch({"id": ids(1, 0)}, batch_id=0))
    sink.write(make_batch({"id": ids(1, 1)}, batch_id=1))
    racing["now"] = True
    with caplog.at_level(logging.WARNING):
        result = sink.write(make_batch({"id": ids(1, 2)}, batch_id=2))
    assert result.rows == 1
    assert [r["id"] for r in rows(path)] == [0, 1, 2]
    assert len(DeltaTable(path).file_uris()) == 1  # the other program's compacted file
    assert "raced another compaction" in caplog.text and "taken back" in caplog.text
    assert DeltaTable(path).transaction_version(APP_ID) == 2


@pytest.mark.parametrize("option", ["storage_options", "configuration"])
def test_a_mapping_option_given_as_a_string_is_named(option: str, tmp_path: Path) -> None:
    """dict() raised a bare ValueError ("dictionary update sequence element #0 has length
    1; 2 is required"), naming neither the sink nor the option."""

    with pytest.raises(ConfigurationError) as caught:
        DeltaSink("d", path=str(tmp_path / "t"), **{option: "AWS_REGION=eu-west-1"})
    assert str(caught.value) == (
        f"Delta sink 'd': option {option!r} must be a mapping of names to values, got str"
    )
