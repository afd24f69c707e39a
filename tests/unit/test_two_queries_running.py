"""Two queries of one pipeline running at once on two checkpoints (two ``fanout run`` of
pipeline files naming one pipeline, or two ``FanOut`` queries in code): the second is
refused at its first batch as a checkpoint reset (the ledger cannot tell the two apart),
and the refusal's ways on begin with what else it may be: the other query still running,
with its newest mark's time, and that the ways on take the pipeline from it. Before, it
said only "the checkpoint was deleted or replaced" and offered a new epoch. Delta
ledger."""

from __future__ import annotations

from pathlib import Path

import pytest

from fanout import CheckpointResetError, FanOut
from fanout.contract.batch import BatchInfo
from fanout.ledger.delta import DeltaLedger
from tests.unit.fakes import SchemaFrame, ScriptedSink


def _fan(ledger: str, *sinks: ScriptedSink) -> FanOut:
    return FanOut("twice", ledger, list(sinks), backoff_s=0)


def test_the_second_query_is_refused_naming_the_first_still_running(tmp_path: Path) -> None:
    ledger = str(tmp_path / "ledger")
    first_sink, second_sink = ScriptedSink("lake"), ScriptedSink("lake")
    with _fan(ledger, first_sink) as first, _fan(ledger, second_sink) as second:
        for batch in range(3):
            first.process(SchemaFrame([batch]), BatchInfo("twice", batch, "query-a"))
        with pytest.raises(CheckpointResetError) as refused:
            second.process(SchemaFrame([100]), BatchInfo("twice", 0, "query-b"))
        first.process(SchemaFrame([3]), BatchInfo("twice", 3, "query-a"))  # it runs on
    newest = next(
        e
        for e in DeltaLedger(ledger).committed_entries("twice")
        if (e.sink, e.batch_id) == ("lake", 2)
    )
    assert newest.finished_at is not None
    at = newest.finished_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    lines = str(refused.value).splitlines()
    assert lines[0].startswith(
        "pipeline 'twice': checkpoint reset detected. Spark handed batch 0 of query query-b"
    )
    ways = lines[lines.index("How to proceed:") + 1 :]
    assert ways[0] == (
        f"  0. First, if query query-a still runs (its newest mark: batch 2 by sink lake, at "
        f"{at}), this is no reset but the pipeline running twice, on two checkpoints: stop "
        "this query (it wrote nothing) and leave that one be. The ways below take the "
        "pipeline from it, and a new epoch started while it runs may leave the batch it has "
        "in flight in the sinks twice."
    )
    assert ways[1].startswith("  1. Restore the original checkpoint directory")
    assert second_sink.calls == []
    assert first_sink.calls == [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert DeltaLedger(ledger).last_committed("twice", ["lake"]) == {"lake": 3}
