"""A lagging sink renamed while the spool keeps batches for it (docs/architecture.md §5,
"A sink renamed mid-batch", and §14.3).

Sink ``copy`` (``on_failure = "lag"``) lags on batches 1 and 2; the spool keeps them for
``copy``. Restarted with ``copy`` renamed to ``copy2`` (the same table), ``copy2`` had no
mark and was not behind (a sink never seen starts with the current batch), and the rename
check asked nothing (``copy``'s last mark, 0, is before the run's first batch minus one):
``copy2`` wrote batch 3 live, the table never got batches 1 and 2, and only a start-up
warning said the spool kept them for a sink not configured. The run is now refused before
anything is written, naming both sinks, the spooled batches and the ways on; renamed back,
the sink catches up from the spool and every batch is in the table once. Real Spark, real
Delta tables, ledger and spool, in process.
"""

from __future__ import annotations

import re
import shlex
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from fanout import BatchFailedError, BatchInfo, FanOut, SinksBehindError
from fanout.app.cli import main
from fanout.dispatch.targets import TargetChecks
from fanout.errors import SinkUnreachableError
from fanout.steps.renamed import RenamedSinkError
from fanout.testing.faults import MarkLost
from tests.integration.streams import delta_rows


def _fan(tmp_path: Path, name: str) -> FanOut:
    return FanOut(
        "ren", str(tmp_path / "ledger"),
        [{"type": "delta", "name": "lake", "path": str(tmp_path / "lake")},
         {"type": "delta", "name": name, "path": str(tmp_path / "copy"), "on_failure": "lag",
          "retries": 0}],
        retries=0, backoff_s=0, spool=str(tmp_path / "spool"), probe_interval_s=3600,
    )  # fmt: skip


def _batch(spark: Any, fan: FanOut, batch: int) -> Any:
    df = spark.range(batch * 10, batch * 10 + 3).withColumnRenamed("id", "order_id")
    return fan.process(df, BatchInfo("ren", batch, "q", {"s": batch}))


def _ids(path: Path) -> Counter[int]:
    return Counter(r["order_id"] for r in delta_rows(path))


def _spooled(fan: FanOut) -> list[tuple[int, list[str]]]:
    assert fan.spool is not None
    return [(b.batch_id, sorted(b.needed_by)) for b in fan.spool.batches()]


def _lag_on_batches_1_and_2(spark: Any, tmp_path: Path) -> list[tuple[int, list[str]]]:
    """Sink ``copy`` writes batch 0, then lags on batches 1 and 2 (its table moved aside,
    a file in its place; no probe: they stay spooled for it); its table put back after
    the run. What the spool kept, for whom, at the run's end."""
    copy, aside = tmp_path / "copy", tmp_path / "copy-aside"
    first = _fan(tmp_path, "copy")
    try:
        first.catchup.stop()  # no probe: the batches stay spooled for copy
        _batch(spark, first, 0)
        copy.rename(aside)
        copy.write_text("not a table")  # copy's writes fail: it lags on batches 1 and 2
        _batch(spark, first, 1)
        _batch(spark, first, 2)
        spooled = _spooled(first)
    finally:
        first.close()
    copy.unlink()
    aside.rename(copy)
    return spooled


def _lag_from_batch_0(spark: Any, tmp_path: Path) -> list[tuple[int, list[str]]]:
    """Sink ``copy`` lags from batch 0 on (its table path a file: no mark in the epoch),
    batches 0 and 1 spooled for it; the file removed after the run. What the spool kept,
    for whom, at the run's end."""
    copy = tmp_path / "copy"
    first = _fan(tmp_path, "copy")
    try:
        if copy.exists():
            shutil.rmtree(copy)
        copy.write_text("not a table")  # copy's writes fail from the first batch on
        first.catchup.stop()
        _batch(spark, first, 0)
        _batch(spark, first, 1)
        spooled = _spooled(first)
    finally:
        first.close()
    copy.unlink()
    return spooled


def test_a_lagging_sink_renamed_with_batches_spooled_for_it_is_refused(
    spark: Any, tmp_path: Path
) -> None:
    copy = tmp_path / "copy"
    assert _lag_on_batches_1_and_2(spark, tmp_path) == [(1, ["copy"]), (2, ["copy"])]
    batch_0 = Counter({0: 1, 1: 1, 2: 1})
    assert _ids(copy) == batch_0

    renamed = _fan(tmp_path, "copy2")  # the same table, the sink renamed
    try:
        # a run with no new batch (available_now, nothing to read): its final catch-up has
        # nothing for copy2, writes nothing, and the spool keeps batches 1 and 2 for copy
        assert {n: s.state for n, s in renamed.catch_up(timeout_s=60).items()} == {"copy2": "live"}
        assert _spooled(renamed) == [
            (1, ["copy"]), (2, ["copy"]),
        ]  # fmt: skip
        assert _ids(copy) == batch_0
        with pytest.raises(BatchFailedError) as refused:
            _batch(spark, renamed, 3)
    finally:
        renamed.close()
    error = refused.value.failures["copy2"]
    assert isinstance(error, RenamedSinkError)
    text = str(error)
    assert "holds batch 0 of sink 'copy'" in text and "sink 'copy2' has no mark" in text
    assert "the spool at" in text and "batches 1-2 of epoch 0 for sink 'copy'" in text
    assert "rename the sink back to 'copy'" in text and "--release-spooled" in text
    assert _ids(copy) == batch_0  # before: batch 3 written, batches 1 and 2 never
    assert _ids(tmp_path / "lake") == Counter({b * 10 + i: 1 for b in range(3) for i in range(3)})

    back = _fan(tmp_path, "copy")  # the way on it names: the old name catches up
    try:
        _batch(spark, back, 3)
        assert {n: s.state for n, s in back.catch_up(timeout_s=120).items()} == {"copy": "live"}
    finally:
        back.close()
    every = Counter({b * 10 + i: 1 for b in range(4) for i in range(3)})
    assert _ids(copy) == every and _ids(tmp_path / "lake") == every


def test_a_sink_lagging_since_the_epochs_first_batch_renamed_is_refused_and_released(
    spark: Any, tmp_path: Path
) -> None:
    """``copy`` lags from batch 0 on (its table path unusable): it has no mark in the epoch,
    so there is no batch of it to ask the new name's target about; the spool's index alone
    names its batches. Renamed ``copy2``, the run is refused (before: ``copy2`` wrote batch
    2 and batches 0 and 1 stayed in the spool for ``copy``); then the release command the
    refusal prints, run as printed, gives them up and the renamed sink starts with batch 2."""
    copy = tmp_path / "copy"
    assert _lag_from_batch_0(spark, tmp_path) == [(0, ["copy"]), (1, ["copy"])]

    renamed = _fan(tmp_path, "copy2")
    try:
        with pytest.raises(BatchFailedError) as refused:
            _batch(spark, renamed, 2)
    finally:
        renamed.close()
    error = refused.value.failures["copy2"]
    assert isinstance(error, RenamedSinkError)
    text = str(error)
    assert "batches 0-1 of epoch 0 for sink 'copy'" in text and "'copy2'" in text
    assert "rename the sink back to 'copy'" in text
    assert not copy.exists()  # before: batch 2 written there, batches 0 and 1 never

    command = re.search(r"`(fanout ledger skip [^`]*--release-spooled)`", text)
    assert command is not None
    assert main(shlex.split(command.group(1))[1:]) == 0  # as printed
    released = _fan(tmp_path, "copy2")
    try:
        assert released.spool is not None and released.spool.batches() == []
        _batch(spark, released, 2)
    finally:
        released.close()
    assert _ids(copy) == Counter({20: 1, 21: 1, 22: 1})
    assert _ids(tmp_path / "lake") == Counter({b * 10 + i: 1 for b in range(3) for i in range(3)})


def _down_at_first_open(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The Delta sink ``name``'s first ``open()`` cannot reach its target (its server down
    at the run's start: it starts behind, ``on_failure="lag"``); later ones open it."""
    from fanout_delta.sink import DeltaSink

    opened, down = DeltaSink.open, {name}

    def open_once_down(self: DeltaSink, context: Any) -> None:
        if self.name in down:
            down.discard(self.name)
            raise SinkUnreachableError("simulated: the store cannot be reached", sink=self.name)
        opened(self, context)

    monkeypatch.setattr(DeltaSink, "open", open_once_down)


def _commit_and_lose_mark(spark: Any, tmp_path: Path, batch: int) -> None:
    """Sink ``copy``, alone, commits batch ``batch`` to its table and loses its ledger mark
    (the kill between the write and the mark): the batch fails, the table holds it."""
    lost = FanOut("ren", MarkLost(str(tmp_path / "ledger"), "copy"),
                  [{"type": "delta", "name": "copy", "path": str(tmp_path / "copy")}],
                  retries=0, backoff_s=0)  # fmt: skip
    try:
        with pytest.raises(BatchFailedError):
            _batch(spark, lost, batch)
    finally:
        lost.close()


def _run_with_copy2_down(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch: int
) -> tuple[FanOut, SinksBehindError | None]:
    """Run batch ``batch`` with ``copy`` renamed ``copy2`` (the same table), whose target
    cannot be reached at the run's start (not opened: the batch is spooled for it), then
    the run's final catch-up, which reopens it. The closed pipeline and the catch-up's
    :class:`SinksBehindError` (``None`` when every sink caught up)."""
    _down_at_first_open(monkeypatch, "copy2")
    renamed = _fan(tmp_path, "copy2")
    try:
        assert renamed.unopened == ("copy2",)
        renamed.catchup.stop()
        _batch(spark, renamed, batch)
        try:
            renamed.final_catch_up()  # reopens copy2: asked before it writes
        except SinksBehindError as exc:
            return renamed, exc
        return renamed, None
    finally:
        renamed.close()


def test_a_renamed_sink_opened_late_is_asked_before_its_catch_up_writes(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``copy`` lags on batches 1 and 2 (spooled for it); renamed ``copy2`` (the same table),
    whose target cannot be reached when the next run starts: not opened, so the start's
    rename check did not ask it, and once reopened its catch-up wrote batch 3 as a new
    sink's (before: the table held batches 0 and 3, never 1 and 2, and ``copy2``, marked,
    was no longer new at the next start). It is asked once it opens, before its first
    write: it lags with the :class:`RenamedSinkError`, the other sink goes on."""
    copy = tmp_path / "copy"
    _lag_on_batches_1_and_2(spark, tmp_path)
    batch_0 = Counter({0: 1, 1: 1, 2: 1})

    renamed, behind = _run_with_copy2_down(spark, tmp_path, monkeypatch, 3)
    assert _ids(copy) == batch_0  # before: batches 0 and 3, never 1 and 2
    assert behind is not None
    text = str(behind)
    assert "RenamedSinkError" in text and "holds batch 0 of sink 'copy'" in text
    assert "batches 1-2 of epoch 0 for sink 'copy'" in text
    assert "Not written by the next run until you act: copy2" in text  # stuck, not retried
    assert _ids(tmp_path / "lake") == Counter({b * 10 + i: 1 for b in range(4) for i in range(3)})
    failed = sorted(
        (r["batch_id"], r["error"].split(":")[0])
        for r in delta_rows(tmp_path / "ledger")
        if r["sink"] == "copy2" and r["status"] == "failed"
    )
    # the live batch's failure is the open's (or, if its reopen was done first, the refusal)
    assert (3, "RenamedSinkError") in failed and {b for b, _ in failed} == {3}
    assert _spooled(renamed) == [
        (1, ["copy"]), (2, ["copy"]), (3, ["copy2"]),
    ]  # fmt: skip


def test_a_sink_lagging_since_the_epochs_first_batch_renamed_and_opened_late_is_refused(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``copy`` lags from batch 0 on (batches 0 and 1 spooled for it, no mark in the epoch);
    renamed ``copy2`` (the same table), whose target cannot be reached at the next run's
    start: not opened, batch 2 spooled for it and its failure recorded. Once reopened, the
    ledger named ``copy2`` through that failure row of this run, so its check took it for a
    name the ledger knew (before: no refusal, the table got batch 2 only and batches 0 and
    1 stayed spooled for ``copy``). It lags with the :class:`RenamedSinkError`."""
    copy = tmp_path / "copy"
    _lag_from_batch_0(spark, tmp_path)

    renamed, behind = _run_with_copy2_down(spark, tmp_path, monkeypatch, 2)
    assert not copy.exists()  # before: batch 2 written there, batches 0 and 1 never
    assert behind is not None
    text = str(behind)
    assert "RenamedSinkError" in text and "batches 0-1 of epoch 0 for sink 'copy'" in text
    assert "rename the sink back to 'copy'" in text
    assert _ids(tmp_path / "lake") == Counter({b * 10 + i: 1 for b in range(3) for i in range(3)})
    assert _spooled(renamed) == [
        (0, ["copy"]), (1, ["copy"]), (2, ["copy2"]),
    ]  # fmt: skip

    again = _fan(tmp_path, "copy2")  # restarted as is (the run exited 3), copy2 reachable
    try:
        again.catchup.stop()
        with pytest.raises(BatchFailedError) as refused:
            _batch(spark, again, 3)
    finally:
        again.close()
    error = refused.value.failures["copy2"]
    assert isinstance(error, RenamedSinkError)
    assert "batches 0-1 of epoch 0 for sink 'copy'" in str(error)
    assert not copy.exists()


def test_a_sink_renamed_mid_batch_opened_late_does_not_write_the_batch_twice(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``copy`` committed batch 1 and lost its mark (the kill); renamed ``copy2`` (the same
    table), whose target cannot be reached at the replay's start: not opened, not asked,
    and once reopened its catch-up wrote batch 1 a second time (before: ids 10-12 twice in
    the table, no error; the Delta sink's own first-write check did not refuse it). Asked
    once it opens, it lags with the :class:`RenamedSinkError`, nothing written."""
    first = _fan(tmp_path, "copy")
    _batch(spark, first, 0)
    first.close()
    _commit_and_lose_mark(spark, tmp_path, 1)  # lake not run
    held = Counter({i: 1 for i in (0, 1, 2, 10, 11, 12)})
    assert _ids(tmp_path / "copy") == held

    _, behind = _run_with_copy2_down(spark, tmp_path, monkeypatch, 1)  # the replay
    assert _ids(tmp_path / "copy") == held  # before: ids 10, 11, 12 twice
    assert behind is not None
    text = str(behind)
    assert "RenamedSinkError" in text and "holds batch 1 of sink 'copy'" in text
    assert "rename the sink back to 'copy'" in text
    assert _ids(tmp_path / "lake") == Counter({b * 10 + i: 1 for b in range(2) for i in range(3)})

    # restarted as is (the run exited 3), copy2 reachable: the start asks it about batch 1,
    # the first it would write (spooled for it), not only the run's first, batch 2
    again = _fan(tmp_path, "copy2")
    try:
        again.catchup.stop()
        with pytest.raises(BatchFailedError) as refused:
            _batch(spark, again, 2)  # before: no error (its catch-up then wrote ids 10-12 twice)
    finally:
        again.close()
    error = refused.value.failures["copy2"]
    assert isinstance(error, RenamedSinkError) and "holds batch 1 of sink 'copy'" in str(error)
    assert _ids(tmp_path / "copy") == held
    assert _ids(tmp_path / "lake") == Counter({b * 10 + i: 1 for b in range(2) for i in range(3)})

    # restarted as is once more, copy2 down at the start again: its reopen, before the
    # run's first batch (a catch-up started with the query), is refused (LOST); the first
    # batch then lets it lag with that refusal, the other sink writes (before: the first
    # batch asked it again as an open sink, and the whole run failed)
    _down_at_first_open(monkeypatch, "copy2")
    third = _fan(tmp_path, "copy2")
    try:
        assert third.unopened == ("copy2",)
        third.catchup.stop()
        lags = third.catch_up(timeout_s=60)  # reopens copy2: refused before any batch
        assert (lags["copy2"].error or "").startswith("RenamedSinkError")
        _batch(spark, third, 2)  # before: BatchFailedError, copy2's RenamedSinkError
        assert third.lagging.stuck("copy2")
        # probed again (a catch-up after the batch): still refused, never reopened unasked
        lags = third.catch_up(timeout_s=60)
        assert (lags["copy2"].error or "").startswith("RenamedSinkError")
        assert _ids(tmp_path / "copy") == held
    finally:
        third.close()
    assert _ids(tmp_path / "copy") == held
    assert _ids(tmp_path / "lake") == Counter({b * 10 + i: 1 for b in range(3) for i in range(3)})
    assert _spooled(third) == [
        (1, ["copy2"]), (2, ["copy2"]),
    ]  # fmt: skip
    refusals = [
        r["batch_id"]
        for r in delta_rows(tmp_path / "ledger")
        if r["sink"] == "copy2" and r["status"] == "failed"
        and r["error"].startswith("RenamedSinkError")
    ]  # fmt: skip
    assert 1 in refusals  # the reopen's refusal, recorded at the batch it would write


def test_a_renamed_sink_whose_reopen_races_the_runs_first_check_is_asked(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above (``copy`` committed batch 1, mark lost; renamed ``copy2`` down at the
    start), but ``copy2``'s reopen (the catch-up's probe) asks its check before the run's
    first batch (nothing to ask about yet) and is moved to open only after that batch's
    renamed check read which sinks are open (``copy2`` still ``OPENING``): neither asked
    it, and the batch wrote ids 10-12 a second time. The interleaving is forced with two
    events; the reopen's check sees the first batch's check ran meanwhile and asks again."""
    import threading

    first = _fan(tmp_path, "copy")
    _batch(spark, first, 0)
    first.close()
    _commit_and_lose_mark(spark, tmp_path, 1)  # lake not run
    held = Counter({i: 1 for i in (0, 1, 2, 10, 11, 12)})

    asked, checked = threading.Event(), threading.Event()
    ask_reopened, refuse_renamed = TargetChecks.ask_reopened, TargetChecks.refuse_renamed

    def ask_then_wait(self: TargetChecks, name: str) -> Any:
        answer = ask_reopened(self, name)
        if not asked.is_set():  # the first ask: before the run's first batch
            asked.set()
            assert checked.wait(60)
        return answer

    def check_then_signal(self: TargetChecks, state: Any) -> None:
        try:
            refuse_renamed(self, state)
        finally:
            checked.set()
        deadline = time.monotonic() + 60  # the reopen moves copy2 on before the batch plans
        while "copy2" in self.lagging.not_opened() and time.monotonic() < deadline:
            time.sleep(0.01)

    monkeypatch.setattr(TargetChecks, "ask_reopened", ask_then_wait)
    monkeypatch.setattr(TargetChecks, "refuse_renamed", check_then_signal)
    _down_at_first_open(monkeypatch, "copy2")
    renamed = _fan(tmp_path, "copy2")
    try:
        assert renamed.unopened == ("copy2",)
        renamed.catchup.stop()
        renamed.lagging.reopen("copy2", wait=False)  # as the catch-up's probe
        assert asked.wait(60)
        _batch(spark, renamed, 1)  # the replay's first batch
        behind: SinksBehindError | None = None
        try:
            renamed.final_catch_up()
        except SinksBehindError as exc:
            behind = exc
    finally:
        renamed.close()
    assert _ids(tmp_path / "copy") == held  # before: ids 10, 11, 12 twice
    assert behind is not None
    text = str(behind)
    assert "RenamedSinkError" in text and "holds batch 1 of sink 'copy'" in text
    assert _ids(tmp_path / "lake") == Counter({b * 10 + i: 1 for b in range(2) for i in range(3)})


def test_a_sink_renamed_in_its_first_batch_is_refused_by_the_delta_table_at_catch_up(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``copy`` committed its very first batch and lost its mark (the kill): the ledger
    never names it, so only the Delta sink's own first-write check can tell. Renamed
    ``copy2``, not opened at the replay's start, its catch-up (from the spool) is that
    check's write path; the batch has no planning time (``BatchInfo`` without it), so
    ``copy``'s commit records no plan and is found by its ``txn`` action (before: ids
    10-12 twice in the table, no error)."""
    _commit_and_lose_mark(spark, tmp_path, 1)  # lake not run
    held = Counter({10: 1, 11: 1, 12: 1})
    assert _ids(tmp_path / "copy") == held

    _, behind = _run_with_copy2_down(spark, tmp_path, monkeypatch, 1)  # the replay
    assert _ids(tmp_path / "copy") == held  # bc30380: ids 10, 11, 12 twice
    assert behind is not None
    text = str(behind)
    assert "RenamedSinkError" in text and "holds batch 1 of sink 'copy'" in text
    assert "'fanout/ren/copy'" in text
    assert _ids(tmp_path / "lake") == held
