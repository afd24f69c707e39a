"""The Delta append as a member of a shared job, without Spark: the driver prepares it
(:func:`fanout_delta.rs_executors.shared_append`), each task's part writes files of its own
(here called by hand, as a shared task would, one call per partition), and the driver
commits every file once with the batch's app transaction, or nothing when a task failed."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltacheck import ids
from fanout_delta import DeltaSink
from fanout_delta.rs_executors import TaskFiles, shared_append

from fanout.contract.batch import Batch, BatchInfo
from fanout.contract.sink import SinkContext
from fanout.errors import TransientSinkError
from fanout.testing.faults import VetoOnce


def _batch(batch_id: int, start: int, rows: int) -> Batch:
    ids = list(range(start, start + rows))
    table = pa.table({"id": pa.array(ids, pa.int64()), "v": [f"v{i}" for i in ids]})
    return Batch(df=table, info=BatchInfo(pipeline="p", batch_id=batch_id), sink_name="lake",
                 txn_app_id="app-lake")  # fmt: skip


class Frame:
    """A batch DataFrame as the driver-side writer reads it (``toArrow``)."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def toArrow(self) -> pa.Table:
        return self.table


def _sink(path: Path, plugins: tuple[object, ...] = ()) -> DeltaSink:
    sink = DeltaSink(name="lake", path=str(path))
    sink.open(SinkContext(pipeline="p", plugins=plugins))
    return sink


def _tasks(sink: DeltaSink, batch: Batch, partitions: int = 2) -> tuple[object, list[str]]:
    """What a shared job would do: each partition's task writes its share of the rows."""
    shared = shared_append(sink.target(), batch)
    assert shared is not None and shared.task is not None and shared.shape == "any"
    table = batch.df
    size = -(-table.num_rows // partitions)
    texts = [
        shared.task.run(p, iter(table.slice(p * size, size).to_batches()))
        for p in range(partitions)
    ]
    return shared, texts


def test_each_task_writes_its_files_and_the_driver_commits_them_once(tmp_path: Path) -> None:
    sink, lake = _sink(tmp_path / "lake"), tmp_path / "lake"
    for batch_id in range(2):
        shared, texts = _tasks(sink, _batch(batch_id, batch_id * 10, 10))
        files = [TaskFiles.from_json(t) for t in texts]
        assert [(f.partition, sum(d.rows for d in f.files), f.error) for f in files] == [
            (0, 5, None), (1, 5, None),
        ]  # fmt: skip
        result = shared.finish(texts)  # type: ignore[attr-defined]
        assert (result.rows, result.details["files"], result.details["version"]) == (
            10, 2, batch_id,
        )  # fmt: skip
    assert ids(lake) == list(range(20))
    # the batch is in the table: a replay is not shared, the sink's own write skips it
    assert shared_append(sink.target(), _batch(1, 10, 10)) is None
    replay = _batch(1, 10, 10)
    assert sink.write(Batch(Frame(replay.df), replay.info, "lake", "app-lake")).already_written


def test_a_task_vetoed_before_its_files_are_handed_over_commits_nothing(tmp_path: Path) -> None:
    veto = VetoOnce(batch=0, partition=1, state=str(tmp_path / "veto.json"), sink="lake")
    sink, lake = _sink(tmp_path / "lake", (veto,)), tmp_path / "lake"
    shared, texts = _tasks(sink, _batch(0, 0, 10))
    failed = TaskFiles.from_json(texts[1])
    assert (failed.partition, failed.files, failed.transient) == (1, (), True)
    assert "injected veto before commit" in (failed.error or "")
    with pytest.raises(TransientSinkError, match=r"p1: TransientSinkError.*injected veto"):
        shared.finish(texts)  # type: ignore[attr-defined]
    assert not (lake / "_delta_log").exists()  # partition 0's file is written, unreferenced
    shared, texts = _tasks(sink, _batch(0, 0, 10))  # the replay: the veto was once
    assert shared.finish(texts).rows == 10  # type: ignore[attr-defined]
    assert ids(lake) == list(range(10))


def test_a_delta_append_shares_tasks_only_where_the_executors_may_write(tmp_path: Path) -> None:
    opened = _sink(tmp_path / "a")  # no Spark session to ask: written from the driver
    assert (opened.shares_tasks(), opened.batch_partitioning(None)) == (False, None)
    executors = DeltaSink(name="e", path=str(tmp_path / "e"), write_from="executors")
    executors.open(SinkContext(pipeline="p"))
    assert executors.shares_tasks()
    assert executors.batch_partitioning(None).partitions == 0  # ANY_PARTITIONING
    for options in ({"mode": "merge", "keys": ["id"]}, {"write_from": "driver"}):
        other = DeltaSink(name="o", path=str(tmp_path / "o"), **options)  # type: ignore[arg-type]
        other.open(SinkContext(pipeline="p"))
        assert not other.shares_tasks(), options


def test_the_shared_prepare_opens_no_table_after_the_first_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fanout.delta_tables import io

    sink, lake = _sink(tmp_path / "lake"), tmp_path / "lake"
    shared, texts = _tasks(sink, _batch(0, 0, 4))
    shared.finish(texts)  # type: ignore[attr-defined]
    opened: list[str] = []
    real = io.open_table

    def counting(path: str, *args: object, **kwargs: object) -> object:
        opened.append(path)
        return real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(io, "open_table", counting)
    shared, texts = _tasks(sink, _batch(1, 4, 4))
    # checked and committed on the snapshot the last batch ended on, brought up to date
    assert opened == []
    result = shared.finish(texts)  # type: ignore[attr-defined]
    assert (result.rows, result.details["version"]) == (4, 1)
    assert ids(lake) == list(range(8))
