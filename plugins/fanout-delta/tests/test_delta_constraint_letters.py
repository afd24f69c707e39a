"""Rows a Delta table's constraints refuse (a CHECK constraint, a NOT NULL column or struct
field) are found in Spark before the write (:mod:`fanout_delta.constraints`): with a
dead-letter target they become dead letters naming the constraint and the rest of the
batch is written; without one the batch fails before anything is written, naming sink,
batch, constraint and the first refused row. A merge refuses only the rows that win their
key. Real Spark batches, real Delta tables read back through delta-rs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from arrow_batches import batch_of
from deltalake import DeltaTable, Field, Schema
from deltalake.schema import StructType
from fanout_delta import DeltaSink, rs_engine

from fanout.contract.sink import SinkContext
from fanout.deadletters.delta import DeltaDeadLetters
from fanout.delta_tables.io import read_delta
from fanout.errors import ConfigurationError, SinkWriteError

pytestmark = pytest.mark.integration

CHECK = (
    "breaks the Delta table's CHECK constraint x_pos (x > 0): the expression is false or "
    "null for the row"
)
NOT_NULL_Y = "null in the Delta table's NOT NULL column 'y'"
NOT_NULL_SA = "null in the Delta table's NOT NULL column 's.a'"
WHAT_TO_DO = (
    "Nothing was written and every replay fails alike: fix or filter those rows in the "
    "stream, or set the sink's option 'dead_letter' to set such rows aside"
)
SCHEMA = "id long, x long, y string, s struct<a: long, b: string>"


def constrained_table(path: Path, *, check: bool = True) -> None:
    """``id``, ``x`` (CHECK ``x > 0`` when ``check``), ``y`` NOT NULL, and a struct ``s``
    whose field ``a`` is NOT NULL; one row already in it."""
    DeltaTable.create(
        str(path),
        Schema(
            [
                Field("id", "long"),
                Field("x", "long"),
                Field("y", "string", nullable=False),
                Field("s", StructType([Field("a", "long", nullable=False), Field("b", "string")])),
            ]
        ),
    )
    if check:
        DeltaTable(str(path)).alter.add_constraint({"x_pos": "x > 0"})


def opened(path: Path, spark: Any, dead: Path | None = None, **options: Any) -> DeltaSink:
    sink = DeltaSink(name="s", path=str(path), **options)
    letters = DeltaDeadLetters(str(dead)) if dead is not None else None
    sink.open(SinkContext(pipeline="p", spark=spark, dead_letters=letters))
    return sink


def rows_of(path: Path) -> list[dict[str, Any]]:
    return sorted(read_delta(str(path)).to_pylist(), key=lambda r: r["id"])


def letters_of(dead: Path) -> list[tuple[int, str | None, dict[str, Any], str]]:
    """``(batch, column, row, reason)`` of each dead letter, by row id."""
    letters = [
        (r["batch_id"], r["column"], json.loads(r["row"]), r["reason"])
        for r in read_delta(str(dead)).to_pylist()
    ]
    assert all(r["source"] == "refused" for r in read_delta(str(dead)).to_pylist())
    return sorted(letters, key=lambda letter: (letter[0], letter[2]["id"] or 0))


def mixed_batch(spark: Any) -> Any:
    """Rows 1 and 6 fit; 2 breaks the CHECK, 3 too (``x`` null: the CHECK is null), 4 has a
    null ``y``, 5 a null ``s.a``, 7 a null ``s`` (so a null ``s.a`` too)."""
    return spark.createDataFrame(
        [
            (1, 5, "a", (1, "p")),
            (2, -1, "b", (2, "q")),
            (3, None, "c", (3, "r")),
            (4, 6, None, (4, "s")),
            (5, 7, "e", (None, "t")),
            (6, 8, "f", (6, None)),
            (7, 9, "g", None),
        ],
        SCHEMA,
    )


def row(i: int, x: Any, y: Any, s: Any) -> dict[str, Any]:
    return {"id": i, "x": x, "y": y, "s": s}


EXPECTED_LETTERS = [
    (0, None, row(2, -1, "b", {"a": 2, "b": "q"}), CHECK),
    (0, None, row(3, None, "c", {"a": 3, "b": "r"}), CHECK),
    (0, "y", row(4, 6, None, {"a": 4, "b": "s"}), NOT_NULL_Y),
    (0, "s.a", row(5, 7, "e", {"a": None, "b": "t"}), NOT_NULL_SA),
    (0, "s.a", row(7, 9, "g", None), NOT_NULL_SA),
]


def test_an_append_sets_rows_breaking_the_constraints_aside(spark, tmp_path):
    path, dead = tmp_path / "t", tmp_path / "dead"
    constrained_table(path)
    sink = opened(path, spark, dead, write_from="driver")

    result = sink.write(batch_of(mixed_batch(spark)))
    again = sink.write(batch_of(mixed_batch(spark)))  # a replay: skipped, no letter twice

    assert (result.rows, result.dead_lettered, result.already_written) == (2, 5, False)
    assert (again.dead_lettered, again.already_written) == (5, True)
    assert rows_of(path) == [
        row(1, 5, "a", {"a": 1, "b": "p"}),
        row(6, 8, "f", {"a": 6, "b": None}),
    ]
    assert letters_of(dead) == EXPECTED_LETTERS


@pytest.mark.parametrize("write_from", ["driver", "executors"])
def test_an_append_sets_rows_breaking_not_null_aside_from_either_writer(
    spark, tmp_path, write_from
):
    """A table with NOT NULL columns only: the executors' writer writes it (a CHECK
    constraint sends the append to the driver's writer), and sets the same rows aside."""
    path, dead = tmp_path / "t", tmp_path / "dead"
    constrained_table(path, check=False)
    sink = opened(path, spark, dead, write_from=write_from)

    result = sink.write(batch_of(mixed_batch(spark)))

    assert (result.rows, result.dead_lettered) == (4, 3)
    assert result.details.get("write_from") == ("executors" if write_from == "executors" else None)
    assert [r["id"] for r in rows_of(path)] == [1, 2, 3, 6]
    assert letters_of(dead) == [letter for letter in EXPECTED_LETTERS if letter[3] != CHECK]


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"write_from": "driver"}, id="append-driver"),
        pytest.param({"write_from": "executors"}, id="append-executors"),
        pytest.param({"mode": "merge", "keys": ["id"]}, id="merge"),
    ],
)
def test_without_a_dead_letter_target_the_batch_fails_naming_the_constraint_and_row(
    spark, tmp_path, options
):
    path = tmp_path / "t"
    constrained_table(path, check=False)
    DeltaTable(str(path)).alter.add_constraint({"x_pos": "x > 0"})
    sink = opened(path, spark, **options)
    df = spark.createDataFrame(
        [(1, 5, "a", (1, "p")), (2, -1, "b", (2, "q")), (3, -3, "c", (3, "r"))], SCHEMA
    )

    with pytest.raises(SinkWriteError) as refused:
        sink.write(batch_of(df))

    assert str(refused.value) == (
        f"sink 's', batch 0: 2 row(s) break the constraints of the Delta table {path}. "
        'First refused row {"id": 2, "x": -1, "y": "b", "s": {"a": 2, "b": "q"}}: '
        f"{CHECK}. {WHAT_TO_DO}"
    )
    assert rows_of(path) == []


def test_a_merge_refuses_only_the_rows_winning_their_key(spark, tmp_path):
    """Key 1's winner (``v`` 2) breaks the CHECK: a dead letter, key 1 keeps its old row.
    Key 2's refused row loses to a fitting one: superseded, no letter. Key 3 has a null
    key and a null ``y``: the null key counts first."""
    path, dead = tmp_path / "t", tmp_path / "dead"
    DeltaTable.create(
        str(path),
        Schema([Field("id", "long"), Field("v", "long"), Field("x", "long"),
                Field("y", "string", nullable=False)]),
    )  # fmt: skip
    DeltaTable(str(path)).alter.add_constraint({"x_pos": "x > 0"})
    sink = opened(path, spark, dead, mode="merge", keys=["id"], order_by=["v"])
    sink.write(
        batch_of(spark.createDataFrame([(1, 0, 10, "old")], "id long, v long, x long, y string"), 0)
    )

    df = spark.createDataFrame(
        [(1, 1, 11, "a"), (1, 2, -1, "b"), (2, 1, -2, "c"), (2, 2, 22, "d"), (None, 1, 5, None)],
        "id long, v long, x long, y string",
    )
    result = sink.write(batch_of(df, 1))

    assert (result.rows, result.dead_lettered) == (1, 2)
    assert rows_of(path) == [
        {"id": 1, "v": 0, "x": 10, "y": "old"},
        {"id": 2, "v": 2, "x": 22, "y": "d"},
    ]
    null_key = "null in key column 'id': a null key cannot be merged"
    assert letters_of(dead) == [
        (1, "id", {"id": None, "v": 1, "x": 5, "y": None}, null_key),
        (1, None, {"id": 1, "v": 2, "x": -1, "y": "b"}, CHECK),
    ]


def test_a_merge_sets_aside_a_refused_winner_holding_a_nan(spark, tmp_path):
    """A refused winner is found among the winners by its whole row: a NaN in it is equal
    to itself there (Python's ``==`` says no, the row stayed a winner, and delta-rs failed
    the whole batch on it, every replay)."""
    path, dead = tmp_path / "t", tmp_path / "dead"
    DeltaTable.create(
        str(path), Schema([Field("id", "long"), Field("f", "double"), Field("x", "long")])
    )
    DeltaTable(str(path)).alter.add_constraint({"x_pos": "x > 0"})
    sink = opened(path, spark, dead, mode="merge", keys=["id"])
    df = spark.createDataFrame(
        [(1, float("nan"), -1), (2, float("nan"), 2)], "id long, f double, x long"
    )

    result = sink.write(batch_of(df))

    assert (result.rows, result.dead_lettered) == (1, 1)
    assert [(r["id"], r["x"]) for r in rows_of(path)] == [(2, 2)]
    assert [(r["row"], r["reason"]) for r in read_delta(str(dead)).to_pylist()] == [
        ('{"id": 1, "f": "NaN", "x": -1}', CHECK)
    ]


def _letters_kept_then_killed_before_the_commit(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, Path]:
    """The constrained table (and its dead-letter table) after a driver wrote the mixed
    batch's letters and died before its commit: the table's and the letters' paths."""
    path, dead = tmp_path / "t", tmp_path / "dead"
    constrained_table(path)
    sink = opened(path, spark, dead, write_from="driver")

    def crash(*args: Any, **kwargs: Any) -> Any:
        raise SystemExit("driver killed before the commit")

    with monkeypatch.context() as patched:
        patched.setattr(rs_engine, "_commit", crash)
        with pytest.raises(SystemExit):
            sink.write(batch_of(mixed_batch(spark)))
    return path, dead


def test_a_replay_after_a_crash_before_the_commit_writes_no_letter_twice(
    spark, tmp_path, monkeypatch
):
    """The letters are written before the data; the driver dies before its commit. The
    replay finds the same rows refused, writes the letters no more, and commits the rest."""
    path, dead = _letters_kept_then_killed_before_the_commit(spark, tmp_path, monkeypatch)
    assert rows_of(path) == []
    assert letters_of(dead) == EXPECTED_LETTERS

    replayed = opened(path, spark, dead, write_from="driver")  # a new driver
    result = replayed.write(batch_of(mixed_batch(spark)))

    assert (result.rows, result.dead_lettered, result.already_written) == (2, 5, False)
    assert [r["id"] for r in rows_of(path)] == [1, 6]
    assert letters_of(dead) == EXPECTED_LETTERS


def test_open_refuses_a_check_constraint_spark_cannot_evaluate(spark, tmp_path):
    """delta-rs takes ``to_hex`` (a DataFusion function), which Spark does not have."""
    path = tmp_path / "t"
    constrained_table(path, check=False)
    DeltaTable(str(path)).alter.add_constraint({"hexed": "to_hex(x) <> ''"})

    with pytest.raises(ConfigurationError) as refused:
        opened(path, spark)

    message = str(refused.value)
    assert message.startswith(
        "Delta sink 's': the table's CHECK hexed (to_hex(x) != '') cannot be evaluated by "
        "Spark on the table's columns, so the sink cannot tell which rows it refuses: "
    ), message
    assert "to_hex" in message.split("refuses: ", 1)[1]
    assert message.endswith(
        "Fix or drop the constraint (ALTER TABLE ... DROP CONSTRAINT) before starting the pipeline"
    )


def test_a_constraint_added_between_a_crash_and_the_replay_fails_the_replay(
    spark, tmp_path, monkeypatch
):
    """The first attempt kept its letters and died before its commit; a constraint added
    then refuses row 6 too. The target skips the replay's letters as the batch's, so
    writing would lose row 6: the replay fails naming the change, nothing written. With
    the constraint dropped again, the replay writes what the first attempt decided."""
    path, dead = _letters_kept_then_killed_before_the_commit(spark, tmp_path, monkeypatch)
    DeltaTable(str(path)).alter.add_constraint({"x_small": "x < 8"})

    with pytest.raises(SinkWriteError) as refused:
        opened(path, spark, dead, write_from="driver").write(batch_of(mixed_batch(spark)))

    assert str(refused.value) == (
        f"sink 's', batch 0: this attempt refuses 6 row(s), but the Delta table {dead} keeps "
        "5 dead letter(s) of the batch from an earlier attempt: the constraints of the "
        f"Delta table {path} changed in between (now: CHECK x_pos (x > 0), CHECK x_small "
        "(x < 8), NOT NULL 'y', NOT NULL 's.a'). Nothing of the batch was written: writing "
        "it would leave rows only one of the two refuses in neither place or in both. "
        "Restore the constraints the batch first ran under until it completes, then "
        "change them"
    )
    assert rows_of(path) == []
    assert letters_of(dead) == EXPECTED_LETTERS

    DeltaTable(str(path)).alter.drop_constraint("x_small")
    result = opened(path, spark, dead, write_from="driver").write(batch_of(mixed_batch(spark)))
    assert (result.rows, result.dead_lettered) == (2, 5)
    assert [r["id"] for r in rows_of(path)] == [1, 6]
    assert letters_of(dead) == EXPECTED_LETTERS


def test_an_append_lacking_a_column_a_check_reads_is_checked_with_it_null(spark, tmp_path):
    """The append pads the table's nullable ``x`` with nulls, so the CHECKs read it null:
    ``x IS NULL OR x > 0`` takes the row, ``x > 0`` refuses it."""
    df = spark.createDataFrame(
        [(1, "a", (1, "p"))], "id long, y string, s struct<a: long, b: string>"
    )
    for name, check in (("takes", "x IS NULL OR x > 0"), ("refuses", "x > 0")):
        constrained_table(tmp_path / name, check=False)
        DeltaTable(str(tmp_path / name)).alter.add_constraint({"x_pos": check})
    takes = opened(tmp_path / "takes", spark, tmp_path / "dead", write_from="driver")
    refuses = opened(tmp_path / "refuses", spark, tmp_path / "dead", write_from="driver")

    taken, refused = takes.write(batch_of(df, 0)), refuses.write(batch_of(df, 1))

    assert (taken.rows, taken.dead_lettered, refused.rows, refused.dead_lettered) == (1, 0, 0, 1)
    assert rows_of(tmp_path / "takes") == [row(1, None, "a", {"a": 1, "b": "p"})]
    assert rows_of(tmp_path / "refuses") == []
    assert letters_of(tmp_path / "dead") == [
        (1, None, {"id": 1, "y": "a", "s": {"a": 1, "b": "p"}}, CHECK)
    ]


def test_a_shared_job_member_checks_not_null_first_or_writes_alone(spark, tmp_path):
    """In a job shared with other sinks (:func:`fanout_delta.rs_executors.shared_append`):
    without a dead-letter target a null in a NOT NULL column fails the batch before the
    job, as the sink's own job does; with one the append writes alone, setting it aside."""
    path, dead = tmp_path / "t", tmp_path / "dead"
    constrained_table(path, check=False)
    df = spark.createDataFrame([(1, 5, "a", (1, "p")), (2, 6, None, (2, "q"))], SCHEMA)
    alone = opened(path, spark, write_from="executors")
    assert alone.shares_tasks()

    with pytest.raises(SinkWriteError) as refused:
        alone.shared_write(batch_of(df))
    assert str(refused.value) == (
        f"sink 's', batch 0: 1 row(s) break the constraints of the Delta table {path}. "
        'First refused row {"id": 2, "x": 6, "y": null, "s": {"a": 2, "b": "q"}}: '
        f"{NOT_NULL_Y}. {WHAT_TO_DO}"
    )

    shared = opened(path, spark, dead, write_from="executors").shared_write(batch_of(df))
    assert shared.task is None  # written alone: its own job filters the refused rows out
    result = shared.alone()
    assert (result.rows, result.dead_lettered) == (1, 1)
    assert [r["id"] for r in rows_of(path)] == [1]
    assert letters_of(dead) == [(0, "y", row(2, 6, None, {"a": 2, "b": "q"}), NOT_NULL_Y)]


def test_not_null_fields_spark_declares_non_nullable_cost_no_check():
    """A NOT NULL field the batch's Spark schema declares non-nullable at every level of
    its path holds no null, so no rule (no Spark job) is made for it; a nullable field,
    or a non-nullable field under a nullable struct, keeps its rule. Every CHECK stays."""
    from fanout_delta.constraints import Rule, TableConstraints
    from pyspark.sql.types import LongType, StructField, StructType

    def not_null(*path: str) -> Rule:
        return Rule("not_null", ".".join(path), path=path)

    rules = TableConstraints((
        Rule("check", "x_pos", "x > 0"), not_null("id"), not_null("x"), not_null("s", "a"),
        not_null("t", "a"), not_null("absent"),
    ))  # fmt: skip
    inner = StructType([StructField("a", LongType(), nullable=False)])
    schema = StructType([
        StructField("id", LongType(), nullable=False), StructField("x", LongType()),
        StructField("s", inner, nullable=True), StructField("t", inner, nullable=False),
    ])  # fmt: skip

    assert [r.name for r in rules.on(schema)] == ["x_pos", "x", "s.a"]
