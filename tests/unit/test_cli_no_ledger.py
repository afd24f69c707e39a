"""An operator's ``fanout`` command never creates a ledger: at a location with none (a
mistyped ``--ledger``, a pipeline file's ``pipeline.ledger`` that never ran) it is refused
with exit 2, a message naming the location and what to check, and nothing is written
there. Only a pipeline's run creates its ledger.

``fanout ledger skip --ledger <typo>`` used to create an empty ledger table there, then
refuse ("no other sink of the pipeline committed batch 3"); ``status``, ``recover`` and
``ledger maintain`` failed with exit 1 (``LedgerError``). ``ledger skip``, the command
that wrote, runs as a real subprocess (with ``--ledger`` and with ``--config``); the
others through :func:`fanout.app.cli.main` in this process (a subprocess each costs 4-7 s
of CI). No Spark."""

from __future__ import annotations

from pathlib import Path

import pytest

from fanout.app.cli import main
from tests.cli_process import fanout_process

SKIP = ["ledger", "skip", "--sink", "s", "--through", "3"]
COMMANDS = {
    "status": ["status"],
    "recover": ["recover", "--pipeline", "p"],
    "recover --no-record": ["recover", "--pipeline", "p", "--no-record"],
    "ledger maintain": ["ledger", "maintain"],
}


def _refused(where: Path, config: Path | None = None) -> str:
    check = (
        "check the path for a typo, or give --config PIPELINE.toml to use the pipeline "
        "file's pipeline.ledger"
        if config is None
        else f"check pipeline.ledger in {config} for a typo, or whether the pipeline has run yet"
    )
    return (
        f"fanout: configuration error: no ledger at {where}: this command reads an existing "
        "ledger and creates none (a pipeline's run creates its ledger when it starts): "
        f"{check}\n"
    )


def _pipeline_file(tmp_path: Path, ledger: Path) -> Path:
    file = tmp_path / "pipeline.toml"
    file.write_text(
        f'[pipeline]\nname = "p"\nledger = "{ledger}"\ncheckpoint = "{tmp_path}/ckpt"\n'
        f'[source]\nformat = "rate"\n[[sinks]]\ntype = "delta"\nname = "s"\n'
        f'path = "{tmp_path}/s"\n'
    )
    return file


def test_ledger_skip_at_a_mistyped_ledger_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    where = tmp_path / "ledgr"  # the typo of an existing pipeline's "ledger"
    done = fanout_process(*SKIP, "--pipeline", "p", "--ledger", str(where))
    assert (done.returncode, done.stdout, done.stderr) == (2, "", _refused(where))
    assert not where.exists()
    assert list(tmp_path.iterdir()) == []


def test_ledger_skip_at_a_pipeline_files_ledger_not_there_is_refused(tmp_path: Path) -> None:
    where = tmp_path / "ledger"
    file = _pipeline_file(tmp_path, where)
    done = fanout_process(*SKIP, "--config", str(file))
    assert (done.returncode, done.stdout, done.stderr) == (2, "", _refused(where, file))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipeline.toml"]


@pytest.mark.parametrize("command", list(COMMANDS), ids=list(COMMANDS))
def test_every_ledger_command_refuses_a_location_with_no_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    where = tmp_path / "ledgr"
    assert main([*COMMANDS[command], "--ledger", str(where)]) == 2
    assert capsys.readouterr().err == _refused(where)
    assert list(tmp_path.iterdir()) == []


def test_recover_at_a_pipeline_files_ledger_not_there_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    where = tmp_path / "ledger"
    file = _pipeline_file(tmp_path, where)
    assert main(["recover", "--config", str(file)]) == 2
    assert capsys.readouterr() == ("", _refused(where, file))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipeline.toml"]
