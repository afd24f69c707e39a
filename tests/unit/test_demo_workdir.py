"""``fanout demo --workdir`` deletes nothing fanout did not create (issue 14, item 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fanout.app.demo.workdir import MARKER, prepare_workdir
from fanout.errors import ConfigurationError


def users_dir(tmp_path: Path) -> Path:
    root = tmp_path / "mine"
    (root / "sub").mkdir(parents=True)
    (root / "important.txt").write_text("keep me")
    (root / "sub" / "notes.md").write_text("and me")
    return root


def test_a_users_directory_is_refused_and_left_intact(tmp_path: Path) -> None:
    root = users_dir(tmp_path)
    with pytest.raises(ConfigurationError, match="was not made by `fanout demo`"):
        prepare_workdir(root)
    assert (root / "important.txt").read_text() == "keep me"
    assert (root / "sub" / "notes.md").read_text() == "and me"
    assert not (root / MARKER).exists()


def test_the_cli_refuses_it_with_exit_code_2_before_starting_anything(tmp_path: Path) -> None:
    root = users_dir(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "fanout.app.cli", "demo", "--workdir", str(root)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "was not made by `fanout demo`" in done.stderr
    assert sorted(p.name for p in root.iterdir()) == ["important.txt", "sub"]


def test_an_earlier_demos_directory_is_cleared_and_reused(tmp_path: Path) -> None:
    root = tmp_path / "demo"
    prepare_workdir(root)
    (root / "bronze").mkdir()
    (root / "bronze" / "part-0.parquet").write_bytes(b"x")
    (root / "outage.json").write_text("{}")
    prepare_workdir(root)
    assert sorted(p.name for p in root.iterdir()) == [MARKER]


def test_an_earlier_demos_directory_with_a_users_file_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "demo"
    prepare_workdir(root)
    (root / "bronze").mkdir()
    (root / "important.txt").write_text("keep me")
    with pytest.raises(ConfigurationError, match="also holds important.txt"):
        prepare_workdir(root)
    assert sorted(p.name for p in root.iterdir()) == [MARKER, "bronze", "important.txt"]


def test_a_new_or_empty_directory_is_created_and_marked(tmp_path: Path) -> None:
    prepare_workdir(tmp_path / "new" / "demo")
    assert (tmp_path / "new" / "demo" / MARKER).is_file()
    (tmp_path / "empty").mkdir()
    prepare_workdir(tmp_path / "empty")
    assert sorted(p.name for p in (tmp_path / "empty").iterdir()) == [MARKER]
