"""The partitioned-sink example (examples/partitioned_sink.py) holds to the contract: the
conformance suite, run on it without installing it, including the checks of a sink that
commits a batch in pieces (a route changed between a partial attempt and its replay)."""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fanout.testing.conformance import SinkConformance, SinkUnderTest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(autouse=True)
def _examples_importable(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``partitioned_sink`` importable here and in the kill check's driver, and pickled by
    value to this session's executors (their workers started without it on their path)."""
    from pyspark import cloudpickle

    monkeypatch.syspath_prepend(str(EXAMPLES))
    path = os.pathsep.join(filter(None, [str(EXAMPLES), os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", path)
    module = importlib.import_module("partitioned_sink")
    cloudpickle.register_pickle_by_value(module)
    yield
    cloudpickle.unregister_pickle_by_value(module)


def _rows(directory: Path) -> list[dict[str, Any]]:
    """The rows of every committed partition file (each file's first line is its mark)."""
    return [
        json.loads(line)
        for path in sorted(directory.glob("*.jsonl"))
        for line in path.read_text().splitlines()[1:]
    ]


class TestPartitionedFiles(SinkConformance):
    @pytest.fixture
    def under_test(self, tmp_path: Path) -> SinkUnderTest:
        directory = tmp_path / "out"
        return SinkUnderTest(
            config={"type": "partitioned_files", "directory": str(directory), "partitions": 3},
            read=lambda: _rows(directory),
            dead_letter=str(tmp_path / "dead"),
            schema_drift="writes",  # JSON lines: a new column is one more key of each row
            plugins=["partitioned_sink"],  # 'id' only partitions the files: no key, append
        )
