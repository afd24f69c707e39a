"""Sink B fails batch 3 once: the query fails; on restart only B gets batch 3."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from fanout import FanOut
from fanout.hooks.registry import load_registry
from fanout.testing import FlakySink
from tests.integration.streams import (
    committed_marks,
    delta_rows,
    id_counts,
    run_stream,
    write_input,
)

FILES, ROWS, FAILING = 6, 25, 3


def _fan(tmp_path: Path) -> tuple[FanOut, FlakySink, FlakySink]:
    delta = load_registry().sink_types()["delta"].sink_class
    a = FlakySink(delta(name="a", path=str(tmp_path / "a")), fail_on=[])
    b = FlakySink(
        delta(name="b", path=str(tmp_path / "b")),
        fail_on=[FAILING],
        times=1,
        state_path=tmp_path / "b-failures.json",
    )
    return FanOut("partial", str(tmp_path / "ledger"), [a, b], retries=0), a, b


def test_only_the_failed_sink_replays(spark: Any, tmp_path: Path) -> None:
    rows = write_input(tmp_path / "input", FILES, ROWS)
    fan, a, b = _fan(tmp_path)
    with pytest.raises(StreamingQueryException) as failure:
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")
    assert "BatchFailedError" in str(failure.value)
    assert "sink 'b', batch 3: simulated outage" in str(failure.value)
    assert [c for c in a.calls] == [(0, 1), (1, 1), (2, 1), (3, 1)]
    assert [c for c in b.calls] == [(0, 1), (1, 1), (2, 1), (3, 1)]
    marks = committed_marks(tmp_path / "ledger", "partial")
    assert ("a", FAILING) in marks and ("b", FAILING) not in marks
    failed = [r for r in delta_rows(tmp_path / "ledger") if r["status"] == "failed"]
    assert [(r["sink"], r["batch_id"]) for r in failed] == [("b", FAILING)]
    assert "simulated outage" in failed[0]["error"]

    fan, a, b = _fan(tmp_path)  # a restarted driver: new objects, same checkpoint
    run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")
    assert [batch for batch, _ in a.calls] == [4, 5]  # a is not called again for batch 3
    assert [batch for batch, _ in b.calls] == [3, 4, 5]

    expected = {r["order_id"] for r in rows}
    for sink in ("a", "b"):
        counts = id_counts(delta_rows(tmp_path / sink))
        assert set(counts) == expected and set(counts.values()) == {1}, sink
    assert committed_marks(tmp_path / "ledger", "partial") == {
        (s, n): 1 for s in ("a", "b") for n in range(FILES)
    }
