"""``fanout recover`` on recorded Kafka-style and file-source offsets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fanout.app.cli import main
from fanout.app.recover import is_kafka_offsets, recovery_of, render
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry


def _mark(sink: str, batch: int, offsets: list[object], query: str = "q-old") -> LedgerEntry:
    return LedgerEntry(
        "orders", sink, batch, "committed", query_id=query, source_offsets=json.dumps(offsets)
    )


def test_kafka_offsets_of_the_sink_furthest_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = DeltaLedger(str(tmp_path))
    ledger.open()
    for batch in range(4):
        kafka = {"orders": {"0": 100 * (batch + 1), "1": 50 * (batch + 1)}}
        ledger.mark_committed(_mark("delta", batch, [kafka]))
        if batch < 3:
            ledger.mark_committed(_mark("pg", batch, [kafka]))
    ledger.mark_committed(LedgerEntry("other", "x", 9, "committed", query_id="q-x"))

    assert main(["recover", "--ledger", str(tmp_path), "--pipeline", "orders"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "pipeline 'orders': last committed batch per sink"
    assert out[1] == (
        '  delta: batch 3, query id q-old, source offsets [{"orders": {"0": 400, "1": 200}}]'
    )
    assert out[2] == (
        '  pg: batch 2, query id q-old, source offsets [{"orders": {"0": 300, "1": 150}}]'
    )
    assert out[3].startswith("Resume after batch 2 (sink 'pg' is furthest behind)")
    assert out[4] == "Source 0 (Kafka): start a new checkpoint with"
    assert out[5] == """  .option("startingOffsets", '{"orders": {"0": 300, "1": 150}}')"""


def test_file_source_offsets_are_explained_not_turned_into_kafka_json() -> None:
    recovery = recovery_of("orders", [_mark("delta", 5, [{"logOffset": 5}])])
    assert recovery.starting_offsets() == [None]
    assert not is_kafka_offsets({"logOffset": 5})
    assert is_kafka_offsets({"t": {"0": 1, "3": 9}, "u": {"1": 0}})
    assert not is_kafka_offsets({"t": {}})


def test_empty_ledger_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    DeltaLedger(str(tmp_path)).open()
    assert main(["recover", "--ledger", str(tmp_path), "--pipeline", "orders"]) == 0
    assert capsys.readouterr().out.strip() == (
        "pipeline 'orders': the ledger holds no committed batch"
    )


def test_planning_time_is_printed_with_the_offsets() -> None:
    """The facts of a CheckpointRollbackError: the newest checkpoint is the one whose
    offsets/<N> holds these offsets and this batchTimestampMs."""
    entry = LedgerEntry(
        "orders",
        "delta",
        5,
        "committed",
        query_id="q-old",
        source_offsets=json.dumps([{"logOffset": 5}]),
        batch_timestamp_ms=1_763_856_000_250,
    )
    lines = render(recovery_of("orders", [entry])).splitlines()
    assert lines[1] == (
        '  delta: batch 5, query id q-old, source offsets [{"logOffset": 5}], '
        "planned at 1763856000250 (2025-11-23T00:00:00.250Z)"
    )
