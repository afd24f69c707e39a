"""The sink conformance suite (fanout.testing.conformance) against the Delta sink."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from fanout.delta_tables.io import read_delta
from fanout.testing.conformance import SinkConformance, SinkUnderTest


def _delta_rows(path: Path) -> list[dict[str, Any]]:
    return read_delta(str(path)).to_pylist() if (path / "_delta_log").exists() else []


class TestDeltaConformance(SinkConformance):
    @pytest.fixture
    def under_test(self, tmp_path: Path) -> SinkUnderTest:
        return SinkUnderTest(
            config={"type": "delta", "path": str(tmp_path / "table")},
            read=lambda: _delta_rows(tmp_path / "table"),
            dead_letter=f"delta:{tmp_path / 'dead'}",
            schema_drift="refuses",
            drop=lambda: shutil.rmtree(tmp_path / "table"),  # the table's directory removed
        )
