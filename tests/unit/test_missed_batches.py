"""A sink is never written past batches it did not receive (docs/architecture.md §14.1):
the gap check before the writes, what it does not refuse, the spool kept for a sink left
out of the configuration, and the explicit acknowledgement, ``fanout ledger skip``."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fanout import FanOut, MissedBatchesError, SinkWriteError
from fanout.app.cli import main
from fanout.contract.batch import BatchInfo
from fanout.errors import ConfigurationError
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.gaps import skip_batches
from fanout.ledger.memory import MemoryLedger
from fanout.sink_spec import SinkSpec, lag_policy
from fanout.spool.table import Spool
from tests.newest_lines import readout, without_newest
from tests.unit.fakes import SchemaFrame, ScriptedSink

FRAMES = {b: SchemaFrame([b * 10, b * 10 + 1]) for b in range(8)}


def _lag(sink: ScriptedSink) -> SinkSpec:
    return SinkSpec(sink, lag=lag_policy(sink.name, {"on_failure": "lag"}))


def _run(fan: FanOut, batches: range, query: str = "q") -> None:
    try:
        for batch in batches:
            fan.process(FRAMES[batch], BatchInfo("gap", batch, query))
    finally:
        fan.close()


def _location(ledger: MemoryLedger) -> str:
    return f"MemoryLedger@{id(ledger):x}"


def _failing_over(ledger: Any, spool: str, down: ScriptedSink) -> FanOut:
    """The pipeline writing "good" and ``down``, which lags when it fails (at once, without
    a retry's backoff; no probe of its target for an hour)."""
    return FanOut(
        "gap", ledger, [ScriptedSink("good"), _lag(down)], backoff_s=0, spool=spool,
        probe_interval_s=3600,
    )  # fmt: skip


def _put_back(ledger: Any, spool: str, batch: int, **options: Any) -> list[tuple[int, int]]:
    """Sink "down" put back in the pipeline, its target up: batch ``batch`` processed, then
    its catch-up (its held batches read from memory). Its write's calls (batch id, attempt)."""
    back = ScriptedSink("down")
    fan = FanOut(
        "gap", ledger, [ScriptedSink("good"), _lag(back)], spool=spool, probe_interval_s=3600,
        **options,
    )  # fmt: skip
    try:
        _catch_up_from_memory(fan)
        fan.process(FRAMES[batch], BatchInfo("gap", batch, "q"))
        fan.catch_up(timeout_s=30)
    finally:
        fan.close()
    return back.calls


def _kept(ledger: Any, spool: str) -> list[int]:
    """The batches the spool keeps, as the pipeline without sink "down" opens it."""
    restarted = FanOut("gap", ledger, [ScriptedSink("good")], spool=spool)
    try:
        return [b.batch_id for b in restarted.lagging.spool.batches()]  # type: ignore[union-attr]
    finally:
        restarted.close()


def _catch_up_from_memory(fan: FanOut) -> None:
    def read(sink: str, key: tuple[int, int]) -> tuple[Any, BatchInfo]:
        spooled = fan.lagging.spool.get(key)  # type: ignore[union-attr]
        assert spooled is not None, key
        return FRAMES[key[1]], spooled.info()

    fan.catchup._reader.read = read  # type: ignore[method-assign]


def test_a_sink_removed_and_put_back_is_refused_then_goes_on_after_an_explicit_skip() -> None:
    ledger = MemoryLedger()
    _run(FanOut("gap", ledger, [ScriptedSink("good"), ScriptedSink("pg")]), range(2))
    _run(FanOut("gap", ledger, [ScriptedSink("good")]), range(2, 5))  # pg left out: 2-4

    good, pg = ScriptedSink("good"), ScriptedSink("pg")
    fan = FanOut("gap", ledger, [good, pg])
    with pytest.raises(MissedBatchesError) as refused:
        _run(fan, range(5, 6))
    assert (good.calls, pg.calls) == ([], [])  # refused before any sink writes
    error = refused.value
    assert (error.sink, error.mark, error.batch_id, error.missing) == ("pg", 1, 5, [2, 3, 4])
    message = str(error)
    assert message.startswith(
        "pipeline 'gap', batch 5: sink 'pg' last committed batch 1 and never received "
        "batch(es) 2-4, which neither the spool nor a backfill source holds for it"
    )
    assert "backfill_from=" in message
    assert "fanout ledger skip --ledger MemoryLedger@" in message
    assert message.endswith(
        "--pipeline gap --sink pg --through 4 --epoch 0` (in Python: "
        "fanout.ledger.gaps.skip_batches), then restart."
    )
    assert ledger.last_committed("gap", ["good", "pg"]) == {"good": 4, "pg": 1}

    done = skip_batches(ledger, "gap", "pg", 4)
    assert (done.before, done.through, done.recorded) == (1, 4, True)
    skipped = [e for e in ledger.committed_entries("gap", 4) if e.sink == "pg"]
    assert [(e.batch_id, e.rows, e.query_id, e.error) for e in skipped] == [
        (4, 0, "q", "skipped: batches 2-4 were never written to this sink (fanout ledger skip)")
    ]
    assert skip_batches(ledger, "gap", "pg", 3).recorded is False  # already held

    good, pg = ScriptedSink("good"), ScriptedSink("pg")
    _run(FanOut("gap", ledger, [good, pg]), range(5, 7))
    assert (good.calls, pg.calls) == ([(5, 1), (6, 1)], [(5, 1), (6, 1)])


def test_a_lagging_sink_left_out_for_a_batch_is_refused_naming_what_the_spool_keeps(
    tmp_path: Path,
) -> None:
    ledger, spool = MemoryLedger(), str(tmp_path / "spool")
    _held_then_missed(ledger, spool)

    # its target is still down when it is put back: the held batches cannot be given first
    back = ScriptedSink("down", always_fail=SinkWriteError("still down", sink="down"))
    fan = FanOut("gap", ledger, [ScriptedSink("good"), _lag(back)], spool=spool)
    _catch_up_from_memory(fan)  # the held batches are readable whether or not Spark runs
    with pytest.raises(MissedBatchesError) as refused:
        _run(fan, range(4, 5))
    assert back.calls == [(1, 1)]  # the first held batch, refused; batch 4 not written
    assert (refused.value.mark, refused.value.missing, refused.value.spooled) == (0, [3], [1, 2])
    assert (
        "sink 'down' last committed batch 0 and never received batch(es) 3, which neither"
        in str(refused.value)
    )
    assert str(refused.value).endswith(
        "; or once 'down' holds batch(es) 1-2, which the spool or its backfill source still "
        "holds for it and which could not be written to it now (they are written first, in "
        "order, at each start: fix the sink and restart), accept that it never gets batch(es) "
        f"3: `fanout ledger skip --ledger {_location(ledger)} --pipeline gap --sink down "
        f"--through 3 --epoch 0 --spool {spool}` (in Python: fanout.ledger.gaps.skip_batches), "
        "then restart. A skip past batches the spool still holds is refused: --release-spooled "
        "gives them up too."
    )


def test_skip_refuses_batches_no_sink_has_run() -> None:
    ledger = MemoryLedger()
    _run(FanOut("gap", ledger, [ScriptedSink("good"), ScriptedSink("pg")]), range(2))
    with pytest.raises(ConfigurationError, match="no other sink of the pipeline committed batch 2"):
        skip_batches(ledger, "gap", "pg", 2)
    assert ledger.last_committed("gap", ["pg"]) == {"pg": 1}


def test_what_is_not_refused_new_sink_next_batch_replay_and_a_new_epoch() -> None:
    ledger = MemoryLedger()
    _run(FanOut("gap", ledger, [ScriptedSink("good")]), range(3))

    good, new = ScriptedSink("good"), ScriptedSink("new")
    fan = FanOut("gap", ledger, [good, new])  # "new" has no mark: starts with this batch
    _run(fan, range(3, 5))
    assert (good.calls, new.calls) == ([(3, 1), (4, 1)], [(3, 1), (4, 1)])

    good, new = ScriptedSink("good"), ScriptedSink("new")
    _run(FanOut("gap", ledger, [good, new]), range(4, 6))  # a replay of 4, then 5
    assert (good.calls, new.calls) == ([(5, 1)], [(5, 1)])

    # a reset accepted as a new epoch: marks are per epoch, batch 0 starts afresh
    good, new = ScriptedSink("good"), ScriptedSink("new")
    fan = FanOut("gap", ledger, [good, new], on_checkpoint_reset="new_epoch")
    _run(fan, range(2), query="q2")
    assert (good.calls, new.calls) == ([(0, 1), (1, 1)], [(0, 1), (1, 1)])
    assert ledger.last_committed("gap", ["good", "new"], epoch=1) == {"good": 1, "new": 1}


def test_a_lag_sink_whose_spool_covers_the_gap_catches_up_across_a_restart(
    tmp_path: Path,
) -> None:
    ledger, spool = MemoryLedger(), str(tmp_path / "spool")
    down = ScriptedSink("down", always_fail=SinkWriteError("refused", sink="down"))
    fan = _failing_over(ledger, spool, down)
    _run(fan, range(3))  # "down" lags from batch 0: 0-2 spooled
    _run(FanOut("gap", ledger, [ScriptedSink("good"), _lag(down)], spool=spool), range(3, 4))
    assert ledger.last_committed("gap", ["good", "down"]) == {"good": 3, "down": None}

    calls = _put_back(ledger, spool, 4, backoff_s=0)  # 4 behind: held back, spooled
    assert [b for b, _ in calls] == [0, 1, 2, 3, 4]


def test_a_lag_sink_holding_some_batches_with_its_spool_covering_the_rest_is_not_refused(
    tmp_path: Path,
) -> None:
    ledger, spool = MemoryLedger(), str(tmp_path / "spool")
    _held(ledger, spool)

    assert [b for b, _ in _put_back(ledger, spool, 3, backoff_s=0)] == [1, 2, 3]


def test_a_left_out_sinks_spool_is_kept_until_skip_releases_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ledger, spool = MemoryLedger(), str(tmp_path / "spool")
    _held(ledger, spool)

    caplog.clear()
    without = FanOut("gap", ledger, [ScriptedSink("good")], spool=spool)  # removed for good
    assert [r.getMessage() for r in caplog.records if "not configured" in r.getMessage()] == [
        f"pipeline gap: the spool at {spool} keeps 2 batch(es) of epoch 0 (from batch 1) for "
        "sink 'down', which is not configured: put back with on_failure='lag', it catches up "
        "from them; removed for good, release them with `fanout ledger skip --ledger "
        f"{_location(ledger)} --pipeline gap --sink down --through 2 --epoch 0 --spool {spool} "
        "--release-spooled`"
    ]
    try:
        assert [b.batch_id for b in without.lagging.spool.batches()] == [1, 2]  # type: ignore[union-attr]
        without.process(FRAMES[3], BatchInfo("gap", 3, "q"))
        assert [b.batch_id for b in without.lagging.spool.batches()] == [1, 2]  # type: ignore[union-attr]
    finally:
        without.close()

    # a skip without the spool cannot see batches 1-2: they are kept, not released
    assert skip_batches(ledger, "gap", "down", 3).recorded
    caplog.clear()
    assert _kept(ledger, spool) == [1, 2]
    assert [r.getMessage() for r in caplog.records if "not configured" in r.getMessage()] == []
    assert len([r for r in caplog.records if "without --spool" in r.getMessage()]) == 1

    done = skip_batches(ledger, "gap", "down", 3, spool=_opened(spool), release_spooled=True)
    assert (done.recorded, done.released) == (False, (1, 2))
    assert _kept(ledger, spool) == []


def test_fanout_ledger_skip_on_a_delta_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / "ledger")
    ledger = DeltaLedger(path)
    _run(FanOut("gap", ledger, [ScriptedSink("good"), ScriptedSink("pg")]), range(1))
    _run(FanOut("gap", DeltaLedger(path), [ScriptedSink("good")]), range(1, 3))

    args = ["ledger", "skip", "--ledger", path, "--pipeline", "gap", "--sink", "pg"]
    assert main([*args, "--through", "3"]) == 2
    assert "no other sink of the pipeline committed batch 3 of epoch 0" in readout(capsys).err
    assert main([*args, "--through", "2"]) == 0
    assert readout(capsys).out.startswith(
        "pipeline 'gap', sink 'pg', epoch 0: batches 1-2 recorded as skipped (never written "
        "to it); the next batch writes it\n"
    )
    assert DeltaLedger(path).last_committed("gap", ["good", "pg"]) == {"good": 2, "pg": 2}

    pg = ScriptedSink("pg")
    _run(FanOut("gap", DeltaLedger(path), [ScriptedSink("good"), pg]), range(3, 4))
    assert pg.calls == [(3, 1)]


def test_a_sink_with_a_backfill_source_is_told_to_restore_the_spool_not_to_configure_one() -> None:
    error = MissedBatchesError(
        "gap", "pg", 0, 1, 5, [2, 3, 4], "/ledger", spooled=[], backfill_from="lake"
    )
    message = str(error)
    assert "backfill_from=" not in message
    assert (
        "Either give them back: restore the spool (the backfill source 'lake' of 'pg' holds "
        "none of them: it has no committed mark for them); or accept that 'pg' never gets "
        "them: `fanout ledger skip --ledger /ledger --pipeline gap --sink pg --through 4 "
        "--epoch 0`"
    ) in message


def _held(ledger: Any, spool: str) -> None:
    """Sink "down" commits batch 0, then lags through 1-2 (spooled for it)."""
    down = ScriptedSink("down")
    fan = _failing_over(ledger, spool, down)
    _run(fan, range(1))
    down.always_fail = SinkWriteError("refused", sink="down")
    _run(FanOut("gap", ledger, [ScriptedSink("good"), _lag(down)], spool=spool), range(1, 3))


def _held_then_missed(ledger: Any, spool: str) -> None:
    """Sink "down" commits batch 0, lags through 1-2 (spooled for it), is left out of the
    configuration for batch 3 (missed: nothing holds it)."""
    _held(ledger, spool)
    _run(FanOut("gap", ledger, [ScriptedSink("good")], spool=spool), range(3, 4))


def _opened(spool: str) -> Spool:
    opened = Spool(spool, "gap")
    opened.open()
    return opened


def test_a_sink_refused_at_a_gap_is_first_given_the_batches_held_before_it(
    tmp_path: Path,
) -> None:
    ledger, spool = MemoryLedger(), str(tmp_path / "spool")
    _held_then_missed(ledger, spool)

    back = ScriptedSink("down")
    fan = FanOut(
        "gap", ledger, [ScriptedSink("good"), _lag(back)], spool=spool, probe_interval_s=3600
    )
    _catch_up_from_memory(fan)
    with pytest.raises(MissedBatchesError) as refused:
        _run(fan, range(4, 5))
    assert back.calls == [(1, 1), (2, 1)]  # the held batches, in order; batch 4 not written
    error = refused.value
    assert (error.mark, error.missing, error.spooled) == (2, [3], [])
    assert str(error).endswith(
        f"--pipeline gap --sink down --through 3 --epoch 0 --spool {spool}` (in Python: "
        "fanout.ledger.gaps.skip_batches), then restart."
    )
    assert [b.batch_id for b in _opened(spool).needed_by("down")] == [1, 2]  # released later

    done = skip_batches(ledger, "gap", "down", 3, spool=_opened(spool))  # passes nothing held
    assert (done.before, done.through, done.recorded) == (2, 3, True)
    back = ScriptedSink("down")
    _run(FanOut("gap", ledger, [ScriptedSink("good"), _lag(back)], spool=spool), range(4, 6))
    assert back.calls == [(4, 1), (5, 1)]


def test_skip_refuses_to_give_up_batches_the_spool_still_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The sink is still down when put back: the held batches 1-2 cannot be given to it
    before the gap at 3. A skip through 3 would give their rows up: refused, naming them,
    unless --release-spooled says to."""
    path, spool = str(tmp_path / "ledger"), str(tmp_path / "spool")
    _held_then_missed(DeltaLedger(path), spool)

    down = ScriptedSink("down", always_fail=SinkWriteError("refused", sink="down"))
    fan = FanOut(
        "gap", DeltaLedger(path), [ScriptedSink("good"), _lag(down)], spool=spool,
        probe_interval_s=3600,
    )  # fmt: skip
    _catch_up_from_memory(fan)
    with pytest.raises(MissedBatchesError) as refused:
        _run(fan, range(4, 5))
    assert (refused.value.mark, refused.value.missing, refused.value.spooled) == (0, [3], [1, 2])
    assert str(refused.value).endswith(
        "; or once 'down' holds batch(es) 1-2, which the spool or its backfill source still "
        "holds for it and which could not be written to it now (they are written first, in "
        "order, at each start: fix the sink and restart), accept that it never gets batch(es) "
        f"3: `fanout ledger skip --ledger {path} --pipeline gap --sink down --through 3 "
        f"--epoch 0 --spool {spool}` (in Python: fanout.ledger.gaps.skip_batches), then "
        "restart. A skip past batches the spool still holds is refused: --release-spooled "
        "gives them up too."
    )

    args = ["ledger", "skip", "--ledger", path, "--pipeline", "gap", "--sink", "down"]
    readout(capsys)  # what the runs above logged
    assert main([*args, "--through", "3", "--spool", spool]) == 2
    assert readout(capsys).err == (
        f"fanout: configuration error: pipeline 'gap', sink 'down': the spool at {spool} "
        "still holds batch(es) 1-2 for it (after its mark 0): a skip through 3 would give "
        "their rows up. Either let it catch up from them first (start the pipeline with the "
        "sink configured: it is given the held batches before a gap, in order, then refused "
        "at the gap), then skip only what it never got; or, to give them up too (the sink "
        "removed for good), add --release-spooled (in Python: release_spooled=True)\n"
    )
    assert DeltaLedger(path).last_committed("gap", ["down"]) == {"down": 0}
    assert [b.batch_id for b in _opened(spool).needed_by("down")] == [1, 2]
    with pytest.raises(ConfigurationError, match=r"skip only the batches before them \(--th"):
        skip_batches(MemoryLedger(), "gap", "down", 4, spool=_opened(spool))  # no mark: 0 too
    assert main([*args, "--through", "3", "--spool", str(tmp_path / "nowhere")]) == 2
    assert readout(capsys).err.startswith(
        f"fanout: configuration error: --spool {tmp_path / 'nowhere'}: no spool there"
    )

    assert main([*args, "--through", "3", "--spool", spool, "--release-spooled"]) == 0
    assert "batches 1-3 recorded as skipped" in readout(capsys).out
    assert _kept(DeltaLedger(path), spool) == []


def test_a_skip_without_the_spool_keeps_the_batches_it_still_holds_and_names_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The operator runs the skip without --spool through 3 (past batches 1-2, which the
    spool holds for 'down'). The restart must neither drop those rows silently nor write
    them under a mark past them: they stay in the spool, named with the command that
    releases them, and that command (with --spool --release-spooled) releases them."""
    path, spool = str(tmp_path / "ledger"), str(tmp_path / "spool")
    _held_then_missed(DeltaLedger(path), spool)
    args = ["ledger", "skip", "--ledger", path, "--pipeline", "gap", "--sink", "down"]
    readout(capsys)
    assert main([*args, "--through", "3"]) == 0
    said = readout(capsys).out

    assert _put_back(DeltaLedger(path), spool, 4) == [(4, 1)]  # live from the batch after the skip
    assert [b.batch_id for b in _opened(spool).needed_by("down")] == [1, 2]  # rows kept
    assert said == (
        "pipeline 'gap', sink 'down', epoch 0: batches 1-3 recorded as skipped (never written "
        "to it); the next batch writes it\n"
        "pipeline 'gap', sink 'down', epoch 0: the backfill source was not checked (no "
        "--config): if the sink has backfill_from in the pipeline file, batches that source "
        "holds through this mark were given up too (they are not backfilled to it)\n"
        "pipeline 'gap', sink 'down', epoch 0: the spool was not checked (no --spool): batches "
        "it still holds for the sink through this mark are kept, neither written nor released; "
        "the pipeline's start-up names them and how to release them\n"
    )
    data = f"{spool}/batches"
    logged = readout(capsys).err.splitlines()  # main() logs to stderr from now on
    assert [line for line in logged if "without --spool" in line] == [
        "WARNING fanout: pipeline gap: sink 'down' was recorded as never getting batch(es) "
        "1-2 of epoch 0 by `fanout ledger skip` without --spool (or one with --release-spooled "
        "stopped before it released them), but the spool at "
        f"{spool} still holds them "
        "(4 row(s)): they are kept, neither written to the sink (its mark is past them) nor "
        "released. If the sink must get them, read their rows from the spool's Delta table "
        f"{data} (where _fanout_pipeline = 'gap', _fanout_epoch = 0 and _fanout_batch in "
        "those batch ids; a batch two drivers spooled at once is there twice, once per "
        "_fanout_spooling: take one; one the log said was written with its own types, a "
        "column the table keeps with another type, is in Parquet files of those types: read "
        "its files with its own schema, not as the table's) and write them to it yourself; "
        "then release them with "
        f"`fanout ledger skip --ledger {path} --pipeline gap --sink down --through 2 --epoch 0 "
        f"--spool {spool} --release-spooled`"
    ]

    assert main([*args, "--through", "2", "--epoch", "0", "--spool", spool,
                 "--release-spooled"]) == 0  # fmt: skip
    assert readout(capsys).out == (
        "pipeline 'gap', sink 'down', epoch 0: already holds batch 2 (its mark: 4); no mark "
        "recorded\n"
        f"pipeline 'gap', sink 'down', epoch 0: released batch(es) 1-2 from the spool at {spool}\n"
    )
    assert _opened(spool).batches() == []
    assert _opened(spool).size()[0] == 0
    assert main([*args, "--through", "2", "--release-spooled"]) == 2
    assert readout(capsys).err == (
        "fanout: configuration error: pipeline 'gap', sink 'down': --release-spooled releases "
        "batches from the spool: give it with --spool (in Python: spool=)\n"
    )


class _CountingLedger(MemoryLedger):
    """A memory ledger counting its scans (``committed_entries``)."""

    scans = 0

    def committed_entries(self, *args: Any, **kwargs: Any) -> Any:
        self.scans += 1
        return super().committed_entries(*args, **kwargs)


def test_a_skip_without_the_spool_made_while_the_pipeline_runs_keeps_the_batches(
    tmp_path: Path,
) -> None:
    """The running instance sees the skip's mark with its next batch's lookup: the batches
    the mark passes are still kept (one ledger scan, not one per release); the batches its
    catch-up wrote are released without a scan."""
    ledger, spool = _CountingLedger(), str(tmp_path / "spool")
    down = ScriptedSink("down", always_fail=SinkWriteError("refused", sink="down"))
    fan = _failing_over(ledger, spool, down)
    try:
        _catch_up_from_memory(fan)
        for batch in range(4):  # "down" lags from batch 0: 0-3 spooled
            fan.process(FRAMES[batch], BatchInfo("gap", batch, "q"))
        assert skip_batches(ledger, "gap", "down", 1).recorded  # while it runs, no --spool
        down.always_fail = None
        fan.process(FRAMES[4], BatchInfo("gap", 4, "q"))  # its lookup reads the mark 1
        scans = ledger.scans
        fan.catch_up(timeout_s=30)  # writes 2-4
        scans = ledger.scans - scans
    finally:
        fan.close()
    assert [b for b, _ in down.calls if b >= 2] == [2, 3, 4]
    assert [b.batch_id for b in _opened(spool).batches()] == [0, 1]  # kept: the skip's
    assert scans == 1  # for 0-1, once; none for the catch-up's own commits
    # what that check remembers is as small as the spool, however long the run: not the
    # live commits ("good" 0-4), nor the caught-up batches the spool let go (2-4)
    assert fan.lagging._release._written == set()
    assert set(fan.lagging._release._given_up) == {("down", (0, 0)), ("down", (0, 1))}


def test_the_batches_a_catch_up_wrote_leave_the_spool_without_a_ledger_scan(
    tmp_path: Path,
) -> None:
    """Whether a skip made without the spool holds a batch is read from the ledger only for
    the batches the running process did not see committed: those its catch-up wrote are
    released on what it saw (SpoolRelease.wrote), with no scan of the ledger's marks."""
    ledger, spool = _CountingLedger(), str(tmp_path / "spool")
    down = ScriptedSink("down", always_fail=SinkWriteError("refused", sink="down"))
    fan = _failing_over(ledger, spool, down)
    try:
        _catch_up_from_memory(fan)
        for batch in range(3):  # "down" lags from batch 0: 0-2 spooled
            fan.process(FRAMES[batch], BatchInfo("gap", batch, "q"))
        down.always_fail = None
        scans = ledger.scans
        fan.catch_up(timeout_s=30)  # writes 0-2, then releases them
        scans = ledger.scans - scans
    finally:
        fan.close()
    assert [b for b, _ in down.calls[-3:]] == [0, 1, 2]
    assert list(_opened(spool).batches()) == []
    assert scans == 0


def test_status_names_the_batches_a_skip_without_the_spool_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After a skip without --spool past batches 1-2 the spool holds for 'down', `fanout
    status --spool` names them for the sink (not as lag: its mark is past them), with the
    command releasing them, in its text and its JSON; once released, no more."""
    path, spool = str(tmp_path / "ledger"), str(tmp_path / "spool")
    _held_then_missed(DeltaLedger(path), spool)
    skip = ["ledger", "skip", "--ledger", path, "--pipeline", "gap", "--sink", "down"]
    assert main([*skip, "--through", "3"]) == 0
    status = ["status", "--ledger", path, "--pipeline", "gap", "--spool", spool]
    readout(capsys)

    assert main(status) == 0
    lines = readout(capsys).out.splitlines()
    release = (
        f"fanout ledger skip --ledger {path} --pipeline gap --sink down --through 2 --epoch 0 "
        f"--spool {spool} --release-spooled"
    )
    assert [line.split()[:3] for line in lines[2:4]] == [["gap", "down", "3"], ["gap", "good", "3"]]
    assert lines[4:9] == [
        "",
        "1 sink has failed attempts; `fanout status --wide` or `--json` shows the last error.",
        "",
        "pipeline gap, down: 2 batch(es) / 4 row(s) of epoch 0 (1-2) kept in the spool after a "
        "`fanout ledger skip` without --spool (or one with --release-spooled stopped before it "
        f"released them), neither written nor released: release them with `{release}`",
        "",
    ]
    assert lines[9].startswith(f"spool {spool} (gap): 2 batch(es), 4 row(s), ")
    assert len(lines) == 10
    assert main([*status, "--wide"]) == 0
    assert readout(capsys).out.splitlines()[4:] == lines[6:]

    assert main([*status, "--json"]) == 0
    sinks = {s["sink"]: s for s in json.loads(readout(capsys).out)}
    assert (sinks["down"]["state"], sinks["down"]["lag_batches"]) == ("live", 0)
    assert sinks["down"]["kept"] == [{"epoch": 0, "batches": [1, 2], "rows": 4, "release": release}]
    assert sinks["good"]["kept"] == []

    assert main(release.split()[1:]) == 0
    readout(capsys)
    assert main([*status, "--json"]) == 0
    assert [s["kept"] for s in json.loads(readout(capsys).out)] == [[], []]


def test_printed_commands_name_a_relative_ledger_and_spool_absolute(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Given as relative paths, the ledger and the spool are named absolute in every
    command fanout prints (the gap refusal's skip, the release of kept batches in the
    start-up warning and in `fanout status`), so each runs from any directory."""
    monkeypatch.chdir(tmp_path)
    ledger, spool = f"{tmp_path}/ledger", f"{tmp_path}/spool"
    _held_then_missed(DeltaLedger("ledger"), "spool")
    down = ScriptedSink("down", always_fail=SinkWriteError("refused", sink="down"))
    fan = FanOut(
        "gap", DeltaLedger("ledger"), [ScriptedSink("good"), _lag(down)], spool="spool",
        probe_interval_s=3600,
    )  # fmt: skip
    _catch_up_from_memory(fan)
    with pytest.raises(MissedBatchesError) as refused:
        _run(fan, range(4, 5))
    assert (
        f"3: `fanout ledger skip --ledger {ledger} --pipeline gap --sink down --through 3 "
        f"--epoch 0 --spool {spool}` (in Python: fanout.ledger.gaps.skip_batches), then restart."
    ) in str(refused.value)

    assert skip_batches(DeltaLedger("ledger"), "gap", "down", 3).recorded  # 1-2 kept
    release = (
        f"fanout ledger skip --ledger {ledger} --pipeline gap --sink down --through 2 "
        f"--epoch 0 --spool {spool} --release-spooled"
    )
    caplog.clear()
    FanOut("gap", DeltaLedger("ledger"), [ScriptedSink("good")], spool="spool").close()
    warnings = [r.getMessage() for r in caplog.records if "release them with" in r.getMessage()]
    assert [w.split("release them with ")[1] for w in warnings] == [f"`{release}`"]

    readout(capsys)
    assert main(["status", "--ledger", "ledger", "--pipeline", "gap", "--spool", "spool"]) == 0
    assert f"release them with `{release}`" in readout(capsys).out


def test_the_printed_skip_with_config_and_spool_runs_as_printed_from_a_quoted_directory(
    tmp_path: Path,
) -> None:
    """The pipeline's file, ledger and spool in a directory named ``it's & co``: the
    ``fanout ledger skip --config ... --ledger ... --spool ...`` the gap refusal of a
    ``FanOut`` given ``pipeline_file=`` prints, pasted into a shell (``sh -c``, a real
    subprocess, from another directory), records exactly the skip of batch 3 for "down"
    and leaves the other marks; the next run writes it from batch 4 on."""
    root = tmp_path / "it's & co"
    root.mkdir()
    ledger, spool, file = str(root / "ledger"), str(root / "spool"), root / "pipeline.toml"
    file.write_text(
        f'[pipeline]\nname = "gap"\nledger = "{ledger}"\nspool = "{spool}"\n'
        f'checkpoint = "{root / "ckpt"}"\n[source]\nformat = "rate"\n'
        + "".join(
            f'[[sinks]]\ntype = "delta"\nname = "{s}"\npath = "{root / s}"\non_failure = "{mode}"\n'
            for s, mode in (("good", "stop"), ("down", "lag"))
        )
    )
    _held_then_missed(DeltaLedger(ledger), spool)
    back = ScriptedSink("down")
    fan = FanOut(
        "gap", DeltaLedger(ledger), [ScriptedSink("good"), _lag(back)], spool=spool,
        probe_interval_s=3600, pipeline_file=str(file),
    )  # fmt: skip
    _catch_up_from_memory(fan)
    with pytest.raises(MissedBatchesError) as refused:
        _run(fan, range(4, 5))
    command = str(refused.value).split("`")[-2]
    assert command == (
        f"fanout ledger skip --config {shlex.quote(str(file))} --ledger {shlex.quote(ledger)} "
        f"--pipeline gap --sink down --through 3 --epoch 0 --spool {shlex.quote(spool)}"
    )
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["sh", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, without_newest(done.stdout, done.stderr)[1]) == (0, ""), done.stdout
    marks = [e for e in DeltaLedger(ledger).committed_entries("gap") if e.sink == "down"]
    assert sorted((e.epoch, e.batch_id, e.rows) for e in marks) == [
        (0, 0, 2),
        (0, 1, 2),
        (0, 2, 2),
        (0, 3, 0),  # the skip, run as printed
    ]
    assert DeltaLedger(ledger).last_committed("gap", ["good"]) == {"good": 3}  # 4 refused
    back = ScriptedSink("down")
    _run(FanOut("gap", DeltaLedger(ledger), [ScriptedSink("good"), _lag(back)], spool=spool),
         range(4, 6))  # fmt: skip
    assert back.calls == [(4, 1), (5, 1)]


def test_a_ledger_restored_from_an_older_copy_is_refused_then_goes_on_after_each_sinks_skip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ledger restored from a copy taken after batch 1, while Spark's checkpoint ran on
    to batch 3: every sink's mark is 1 at batch 4. The refusal names the restored ledger,
    and the skip it names is accepted (the refusal recorded that batch 4 ran); before, the
    skip was refused ("no other sink committed batch 3") for every sink, for ever."""
    path, copy = tmp_path / "ledger", tmp_path / "copy"
    _run(
        FanOut("gap", DeltaLedger(str(path)), [ScriptedSink("good"), ScriptedSink("pg")]), range(2)
    )
    shutil.copytree(path, copy)
    _run(
        FanOut("gap", DeltaLedger(str(path)), [ScriptedSink("good"), ScriptedSink("pg")]),
        range(2, 4),
    )
    shutil.rmtree(path)
    shutil.copytree(copy, path)

    skip = ["ledger", "skip", "--ledger", str(path), "--pipeline", "gap", "--through", "3"]
    for refused in ("good", "pg"):  # one sink named per start, in configuration order
        good, pg = ScriptedSink("good"), ScriptedSink("pg")
        with pytest.raises(MissedBatchesError) as raised:
            _run(FanOut("gap", DeltaLedger(str(path)), [good, pg]), range(4, 5))
        assert (good.calls, pg.calls) == ([], [])  # refused before any sink writes
        error = raised.value
        assert (error.sink, error.batch_id, error.missing) == (refused, 4, [2, 3])
        assert error.no_mark_since == (1 if refused == "good" else None)
        if refused == "good":
            assert (
                "No sink of the pipeline has a mark after batch 1, yet Spark ran the "
                "batches up to 3: when the ledger was restored from an older copy" in str(error)
            )
        assert main([*skip, "--sink", refused]) == 0, readout(capsys).err
        capsys.readouterr()

    good, pg = ScriptedSink("good"), ScriptedSink("pg")
    _run(FanOut("gap", DeltaLedger(str(path)), [good, pg]), range(4, 6))
    assert (good.calls, pg.calls) == ([(4, 1), (5, 1)], [(4, 1), (5, 1)])
    assert DeltaLedger(str(path)).last_committed("gap", ["good", "pg"]) == {"good": 5, "pg": 5}


def test_a_sink_left_out_while_another_ran_on_is_not_taken_for_a_restored_ledger() -> None:
    """Sink "a" left out of the configuration while "c" ran batches 2-3, then "c" left out
    and "a" put back: the refusal of "a" is the ordinary one. The ledger's high-water mark
    (3, "c"'s) shows the batches were marked: no "restored ledger" in the message, no
    failed row recorded (before, the configured sinks' marks alone, "a"'s 1, made it say
    that no sink of the pipeline has a mark after batch 1, and record one)."""
    ledger = MemoryLedger()
    _run(FanOut("gap", ledger, [ScriptedSink("a"), ScriptedSink("c")]), range(2))
    _run(FanOut("gap", ledger, [ScriptedSink("c")]), range(2, 4))

    a = ScriptedSink("a")
    with pytest.raises(MissedBatchesError) as raised:
        _run(FanOut("gap", ledger, [a]), range(4, 5))

    error = raised.value
    assert (error.sink, error.mark, error.batch_id, error.missing) == ("a", 1, 4, [2, 3])
    assert error.no_mark_since is None
    assert "restored" not in str(error)
    assert a.calls == []
    assert ledger.failed_batches("gap", 0, 0) == []
