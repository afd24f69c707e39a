"""A harmless rewrite (ARCHITECTURE §5, "A harmless rewrite") is harmless only when the new
epoch must write the batch anyway, for a sink that lacks it.

``silver`` (a Delta append) writes and marks batch 3; ``bronze`` (a Delta merge by ``id``,
no dead-letter target) writes it and the driver dies before its mark. ``fanout recover``
counts bronze at batch 2, so it says: resume after batch 2. Every sink holds batch 3,
though. Before the harmless rewrite, the start was refused, bronze's lost mark recorded,
and ``fanout recover`` then said: resume after batch 3, nothing written twice. With it, the
start went on from after batch 2: bronze's merge of batch 3 again changed nothing, but
silver's append held rows 30-39 twice. Now a held batch no sink lacks refuses the start as
before, and the refused query started again stays refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fanout import BatchInfo, FanOut, hookimpl
from fanout.errors import UnmarkedBatchError
from tests.in_process_cli import Cli
from tests.integration import two_sink_resets as resets
from tests.integration.test_unmarked_batch import DriverKilled
from tests.integration.two_sink_resets import NEW, OLD, ROWS

PIPELINE = "unmarked"
_run, _ids, _marks = resets.run, resets.ids, resets.marks


class KillAfterBronze:
    """Kills the driver right after ``bronze`` wrote batch 3 (``silver`` wrote and marked
    it before), before bronze's ledger mark."""

    @hookimpl
    def fanout_sink_done(self, info: BatchInfo, sink: str, result: Any, duration_s: float) -> None:
        if info.batch_id == 3 and sink == "bronze":
            raise DriverKilled("killed between the write and the mark")


def _fan(tmp_path: Path, *plugins: object, on_reset: str = "refuse") -> FanOut:
    sinks = [
        {"type": "delta", "name": "silver", "path": str(tmp_path / "silver")},
        {"type": "delta", "name": "bronze", "path": str(tmp_path / "bronze"), "mode": "merge",
         "keys": ["id"]},
    ]  # fmt: skip
    return FanOut(
        PIPELINE, str(tmp_path / "ledger"), sinks, plugins=plugins, parallelism=1, retries=0,
        on_checkpoint_reset=on_reset,  # type: ignore[arg-type]
    )  # fmt: skip


def _recover(fanout_cli: Cli, tmp_path: Path) -> str:
    ran = fanout_cli("recover", "--ledger", tmp_path / "ledger", "--pipeline", PIPELINE)
    assert ran.returncode == 0, ran
    return ran.stdout


def test_a_harmless_sink_alone_behind_refuses_as_before(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    old = _fan(tmp_path, KillAfterBronze())
    for batch in range(3):
        _run(old, spark, OLD, batch, batch * ROWS)
    with pytest.raises(DriverKilled):
        _run(old, spark, OLD, 3, 30)
    assert _ids(tmp_path, "silver") == list(range(40))
    assert _ids(tmp_path, "bronze") == list(range(40))
    assert _marks(tmp_path) == sorted(
        [(0, s, b) for s in ("bronze", "silver") for b in range(3)] + [(0, "silver", 3)]
    )
    assert """.option("startingOffsets", '{"orders": {"0": 30}}')""" in _recover(
        fanout_cli, tmp_path
    )

    with pytest.raises(UnmarkedBatchError) as refused:
        _run(_fan(tmp_path, on_reset="new_epoch"), spark, NEW, 0, 30)  # recover's offsets
    assert "sink bronze holds batch 3 of epoch 0" in str(refused.value)
    assert "sinks without it: none." in str(refused.value)
    assert _ids(tmp_path, "silver") == list(range(40))
    assert _ids(tmp_path, "bronze") == list(range(40))
    with pytest.raises(UnmarkedBatchError):  # the refused query, started again
        _run(_fan(tmp_path, on_reset="new_epoch"), spark, NEW, 0, 30)
    assert _ids(tmp_path, "silver") == list(range(40))

    # recover now counts bronze at batch 3: a new checkpoint after it writes nothing twice
    assert """.option("startingOffsets", '{"orders": {"0": 40}}')""" in _recover(
        fanout_cli, tmp_path
    )
    _run(_fan(tmp_path, on_reset="new_epoch"), spark, "query-newer", 0, 40)
    assert _ids(tmp_path, "silver") == list(range(50))
    assert _ids(tmp_path, "bronze") == list(range(50))
