"""A replaced epoch's driver still running when a checkpoint reset starts a new epoch
(``on_checkpoint_reset="new_epoch"``) does not put its batch in the table a second time
(:meth:`fanout_delta.DeltaSink.fence_earlier_epochs`, :mod:`fanout_delta.fence`;
docs/architecture.md §5, window 2, and §8.1).

Before the fence: the old driver committed its batch m + 1 after the new epoch's start
asked ``holds_batch`` about it (answer: not held), the new epoch read m + 1's input again
under its own app id and wrote it, and the table held m + 1's rows twice (a merge: the old
batch's values over the new epoch's); only the old driver's ledger mark failed, after.
Real Spark DataFrames, real Delta tables, two sinks on one table as the two drivers."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from fanout_delta import DeltaSink, rs_engine, spark_engine
from fanout_delta.fence import EpochFencedError

from fanout import FanOut, UnmarkedBatchError, hookimpl
from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.sink import SinkResult
from fanout.delta_tables import distributed
from fanout.delta_tables.io import EPOCH_FENCE, read_delta
from fanout.ledger.delta import DeltaLedger
from fanout.testing import open_sink

SCHEMA = "id LONG, v STRING"
OLD = txn_app_id("p", "s", 0)
NEW = txn_app_id("p", "s", 1)
WRITERS = {
    "driver append": {"write_from": "driver"},
    "executors append": {"write_from": "executors"},
    "merge": {"mode": "merge", "keys": ["id"]},
}


def _sink(path: Path, **options: Any) -> DeltaSink:
    return open_sink(DeltaSink(name="s", path=str(path), **options), "p")


def _batch(spark: Any, rows: list[tuple[int, str]], batch_id: int, epoch: int) -> Batch:
    info = BatchInfo("p", batch_id, f"q{epoch}", epoch=epoch)
    return Batch(spark.createDataFrame(rows, SCHEMA), info, "s", txn_app_id("p", "s", epoch))


def _rows(path: Path) -> list[tuple[int, str]]:
    table = read_delta(str(path))
    return sorted(zip(table["id"].to_pylist(), table["v"].to_pylist(), strict=True))


def _written(path: Path, app_id: str) -> Any:
    return DeltaTable(str(path)).transaction_version(app_id)


class Gate:
    """Holds the first call of a writer's commit step until :attr:`go` is set (the old
    driver's, after :meth:`arm`); the later ones (the new epoch's) go through."""

    def __init__(self) -> None:
        self.reached, self.go, self.calls = threading.Event(), threading.Event(), 0

    def arm(self) -> None:
        """Hold the next call (the earlier ones went through, :attr:`go` set)."""
        self.go.clear()
        self.reached.clear()
        self.calls = 0

    def wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def gated(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == 1:
                self.reached.set()
                assert self.go.wait(120), "the test never let the commit go"
            return real(*args, **kwargs)

        return gated


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    """The old driver's commit held after its snapshot was checked: the driver's append
    (``rs_engine._append``), the executors' (``distributed._commit``), the merge (its
    predicate, built on the checked snapshot just before ``merge``)."""
    held = Gate()
    monkeypatch.setattr(rs_engine, "_append", held.wrap(rs_engine._append))
    monkeypatch.setattr(distributed, "_commit", held.wrap(distributed._commit))
    monkeypatch.setattr(rs_engine, "merge_predicate", held.wrap(rs_engine.merge_predicate))
    yield held
    held.go.set()


@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_commit_prepared_before_the_fence_loses_to_it(
    spark: Any, tmp_path: Path, gate: Gate, writer: str
) -> None:
    """(a) The old driver checked its snapshot for batch 1 (not held) and is about to
    commit when the new epoch fences and writes batch 1's rows as its batch 0: the old
    commit conflicts with the fence, its retry reads the fence and refuses; the rows are in
    the table once (a merge: the new epoch's values). Before: twice ((1, 'old'), (1, 'new')
    for an append; (1, 'old') over the new epoch's for a merge)."""
    path = tmp_path / "t"
    options = WRITERS[writer]
    old = _sink(path, **options)
    gate.go.set()  # batch 0 goes through
    old.write(_batch(spark, [(0, "zero")], 0, 0))
    gate.arm()
    outcome: dict[str, Any] = {}

    def straggle() -> None:
        try:
            outcome["old"] = old.write(_batch(spark, [(1, "old")], 1, 0))
        except Exception as exc:
            outcome["old"] = exc

    thread = threading.Thread(target=straggle)
    thread.start()
    assert gate.reached.wait(120), "the old driver never reached its commit"
    new = _sink(path, **options)
    new.fence_earlier_epochs("p", 1)
    assert new.holds_batch("p", 0, 1) is False
    assert new.holds_batch("p", 0, 0) is True  # the fence hides no batch written
    new.write(_batch(spark, [(1, "new")], 0, 1))
    gate.go.set()
    thread.join(120)

    assert _rows(path) == [(0, "zero"), (1, "new")]
    assert isinstance(outcome["old"], EpochFencedError), outcome
    message = str(outcome["old"])
    assert "epoch 1" in message and "(epoch 0)" in message and "batch 1" in message
    assert "sink.lift_epoch_fence('p', 1)" in message
    assert _written(path, OLD) == EPOCH_FENCE + 1  # batch 0, fenced
    assert _written(path, NEW) == 0


@pytest.mark.parametrize("writer", [*WRITERS, "spark append", "spark merge"])
def test_a_write_starting_after_the_fence_is_refused_before_writing(
    spark: Any, tmp_path: Path, writer: str
) -> None:
    """(b) The old driver's batch 1 starts after the new epoch's fence: refused on the
    version it reads anyway, nothing written (delta-spark would have skipped it and
    reported success: the sink refuses first). An epoch that never wrote the table is
    fenced too. Before: its rows were appended beside the new epoch's."""
    path = tmp_path / "t"
    if writer.startswith("spark"):
        if spark_engine.delta_jvm_missing(spark):
            pytest.skip("no delta-spark jars")
        options: dict[str, Any] = {"engine": "spark"}
        if writer == "spark merge":
            options |= {"mode": "merge", "keys": ["id"]}
    else:
        options = WRITERS[writer]
    old = _sink(path, **options)
    old.write(_batch(spark, [(0, "zero")], 0, 0))
    new = _sink(path, **options)
    new.fence_earlier_epochs("p", 2)  # epoch 1 never wrote: fenced all the same
    assert new.holds_batch("p", 0, 0) is True
    assert new.holds_batch("p", 0, 1) is False
    assert new.holds_batch("p", 1, 0) is False
    new.write(_batch(spark, [(1, "new")], 0, 2))
    version = DeltaTable(str(path)).version()

    refusals: list[Exception] = []
    for epoch in (0, 1):
        try:
            old.write(_batch(spark, [(1, "old")], 1, epoch))
        except EpochFencedError as exc:
            refusals.append(exc)

    assert _rows(path) == [(0, "zero"), (1, "new")]
    assert DeltaTable(str(path)).version() == version  # nothing committed
    assert len(refusals) == 2
    for epoch, refused in enumerate(refusals):
        assert "epoch 2 of the pipeline" in str(refused)
        assert f"(epoch {epoch})" in str(refused)
        assert f"sink.lift_epoch_fence('p', {epoch + 1})" in str(refused)
    # a second start fences nothing again: no commit
    new.fence_earlier_epochs("p", 2)
    assert DeltaTable(str(path)).version() == version


@pytest.mark.parametrize("writer", ["driver append", "merge"])
def test_a_lifted_fence_lets_the_old_epoch_write_again(
    spark: Any, tmp_path: Path, writer: str
) -> None:
    """(c) The new epoch's start was refused after its fence: the lift commits the old
    app transaction's real version back (none for an epoch never written), so the old
    checkpoint completes its batch, and its replay of batch 0 is still skipped."""
    path = tmp_path / "t"
    options = WRITERS[writer]
    old = _sink(path, **options)
    old.write(_batch(spark, [(0, "zero")], 0, 0))
    new = _sink(path, **options)
    new.fence_earlier_epochs("p", 2)
    new.lift_epoch_fence("p", 2)  # epoch 1's app id, never written: lifted to none
    assert _written(path, txn_app_id("p", "s", 1)) == -1
    assert new.holds_batch("p", 1, 0) is False
    with pytest.raises(EpochFencedError):  # epoch 0 stays closed: not the refused start's
        old.write(_batch(spark, [(1, "old")], 1, 0))
    new.lift_epoch_fence("p", 1)
    assert _written(path, OLD) == 0
    assert new.holds_batch("p", 0, 0) is True

    assert old.write(_batch(spark, [(0, "zero")], 0, 0)).already_written
    assert old.write(_batch(spark, [(1, "old")], 1, 0)).rows == 1
    assert _written(path, OLD) == 1
    # epoch 1's first write in a process fences epoch 0 again (its start is not redone)
    assert _sink(path, **options).write(_batch(spark, [(5, "e1")], 0, 1)).rows == 1
    assert _rows(path) == [(0, "zero"), (1, "old"), (5, "e1")]
    assert _written(path, OLD) == EPOCH_FENCE + 2


def test_the_first_write_of_an_epoch_fences_too(spark: Any, tmp_path: Path) -> None:
    """A process whose first batch is of epoch 1 without having started it (the start's
    fence came from another process, or the sink lagged through the start) fences before
    it writes: the old driver's batch after that is refused. Its own epoch stays open."""
    path = tmp_path / "t"
    old = _sink(path)
    old.write(_batch(spark, [(0, "zero")], 0, 0))
    new = _sink(path)
    assert new.write(_batch(spark, [(1, "new")], 0, 1)).rows == 1
    assert new.write(_batch(spark, [(2, "new")], 1, 1)).rows == 1

    refused: Exception | None = None
    try:
        old.write(_batch(spark, [(1, "old")], 1, 0))
    except EpochFencedError as exc:
        refused = exc
    assert _rows(path) == [(0, "zero"), (1, "new"), (2, "new")]
    assert refused is not None and "epoch 1 of the pipeline" in str(refused)
    assert _written(path, OLD) == EPOCH_FENCE + 1
    assert _written(path, NEW) == 1


def _fan(tmp_path: Path, on_reset: str = "refuse") -> FanOut:
    sinks = [{"type": "delta", "name": "s", "path": str(tmp_path / "t"), "mode": "append",
              "write_from": "driver"}]  # fmt: skip
    return FanOut(
        "p", str(tmp_path / "ledger"), sinks, parallelism=1, retries=0,
        on_checkpoint_reset=on_reset,  # type: ignore[arg-type]
    )  # fmt: skip


def _info(batch_id: int, query_id: str, end: int) -> BatchInfo:
    return BatchInfo("p", batch_id, query_id, [{"orders": {"0": end}}],
                     batch_timestamp_ms=1000 + batch_id)  # fmt: skip


def test_a_second_query_on_a_fresh_checkpoint_while_the_old_batch_is_in_flight(
    spark: Any, tmp_path: Path, gate: Gate
) -> None:
    """(d) Through :class:`fanout.FanOut`: the old query's batch 1 is about to commit when
    a query on a fresh checkpoint starts epoch 1 with batch 1's rows: the start fences,
    finds batch 1 not held and writes the rows; the old commit loses to the fence and the
    old query's batch fails with the fence's refusal. Rows once. Before: the old commit
    went through (rows twice) and only its ledger mark failed (ZombieBatchError)."""
    old = _fan(tmp_path)
    gate.go.set()
    old.process(spark.createDataFrame([(0, "zero")], SCHEMA), _info(0, "q-old", 1))
    gate.arm()
    outcome: dict[str, Any] = {}

    def straggle() -> None:
        try:
            old.process(spark.createDataFrame([(1, "m+1")], SCHEMA), _info(1, "q-old", 3))
            outcome["old"] = "done"
        except Exception as exc:
            outcome["old"] = exc

    thread = threading.Thread(target=straggle)
    thread.start()
    assert gate.reached.wait(120), "the old query never reached its commit"
    new = _fan(tmp_path, on_reset="new_epoch")
    new.process(spark.createDataFrame([(1, "m+1")], SCHEMA), _info(1, "q-new", 3))
    gate.go.set()
    thread.join(120)
    old.close()
    new.close()

    assert _rows(tmp_path / "t") == [(0, "zero"), (1, "m+1")]
    assert isinstance(outcome["old"], Exception), outcome
    assert "closes this query's app transaction" in str(outcome["old"]), outcome
    assert _written(tmp_path / "t", OLD) == EPOCH_FENCE + 1
    assert _written(tmp_path / "t", NEW) is not None


def test_the_restore_hint_looks_past_the_fence_commits(spark: Any, tmp_path: Path) -> None:
    """A refused start's hint names the restore removing the held batch when only epoch
    fences (commits without rows) came after its commit, not "delete the rows": a fence
    is made again by the next start."""
    path = tmp_path / "t"
    old = _sink(path)
    old.write(_batch(spark, [(0, "zero")], 0, 0))
    old.write(_batch(spark, [(1, "one")], 1, 0))
    new = _sink(path)
    new.fence_earlier_epochs("p", 1)
    new.lift_epoch_fence("p", 1)

    hint = new.remove_batch_hint("p", 0, 1)
    assert hint is not None
    assert hint.startswith(
        f"Its rows are version 1 of the Delta table at {path}, the table's last commit but "
        "for the 2 epoch fence commits after it (without rows; a new epoch's start fences "
        "again): to remove them, restore the table to version 0 "
    )
    DeltaTable(str(path)).restore(0)
    assert new.holds_batch("p", 0, 1) is False
    assert _rows(path) == [(0, "zero")]


def _protocol(path: Path, reader: list[str], writer: list[str]) -> None:
    """Commit by hand a protocol with table features (what delta-spark writes when a
    feature delta-rs 1.6.6 lacks is enabled: row tracking, liquid clustering...)."""
    import json
    import time

    version = DeltaTable(str(path)).version() + 1
    protocol: dict[str, Any] = {"minReaderVersion": 3 if reader else 1, "minWriterVersion": 7,
                                "writerFeatures": writer}  # fmt: skip
    if reader:
        protocol["readerFeatures"] = reader
    info = {"timestamp": int(time.time() * 1000), "operation": "SET TBLPROPERTIES"}
    log = path / "_delta_log" / f"{version:020d}.json"
    log.write_text(json.dumps({"commitInfo": info}) + "\n" + json.dumps({"protocol": protocol}))


@pytest.mark.parametrize(
    ("reader", "writer"),
    [([], ["rowTracking", "domainMetadata"]), (["futureFeature"], ["futureFeature"])],
    ids=["delta-rs cannot write", "delta-rs cannot read"],
)
def test_a_table_delta_rs_cannot_fence_is_not_fenced_and_the_start_goes_on(
    spark: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    reader: list[str],
    writer: list[str],
) -> None:
    """A table with a feature delta-rs cannot write (or read), written by engine
    ``spark`` (delta-spark can): the fence cannot be committed, and is skipped with a
    warning (the replaced driver's batch in flight detected by the ledger, not prevented,
    as before the fence) rather than refusing every start and every write of an epoch > 0
    of a pipeline that ran. The write itself is stubbed (no delta-spark jars here): what
    is checked is that it is reached, the fence's warning logged once per process."""
    path = tmp_path / "t"
    _sink(path).write(_batch(spark, [(0, "zero")], 0, 0))
    sink = _sink(path)
    sink.resolved_engine = "spark"  # as opened with the jars (which open a table delta-rs cannot)
    _protocol(path, reader, writer)
    version = len(list((path / "_delta_log").glob("*.json")))
    written: list[int] = []

    def write_spark(target: Any, batch: Batch) -> SinkResult:
        written.append(batch.batch_id)
        return SinkResult(rows=1)

    monkeypatch.setattr(spark_engine, "write_spark", write_spark)
    with caplog.at_level("WARNING", logger="fanout_delta"):
        sink.fence_earlier_epochs("p", 1)  # the start's fence
        sink.lift_epoch_fence("p", 1)  # the start refused after it: nothing to lift
        sink.write(_batch(spark, [(1, "new")], 0, 1))
        sink.write(_batch(spark, [(2, "new")], 1, 1))
    assert written == [0, 1]
    assert len(list((path / "_delta_log").glob("*.json"))) == version  # nothing committed
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2, warnings  # the start's, then this process's first write's
    assert "sink 's'" in warnings[0] and str(path) in warnings[0]
    assert "not fenced" in warnings[0] and "Stop the replaced query" in warnings[0]


def test_a_restore_to_before_the_fence_keeps_it(spark: Any, tmp_path: Path) -> None:
    """A RESTORE takes rows out, not app transactions (delta-rs 1.6.6): restored to a
    version before the fence, the table still closes the old epoch, whose next write is
    refused; the new epoch's own rows (after the fence) are taken out with the restore."""
    path = tmp_path / "t"
    old = _sink(path)
    old.write(_batch(spark, [(0, "zero")], 0, 0))
    new = _sink(path)
    new.fence_earlier_epochs("p", 1)
    new.write(_batch(spark, [(1, "new")], 0, 1))
    DeltaTable(str(path)).restore(0)

    with pytest.raises(EpochFencedError, match="epoch 1 of the pipeline"):
        old.write(_batch(spark, [(1, "old")], 1, 0))
    assert _rows(path) == [(0, "zero")]
    assert _written(path, OLD) == EPOCH_FENCE + 1
    assert new.holds_batch("p", 0, 0) is True


class _HoldAfterWrite:
    """A plugin of the running query: holds its sink ``s1``'s batch 1 between the write
    and the mark (committed in the table, not yet in the ledger) until :attr:`go` is set;
    its sink ``s2`` writes the batch after."""

    def __init__(self) -> None:
        self.reached, self.go = threading.Event(), threading.Event()

    @hookimpl
    def fanout_sink_done(self, info: BatchInfo, sink: str, result: Any, duration_s: float) -> None:
        if info.batch_id == 1 and sink == "s1":
            self.reached.set()
            assert self.go.wait(120), "the test never let the running query go on"


def test_a_mistaken_second_query_refused_for_a_held_batch_leaves_the_running_query_alone(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second query of the pipeline started on a fresh checkpoint (``--new-epoch``) while
    the first one runs: the running query's batch 1 is committed in s1's table, not yet
    marked, and s2 not yet written. The new query's start finds s1 holding batch 1 and is
    refused. The running query goes on while the start is asked (its s1 mark, then its s2
    write, land during the question), and completes its batch; neither table gets a
    commit of the refused start. Before, the start fenced both tables first (a commit in
    each), so the running query's s2 write read the fence and failed (EpochFencedError:
    its batch failed, BatchFailedError), and the refusal's lift added a commit more: s1 at
    version 3, s2 at version 2, holding batch 0 only."""
    t1, t2 = tmp_path / "t1", tmp_path / "t2"

    def fan(on_reset: str, *plugins: object) -> FanOut:
        sinks = [{"type": "delta", "name": name, "path": str(path), "mode": "append",
                  "write_from": "driver"} for name, path in (("s1", t1), ("s2", t2))]  # fmt: skip
        return FanOut(
            "p", str(tmp_path / "ledger"), sinks, plugins=plugins, parallelism=1, retries=0,
            on_checkpoint_reset=on_reset,  # type: ignore[arg-type]
        )  # fmt: skip

    hold = _HoldAfterWrite()
    running = fan("refuse", hold)
    hold.go.set()
    running.process(spark.createDataFrame([(0, "zero")], SCHEMA), _info(0, "q-old", 1))
    hold.go.clear()
    outcome: dict[str, Any] = {}

    def batch_1() -> None:
        try:
            running.process(spark.createDataFrame([(1, "m+1")], SCHEMA), _info(1, "q-old", 3))
            outcome["running"] = "done"
        except Exception as exc:
            outcome["running"] = exc

    thread = threading.Thread(target=batch_1)
    thread.start()
    assert hold.reached.wait(120), "the running query never wrote batch 1 to s1"
    real = DeltaSink.holds_batch

    def asked(self: DeltaSink, pipeline: str, epoch: int, batch_id: int) -> bool | None:
        if batch_id == 1:  # not the lost-target check's question about batch 0, before it
            hold.go.set()  # the running query goes on during the start's question
            thread.join(120)
        return real(self, pipeline, epoch, batch_id)

    monkeypatch.setattr(DeltaSink, "holds_batch", asked)
    mistaken = fan("new_epoch")
    try:
        with pytest.raises(UnmarkedBatchError) as refused:
            mistaken.process(spark.createDataFrame([(1, "m+1")], SCHEMA), _info(1, "q-new", 3))
    finally:
        hold.go.set()
        thread.join(120)
        running.close()
        mistaken.close()

    assert outcome == {"running": "done"}
    assert str(refused.value).startswith(
        "pipeline 'p': query q-new cannot start epoch 1: sink s1 holds batch 1, sink s2 holds "
        "batch 1 of epoch 0 by its own records"
    )
    assert _rows(t1) == _rows(t2) == [(0, "zero"), (1, "m+1")]
    assert (DeltaTable(str(t1)).version(), DeltaTable(str(t2)).version()) == (1, 1)
    assert DeltaLedger(str(tmp_path / "ledger")).current_epoch("p") == 0
