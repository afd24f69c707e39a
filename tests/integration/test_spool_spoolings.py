"""Two drivers of one pipeline (a zombie beside the restarted one) spooling one batch at
once may both find its rows absent and both append them; the catch-up's read of the batch
(``Spool.read``: real local Spark over the spool's Parquet files) still gives each row
once, and the spool's size counts one copy (docs/architecture.md §14.3). Also for a spool
written by the older version, whose rows carry no spooling id. Real spool (delta-rs)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from fanout.contract.batch import BatchInfo
from fanout.errors import SpoolError
from fanout.ledger.entry import now_utc
from fanout.spool.data import PARTITION_COLUMNS, with_partition_columns
from fanout.spool.index import SHORT_LOG, SpooledBatch
from fanout.spool.table import Spool
from tests.unit.fakes import spooled_ids

SPOOLING_COLUMN = "_fanout_spooling"  # fanout.spool.data's, named here to run on older code


def _frame(spark: Any, ids: list[int]) -> Any:
    return spark.createDataFrame([(i, f"v{i}") for i in ids], "id LONG, v STRING")


def _opened(path: Path) -> Spool:
    spool = Spool(str(path), "pipe")
    spool.open()
    return spool


def _read_ids(spark: Any, spool: Spool, batch_id: int) -> list[int]:
    return sorted(r["id"] for r in spool.read(spark, (0, batch_id)).collect())


def _at_once(first: Spool, second: Spool, spooling: Callable[[Spool], Any]) -> None:
    """``first`` and ``second`` spool one batch, both finding its rows absent before either
    appends them: ``second`` spools the whole batch in ``first``'s append, after ``first``
    looked (two processes: two objects, no lock in common)."""
    append = first._append_rows

    def second_in_between(*args: Any, **kwargs: Any) -> Any:
        spooling(second)
        return append(*args, **kwargs)

    first._append_rows = second_in_between  # type: ignore[method-assign]
    try:
        spooling(first)
    finally:
        del first._append_rows


def _file_sizes(spool: Spool, batch_id: int) -> list[int]:
    actions = pa.table(DeltaTable(spool.data_path).get_add_actions(flatten=True)).to_pydict()
    return sorted(
        size
        for batch, size in zip(
            actions["partition._fanout_batch"], actions["size_bytes"], strict=True
        )
        if int(batch) == batch_id
    )


def test_a_batch_two_drivers_spooled_at_once_is_read_once(spark: Any, tmp_path: Path) -> None:
    zombie, restarted = _opened(tmp_path / "spool"), _opened(tmp_path / "spool")
    info = BatchInfo("pipe", 7, "q1", [{"o": 7}], batch_timestamp_ms=1000)
    frame = _frame(spark, [1, 2, 3])

    _at_once(zombie, restarted, lambda spool: spool.add(frame, info, {"S"}, now_utc()))

    assert spooled_ids(zombie, (0, 7)) == [1, 1, 2, 2, 3, 3]  # both appends landed
    fresh = _opened(tmp_path / "spool")
    for spool in (zombie, restarted, fresh):
        assert _read_ids(spark, spool, 7) == [1, 2, 3]  # was [1, 1, 2, 2, 3, 3]
    one, other = _file_sizes(fresh, 7)
    assert fresh.size()[:2] == (1, 3) and fresh.size()[2] in (one, other)  # was one + other
    assert [(b.batch_id, b.rows, sorted(b.needed_by)) for b in fresh.batches()] == [(7, 3, ["S"])]

    assert fresh.remove([(0, 7)]) == 1  # the removal takes both copies
    assert spooled_ids(fresh, (0, 7)) == [] and _opened(tmp_path / "spool").batches() == []


def _old_spooling(spool: Spool, frame: Any, info: BatchInfo, sinks: set[str]) -> None:
    """Spool a batch as the older version did: its index rows, then its rows without a
    spooling id, in a data table created without the statistics property."""
    rows = frame.toArrow()
    spool._append_index(
        SpooledBatch("pipe", 0, info.batch_id, rows.num_rows, frame.schema.json(), now_utc()),
        sinks,
    )
    write_deltalake(
        spool.data_path,
        with_partition_columns(rows, "pipe", info),
        mode="append",
        partition_by=list(PARTITION_COLUMNS),
        schema_mode="merge",
        configuration=SHORT_LOG,
    )


def test_a_spool_the_older_version_wrote_is_read_once_beside_new_spoolings(
    spark: Any, tmp_path: Path
) -> None:
    old = _opened(tmp_path / "spool")
    _old_spooling(old, _frame(spark, [1, 2]), BatchInfo("pipe", 1, "q1"), {"S"})
    assert SPOOLING_COLUMN not in DeltaTable(old.data_path).schema().to_arrow().names

    # a driver of the older version and one of this version spool batch 3 at once
    new, zombie = _opened(tmp_path / "spool"), _opened(tmp_path / "spool")
    assert _read_ids(spark, new, 1) == [1, 2]
    batch_3 = _frame(spark, [30, 31, 32])

    def old_or_new(spool: Spool) -> None:
        if spool is zombie:
            _old_spooling(spool, batch_3, BatchInfo("pipe", 3, "q1"), {"S"})
        else:
            spool.add(batch_3, BatchInfo("pipe", 3, "q1"), {"S"}, now_utc())

    _at_once(new, zombie, old_or_new)

    assert spooled_ids(new, (0, 3)) == [30, 30, 31, 31, 32, 32]
    fresh = _opened(tmp_path / "spool")
    assert [_read_ids(spark, fresh, b) for b in (1, 3)] == [[1, 2], [30, 31, 32]]  # was 3 twice
    files = fresh._files((0, 3))
    assert len(files) == 1 and spark.read.parquet(*files).columns == ["id", "v"]  # the old copy
    assert fresh.size()[:2] == (2, 5)


def test_a_spooling_from_a_stale_snapshot_loses_its_commit_to_the_other(
    spark: Any, tmp_path: Path
) -> None:
    # the data table exists: the second append commits from the snapshot it found the rows
    # absent in, and Delta refuses it (the other's commit carries the same app transaction)
    first, second = _opened(tmp_path / "spool"), _opened(tmp_path / "spool")
    first.add(_frame(spark, [1]), BatchInfo("pipe", 1, "q1"), {"S"}, now_utc())
    batch_2 = _frame(spark, [20, 21])
    with pytest.raises(SpoolError, match="batch 2: cannot spool the batch for S .*Concurrent"):
        _at_once(
            first, second, lambda s: s.add(batch_2, BatchInfo("pipe", 2, "q1"), {"S"}, now_utc())
        )
    first.add(batch_2, BatchInfo("pipe", 2, "q1"), {"S"}, now_utc())  # Spark's replay
    assert spooled_ids(first, (0, 2)) == [20, 21]
    assert _read_ids(spark, _opened(tmp_path / "spool"), 2) == [20, 21]


def test_a_batch_of_several_files_spooled_twice_is_read_once(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # each spooling writes the batch in several files: one spooling's files, all of them
    import deltalake

    monkeypatch.setattr(
        deltalake, "write_deltalake", partial(deltalake.write_deltalake, target_file_size=20_000)
    )
    zombie, restarted = _opened(tmp_path / "spool"), _opened(tmp_path / "spool")
    ids = list(range(5000))
    frame, info = _frame(spark, ids), BatchInfo("pipe", 4, "q1")

    _at_once(zombie, restarted, lambda spool: spool.add(frame, info, {"S"}, now_utc()))

    assert spooled_ids(zombie, (0, 4)) == sorted(ids * 2)
    fresh = _opened(tmp_path / "spool")
    files, sizes = fresh._files((0, 4)), _file_sizes(fresh, 4)
    assert 1 < len(files) == len(sizes) // 2
    assert _read_ids(spark, fresh, 4) == ids  # was each id twice
    assert fresh.size()[:2] == (1, 5000) and fresh.size()[2] < sum(sizes) * 0.6
