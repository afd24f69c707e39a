"""A batch the Delta table already holds under another plan is refused, not skipped
(docs/architecture.md §8.1, :mod:`fanout_delta.plans`): no Spark, real delta-rs tables.

The sequence: the sink commits batch 3, the driver dies before the ledger marks it, the
checkpoint loses ``offsets/3`` and Spark plans batch 3 again with more input (a new
``batchTimestampMs``). Skipping by the app transaction would lose the rows past the first
plan; the sink raises :class:`fanout.CheckpointRollbackError` instead. A true replay (the
same planning time) still skips, and so does every case that gives no evidence.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from arrow_batches import FakeFrame, opened
from deltacheck import ids
from deltalake import DeltaTable, write_deltalake
from fanout_delta import DeltaSink, plans
from fanout_delta.spark_engine import write_spark

from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.plans import planned_at
from fanout.delta_tables import io as deltaio
from fanout.delta_tables.io import read_delta
from fanout.errors import CheckpointRollbackError

APP_ID = txn_app_id("p", "s")
FIRST = 1_800_000_000_000  # batch 3 as first planned
AGAIN = FIRST + 61_000  # batch 3 planned again after the rollback
OFFSETS_FIRST = [{"logOffset": 3}]
OFFSETS_AGAIN = [{"logOffset": 4}]


def batch(
    batch_id: int,
    ids: range,
    planned: int | None,
    offsets: list[Any] | None = None,
) -> Batch:
    data = pa.table({"id": pa.array(ids, pa.int64()), "v": [f"v{i}" for i in ids]})
    info = BatchInfo("p", batch_id, "q-1", offsets, 0, planned)
    return Batch(df=FakeFrame(data), info=info, sink_name="s", txn_app_id=APP_ID)


def values(path: Path) -> dict[int, str]:
    return {r["id"]: r["v"] for r in read_delta(str(path)).to_pylist()}


def recorded_plans(path: Path) -> list[dict[str, Any]]:
    """The ``fanout`` plans the table's commits carry, oldest first."""
    history = reversed(DeltaTable(str(path)).history())
    return [json.loads(c["userMetadata"])["fanout"] for c in history if "userMetadata" in c]


def first_three_batches(sink: DeltaSink) -> None:
    """Batches 0-2 (ids 0-29) and batch 3 (ids 30-39) as first planned."""
    for n in range(3):
        sink.write(batch(n, range(10 * n, 10 * n + 10), FIRST - (3 - n) * 1000, [{"logOffset": n}]))
    sink.write(batch(3, range(30, 40), FIRST, OFFSETS_FIRST))


SINKS = {
    "driver append": {"write_from": "driver"},
    "executors append": {"write_from": "executors"},
    "merge": {"mode": "merge", "keys": ["id"]},
}


@pytest.mark.parametrize("options", SINKS.values(), ids=SINKS.keys())
def test_every_commit_records_the_batch_plan(tmp_path: Path, options: dict[str, Any]) -> None:
    sink = opened(tmp_path / "t", **options)
    first_three_batches(sink)
    assert recorded_plans(tmp_path / "t") == [
        {
            "app_id": "fanout/p/s",
            "batch_id": n,
            "batch_timestamp_ms": FIRST - (3 - n) * 1000,
            "source_offsets": [{"logOffset": n}],
        }
        for n in range(3)
    ] + [
        {
            "app_id": "fanout/p/s",
            "batch_id": 3,
            "batch_timestamp_ms": FIRST,
            "source_offsets": OFFSETS_FIRST,
        }
    ]


@pytest.mark.parametrize("options", SINKS.values(), ids=SINKS.keys())
def test_a_batch_planned_again_is_refused_and_a_true_replay_skips(
    tmp_path: Path, options: dict[str, Any]
) -> None:
    path = tmp_path / "t"
    sink = opened(path, **options)
    first_three_batches(sink)
    version = DeltaTable(str(path)).version()
    committed = DeltaTable(str(path)).history(1)[0]["timestamp"]

    with pytest.raises(CheckpointRollbackError) as refused:
        sink.write(batch(3, range(30, 50), AGAIN, OFFSETS_AGAIN))

    assert str(refused.value).splitlines()[:3] == [
        "pipeline 'p': checkpoint rolled back. Spark handed batch 3 of query q-1, but the "
        f"Delta table of sink 's' ({path}) already holds batch 3, committed under another "
        "plan before the ledger marked it: the checkpoint was restored from a backup or "
        "lost its newest offsets/ and commits/ files, so Spark planned the batch again from "
        "the end of the batch before it. The sink would skip it and lose the rows it holds "
        "now; fanout refuses to write.",
        '  Spark re-planned batch 3: source offsets [{"logOffset": 4}], planned at '
        + planned_at(AGAIN),
        f"  the Delta table recorded batch 3 in version {version}, at {planned_at(committed)}: "
        f'source offsets [{{"logOffset": 3}}], planned at {planned_at(FIRST)}',
    ]
    assert "How to proceed:\n  1. Restore the newest checkpoint (the one whose offsets/3" in (
        str(refused.value)
    )
    assert ids(path) == list(range(40))  # nothing written, nothing skipped silently
    assert DeltaTable(str(path)).version() == version

    replay = sink.write(batch(3, range(30, 40), FIRST, OFFSETS_FIRST))  # as first planned
    assert replay.already_written is True
    assert ids(path) == list(range(40))
    assert DeltaTable(str(path)).version() == version


def test_the_commit_of_an_older_batch_is_found_behind_later_ones(tmp_path: Path) -> None:
    """The table holds batches 3 and 4 (and other writers' commits): a re-plan of batch 3
    is found in batch 3's commit, a replay of it skips."""
    path = tmp_path / "t"
    sink = opened(path, write_from="driver")
    first_three_batches(sink)
    sink.write(batch(4, range(40, 50), FIRST + 1000, [{"logOffset": 4}]))
    write_deltalake(str(path), pa.table({"id": [900], "v": ["other"]}), mode="append")

    with pytest.raises(CheckpointRollbackError, match=r"recorded batch 3 in version 3, "):
        sink.write(batch(3, range(30, 60), AGAIN, [{"logOffset": 5}]))
    assert sink.write(batch(3, range(30, 40), FIRST, OFFSETS_FIRST)).already_written is True
    assert ids(path) == [*range(50), 900]


def test_the_spark_engine_refuses_by_the_plan_delta_spark_recorded(tmp_path: Path) -> None:
    """The spark engine's skip path (the delta-rs lookup) reads the plan from the commit's
    ``userMetadata``, the field delta-spark's ``userMetadata`` option writes; written here
    by delta-rs in the same field (no Delta jars in this test)."""
    path = tmp_path / "t"
    first_three_batches(opened(path, write_from="driver"))
    target = opened(path, write_from="driver").target()

    with pytest.raises(CheckpointRollbackError, match=r"already holds batch 3, committed under"):
        write_spark(target, batch(3, range(30, 50), AGAIN, OFFSETS_AGAIN))
    replay = write_spark(target, batch(3, range(30, 40), FIRST, OFFSETS_FIRST))
    assert (replay.already_written, replay.rows) == (True, 10)
    assert ids(path) == list(range(40))


def test_no_evidence_skips_as_before(tmp_path: Path) -> None:
    """A re-plan without a planning time, a commit without the plan (an older fanout), and
    a commit further back than the search goes: skipped as before."""
    path = tmp_path / "t"
    sink = opened(path, write_from="driver")
    first_three_batches(sink)
    assert sink.write(batch(3, range(30, 50), None, OFFSETS_AGAIN)).already_written is True

    older = tmp_path / "older"  # batch 3 committed as an older fanout did: no metadata
    write_deltalake(
        str(older),
        pa.table(
            {"id": pa.array(range(30, 40), pa.int64()), "v": [f"v{i}" for i in range(30, 40)]}
        ),
        commit_properties=deltaio.commit_properties({APP_ID: 3}),
    )
    skipped = opened(older, write_from="driver").write(
        batch(3, range(30, 50), AGAIN, OFFSETS_AGAIN)
    )
    assert skipped.already_written is True
    assert ids(older) == list(range(30, 40))

    for n in range(3):  # three more commits of another writer: batch 3's is the 4th newest
        write_deltalake(str(path), pa.table({"id": [900 + n], "v": ["other"]}), mode="append")
    assert plans.find_plan(DeltaTable(str(path)), APP_ID, 3, limit=3) is None
    assert plans.find_plan(DeltaTable(str(path)), APP_ID, 3, limit=4) is not None
    assert ids(path) == [*range(40), 900, 901, 902]


def test_offsets_too_long_are_not_recorded_and_the_planning_time_still_tells(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t"
    sink = opened(path, write_from="driver")
    many = [{"topic": {str(p): 10**9 + p for p in range(400)}}]
    sink.write(batch(0, range(10), FIRST, many))
    assert recorded_plans(path)[0]["source_offsets"] is None
    with pytest.raises(CheckpointRollbackError) as refused:
        sink.write(batch(0, range(20), AGAIN, many))
    assert f"source offsets not recorded, planned at {planned_at(FIRST)}" in str(refused.value)
    assert ids(path) == list(range(10))


def test_the_common_path_reads_no_history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a batch found already written looks for its commit."""
    looked: list[int] = []
    find = plans.find_plan
    monkeypatch.setattr(
        plans,
        "find_plan",
        lambda table, app, n, limit=None: looked.append(n) or find(table, app, n),
    )
    sink = opened(tmp_path / "t", write_from="driver")
    first_three_batches(sink)
    assert looked == []
    sink.write(batch(3, range(30, 40), FIRST, OFFSETS_FIRST))
    assert looked == [3]


def test_a_merge_replanned_keeps_the_first_values(tmp_path: Path) -> None:
    """The refused merge changes no row: the values are those of the first plan."""
    path = tmp_path / "t"
    sink = opened(path, mode="merge", keys=["id"])
    first_three_batches(sink)
    again = batch(3, range(30, 50), AGAIN, OFFSETS_AGAIN)
    again.df.table = again.df.table.set_column(1, "v", pa.array(["new"] * 20))
    with pytest.raises(CheckpointRollbackError):
        sink.write(again)
    assert values(path) == {i: f"v{i}" for i in range(40)}
