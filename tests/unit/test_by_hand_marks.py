"""A ``FanOut`` called by hand on a plain DataFrame (``fo(df, 0)`` in a notebook or a test,
no streaming query) marks its batches with no query id and no source offsets. The real
query then started on that ledger: Spark's batch 0 of the stream found the sinks' marks of
batch 0, could not compare plans, warned, and every sink holding the hand-written batch
skipped the stream's batch 0, its rows lost. It is refused, naming the cause, and the way
printed (a new epoch) writes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from fanout import BatchInfo, FanOut
from fanout.errors import CheckpointResetError
from fanout.ledger.delta import DeltaLedger
from tests.unit.fakes import FakeFrame, ScriptedSink

QUERY = "22222222-aaaa-4bbb-8ccc-000000000002"
OFFSETS = [{"orders": {"0": 5}}]


def test_marks_of_a_call_by_hand_are_refused_naming_it_and_a_new_epoch_writes(
    tmp_path: Path,
) -> None:
    ledger = DeltaLedger(str(tmp_path / "ledger"))
    ledger.open()
    with FanOut("orders", ledger, [ScriptedSink("pg")], backoff_s=0) as by_hand:
        by_hand(FakeFrame(), 0)  # no query: no query id, no offsets
    [mark] = ledger.committed_entries("orders")
    assert (mark.batch_id, mark.query_id, mark.source_offsets) == (0, None, None)

    pg = ScriptedSink("pg")
    with FanOut("orders", ledger, [pg], backoff_s=0) as stream:
        with pytest.raises(CheckpointResetError) as refused:
            stream.process(FakeFrame(), BatchInfo("orders", 0, QUERY, source_offsets=OFFSETS))
    said = str(refused.value)
    assert said.startswith(
        f"pipeline 'orders': Spark handed batch 0 of query {QUERY}, but the ledger's marks of "
        "this pipeline at or after it (batch 0: sink pg) have no query id and no source "
        "offsets: a FanOut called outside a streaming query (fo(df, batch_id) on a plain "
        "DataFrame, in a test or a notebook) wrote them into this ledger. fanout refuses "
        "to write, because the sinks holding them would skip this query's batches."
    )
    assert (
        "How to proceed:\n  1. Continue this query under a new epoch, its batches written as "
        'new data beside the hand-written ones: FanOut(..., on_checkpoint_reset="new_epoch").\n'
    ) in said
    assert pg.calls == []

    pg = ScriptedSink("pg")  # the way printed
    with FanOut("orders", ledger, [pg], backoff_s=0, on_checkpoint_reset="new_epoch") as stream:
        written = stream.process(FakeFrame(), BatchInfo("orders", 0, QUERY, source_offsets=OFFSETS))
    assert sorted(written) == ["pg"] and pg.calls == [(0, 1)]
    marks = sorted(
        (e.epoch, e.batch_id, e.query_id or "") for e in ledger.committed_entries("orders")
    )
    assert marks == [(0, 0, ""), (1, 0, QUERY)]
