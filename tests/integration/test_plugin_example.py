"""The plugin author's example runs as documented, also under a new epoch."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "jsonl_sink.py"


def run_example(workdir: Path, *args: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), str(workdir), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [line for line in done.stdout.splitlines() if line.endswith(".jsonl 3")]


def test_the_readme_shows_the_example_verbatim() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "```python\n" + EXAMPLE.read_text() + "```" in readme


def test_example_writes_each_batch_once_and_a_new_epoch_beside_the_old(tmp_path: Path) -> None:
    first = run_example(tmp_path)
    assert first == ["orders~raw~000000000000.jsonl 3", "orders~raw~000000000001.jsonl 3"]
    shutil.rmtree(tmp_path / "checkpoint")  # a lost checkpoint, accepted as a new epoch
    second = run_example(tmp_path, "--new-epoch")
    assert second == [
        *(f"orders@e1~raw~{n:012d}.jsonl 3" for n in range(4)),
        "orders~raw~000000000000.jsonl 3",
        "orders~raw~000000000001.jsonl 3",
    ]
    epoch0 = (tmp_path / "out" / "orders~raw~000000000001.jsonl").read_text().splitlines()
    assert [line.split(",")[0] for line in epoch0] == [
        '{"order_id": 10',
        '{"order_id": 11',
        '{"order_id": 12',
    ]


def test_example_opened_by_validate_creates_nothing_and_says_what_it_would(
    tmp_path: Path,
) -> None:
    import importlib.util

    from fanout import SinkContext

    spec = importlib.util.spec_from_file_location("jsonl_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    target = tmp_path / "out"
    sink = example.JsonLinesSink("raw", directory=str(target))
    checking = SinkContext("orders", checking=True)

    sink.open(checking)

    assert type(sink).read_only_check is True
    assert checking.changes == [f"create directory {target}"]
    assert not target.exists()
    sink.open(SinkContext("orders"))  # a run creates it
    assert target.is_dir()
