"""A PostgreSQL append sink that committed a batch but lost its ledger mark, then a checkpoint
reset: its progress marks say it holds the batch (``holds_batch``), so the new epoch is
refused instead of appending the batch's rows a second time (ARCHITECTURE §5)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pgcheck import execute, query

from fanout import (
    BatchInfo,
    FanOut,
    SinkRecordsGoneError,
    TargetLostError,
    UnmarkedBatchError,
    hookimpl,
)
from fanout.ledger.delta import DeltaLedger
from tests.in_process_cli import Cli

ROWS = 10
FENCE_ROWS = "SELECT pipeline, batch_id, partition FROM fanout.progress WHERE batch_id = %s"


class DriverKilled(BaseException):
    """The driver's death, between the PostgreSQL sink's commit and its mark."""


class KillAfterPostgresWrote:
    @hookimpl
    def fanout_sink_done(self, info: BatchInfo, sink: str, result: Any, duration_s: float) -> None:
        if info.batch_id == 1 and sink == "pg":
            raise DriverKilled("killed between the write and the mark")

    @hookimpl
    def fanout_sink_start(self, info: BatchInfo, sink: str, attempt: int) -> None:
        if info.batch_id == 1 and sink == "silver":
            raise DriverKilled("killed before silver's write")


def _fan(
    tmp_path: Path,
    url: str,
    *plugins: object,
    on_reset: str = "refuse",
    accept: list[str] | None = None,
) -> FanOut:
    sinks = [
        {"type": "postgres", "name": "pg", "url": url, "table": "unmarked_orders",
         "mode": "append", "create_table": True, "partitions": 2},
        {"type": "delta", "name": "silver", "path": str(tmp_path / "silver")},
    ]  # fmt: skip
    return FanOut(
        "unmarkedpg", str(tmp_path / "ledger"), sinks, plugins=plugins, parallelism=1,
        retries=0, on_checkpoint_reset=on_reset,  # type: ignore[arg-type]
        accept_lost_targets=accept or (),
    )  # fmt: skip


def _run(fan: FanOut, spark: Any, query_id: str, batch_id: int, first: int) -> None:
    rows = [(n, f"order-{n}") for n in range(first, first + ROWS)]
    info = BatchInfo("unmarkedpg", batch_id, query_id, [{"orders": {"0": first + ROWS}}],
                     batch_timestamp_ms=1000 + batch_id)  # fmt: skip
    fan.process(spark.createDataFrame(rows, "id LONG, name STRING"), info)


def _killed_after_pg_wrote(old: FanOut, spark: Any) -> FanOut:
    """``old`` (with :class:`KillAfterPostgresWrote`) writes batch 0 of query-old, then
    dies in batch 1 after pg wrote it (unmarked), before silver's write."""
    _run(old, spark, "query-old", 0, 0)
    with pytest.raises(DriverKilled):
        _run(old, spark, "query-old", 1, 10)
    return old


def _ledger_rows(tmp_path: Path) -> list[tuple[str, int, str, int]]:
    """The ledger's rows but ``admitted`` ones: (status, epoch, sink, batch id). These
    tests plan their batches before their FanOut is built, so every attempt is a replay,
    recorded admitted before its first write (docs/architecture.md §4)."""
    from deltalake import DeltaTable

    rows = DeltaTable(str(tmp_path / "ledger")).to_pyarrow_table().to_pylist()
    return sorted((r["status"], r["epoch"], r["sink"], r["batch_id"]) for r in rows
                  if r["status"] != "admitted")  # fmt: skip


def _ids(url: str) -> list[int]:
    return [row[0] for row in query(url, "SELECT id FROM unmarked_orders ORDER BY 1")]


def test_an_append_batch_written_but_never_marked_refuses_the_new_epoch(
    spark: Any, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refused start fences nothing: no fence row in the old scope at any time, no
    commit in silver's table. (Before, both sinks were fenced before the question, and
    the refusal lifted them: a fence row inserted and deleted, two Delta commits.)"""
    from deltalake import DeltaTable
    from fanout_postgres import PostgresSink
    from fanout_postgres.statements import EPOCH_FENCE

    fence_rows: list[list[tuple[Any, ...]]] = []
    real_fence = PostgresSink.fence_earlier_epochs

    def fence(self: PostgresSink, pipeline: str, epoch: int) -> None:
        real_fence(self, pipeline, epoch)
        fence_rows.append(query(pg_url, FENCE_ROWS, (EPOCH_FENCE,)))

    monkeypatch.setattr(PostgresSink, "fence_earlier_epochs", fence)
    old = _killed_after_pg_wrote(_fan(tmp_path, pg_url, KillAfterPostgresWrote()), spark)
    sink = old.sinks["pg"]
    assert sink.holds_batch("unmarkedpg", 0, 1) is True
    assert sink.holds_batch("unmarkedpg", 0, 2) is False
    assert sink.holds_batch("unmarkedpg", 1, 1) is False

    with pytest.raises(UnmarkedBatchError) as refused:
        _run(_fan(tmp_path, pg_url, on_reset="new_epoch"), spark, "query-new", 0, 10)
    message = str(refused.value)
    assert message.startswith(
        "pipeline 'unmarkedpg': query query-new cannot start epoch 1: sink pg holds batch 1 "
        "of epoch 0 by its own records"
    )
    assert (
        "- sink pg: batch 1 of epoch 0, source offsets unknown (no sink marked it); sinks "
        "without it: silver (mark 0).\n"
    ) in message
    assert _ids(pg_url) == list(range(20))
    assert fence_rows == []  # before: [[('unmarkedpg', EPOCH_FENCE, -1)]], then lifted
    assert query(pg_url, FENCE_ROWS, (EPOCH_FENCE,)) == []
    assert DeltaTable(str(tmp_path / "silver")).version() == 0  # before: 2 (fence, lift)


def _upserting(tmp_path: Path, url: str, *plugins: object, on_reset: str = "refuse") -> FanOut:
    sinks = [
        {"type": "postgres", "name": "pg", "url": url, "table": "unmarked_upserts",
         "mode": "upsert", "keys": ["id"], "create_table": True, "partitions": 2},
        {"type": "delta", "name": "silver", "path": str(tmp_path / "silver")},
    ]  # fmt: skip
    return FanOut(
        "unmarkedpg", str(tmp_path / "ledger"), sinks, plugins=plugins, parallelism=1,
        retries=0, on_checkpoint_reset=on_reset,  # type: ignore[arg-type]
    )  # fmt: skip


def test_an_upsert_batch_written_but_never_marked_lets_the_new_epoch_start(
    spark: Any, pg_url: str, tmp_path: Path, fanout_cli: Cli
) -> None:
    """pg upserts by key without a dead-letter target: writing batch 1 again changes
    nothing. Before, the start was refused like an append's, for nothing. Now, after
    `fanout recover` (which counted pg at batch 0), the new epoch starts: its first batch
    covers other offsets (rows 10-24) with other values of a column, and the table ends
    with each key's last row; the lost mark is recorded, and recover's report is no reason
    to refuse (no query wrote the batch after it)."""
    from fanout.ledger.delta import DeltaLedger

    _killed_after_pg_wrote(_upserting(tmp_path, pg_url, KillAfterPostgresWrote()), spark)
    ledger = str(tmp_path / "ledger")
    ran = fanout_cli("recover", "--ledger", ledger, "--pipeline", "unmarkedpg")
    assert ran.returncode == 0, ran
    assert """.option("startingOffsets", '{"orders": {"0": 10}}')""" in ran.stdout

    new = _upserting(tmp_path, pg_url, on_reset="new_epoch")
    rows = [(n, f"again-{n}") for n in range(10, 25)]
    info = BatchInfo("unmarkedpg", 0, "query-new", [{"orders": {"0": 25}}],
                     batch_timestamp_ms=2000)  # fmt: skip
    new.process(spark.createDataFrame(rows, "id LONG, name STRING"), info)
    assert query(pg_url, "SELECT id, name FROM unmarked_upserts ORDER BY 1") == [
        *((n, f"order-{n}") for n in range(10)),
        *((n, f"again-{n}") for n in range(10, 25)),
    ]
    marks = sorted(
        (e.epoch, e.sink, e.batch_id, e.lost)
        for e in DeltaLedger(ledger).committed_entries("unmarkedpg")
    )
    assert marks == [
        (0, "pg", 0, False), (0, "pg", 1, True), (0, "silver", 0, False),
        (1, "pg", 0, False), (1, "silver", 0, False),
    ]  # fmt: skip
    assert DeltaLedger(ledger).current_epoch("unmarkedpg") == 1


def test_a_table_re_created_empty_after_its_unmarked_batch_lets_the_new_epoch_start(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """The progress marks (which outlive the table) say it holds batch 1, but the table was
    dropped and created again empty since (another OID: ``target_replaced``): it holds
    nothing, so the unmarked-batch question passes, and no lost mark is recorded for a batch
    the table does not hold (the records alone refused the start for a copy that is not
    there). The table lost batch 0 too, which the ledger marks written there: the new
    epoch's first run asks about that earlier epoch's mark and refuses (before, it wrote on
    and ids 0-9 were gone silently); accepted as printed, it writes the batch's rows once."""
    old = _killed_after_pg_wrote(_fan(tmp_path, pg_url, KillAfterPostgresWrote()), spark)
    execute(pg_url, "DROP TABLE unmarked_orders",
            "CREATE TABLE unmarked_orders (id BIGINT, name TEXT)")  # fmt: skip
    sink = old.sinks["pg"]
    assert sink.holds_batch("unmarkedpg", 0, 1) is True  # its records alone
    assert (sink.target_replaced("unmarkedpg", 0, 1) or "").startswith(
        "table unmarked_orders has OID"
    )

    from fanout_postgres.statements import EPOCH_FENCE

    ledger_before = _ledger_rows(tmp_path)
    lost = "sink 'pg', batch 0: pipeline 'unmarkedpg': table 'unmarked_orders' no longer holds"
    with pytest.raises(TargetLostError, match=lost) as refused:
        _run(_fan(tmp_path, pg_url, on_reset="new_epoch"), spark, "query-new", 0, 10)
    assert "epoch 1 was not started and no sink was fenced or written" in str(refused.value)
    assert _ids(pg_url) == []
    # refused before the claim and the fences (before: epoch 1's row, pg's fence of epoch 0)
    assert _ledger_rows(tmp_path) == ledger_before
    assert ("epoch", 1) not in {(status, epoch) for status, epoch, _, _ in ledger_before}
    assert query(pg_url, FENCE_ROWS, (EPOCH_FENCE,)) == []
    accepted = _fan(tmp_path, pg_url, on_reset="new_epoch", accept=["pg"])
    _run(accepted, spark, "query-new", 0, 10)
    assert _ids(pg_url) == list(range(10, 20))
    ledger = DeltaLedger(str(tmp_path / "ledger"))
    assert ledger.last_committed("unmarkedpg", ["pg", "silver"], 0) == {"pg": 0, "silver": 0}


def test_a_reset_after_the_records_went_is_refused_before_the_new_epoch_writes(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """pg wrote batch 1 and lost its mark, then its records went: its "not held" about
    batch 1 is no answer, so the new epoch's start is refused (before, the epoch started,
    its first run was refused "created again empty", and once the records were put back
    the new epoch wrote batch 1's rows a second time); with them back, the unmarked batch
    is found and refused as such."""
    _killed_after_pg_wrote(_fan(tmp_path, pg_url, KillAfterPostgresWrote()), spark)
    execute(pg_url, "CREATE TABLE saved AS SELECT * FROM fanout.progress",
            "DELETE FROM fanout.progress")  # fmt: skip

    new = _fan(tmp_path, pg_url, on_reset="new_epoch")
    with pytest.raises(SinkRecordsGoneError) as refused:
        _run(new, spark, "query-new", 0, 10)
    # asked by the reset's lost-target check, before the claim (the question about the
    # batch after the mark, refuse_records_gone, would refuse it the same way after it)
    assert str(refused.value).startswith(
        "sink 'pg', batch 0: pipeline 'unmarkedpg', sink 'pg': its own records of batch 0 of "
        "epoch 0, which the ledger marks written to table 'unmarked_orders' (its last marked "
        "batch that wrote rows), are gone, and the target still holds rows: "
        "fanout.progress holds no progress mark of batch 0 of sink 'pg'"
    )
    assert (
        "The checkpoint reset is refused before it started: epoch 1 was not started and no "
        "sink was fenced or written" in str(refused.value)
    )
    assert "then run the reset again: `fanout run PIPELINE.toml --new-epoch`" in str(refused.value)
    assert "--new-epoch --accept-lost-target pg` (FanOut(on_checkpoint_reset=" in str(refused.value)
    assert _ledger_rows(tmp_path) == [("committed", 0, "pg", 0), ("committed", 0, "silver", 0),
                                      ("epoch", 0, "*", 0)]  # fmt: skip
    assert _ids(pg_url) == list(range(20))

    execute(pg_url, "INSERT INTO fanout.progress SELECT * FROM saved")
    with pytest.raises(UnmarkedBatchError, match="sink pg holds batch 1 of epoch 0"):
        _run(_fan(tmp_path, pg_url, on_reset="new_epoch"), spark, "query-new", 0, 10)
    assert _ids(pg_url) == list(range(20))


def test_the_unmarked_copy_removed_as_the_refusal_says_is_not_records_gone(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """The refusal's way on: remove pg's copy of batch 1 (its rows and its progress marks,
    so that its own records no longer hold it) and start this query again. The lost mark
    it recorded is pg's last mark that wrote rows, and its records are gone, as the
    refusal asked: not records gone (that refused the way on the refusal printed); the
    epoch starts and writes batch 1's rows once."""
    _killed_after_pg_wrote(_fan(tmp_path, pg_url, KillAfterPostgresWrote()), spark)
    with pytest.raises(UnmarkedBatchError, match="sink pg holds batch 1 of epoch 0"):
        _run(_fan(tmp_path, pg_url, on_reset="new_epoch"), spark, "query-new", 0, 10)
    execute(pg_url, "DELETE FROM unmarked_orders WHERE id >= 10",
            "DELETE FROM fanout.progress WHERE batch_id = 1")  # fmt: skip

    _run(_fan(tmp_path, pg_url, on_reset="new_epoch"), spark, "query-new", 0, 10)
    assert _ids(pg_url) == list(range(20))
