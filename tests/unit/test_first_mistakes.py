"""A newcomer's first mistakes in a pipeline file, refused before Spark starts with the key,
the value and what to write instead (exit code 2). A checkpoint location that is a file, or
lies under one, made ``fanout run`` open every sink and then die in Spark's
``writeStream.start()`` with a Java traceback (exit 1), while ``fanout validate`` called the
file valid; a quoted ``available_now = "yes"`` was refused without its value. No Spark."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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


def _bound_by_permissions() -> list[str]:
    """The prefix of a command line whose process the file permissions bind: none for a
    user not root; for root (whose writes pass any permission), ``setpriv`` dropping the
    capabilities that let it (``CAP_DAC_OVERRIDE``, ``CAP_DAC_READ_SEARCH``). A process of
    its own: this test process never changes its user or capabilities (a worker left so by
    an error would fail every later test it runs)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("run as root, and no setpriv (util-linux) to drop root's DAC capabilities")
    return [setpriv, "--bounding-set", "-dac_override,-dac_read_search"]


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize("exists", [False, True])
def test_a_checkpoint_the_user_may_not_write_is_refused_before_spark_starts(
    tmp_path: Path, command: str, exists: bool
) -> None:
    """Permission denied on the checkpoint's parent (or on the checkpoint itself, made
    earlier by another user): refused naming the option, the path and the directory, exit
    2, before Spark. Before, ``run`` opened the sinks and died in Spark's query start with
    a Hadoop traceback, and ``validate`` said the file was valid."""
    locked = tmp_path / "locked"
    locked.mkdir()
    checkpoint = locked / "ckpt"
    if exists:
        checkpoint.mkdir()
    denied = checkpoint if exists else locked
    denied.chmod(0o555)
    file = _file(tmp_path, str(checkpoint))
    try:
        done = subprocess.run(
            [*_bound_by_permissions(), sys.executable, "-m", "fanout", command, str(file)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            check=False,
        )
    finally:
        denied.chmod(0o755)
    made = "write into it" if exists else "create a directory in it"
    assert (done.returncode, done.stdout, done.stderr) == (
        2,
        "",
        f"fanout: configuration error: pipeline.checkpoint: '{checkpoint}': permission "
        f"denied: '{denied}' does not let this user (uid {os.geteuid()}) {made}; give a path "
        "it can write, or grant it write access there\n",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["locked", "pipeline.toml"]
    assert sorted(p.name for p in locked.iterdir()) == (["ckpt"] if exists else [])
