"""``fanout validate`` and ``fanout run`` of a pipeline file naming a sink module of its
own (``plugins = ["my_sinks"]``: the README's examples/jsonl_sink.py beside the file, not
installed), in this process and its Spark session (``fanout.app.cli.main``)."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.in_process_cli import Cli
from tests.integration.streams import SCHEMA, pipeline_file, write_input

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def own_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    shutil.copy(ROOT / "examples" / "jsonl_sink.py", tmp_path / "my_sinks.py")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])
    try:
        yield tmp_path
    finally:
        sys.modules.pop("my_sinks", None)


def test_validate_and_run_a_pipeline_file_naming_its_own_sink_module(
    own_module: Path, fanout_cli: Cli
) -> None:
    data = own_module
    sink = f'[[sinks]]\ntype = "jsonl"\nname = "raw"\ndirectory = "{data}/out"\n'
    file = data / "pipeline.toml"
    text = pipeline_file(data, "mine", SCHEMA, sink, available_now=True)
    file.write_text('plugins = ["my_sinks"]\n' + text)
    rows = write_input(data / "input", 2, 3)  # one batch (available now): orders 0-5

    validated = fanout_cli("validate", file)
    assert validated.returncode == 0, validated.stderr
    out = validated.stdout
    assert f"sink raw: would create directory {data}/out" in out, out
    assert "  sink raw: JsonLinesSink, idempotent\n" in out, out
    assert not (data / "out").exists()

    ran = fanout_cli("run", file)
    assert ran.returncode == 0, ran.stderr
    written = sorted((data / "out").glob("*.jsonl"))
    assert [p.name for p in written] == ["mine~raw~000000000000.jsonl"]  # batch 0's
    got = [json.loads(line) for path in written for line in path.read_text().splitlines()]
    assert sorted(r["order_id"] for r in got) == [r["order_id"] for r in rows] == list(range(6))
    assert sorted(got, key=lambda r: r["order_id"]) == rows
