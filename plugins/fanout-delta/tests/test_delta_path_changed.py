"""A Delta sink's ``path`` changed on purpose between runs (docs/architecture.md §5, "A
target lost"): the new table holds none of the batches the ledger marks for the sink, so
the lost-target check refuses the run, rightly (the ledger would count them there). Its
message named only a target "deleted or replaced ... created again empty" and ways on for
that (restore it, or accept a loss); it now names the option change and the way that
keeps the ledger true: rename the sink too, which starts afresh at the new path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fanout import BatchFailedError, BatchInfo, FanOut, TargetLostError
from fanout.delta_tables.io import read_delta


def _ids(path: Path) -> list[int]:
    return sorted(r["id"] for r in read_delta(str(path)).to_pylist())


def _run(spark: Any, tmp_path: Path, name: str, table: str, start: int, batch: int) -> None:
    sinks = [{"type": "delta", "name": name, "path": str(tmp_path / table)}]
    fan = FanOut("moved", str(tmp_path / "ledger"), sinks, retries=0, spark=spark)
    try:
        fan.process(spark.range(start, start + 2), BatchInfo("moved", batch, "q"))
    finally:
        fan.close()


def test_a_path_changed_on_purpose_is_refused_with_a_way_on_that_works(
    spark: Any, tmp_path: Path
) -> None:
    _run(spark, tmp_path, "gold", "old", 0, 0)
    with pytest.raises((BatchFailedError, TargetLostError)) as refused:
        _run(spark, tmp_path, "gold", "new", 2, 1)
    text = str(refused.value)
    assert f"path '{tmp_path / 'new'}' no longer holds batch 0 of epoch 0" in text
    assert text.endswith(
        "If 'gold''s path was changed on purpose to a new target (the old one still holds "
        "those batches), set it back; or give the sink a new name too and restart: the new "
        "name starts afresh there with the next batch, and the old name's marks stay the "
        "record of the old target."
    )
    assert not (tmp_path / "new").exists()  # nothing written
    _run(spark, tmp_path, "gold2", "new", 2, 1)  # the way on, as printed: no refusal
    assert _ids(tmp_path / "new") == [2, 3]
    assert _ids(tmp_path / "old") == [0, 1]
