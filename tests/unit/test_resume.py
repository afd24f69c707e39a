"""The catch-up started with the query (``FanOut.start_catch_up``), before any batch: only
when the checkpoint guard would admit the batch Spark runs next (docs/architecture.md
§14.4, "Before the first batch"). A memory ledger, a real spool (delta-rs) and a
checkpoint's ``offsets/`` and ``commits/`` files written as Spark writes them."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from fanout import FanOut, SinkWriteError
from fanout.contract.batch import BatchInfo
from fanout.ledger.memory import MemoryLedger
from fanout.sink_spec import SinkSpec, lag_policy
from tests.unit.fakes import SchemaFrame, ScriptedSink

PLANNED_AT = 1_700_000_000_000


class _Query:
    """A started query as ``start_catch_up`` sees it."""

    def __init__(self, query_id: str | None) -> None:
        self.id = query_id


def _info(batch: int, query_id: str = "q", planned_at: int = PLANNED_AT) -> BatchInfo:
    return BatchInfo(
        "resumed", batch, query_id, [{"logOffset": batch}], batch_timestamp_ms=planned_at + batch
    )


def _checkpoint(root: Path, planned: int, committed: int, planned_at: int = PLANNED_AT) -> str:
    """A checkpoint whose ``offsets/`` hold batches 0..``planned`` and ``commits/`` 0..
    ``committed`` (``-1``: none), each batch planned as :func:`_info` says."""
    for directory in ("offsets", "commits"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    for batch in range(planned + 1):
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": planned_at + batch}
        (root / "offsets" / str(batch)).write_text(
            f"v1\n{json.dumps(meta)}\n{json.dumps({'logOffset': batch})}"
        )
        (root / "offsets" / f".{batch}.crc").write_text("")
    for batch in range(committed + 1):
        (root / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    return str(root)


def _behind(tmp_path: Path, ledger: MemoryLedger) -> dict[int, SchemaFrame]:
    """Batches 0, 1 and 2 of query ``q``: ``good`` writes them, ``down`` fails and lags
    (they are spooled for it); that run ends."""
    down = ScriptedSink("down", always_fail=SinkWriteError("refused", sink="down"))
    frames = {b: SchemaFrame([b * 10, b * 10 + 1]) for b in range(3)}
    with _fan(tmp_path, ledger, down, None) as fan:
        for batch in range(3):
            fan.process(frames[batch], _info(batch))
    return frames


def _fan(tmp_path: Path, ledger: MemoryLedger, down: ScriptedSink, checkpoint: str | None) -> Any:
    spec = SinkSpec(down, lag=lag_policy("down", {"on_failure": "lag"}))
    return FanOut(
        "resumed", ledger, [ScriptedSink("good"), spec], backoff_s=0, probe_interval_s=3600,
        spool=str(tmp_path / "spool"), checkpoint_location=checkpoint,
    )  # fmt: skip


def _restart(tmp_path: Path, ledger: MemoryLedger, checkpoint: str | None) -> tuple[Any, Any]:
    """The next run's FanOut, ``down`` back; its catch-up reads the frames kept here."""
    frames = {b: SchemaFrame([b * 10, b * 10 + 1]) for b in range(3)}
    down = ScriptedSink("down")
    fan = _fan(tmp_path, ledger, down, checkpoint)

    def read(sink: str, key: tuple[int, int]) -> tuple[Any, BatchInfo]:
        spooled = fan.lagging.spool.get(key)
        assert spooled is not None, key
        return frames[key[1]], spooled.info()

    fan.catchup._reader.read = read
    return fan, down


def _wait_for_mark(ledger: MemoryLedger, sink: str, batch: int) -> None:
    deadline = time.monotonic() + 20
    while ledger.last_committed("resumed", [sink])[sink] != batch:
        assert time.monotonic() < deadline, ledger.last_committed("resumed", [sink])
        time.sleep(0.05)


@pytest.mark.parametrize("replayed", [False, True], ids=["committed", "replay of batch 2"])
def test_a_restart_on_the_same_checkpoint_catches_up_before_any_batch(
    tmp_path: Path, replayed: bool
) -> None:
    ledger = MemoryLedger()
    _behind(tmp_path, ledger)
    checkpoint = _checkpoint(tmp_path / "cp", 2, 1 if replayed else 2)
    fan, down = _restart(tmp_path, ledger, checkpoint)
    try:
        assert fan.start_catch_up(_Query("q")) is None
        _wait_for_mark(ledger, "down", 2)
        assert down.calls == [(0, 1), (1, 1), (2, 1)]
        assert ledger.last_committed("resumed", ["good", "down"]) == {"good": 2, "down": 2}
    finally:
        fan.close()


@pytest.mark.parametrize(
    ("query_id", "planned", "committed", "planned_at", "reason"),
    [
        (None, 2, 2, PLANNED_AT, "the query's id is unknown"),
        ("q2", 2, 2, PLANNED_AT, "epoch 0 of the ledger belongs to query q, not to q2"),
        (
            "q", 1, 1, PLANNED_AT,
            "the spool holds batch 2 (epoch 0), which the checkpoint has not planned (its next "
            "batch is 2)",
        ),
        (
            "q", 2, 1, PLANNED_AT + 5,
            "the guard would refuse batch 2 (CheckpointRollbackError)",
        ),
    ],
    ids=["query id unknown", "another query (reset)", "checkpoint behind (rollback)",
         "batch 2 planned again (rollback)"],
)  # fmt: skip
def test_a_restart_the_guard_would_refuse_waits_for_the_first_batch(
    tmp_path: Path,
    query_id: str | None,
    planned: int,
    committed: int,
    planned_at: int,
    reason: str,
) -> None:
    ledger = MemoryLedger()
    _behind(tmp_path, ledger)
    checkpoint = _checkpoint(tmp_path / "cp", planned, committed, planned_at)
    fan, down = _restart(tmp_path, ledger, checkpoint)
    try:
        assert fan.start_catch_up(_Query(query_id)) == reason
        time.sleep(0.3)
        assert fan.catchup._thread is None
        assert down.calls == []
        assert ledger.last_committed("resumed", ["down"]) == {"down": None}
    finally:
        fan.close()


def test_a_ledger_ahead_of_the_checkpoint_without_spooled_batches_waits(tmp_path: Path) -> None:
    """Every sink at batch 2, the checkpoint's last batch 1 committed: Spark plans batch 2
    afresh, which the guard refuses as a rollback."""
    ledger = MemoryLedger()
    with _fan(tmp_path, ledger, ScriptedSink("down"), None) as fan:
        for batch in range(3):
            fan.process(SchemaFrame([batch]), _info(batch))
    checkpoint = _checkpoint(tmp_path / "cp", 1, 1)
    with _fan(tmp_path, ledger, ScriptedSink("down"), checkpoint) as fan:
        assert fan.start_catch_up(_Query("q")) == (
            "the ledger holds batch 2 (epoch 0) and the checkpoint plans batch 2 afresh"
        )
        assert fan.catchup._thread is None
