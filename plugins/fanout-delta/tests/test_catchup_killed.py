"""A catch-up write of a spooled batch killed before the sink's ledger mark, restarted once
the Delta sink's app transactions expired (``delta.setTransactionRetentionDuration`` of 2
seconds): the next run's catch-up sees no replay of Spark's, and the sink cannot tell
whether its table holds the batch. Before, it appended the batch a second time; now the
catch-up notes in the spool's index that it is about to write the batch, so the next run
asks the sink first and refuses it, naming the skip that releases it (run as printed,
through the real CLI). The same for a batch a sink added later backfills from another
sink's table (in no spool: its note is a ledger row, fanout.ledger.begun). And a doubted
replay is recorded in the spool only for the lag sinks its earlier attempt could have
written: a sink already behind it gets it from its catch-up without a question (it was
refused needlessly once its records expired). Real Spark, Delta
sinks, ledger and spool; the killed catch-up runs in a driver subprocess
(catchup_driver.py) SIGKILLed with its JVM."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import catchup_driver
import pytest
from catchup_driver import PIPELINE, SILVER, fan_out
from deltacheck import ids
from fanout_delta import DeltaSink

from fanout import BatchInfo, FanOut, SinksBehindError
from fanout.ledger.delta import DeltaLedger
from fanout.sink_spec import SinkSpec, lag_policy
from fanout.testing.faults import DieAfterWrite, DownWhile, DriverKilled
from tests.cli_process import driver_process, fanout_process, printed_command

pytestmark = pytest.mark.integration

DRIVER = Path(catchup_driver.__file__)


class DownDelta(DownWhile, DeltaSink):
    """The Delta sink, its writes failing while ``down``."""


def _down(work: Path, name: str) -> SinkSpec:
    sink = DownDelta(name, path=str(work / name), **SILVER)
    sink.down = False
    return SinkSpec(sink, lag=lag_policy(name, {"on_failure": "lag"}))


def _write(
    fan: FanOut, spark: Any, batch_id: int, planned: int | None = None, rows: int = 3
) -> list[str]:
    """Batch ``batch_id`` (ids ``10 * batch_id`` + 0..``rows - 1``); the sinks written live."""
    planned = int(time.time() * 1000) if planned is None else planned
    info = BatchInfo(PIPELINE, batch_id, "query-1", [{"src": {"0": batch_id + 1}}],
                     batch_timestamp_ms=planned)  # fmt: skip
    frame = spark.createDataFrame([(batch_id * 10 + n,) for n in range(rows)], "id LONG")
    return sorted(fan.process(frame, info))


def _spooled(fan: FanOut) -> list[tuple[int, list[str], list[str]]]:
    assert fan.spool is not None
    return [(b.batch_id, sorted(b.needed_by), sorted(b.replayed)) for b in fan.spool.batches()]


def _ledger(work: Path) -> DeltaLedger:
    ledger = DeltaLedger(str(work / "ledger"))
    ledger.open()
    return ledger


def _failed(work: Path) -> list[tuple[str, int, str]]:
    rows = _ledger(work).rows(PIPELINE)
    return sorted(
        (r["sink"], r["batch_id"], r["error"].split(":")[0])
        for r in rows
        if r["status"] == "failed"
    )


def _begun(work: Path) -> list[tuple[str, int]]:
    """The ledger's ``begun`` notes (fanout.ledger.begun): (sink, batch)."""
    rows = _ledger(work).rows(PIPELINE)
    return sorted((r["sink"], r["batch_id"]) for r in rows if r["status"] == "begun")


def _driver(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """catchup_driver.py in a process group of its own (:func:`driver_process`)."""
    return driver_process(str(DRIVER), str(work), *args, timeout_s=180)


def _restart_refused(
    work: Path, *, backfill: bool = False
) -> tuple[list[tuple[int, list[str], list[str]]], str]:
    """The restart's final catch-up, refused batch 1 of silver: what the spool held for it
    first, and silver's error; silver's table still holds batch 1 once."""
    restart = fan_out(work, backfill=backfill)
    try:
        spooled = _spooled(restart)
        with pytest.raises(SinksBehindError):
            restart.final_catch_up()  # asked: refused, not written again
        error = restart.lagging.lags()["silver"].error or ""
    finally:
        restart.close()
    assert ids(work / "silver") == [0, 1, 2, 10, 11, 12]  # batch 1 once
    return spooled, error


REFUSED = (
    "SinkRecordsGoneError: sink 'silver', batch 1: pipeline 'catchupkill', sink 'silver': "
    "batch 1 of epoch 0 was spooled for the sink from a replay, or an earlier run's catch-up "
    "began writing it (an attempt that may have written it to path '{path}' died before the "
    "sink's ledger mark: Spark ran the batch again after it, or the catch-up's process ended "
    "in it), and the sink cannot tell whether its target holds it, its own records of the "
    "epoch being gone: the table's log keeps no app transaction 'fanout/catchupkill/silver'"
)


def test_a_catch_up_write_killed_before_its_mark_is_asked_about_by_the_next_run(
    spark: Any, tmp_path: Path
) -> None:
    work = tmp_path
    silver = _down(work, "silver")
    first = FanOut(PIPELINE, str(work / "ledger"), [silver, catchup_driver.sinks(work)[1]],
                   retries=0, backoff_s=0, parallelism=1, spool=str(work / "spool"),
                   probe_interval_s=3600)  # fmt: skip
    first.catchup.stop()
    try:
        assert _write(first, spark, 0) == ["gold", "silver"]
        silver.sink.down = True  # type: ignore[attr-defined]
        assert _write(first, spark, 1) == ["gold"]  # silver lags: batch 1 spooled for it
        assert _spooled(first) == [(1, ["silver"], [])]  # no replay: nothing to ask
    finally:
        first.close()

    killed = _driver(work)  # its final catch-up writes batch 1 to silver: killed there
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert "KILL after the catch-up wrote batch 1 to silver" in killed.stderr
    assert ids(work / "silver") == [0, 1, 2, 10, 11, 12]  # written, not marked
    assert _ledger(work).last_committed(PIPELINE, ["silver", "gold"]) == {"silver": 0, "gold": 1}
    time.sleep(3)  # the table forgets the app transactions 2 s after their commit

    spooled, error = _restart_refused(work)
    assert spooled == [(1, ["silver"], ["silver"])]  # the killed run's note
    assert error.startswith(REFUSED.format(path=work / "silver")), error
    assert _failed(work) == [("silver", 1, "SinkRecordsGoneError"), ("silver", 1, "SinkWriteError")]

    args = printed_command(error, "fanout ledger skip")  # the operator found batch 1 there
    assert args[-1] == "--release-spooled", args
    done = fanout_process(*args)
    assert done.returncode == 0, done.stderr
    assert "released batch(es) 1 from the spool" in done.stdout, done.stdout
    last = fan_out(work)
    try:
        last.final_catch_up()  # nothing behind
        assert _spooled(last) == []
        assert _write(last, spark, 2) == ["gold", "silver"]  # live again
    finally:
        last.close()
    assert ids(work / "silver") == [0, 1, 2, 10, 11, 12, 20, 21, 22]
    assert ids(work / "gold") == [0, 1, 2, 10, 11, 12, 20, 21, 22]


BACKFILL_REFUSED = (
    "SinkRecordsGoneError: sink 'silver', batch 1: pipeline 'catchupkill', sink 'silver': "
    "batch 1 of epoch 0, backfilled from sink 'gold', was begun by an earlier run's catch-up "
    "(an attempt that may have written it to path '{path}' died before the sink's ledger "
    "mark: the catch-up's process ended in it), and the sink cannot tell whether its target "
    "holds it, its own records of the epoch being gone: the table's log keeps no app "
    "transaction 'fanout/catchupkill/silver'"
)


def test_a_backfilled_catch_up_write_killed_before_its_mark_is_asked_about_by_the_next_run(
    spark: Any, tmp_path: Path
) -> None:
    """gold alone writes batches 0-2; silver is added with ``backfill_from="gold"``; the
    driver's final catch-up backfills batch 0, then is SIGKILLed with its JVM after it wrote
    batch 1 to silver, before its mark; silver's app transactions expire; the restart's
    catch-up finds the ledger's note of batch 1, asks silver, and refuses it (nothing in
    the spool: the note is a ledger row); the printed skip through the real CLI; then the
    backfill goes on with batch 2 and silver goes live."""
    work = tmp_path
    gold = FanOut(PIPELINE, str(work / "ledger"), [catchup_driver.sinks(work)[1]], retries=0,
                  backoff_s=0, parallelism=1, spool=str(work / "spool"))  # fmt: skip
    gold.catchup.stop()
    try:
        assert [_write(gold, spark, b) for b in range(3)] == [["gold"]] * 3
    finally:
        gold.close()

    killed = _driver(work, "backfill")  # backfills batch 0, killed in its write of batch 1
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert "KILL after the catch-up wrote batch 1 to silver" in killed.stderr
    assert ids(work / "silver") == [0, 1, 2, 10, 11, 12]  # batch 1 written, not marked
    assert _ledger(work).last_committed(PIPELINE, ["silver", "gold"]) == {"silver": 0, "gold": 2}
    assert _begun(work) == [("silver", 0), ("silver", 1)]  # noted before each write began
    time.sleep(3)  # the table forgets the app transactions 2 s after their commit

    spooled, error = _restart_refused(work, backfill=True)
    assert spooled == []  # a backfilled batch: in no spool
    assert error.startswith(BACKFILL_REFUSED.format(path=work / "silver")), error
    assert _failed(work) == [("silver", 1, "SinkRecordsGoneError")]
    assert _begun(work) == [("silver", 0), ("silver", 1)]  # asked: no second note

    args = printed_command(error, "fanout ledger skip")  # the operator found batch 1 there
    assert args[-6:] == ["--sink", "silver", "--through", "1", "--epoch", "0"], args
    done = fanout_process(*args)
    assert done.returncode == 0, done.stderr
    assert "sink 'silver', epoch 0: batches 1-1 recorded as skipped" in done.stdout, done.stdout
    last = fan_out(work, backfill=True)
    try:
        last.final_catch_up()  # the backfill goes on: batch 2
        assert _write(last, spark, 3) == ["gold", "silver"]  # live
    finally:
        last.close()
    assert ids(work / "silver") == [0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32]
    assert ids(work / "gold") == [0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32]
    assert _ledger(work).last_committed(PIPELINE, ["silver", "gold"]) == {"silver": 3, "gold": 3}
    assert _begun(work) == [("silver", 0), ("silver", 1), ("silver", 2)]


def test_a_doubted_replay_is_not_asked_of_a_lag_sink_that_was_already_behind_it(
    spark: Any, tmp_path: Path
) -> None:
    """bronze lags from batch 1 (down; the batch is empty, so its catch-up leaves no
    record of it in the table); batch 2's attempt is killed after silver wrote it (gold
    before it, tin not yet); both lag sinks' transactions expire; Spark replays batch 2:
    silver, which could have been written, is refused and its spooled batch 2 flagged;
    bronze, marked at batch 0, could not have been (it gets batch 1 first): not asked at
    the replay, not flagged in the spool (the spooling beside tin's write), and its
    catch-up writes batches 1 and 2 (flagged, batch 2 was refused: bronze's records of
    the epoch are still gone after the empty batch 1)."""
    work = tmp_path
    bronze, silver = _down(work, "bronze"), _down(work, "silver")
    gold = catchup_driver.sinks(work)[1]
    tin = {**gold, "name": "tin", "path": str(work / "tin")}
    killing = FanOut(PIPELINE, str(work / "ledger"), [bronze, silver, gold, tin], retries=0,
                     backoff_s=0, parallelism=1, spool=str(work / "spool"),
                     probe_interval_s=3600, plugins=[DieAfterWrite("silver", 2)])  # fmt: skip
    killing.catchup.stop()
    try:
        assert _write(killing, spark, 0) == ["bronze", "gold", "silver", "tin"]
        bronze.sink.down = True  # type: ignore[attr-defined]
        assert _write(killing, spark, 1, rows=0) == ["gold", "silver", "tin"]
        planned = int(time.time() * 1000)
        with pytest.raises(DriverKilled):
            _write(killing, spark, 2, planned)
    finally:
        killing.close()
    assert ids(work / "silver") == [0, 1, 2, 20, 21, 22]
    assert ids(work / "tin") == [0, 1, 2]
    time.sleep(3)  # both tables forget their app transactions

    replay = FanOut(PIPELINE, str(work / "ledger"), [bronze, silver, gold, tin], retries=0,
                    backoff_s=0, parallelism=1, spool=str(work / "spool"),
                    probe_interval_s=3600)  # fmt: skip
    replay.catchup.stop()
    try:
        assert _write(replay, spark, 2, planned) == ["tin"]  # gold holds it; bronze behind
        assert _failed(work) == [
            ("bronze", 1, "SinkWriteError"),
            ("silver", 2, "SinkRecordsGoneError"),
        ]
        assert _spooled(replay) == [(1, ["bronze"], []), (2, ["bronze", "silver"], ["silver"])]
    finally:
        replay.close()

    bronze.sink.down = False  # type: ignore[attr-defined]
    after = FanOut(PIPELINE, str(work / "ledger"), [bronze, silver, gold, tin], retries=0,
                   backoff_s=0, parallelism=1, spool=str(work / "spool"),
                   probe_interval_s=3600)  # fmt: skip
    after.catchup.stop()
    try:
        with pytest.raises(SinksBehindError) as behind:
            after.final_catch_up()
        lags = after.lagging.lags()
    finally:
        after.close()
    assert [s.sink for s in behind.value.behind] == ["silver"], str(behind.value)
    assert (lags["bronze"].batches, lags["silver"].batches) == (0, 1)
    assert ids(work / "bronze") == [0, 1, 2, 20, 21, 22]  # each batch once
    assert ids(work / "silver") == [0, 1, 2, 20, 21, 22]
    assert ids(work / "tin") == [0, 1, 2, 20, 21, 22]
    assert _ledger(work).last_committed(PIPELINE, ["bronze", "silver", "gold", "tin"]) == {
        "bronze": 2, "silver": 1, "gold": 2, "tin": 2,
    }  # fmt: skip
