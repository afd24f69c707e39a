"""The sink conformance suite (fanout.testing.conformance) against the sample third-party
plugin, installed by its fixture (conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fanout.testing.conformance import SinkConformance, SinkUnderTest


def _jsonl_rows(directory: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted(directory.glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]


class TestSamplePluginConformance(SinkConformance):
    @pytest.fixture
    def under_test(self, tmp_path: Path, sample_distribution: Any) -> SinkUnderTest:
        return SinkUnderTest(
            config={"type": "sample-jsonl", "directory": str(tmp_path / "out")},
            read=lambda: _jsonl_rows(tmp_path / "out"),
            schema_drift="writes",
        )
