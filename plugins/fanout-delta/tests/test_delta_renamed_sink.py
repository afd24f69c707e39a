"""A Delta sink renamed between a crash and its replay (docs/architecture.md §8.1, "A sink
renamed mid-batch").

The sink's name keys its ledger marks and its app transaction (``fanout/<pipeline>/<sink>``).
Killed after the sink committed batch N and before its mark, then restarted with the sink
renamed (same table): the new name has no mark and no transaction in the table, so the
replay of N wrote N's rows into the table a second time, silently. The sink now refuses
that write, naming the old sink, the batch and what to do, and writes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fanout import BatchFailedError, BatchInfo, FanOut
from fanout.delta_tables.io import read_delta
from fanout.testing.faults import MarkLost

PLANNED = 1_700_000_000_000  # Spark's batchTimestampMs: a replay keeps it


def _info(batch_id: int) -> BatchInfo:
    return BatchInfo("ren", batch_id, "q", batch_timestamp_ms=PLANNED + batch_id)


def _sinks(tmp_path: Path, name: str, **options: Any) -> list[dict[str, Any]]:
    return [
        {"type": "delta", "name": "keep", "path": str(tmp_path / "keep")},
        {"type": "delta", "name": name, "path": str(tmp_path / "table"), **options},
    ]


def _ids(path: Path) -> list[int]:
    return sorted(r["id"] for r in read_delta(str(path)).to_pylist())


def _crash_after_write(spark: Any, tmp_path: Path, name: str, **options: Any) -> None:
    """Batch 1 written to ``name``'s table and not marked (the kill)."""
    lost = FanOut("ren", MarkLost(str(tmp_path / "ledger"), name),
                  _sinks(tmp_path, name, **options), retries=0, spark=spark)  # fmt: skip
    with pytest.raises(BatchFailedError):
        lost.process(spark.range(3, 6), _info(1))
    lost.close()
    assert _ids(tmp_path / "table") == [3, 4, 5]


@pytest.mark.parametrize("write_from", ["driver", "executors"])
def test_a_sink_renamed_between_a_crash_and_its_replay_is_refused_not_written_twice(
    spark: Any, tmp_path: Path, write_from: str
) -> None:
    _crash_after_write(spark, tmp_path, "old", write_from=write_from)

    sinks = _sinks(tmp_path, "new", write_from=write_from)
    renamed = FanOut("ren", str(tmp_path / "ledger"), sinks, retries=0, spark=spark)
    with pytest.raises(BatchFailedError) as refused:
        renamed.process(spark.range(3, 6), _info(1))
    assert set(refused.value.failures) == {"new"}
    text = str(refused.value.failures["new"])
    assert "batch 1 of sink 'old'" in text and "'fanout/ren/old'" in text
    assert "rename the sink back to 'old'" in text
    assert _ids(tmp_path / "table") == [3, 4, 5]  # before: [3, 3, 4, 4, 5, 5]
    assert _ids(tmp_path / "keep") == [3, 4, 5]
    renamed.close()
    if write_from == "executors":
        return  # the way out, below, is the driver's path again: tested once

    # the way out it names: the old name completes the batch (skipped: the table holds it)
    back = FanOut(
        "ren", str(tmp_path / "ledger"), _sinks(tmp_path, "old", write_from=write_from), spark=spark
    )
    assert back.process(spark.range(3, 6), _info(1))["old"].already_written is True
    back.close()
    # then renamed: the new name starts after the old one's last batch, no refusal
    after = FanOut(
        "ren", str(tmp_path / "ledger"), _sinks(tmp_path, "new", write_from=write_from), spark=spark
    )
    after.process(spark.range(6, 8), _info(2))
    after.close()
    assert _ids(tmp_path / "table") == [3, 4, 5, 6, 7]


def test_a_renamed_merge_without_dead_letters_writes_the_batch_again_harmlessly(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A merge by key leaves each key's last row whatever it merges twice: written, said."""
    _crash_after_write(spark, tmp_path, "old", mode="merge", keys=["id"])
    renamed = FanOut("ren", str(tmp_path / "ledger"),
                     _sinks(tmp_path, "new", mode="merge", keys=["id"]), spark=spark)  # fmt: skip
    assert renamed.process(spark.range(3, 6), _info(1))["new"].rows == 3
    renamed.close()
    assert _ids(tmp_path / "table") == [3, 4, 5]
    assert "holds batch 1 of sink 'old'" in caplog.text


def test_two_sinks_of_the_pipeline_on_one_table_are_not_refused(spark: Any, tmp_path: Path) -> None:
    """A sink added beside one still configured that writes the same table (another route)
    is no rename: its first batch is written, though the other sink wrote that batch."""
    table = str(tmp_path / "table")
    first = [{"type": "delta", "name": "even", "path": table, "where": "id % 2 = 0"}]
    fan = FanOut("ren", str(tmp_path / "ledger"), first, spark=spark)
    fan.process(spark.range(0, 4), _info(0))
    fan.close()
    both = [*first, {"type": "delta", "name": "odd", "path": table, "where": "id % 2 = 1"}]
    fan = FanOut("ren", str(tmp_path / "ledger"), both, spark=spark, parallelism=1)
    fan.process(spark.range(4, 8), _info(1))
    fan.close()
    assert _ids(tmp_path / "table") == [0, 2, 4, 5, 6, 7]


@pytest.mark.parametrize("write_from", ["driver", "executors"])
def test_a_renamed_sink_is_refused_when_the_batch_recorded_no_plan(
    spark: Any, tmp_path: Path, write_from: str
) -> None:
    """A batch without Spark's planning time (``FanOut.process`` given a ``BatchInfo``
    without it, a foreachBatch whose checkpoint offsets cannot be read, a catch-up of a
    batch spooled so, a backfill from a mark without it) commits no plan metadata: the
    renamed sink's check finds the old sink's commit by its ``txn`` action instead."""
    options = {"write_from": write_from}
    bare = BatchInfo("ren", 1, "q")  # batch_timestamp_ms None: no userMetadata committed
    lost = FanOut("ren", MarkLost(str(tmp_path / "ledger"), "old"),
                  _sinks(tmp_path, "old", **options), retries=0, spark=spark)  # fmt: skip
    with pytest.raises(BatchFailedError):
        lost.process(spark.range(10, 13), bare)
    lost.close()
    assert _ids(tmp_path / "table") == [10, 11, 12]

    renamed = FanOut("ren", str(tmp_path / "ledger"), _sinks(tmp_path, "new", **options),
                     retries=0, spark=spark)  # fmt: skip
    with pytest.raises(BatchFailedError) as refused:
        renamed.process(spark.range(10, 13), bare)
    renamed.close()
    assert set(refused.value.failures) == {"new"}
    text = str(refused.value.failures["new"])
    assert "batch 1 of sink 'old'" in text and "'fanout/ren/old'" in text
    assert _ids(tmp_path / "table") == [10, 11, 12]  # bc30380: [10, 10, 11, 11, 12, 12]
    assert _ids(tmp_path / "keep") == [10, 11, 12]


@pytest.mark.parametrize("planned", [True, False], ids=["plan", "no-plan"])
def test_the_restore_way_out_the_refusal_names_lets_the_new_name_write(
    spark: Any, tmp_path: Path, planned: bool
) -> None:
    """The refusal's third way on: restore the table to before the old sink's commit (the
    batch's rows out); the new name then writes the batch, once."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    table = tmp_path / "table"
    write_deltalake(str(table), pa.table({"id": pa.array([1], pa.int64())}))  # another writer
    info = _info(1) if planned else BatchInfo("ren", 1, "q")
    lost = FanOut("ren", MarkLost(str(tmp_path / "ledger"), "old"),
                  _sinks(tmp_path, "old"), retries=0, spark=spark)  # fmt: skip
    with pytest.raises(BatchFailedError):
        lost.process(spark.range(3, 6), info)
    lost.close()
    renamed = FanOut("ren", str(tmp_path / "ledger"), _sinks(tmp_path, "new"), retries=0,
                     spark=spark)  # fmt: skip
    with pytest.raises(BatchFailedError) as refused:
        renamed.process(spark.range(3, 6), info)
    assert "restore the table to version 0 (the batch's rows out; delta-rs: " in str(
        refused.value.failures["new"]
    )
    assert _ids(table) == [1, 3, 4, 5]
    DeltaTable(str(table)).restore(0)  # as the refusal says
    assert _ids(table) == [1]
    renamed.process(spark.range(3, 6), info)  # bc30380: refused again, for ever
    renamed.close()
    assert _ids(table) == [1, 3, 4, 5]


def test_the_way_out_of_a_table_the_old_sinks_batch_created_is_deleting_it(
    spark: Any, tmp_path: Path
) -> None:
    """The old sink's batch created the table (version 0): there is no version before it to
    restore (bb398bc offered "restore the table to before version 0"), so the refusal offers
    deleting the table, and the new name, restarted, creates it with the batch, once."""
    import shutil

    _crash_after_write(spark, tmp_path, "old")
    renamed = FanOut("ren", str(tmp_path / "ledger"), _sinks(tmp_path, "new"), retries=0,
                     spark=spark)  # fmt: skip
    with pytest.raises(BatchFailedError) as refused:
        renamed.process(spark.range(3, 6), _info(1))
    text = str(refused.value.failures["new"])
    assert "version 0" in text and "before version 0" not in text
    assert text.endswith(
        "; or to have the batch written under the new name, delete the table (its directory, "
        "_delta_log included: the batch's commit, version 0, created it, so there is no "
        "version before it to restore) and restart"
    )
    shutil.rmtree(tmp_path / "table")  # as the refusal says
    renamed.process(spark.range(3, 6), _info(1))
    renamed.close()
    assert _ids(tmp_path / "table") == [3, 4, 5]
    assert _ids(tmp_path / "keep") == [3, 4, 5]


def test_no_delete_way_when_later_versions_hold_another_sinks_marked_batch(
    spark: Any, tmp_path: Path
) -> None:
    """The old sink's batch created the table (version 0) and another sink of the pipeline
    on the same table (another route) committed its part of the batch after it, version 1,
    marked. bc8f54b offered deleting the table "and with it the rows of its versions 1-1:
    write those again yourself": followed, the restart was refused for 'odd' (the ledger
    marks its batch 1 written to a table no longer holding it), whose ways on were a restore
    (of a deleted table) or accepting the loss of ids 1 and 3. The refusal now offers no
    removal there, and names why; renaming back, the first way, loses nothing."""
    table = str(tmp_path / "table")

    def sinks(name: str) -> list[dict[str, Any]]:
        return [
            {"type": "delta", "name": name, "path": table, "where": "id % 2 = 0"},
            {"type": "delta", "name": "odd", "path": table, "where": "id % 2 = 1"},
        ]

    def fan(name: str, ledger: Any = None) -> FanOut:
        return FanOut("ren", ledger or str(tmp_path / "ledger"), sinks(name), retries=0,
                      spark=spark, parallelism=1)  # fmt: skip

    lost = fan("old", MarkLost(str(tmp_path / "ledger"), "old"))
    with pytest.raises(BatchFailedError):
        lost.process(spark.range(0, 4), _info(1))
    lost.close()
    assert _ids(tmp_path / "table") == [0, 1, 2, 3]  # version 0: 'old' [0, 2]; 1: 'odd'
    renamed = fan("new")
    with pytest.raises(BatchFailedError) as refused:
        renamed.process(spark.range(0, 4), _info(1))
    renamed.close()
    assert set(refused.value.failures) == {"new"}
    text = str(refused.value.failures["new"])
    assert "delete the table" not in text and "restore the table" not in text
    assert text.endswith(
        "rename it once batch 1 is marked (the new name then starts after it). Taking the "
        "batch's commit (version 0) out of the table, by deleting the table, is no way on "
        "here: its versions 1-1 would go with it (other sinks' marked batches, another "
        "writer's rows), which nothing writes again"
    )
    back = fan("old")  # the first way, as printed
    back.process(spark.range(0, 4), _info(1))
    back.close()
    assert _ids(tmp_path / "table") == [0, 1, 2, 3]


def test_the_refusal_names_the_old_sinks_commit_when_another_writer_commits_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No Spark. delta-rs (1.6) numbers the history from the snapshot's version: another
    pipeline's commit to the table after the renamed sink loaded its snapshot numbered the
    old sink's commit one lower, and the refusal named version 0 (the table's creation by
    another writer), its way out "restore the table to before version 0". (A commit
    without a plan just above the old sink's hid it: its txn actions were read from the
    log file of the version it was numbered, the old sink's.)"""
    import pyarrow as pa
    from arrow_batches import FakeFrame
    from deltalake import CommitProperties, DeltaTable, write_deltalake
    from fanout_delta import DeltaSink
    from fanout_delta.plans import CommitPlan

    from fanout.contract.batch import Batch, txn_app_id
    from fanout.contract.sink import SinkContext
    from fanout.errors import RenamedSinkError

    table = tmp_path / "table"
    write_deltalake(str(table), pa.table({"id": pa.array([1], pa.int64())}))  # version 0

    def written_by(name: str) -> tuple[DeltaSink, Batch]:
        sink = DeltaSink(name=name, path=str(table))
        sink.open(SinkContext(pipeline="ren", sinks=(name,)))
        rows = FakeFrame(pa.table({"id": pa.array([3, 4, 5], pa.int64())}))
        return sink, Batch(rows, _info(1), name, txn_app_id("ren", name))

    old, batch = written_by("old")
    old.write(batch)  # version 1; its mark lost
    new, batch = written_by("new")
    history = DeltaTable.history

    other = CommitPlan(txn_app_id("other", "s"), 5, PLANNED).text()  # another pipeline's
    properties = CommitProperties(custom_metadata={"userMetadata": other})

    def racing(inner: DeltaTable, limit: int | None = None) -> list[dict[str, Any]]:
        if DeltaTable(str(table)).version() == 1:  # once: version 2, after the snapshot
            write_deltalake(str(table), pa.table({"id": pa.array([900], pa.int64())}),
                            mode="append", commit_properties=properties)  # fmt: skip
        return history(inner, limit)

    monkeypatch.setattr(DeltaTable, "history", racing)
    with pytest.raises(RenamedSinkError) as refused:
        new.write(batch)

    text = str(refused.value)
    assert "table version 1)" in text  # bb398bc: "table version 0)"
    assert "restore the table" not in text  # version 2, another writer's, would go with it
    assert text.endswith(
        "Taking the batch's commit (version 1) out of the table, by a RESTORE to before it, "
        "is no way on here: its versions 2-2 would go with it (other sinks' marked batches, "
        "another writer's rows), which nothing writes again"
    )  # the merge of this test and of that rule: the snapshot's version offered RESTORE to 0
    assert _ids(table) == [1, 3, 4, 5, 900]
