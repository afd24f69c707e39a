"""The plugin author's example runs as documented, also under a new epoch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "jsonl_sink.py"
NEW_EPOCH = "--- the checkpoint lost, then a run with --new-epoch"
RUN_TWICE = f"""
import runpy, shutil, sys
example, workdir = sys.argv[1:]
sys.argv = [example, workdir]
runpy.run_path(example, run_name="__main__")
print({NEW_EPOCH!r}, flush=True)
shutil.rmtree(workdir + "/checkpoint")  # a lost checkpoint, accepted as a new epoch
sys.argv = [example, workdir, "--new-epoch"]
runpy.run_path(example, run_name="__main__")
"""
"""Runs the example as ``python examples/jsonl_sink.py WORKDIR`` does, then once more with
``--new-epoch`` after deleting its checkpoint, in the same process: the second run's session
starts in the JVM the first one stopped its session in (a process a run would start two
JVMs, ~10 s of CPU each)."""


def run_example_twice(workdir: Path) -> tuple[list[str], list[str]]:
    """What each run printed of the files it lists (``<file> <lines>``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", RUN_TWICE, str(EXAMPLE), str(workdir)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = (
        [line for line in out.splitlines() if line.endswith(".jsonl 3")]
        for out in done.stdout.split(NEW_EPOCH + "\n")
    )
    return first, second


def test_the_readme_shows_the_example_verbatim() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "```python\n" + EXAMPLE.read_text() + "```" in readme


def test_example_writes_each_batch_once_and_a_new_epoch_beside_the_old(tmp_path: Path) -> None:
    first, second = run_example_twice(tmp_path)
    assert first == ["orders~raw~000000000000.jsonl 3", "orders~raw~000000000001.jsonl 3"]
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
    sink.open(SinkContext("orders"))  # a run's open() creates nothing either:
    assert not target.exists()  # the first write does, after the lost-target check


def test_example_open_refuses_a_directory_that_is_a_file(tmp_path: Path) -> None:
    """open() made the directory before; since the first write does, a ``directory`` that
    is a file (or under one) passed open() and failed the first batch, after the stream
    had started (``FileExistsError``, ``NotADirectoryError``)."""
    import importlib.util

    from fanout import ConfigurationError, SinkContext

    spec = importlib.util.spec_from_file_location("jsonl_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    file = tmp_path / "out"
    file.write_text("")
    for directory in (file, file / "batches"):
        sink = example.JsonLinesSink("raw", directory=str(directory))
        for context in (SinkContext("orders", checking=True), SinkContext("orders")):
            with pytest.raises(ConfigurationError) as raised:
                sink.open(context)
            assert str(raised.value) == (
                f"sink 'raw': cannot create directory {directory} ({file} is a file)"
            )
            assert context.changes == []
