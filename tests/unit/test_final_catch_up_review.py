"""Review of the final catch-up, the gap catch-up and ``fanout ledger skip --spool``:
what each must do for a backfill sink and after a checkpoint reset (docs/architecture.md
§14)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from fanout import Batch, FanOut
from fanout.contract.batch import BatchInfo
from fanout.ledger.memory import MemoryLedger
from fanout.sink_spec import SinkSpec, lag_policy
from tests.unit.fakes import SchemaFrame, ScriptedSink

FRAMES = {b: SchemaFrame([b * 10, b * 10 + 1]) for b in range(4)}


class _Lake(ScriptedSink):
    """An append sink that gives back each batch it holds (as a Delta sink in append mode
    does through its table's history)."""

    def __init__(self, name: str, **kw: Any) -> None:
        super().__init__(name, **kw)
        self.table: dict[tuple[int, int], pa.Table] = {}

    def write(self, batch: Batch) -> Any:
        rows = super().write(batch)
        self.table[(batch.info.epoch, batch.batch_id)] = batch.df.table  # type: ignore[attr-defined]
        return rows

    def backfill_source(self, pipeline: str) -> Any:
        lake = self

        class _Source:
            def batches(self, epochs: Any) -> list[tuple[int, int]]:
                return sorted(k for k in lake.table if k[0] in epochs)

            def read(self, key: tuple[int, int]) -> pa.Table:
                return lake.table[key]

        return _Source()


def _lake_in_two_epochs(ledger: MemoryLedger, lake: _Lake) -> None:
    """The lake alone commits batches 0-1 of epoch 0, then, after a checkpoint reset
    accepted as a new epoch, batches 0-1 of epoch 1."""
    for query, options in (("q", {}), ("q2", {"on_checkpoint_reset": "new_epoch"})):
        fan = FanOut("grow", ledger, [lake], backoff_s=0, **options)
        try:
            for batch in range(2):
                fan.process(FRAMES[batch], BatchInfo("grow", batch, query))
        finally:
            fan.close()


def test_a_run_with_no_batch_backfills_the_current_epoch_too(tmp_path: Path) -> None:
    """An ``available_now`` run that finds no new data runs no batch: its final catch-up
    must still see the batches of the pipeline's current epoch the backfill source holds
    (it saw only epoch 0's, said the sink caught up, and the run exited 0)."""
    ledger, lake = MemoryLedger(), _Lake("lake")
    _lake_in_two_epochs(ledger, lake)

    pg = ScriptedSink("pg")
    spec = SinkSpec(pg, lag=lag_policy("pg", {"backfill_from": "lake"}))
    fan = FanOut("grow", ledger, [lake, spec], backoff_s=0, spool=str(tmp_path / "spool"),
                 probe_interval_s=3600)  # fmt: skip
    fan.catchup.stop()  # the query ended without a batch: only the final catch-up writes
    fan.catchup._read = lambda sink, key: (  # type: ignore[method-assign]
        SchemaFrame(lake.table[key].column("id").to_pylist()),
        BatchInfo("grow", key[1], "q", epoch=key[0]),
    )
    try:
        [behind] = fan.behind()
        assert (behind.sink, behind.first, behind.last, behind.batches) == (
            "pg", (0, 0), (1, 1), 4
        )
        assert {n: lag.state for n, lag in fan.final_catch_up().items()} == {"pg": "live"}
        assert [(b.info.epoch, b.batch_id) for b in pg.batches] == [
            (0, 0), (0, 1), (1, 0), (1, 1)
        ]
        assert ledger.last_committed("grow", ["pg"], epoch=1) == {"pg": 1}
    finally:
        fan.close()
