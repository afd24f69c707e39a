"""A newcomer's first mistakes in a pipeline file, refused before Spark starts with the key,
the value and what to write instead (exit code 2). A checkpoint location that is a file, or
lies under one, made ``fanout run`` open every sink and then die in Spark's
``writeStream.start()`` with a Java traceback (exit 1), while ``fanout validate`` called the
file valid; a quoted ``available_now = "yes"`` was refused without its value. No Spark."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fanout.app.cli import main

FILE = """\
[pipeline]
name = "orders"
ledger = "{d}/ledger"
checkpoint = "{checkpoint}"
{trigger}
[source]
format = "rate"

[[sinks]]
type = "delta"
name = "bronze"
path = "{d}/bronze"
"""


def _file(tmp_path: Path, checkpoint: str, trigger: str = "") -> Path:
    file = tmp_path / "pipeline.toml"
    file.write_text(FILE.format(d=tmp_path, checkpoint=checkpoint, trigger=trigger))
    return file


@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_checkpoint_that_is_a_file_is_refused_before_spark_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    taken = tmp_path / "ckpt"
    taken.write_text("notes")
    assert main([command, str(_file(tmp_path, str(taken)))]) == 2
    assert capsys.readouterr() == (
        "",
        f"fanout: configuration error: pipeline.checkpoint: '{taken}': it is a file, not a "
        "directory: Spark keeps the query's checkpoint in a directory; give a directory, or "
        "a path where nothing is yet (Spark creates it)\n",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "pipeline.toml"]


@pytest.mark.parametrize("written", ["{f}/orders", "file:{f}/orders"])
def test_a_checkpoint_under_a_file_is_refused_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], written: str
) -> None:
    taken = tmp_path / "data"
    taken.write_text("")
    checkpoint = written.format(f=taken)
    assert main(["run", str(_file(tmp_path, checkpoint))]) == 2
    assert capsys.readouterr().err == (
        f"fanout: configuration error: pipeline.checkpoint: '{checkpoint}': '{taken}' is a "
        "file, so no directory can be created under it; give a path under a directory\n"
    )


def test_a_checkpoint_to_be_made_under_a_directory_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fanout.app.runner import load_pipeline

    config = load_pipeline(str(_file(tmp_path, f"{tmp_path}/new/ckpt")))
    assert config.checkpoint == f"{tmp_path}/new/ckpt"


@pytest.mark.parametrize(
    ("trigger", "said"),
    [
        ('trigger = { available_now = "yes" }',
         "pipeline.trigger.available_now: expected bool, got 'yes'; write trigger = "
         "{ available_now = true }"),
        ("trigger = { once = 1 }",
         "pipeline.trigger.once: expected bool, got 1; write trigger = { once = true }"),
        ("trigger = { processing_time = 10 }",
         "pipeline.trigger.processing_time: expected str, got 10; write trigger = "
         '{ processing_time = "10 seconds" }'),
    ],
)  # fmt: skip
def test_a_trigger_of_the_wrong_type_names_its_value_and_what_to_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], trigger: str, said: str
) -> None:
    assert main(["validate", str(_file(tmp_path, f"{tmp_path}/ckpt", trigger))]) == 2
    assert capsys.readouterr().err == f"fanout: configuration error: {said}\n"


@pytest.mark.parametrize(
    "written",
    ["s3://bucket/ckpt", "gs://bucket/ckpt", "abfss://c@a.dfs.core.windows.net/ckpt",
     "hdfs://nn:8020/ckpt", "dbfs:/checkpoints/orders", "s3a:/bucket/ckpt"],
)  # fmt: skip
def test_a_checkpoint_in_another_filesystem_is_not_looked_for_on_the_local_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, written: str
) -> None:
    """A URI with a scheme other than file: (``dbfs:/x`` has no ``//``) names no local path:
    a local file beside the command named like its scheme, ``dbfs:``, refused it as 'under a
    file'."""
    from fanout.app.runner import load_pipeline

    monkeypatch.chdir(tmp_path)
    (tmp_path / f"{written.split(':')[0]}:").write_text("a local file, not the store")
    config = load_pipeline(str(_file(tmp_path, written)))
    assert config.checkpoint == written


@pytest.mark.parametrize("kind", ["empty", "earlier", "symlink", "relative", "tilde"])
def test_a_checkpoint_directory_spark_can_use_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """An existing directory (empty, or an earlier run's checkpoint), a symlink to one, a
    path relative to the current directory (Spark's too), ``~`` taken literally as Spark
    takes it: none is refused."""
    from fanout.app.runner import load_pipeline

    monkeypatch.chdir(tmp_path)
    made = tmp_path / "ckpt"
    made.mkdir()
    (made / "offsets").mkdir()
    if kind == "earlier":
        (made / "metadata").write_text('{"id":"7f3c"}\n')
    written = {"empty": str(made), "earlier": str(made), "symlink": str(tmp_path / "link"),
               "relative": "ckpt/orders", "tilde": "~/ckpt"}[kind]  # fmt: skip
    if kind == "symlink":
        (tmp_path / "link").symlink_to(made, target_is_directory=True)
    config = load_pipeline(str(_file(tmp_path, written)))
    assert config.checkpoint == written


NOBODY = 65534
"""The user a test run as root checks the refusal as (root's writes pass any permission)."""


@contextlib.contextmanager
def _as_unprivileged() -> Iterator[None]:
    """This process's effective user, for the block: ``nobody`` when it is root (as a
    driver not run as root is), else unchanged. The modules ``main`` imports are imported
    first, as this process's user."""
    import fanout.app.runner
    import fanout.app.validate  # noqa: F401

    if os.geteuid() != 0:
        yield
        return
    os.setegid(NOBODY)
    os.seteuid(NOBODY)
    try:
        # the code main imports (the sink types' modules, the plugins' entry points)
        unreadable = [p for p in sys.path if os.path.isdir(p)
                      and not os.access(p, os.R_OK | os.X_OK, effective_ids=True)]  # fmt: skip
        if unreadable:
            pytest.skip(f"as root, checked as nobody, who cannot read {unreadable[0]}")
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user may read (``tmp_path`` is its owner's only)."""
    made = Path(tempfile.mkdtemp(prefix="fanout-perm-"))
    made.chmod(0o755)
    try:
        yield made
    finally:
        for path in made.rglob("*"):
            if path.is_dir():
                path.chmod(0o755)
        shutil.rmtree(made)


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize("exists", [False, True])
def test_a_checkpoint_the_user_may_not_write_is_refused_before_spark_starts(
    shared_dir: Path, capsys: pytest.CaptureFixture[str], command: str, exists: bool
) -> None:
    """Permission denied on the checkpoint's parent (or on the checkpoint itself, made
    earlier by another user): refused naming the option, the path and the directory, exit
    2, before Spark. Before, ``run`` opened the sinks and died in Spark's query start with
    a Hadoop traceback, and ``validate`` said the file was valid."""
    locked = shared_dir / "locked"
    locked.mkdir()
    checkpoint = locked / "ckpt"
    if exists:
        checkpoint.mkdir()
    denied = checkpoint if exists else locked
    denied.chmod(0o555)
    file = _file(shared_dir, str(checkpoint))
    file.chmod(0o644)
    with _as_unprivileged():
        user = os.geteuid()
        code = main([command, str(file)])
    assert code == 2
    made = "write into it" if exists else "create a directory in it"
    assert capsys.readouterr() == (
        "",
        f"fanout: configuration error: pipeline.checkpoint: '{checkpoint}': permission "
        f"denied: '{denied}' does not let this user (uid {user}) {made}; give a path it can "
        "write, or grant it write access there\n",
    )
    assert sorted(p.name for p in shared_dir.iterdir()) == ["locked", "pipeline.toml"]
