"""A batch Spark replays reaching a lag sink from the spool (fanout.steps.replay_lag): the
Delta sink wrote batch 1 and the driver died before its mark; by the restart its app
transactions had expired (``delta.setTransactionRetentionDuration``), so it cannot tell
whether it holds the batch. Refused at the replay (a lag sink lags), or not asked there
(unreachable), the batch was spooled for it, Spark committed it, and the next catch-up,
which no longer sees a replay, appended it a second time. Now the spool's index says the
batch came from a replay and the catch-up asks the sink first: refused, the printed skip
(run through the real CLI) gives it up, also in a pipeline whose every sink lags; accepted,
it is written. Real Spark, Delta sinks, ledger and spool."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest
from deltacheck import ids
from fanout_delta import DeltaSink

from fanout import BatchInfo, FanOut, SinksBehindError, SinkUnreachableError
from fanout.delta_tables.retention import PROPERTY
from fanout.ledger.delta import DeltaLedger
from fanout.sink_spec import SinkSpec, lag_policy
from fanout.testing.faults import DieAfterWrite, DieBeforeWrites, DriverKilled
from tests.cli_process import fanout_process, printed_command

pytestmark = pytest.mark.integration

PIPELINE = "replaylag"
RETAINED = {PROPERTY: "interval 2 seconds"}
SILVER = {"configuration": RETAINED, "min_txn_retention_hours": 0}


def _silver(tmp_path: Path) -> dict[str, Any]:
    return {"type": "delta", "name": "silver", "path": str(tmp_path / "silver"),
            "on_failure": "lag", **SILVER}  # fmt: skip


def _gold(tmp_path: Path) -> dict[str, Any]:
    return {"type": "delta", "name": "gold", "path": str(tmp_path / "gold")}


class _UnreachableDelta(DeltaSink):
    """The Delta sink whose storage cannot be reached while ``reachable`` is false."""

    reachable = True

    def open(self, context: Any) -> None:
        if not self.reachable:
            raise SinkUnreachableError("the storage does not answer", sink=self.name)
        super().open(context)


def _fan(tmp_path: Path, sinks: list[Any], *plugins: object, **options: Any) -> FanOut:
    fan = FanOut(PIPELINE, str(tmp_path / "ledger"), sinks, retries=0, backoff_s=0,
                 parallelism=1, spool=str(tmp_path / "spool"), probe_interval_s=3600,
                 plugins=plugins, **options)  # fmt: skip
    fan.catchup.stop()  # the test drives the catch-up
    return fan


def _now() -> int:
    return int(time.time() * 1000)


def _write(fan: FanOut, spark: Any, batch_id: int, planned: int) -> list[str]:
    """Batch ``batch_id`` (ids ``10 * batch_id`` + 0..2) planned at ``planned`` (a replay
    keeps its first attempt's); the sinks written live."""
    info = BatchInfo(PIPELINE, batch_id, "query-1", [{"src": {"0": batch_id + 1}}],
                     batch_timestamp_ms=planned)  # fmt: skip
    frame = spark.createDataFrame([(batch_id * 10 + n,) for n in range(3)], "id LONG")
    return sorted(fan.process(frame, info))


def _killed_in_batch_1(tmp_path: Path, spark: Any, sinks: list[Any], fault: object) -> int:
    """Batch 0 written and marked, batch 1's attempt killed by ``fault``, then idle past
    the transaction retention: batch 1's planning time."""
    fan = _fan(tmp_path, sinks, fault)
    try:
        _write(fan, spark, 0, _now())
        planned = _now()
        with pytest.raises(DriverKilled):
            _write(fan, spark, 1, planned)
    finally:
        fan.close()
    time.sleep(3)  # the transactions expire
    return planned


def _spooled(fan: FanOut) -> list[tuple[int, list[str], list[str]]]:
    assert fan.spool is not None
    return [(b.batch_id, sorted(b.needed_by), sorted(b.replayed)) for b in fan.spool.batches()]


def _failed(tmp_path: Path) -> list[tuple[str, int, str]]:
    rows = DeltaLedger(str(tmp_path / "ledger")).rows(PIPELINE)
    return sorted(
        (r["sink"], r["batch_id"], r["error"].split(":")[0])
        for r in rows
        if r["status"] == "failed"
    )


def _marks(tmp_path: Path, *sinks: str) -> dict[str, int | None]:
    ledger = DeltaLedger(str(tmp_path / "ledger"))
    ledger.open()
    return ledger.last_committed(PIPELINE, list(sinks))


def _skip_as_printed(error: str) -> None:
    """Run the ``fanout ledger skip`` the refusal prints, as printed, through the CLI."""
    args = printed_command(error, "fanout ledger skip")
    assert args[-1] == "--release-spooled", args  # the batch is released from the spool
    done = fanout_process(*args)
    assert done.returncode == 0, done.stderr
    assert "released batch(es) 1 from the spool" in done.stdout, done.stdout


SPOOLED_REPLAY = (
    "SinkRecordsGoneError: sink 'silver', batch 1: pipeline 'replaylag', sink 'silver': batch "
    "1 of epoch 0 was spooled for the sink from a replay, or an earlier run's catch-up began "
    "writing it (an attempt that may have written it to path '{path}' died before the sink's "
    "ledger mark: Spark ran the batch again after it, or the catch-up's process ended in it), "
    "and the sink cannot tell whether its target holds it, its own records of the epoch being "
    "gone: the table's log keeps no app transaction 'fanout/replaylag/silver'"
)


def test_a_replay_a_lag_sink_was_refused_is_refused_again_by_the_next_runs_catch_up(
    spark: Any, tmp_path: Path
) -> None:
    sinks = [_silver(tmp_path), _gold(tmp_path)]
    planned = _killed_in_batch_1(tmp_path, spark, sinks, DieAfterWrite("silver", 1))
    assert ids(tmp_path / "silver") == [0, 1, 2, 10, 11, 12]

    replay = _fan(tmp_path, sinks)  # Spark replays batch 1: silver lags with the refusal
    try:
        assert "silver" not in _write(replay, spark, 1, planned)  # gold: written or held
        assert _spooled(replay) == [(1, ["silver"], ["silver"])]
    finally:
        replay.close()
    assert _failed(tmp_path) == [("silver", 1, "SinkRecordsGoneError")]  # at the hold-back

    after = _fan(tmp_path, sinks)  # Spark committed batch 1: batch 2 is planned afresh
    try:
        assert _write(after, spark, 2, _now()) == ["gold"]  # silver behind: held back
        with pytest.raises(SinksBehindError):
            after.final_catch_up()  # batch 1 from the spool: asked, refused
        error = after.lagging.lags()["silver"].error or ""
    finally:
        after.close()
    assert ids(tmp_path / "silver") == [0, 1, 2, 10, 11, 12]  # batch 1 once, nothing more
    assert ids(tmp_path / "gold") == [0, 1, 2, 10, 11, 12, 20, 21, 22]
    assert error.startswith(SPOOLED_REPLAY.format(path=tmp_path / "silver")), error
    assert _failed(tmp_path) == [("silver", 1, "SinkRecordsGoneError")] * 2  # and the catch-up

    _skip_as_printed(error)  # the operator found batch 1 in the table
    last = _fan(tmp_path, sinks)
    try:
        last.final_catch_up()  # batch 2 from the spool
        assert _spooled(last) == []
    finally:
        last.close()
    assert ids(tmp_path / "silver") == [0, 1, 2, 10, 11, 12, 20, 21, 22]
    assert _marks(tmp_path, "silver", "gold") == {"silver": 2, "gold": 2}


def test_an_unreachable_lag_sink_is_asked_before_its_catch_up_writes_the_replay(
    spark: Any, tmp_path: Path
) -> None:
    """A pipeline whose only sink lags: not opened at the replay, so not asked there; the
    printed skip (no other sink's mark of the batch) stands on the catch-up's failed
    attempt of the batch."""
    planned = _killed_in_batch_1(tmp_path, spark, [_silver(tmp_path)], DieAfterWrite("silver", 1))
    silver = _UnreachableDelta("silver", path=str(tmp_path / "silver"), **SILVER)
    silver.reachable = False
    replay = _fan(tmp_path, [SinkSpec(silver, lag=lag_policy("silver", {"on_failure": "lag"}))])
    try:
        assert replay.unopened == ("silver",)
        assert _write(replay, spark, 1, planned) == []  # spooled for silver
        assert _spooled(replay) == [(1, ["silver"], ["silver"])]
        silver.reachable = True
        lags = replay.catch_up(timeout_s=120)  # reopens silver, asks, refuses
        assert (lags["silver"].state, lags["silver"].batches) == ("lagging", 1)
        error = lags["silver"].error or ""
    finally:
        replay.close()
    assert ids(tmp_path / "silver") == [0, 1, 2, 10, 11, 12]
    assert error.startswith(SPOOLED_REPLAY.format(path=tmp_path / "silver")), error
    assert _failed(tmp_path) == [
        ("silver", 1, "SinkRecordsGoneError"),
        ("silver", 1, "SinkUnreachableError"),
    ]

    _skip_as_printed(error)
    after = _fan(tmp_path, [_silver(tmp_path)])
    try:
        assert _write(after, spark, 2, _now()) == ["silver"]  # live again
    finally:
        after.close()
    assert ids(tmp_path / "silver") == [0, 1, 2, 10, 11, 12, 20, 21, 22]
    assert _marks(tmp_path, "silver") == {"silver": 2}


def test_an_accepted_sink_gets_the_spooled_replay_its_table_lacks(
    spark: Any, tmp_path: Path, caplog: Any
) -> None:
    """Killed before the write: the table lacks batch 1; refused at the replay, the
    operator checked and accepts it: the catch-up writes it, once, warned."""
    sinks = [_silver(tmp_path), _gold(tmp_path)]
    planned = _killed_in_batch_1(tmp_path, spark, sinks, DieBeforeWrites(1))
    replay = _fan(tmp_path, sinks)
    try:
        assert _write(replay, spark, 1, planned) == ["gold"]
    finally:
        replay.close()
    assert ids(tmp_path / "silver") == [0, 1, 2]

    accepting = _fan(tmp_path, sinks, accept_lost_targets=["silver"])
    try:
        with caplog.at_level(logging.WARNING, logger="fanout"):
            accepting.final_catch_up()
    finally:
        accepting.close()
    assert ids(tmp_path / "silver") == [0, 1, 2, 10, 11, 12]
    assert _marks(tmp_path, "silver", "gold") == {"silver": 1, "gold": 1}
    assert any(
        "sink silver: batch 1 of epoch 0, spooled for the sink from a replay or begun by an "
        "earlier run's catch-up, is one it cannot tell its target holds" in r.getMessage()
        for r in caplog.records
    )
