"""The sink conformance suite (fanout.testing.conformance) against the Delta sink and the
sample third-party plugin (tests/plugins/fanout-sample, installed by its fixture)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fanout.delta_tables.io import read_delta
from fanout.testing.conformance import SinkConformance, SinkUnderTest
from tests.unit.test_sample_plugin import sample_distribution  # noqa: F401  (a fixture)


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
        )


def _jsonl_rows(directory: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted(directory.glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]


class TestSamplePluginConformance(SinkConformance):
    @pytest.fixture
    def under_test(self, tmp_path: Path, sample_distribution: Any) -> SinkUnderTest:  # noqa: F811
        return SinkUnderTest(
            config={"type": "sample-jsonl", "directory": str(tmp_path / "out")},
            read=lambda: _jsonl_rows(tmp_path / "out"),
            schema_drift="writes",
        )
