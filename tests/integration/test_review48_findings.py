"""Findings of review 48, each a test with real parts (local Spark, Delta ledger, Delta
sinks, a spool)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fanout import BatchInfo, FanOut
from fanout.contract.locations import command_location
from fanout.ledger.delta import DeltaLedger
from tests.integration.streams import delta_rows


def _rows(path: Path) -> list[tuple[int, str]]:
    return sorted((r["id"], r["k"]) for r in delta_rows(path))


def _backfill(
    spark: Any,
    tmp_path: Path,
    pipeline: str,
    written: list[list[tuple[int, str]]],
    last: list[tuple[int, str]],
) -> Any:
    """Sink ``lake`` (partitioned by ``k``) writes the batches ``written`` alone; then sink
    ``copy`` is added, backfilling from it, batch ``len(written)`` (``last``) runs and
    ``copy`` catches up. Returns ``copy``'s lag after the catch-up."""
    ledger = str(tmp_path / "ledger")
    lake = {"type": "delta", "name": "lake", "path": str(tmp_path / "lake"),
            "partition_by": ["k"]}  # fmt: skip
    copy = {"type": "delta", "name": "copy", "path": str(tmp_path / "copy"),
            "backfill_from": "lake"}  # fmt: skip

    def frame(rows: list[tuple[int, str]]) -> Any:
        return spark.createDataFrame(rows, "id LONG, k STRING")

    first = FanOut(pipeline, ledger, [lake], backoff_s=0)
    try:
        for batch, rows in enumerate(written):
            first.process(frame(rows), BatchInfo(pipeline, batch, "q"))
    finally:
        first.close()

    fan = FanOut(pipeline, ledger, [lake, copy], backoff_s=0, spool=str(tmp_path / "spool"))
    try:
        fan.process(frame(last), BatchInfo(pipeline, len(written), "q"))
        return fan.catch_up(timeout_s=120)["copy"]
    finally:
        fan.close()


def test_a_backfill_from_a_table_partitioned_by_values_that_need_escaping_gives_every_row(
    spark: Any, tmp_path: Path
) -> None:
    """The source's partition directories hold escaped values (``k=New%20York``), which
    its Delta log holds URL-encoded once more (``k=New%2520York``): the backfill gives the
    new sink the rows of those partitions too. It gave batch 0 only its row in ``k=a``
    (two of three rows lost, the sink marked), and refused batch 1 as a batch whose
    commit the table lost, with a `fanout ledger skip` that would give up rows it holds."""
    lag = _backfill(spark, tmp_path, "esc",
                    [[(1, "a"), (2, "New York"), (3, "x:y")], [(4, "São Paulo"), (5, "50%")]],
                    [(6, "b c")])  # fmt: skip
    ledger = str(tmp_path / "ledger")
    every = [(1, "a"), (2, "New York"), (3, "x:y"), (4, "São Paulo"), (5, "50%"), (6, "b c")]
    assert _rows(tmp_path / "lake") == every
    assert _rows(tmp_path / "copy") == every
    assert (lag.state, lag.error) == ("live", None)
    assert DeltaLedger(ledger).last_committed("esc", ["lake", "copy"]) == {"lake": 2, "copy": 2}


def _wrong_matchers() -> dict[str, Any]:
    """Ways the backfill's read could get a batch's files wrong: as before the fix of the
    test above (the log's URL-encoded spelling: the rows of ``k=New York`` and ``k=x:y``
    not found), and taking every file of the table at the batch's version."""
    from fanout.delta_tables import history

    def logged(table: object) -> list[str]:
        import pyarrow as pa

        actions = pa.table(table.get_add_actions(flatten=True))  # type: ignore[attr-defined]
        return [str(path) for path in actions.column("path").to_pylist()]

    return {
        "fewer": (history, "_paths", logged),
        "more": (history, "_relative", lambda fragment_path, added: True),
    }


@pytest.mark.parametrize("wrong", ["fewer", "more"])
def test_a_backfill_reading_another_count_than_its_source_wrote_is_refused_not_marked(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wrong: str
) -> None:
    """A batch the backfill reads back with fewer rows (or more) than the source's ledger
    mark says it wrote is refused, naming both sinks, the batch and both counts, and not
    marked: the new sink waits at it. It was marked holding the rows read (one of three of
    batch 0; batch 0's rows again in batch 1), as long as the read found any."""
    monkeypatch.setattr(*_wrong_matchers()[wrong])
    lag = _backfill(spark, tmp_path, "cnt", [[(1, "a"), (2, "New York"), (3, "x:y")], [(4, "b")]],
                    [(5, "c")])  # fmt: skip
    ledger = str(tmp_path / "ledger")
    assert _rows(tmp_path / "lake") == [(1, "a"), (2, "New York"), (3, "x:y"), (4, "b"), (5, "c")]
    marks = DeltaLedger(ledger).last_committed("cnt", ["lake", "copy"])
    ledger_text = command_location(ledger)
    if wrong == "fewer":  # batch 0: 1 row of 3 read
        batch, wrote, read, mark, held = 0, 3, 1, None, []
    else:  # batch 1: its row and batch 0's three
        batch, wrote, read, mark, held = 1, 1, 4, 0, [(1, "a"), (2, "New York"), (3, "x:y")]
    assert marks == {"lake": 2, "copy": mark}
    if held:
        assert _rows(tmp_path / "copy") == held
    else:
        assert not (tmp_path / "copy").exists()
    assert lag.error == (
        f"BackfillError: sink 'copy', batch {batch}: cannot be backfilled from sink 'lake': "
        f"its ledger mark says it committed batch {batch} (epoch 0) with {wrote} row(s), "
        f"but the batch's commit in its table gives back {read} row(s) (its table's log or "
        "files changed outside fanout, or a fanout bug: please report it), so the batch "
        f"read back would {'lack rows' if read < wrote else 'hold rows not its own'}"
        "; nothing of it is written to 'copy', which waits at this batch. Restore the table "
        "of 'lake' to a version whose commit of the batch holds its rows, or accept that "
        f"'copy' never gets batch {batch}: `fanout ledger skip --ledger {ledger_text} "
        f"--pipeline cnt --sink copy --through {batch} --epoch 0`, then restart"
    )
