"""A newcomer's first mistakes in a pipeline file, refused before Spark starts with the key,
the value and what to write instead (exit code 2). A checkpoint location that is a file, or
lies under one, made ``fanout run`` open every sink and then die in Spark's
``writeStream.start()`` with a Java traceback (exit 1), while ``fanout validate`` called the
file valid; a quoted ``available_now = "yes"`` was refused without its value. No Spark."""

from __future__ import annotations

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
