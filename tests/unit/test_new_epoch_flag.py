"""How a reset's refusal and ``fanout recover`` say to start a new epoch (``fanout run
PIPELINE.toml --new-epoch`` for a pipeline file, ``FanOut(..., on_checkpoint_reset=
"new_epoch")`` in code, both when not known), and what ``fanout run --new-epoch`` refuses
before anything starts. A real (delta-rs) ledger; no Spark."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fanout.app.cli import main
from fanout.app.config import PipelineConfig
from fanout.app.new_epoch import check_new_epoch
from fanout.contract.batch import BatchInfo
from fanout.errors import CheckpointResetError, ConfigurationError
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry
from fanout.steps.guard import CheckpointGuard

OLD, NEW = "q-old", "q-new"
IN_CODE = (
    "  3. Or, accepting that the new query's batches are written as new data even where they "
    'repeat old input, continue under a new epoch: FanOut(..., on_checkpoint_reset="new_epoch").'
)


def _ledger(tmp_path: Path) -> DeltaLedger:
    ledger = DeltaLedger(str(tmp_path / "ledger"))
    ledger.open()
    ledger.start_epoch(LedgerEntry("p", "*", 0, "epoch", query_id=OLD, epoch=0))
    offsets = json.dumps([{"t": {"0": 10}}])
    ledger.mark_committed(LedgerEntry("p", "a", 0, "committed", query_id=OLD,
                                      source_offsets=offsets))  # fmt: skip
    return ledger


def _refusal(ledger: DeltaLedger, pipeline_file: str | None) -> list[str]:
    guard = CheckpointGuard(ledger)
    guard.pipeline_file = pipeline_file
    with pytest.raises(CheckpointResetError) as refused:
        guard.check(BatchInfo("p", 0, NEW), ledger.lookup("p", []).high_water)
    return str(refused.value).splitlines()


def test_a_reset_refused_names_the_command_for_the_way_the_pipeline_runs(
    tmp_path: Path,
) -> None:
    """``fanout run`` gives the FanOut its pipeline file: the refusal said
    ``FanOut(..., on_checkpoint_reset="new_epoch")``, which neither ``fanout run`` nor the
    file accepts. A FanOut built in code (no pipeline file) still gets the option."""
    ledger = _ledger(tmp_path)
    assert _refusal(ledger, "/etc/p.toml")[-2:] == [
        "  3. Or, accepting that the new query's batches are written as new data even where "
        "they repeat old input, continue under a new epoch: `fanout run /etc/p.toml "
        "--new-epoch` (this run only: later runs refuse resets again).",
        "  `fanout recover --config /etc/p.toml` prints these facts again, with Kafka "
        "startingOffsets, and asks each sink whether it holds a batch written but never marked.",
    ]
    assert _refusal(ledger, None)[-2:] == [
        IN_CODE,
        f"  `fanout recover --ledger {tmp_path}/ledger --pipeline p` prints these facts "
        "again, with Kafka startingOffsets.",
    ]


def _config(tmp_path: Path, name: str = "p") -> PipelineConfig:
    return PipelineConfig(
        name, str(tmp_path / "ledger"), str(tmp_path / "ckpt"), {"format": "rate"}, []
    )


def _checkpoint_of(tmp_path: Path, query: str) -> None:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "metadata").write_text(json.dumps({"id": query}) + "\n")


def test_new_epoch_on_the_epochs_own_checkpoint_is_refused(tmp_path: Path) -> None:
    _ledger(tmp_path)
    _checkpoint_of(tmp_path, OLD)
    (tmp_path / "ckpt" / "offsets").mkdir()  # batch 0, which the ledger marked, planned
    (tmp_path / "ckpt" / "offsets" / "0").write_text("v1\n{}\n{}\n")
    with pytest.raises(ConfigurationError) as refused:
        check_new_epoch(_config(tmp_path), "p.toml")
    assert str(refused.value) == (
        f"--new-epoch: the checkpoint at {tmp_path}/ckpt is the one epoch 0 of pipeline 'p' "
        "belongs to (query q-old): it was not reset, so there is no new epoch to start; run "
        "`fanout run p.toml` without --new-epoch (it continues epoch 0; a rolled-back "
        "checkpoint is refused with or without the flag)"
    )


def test_new_epoch_on_a_new_or_replaced_checkpoint_says_what_it_starts(tmp_path: Path) -> None:
    _ledger(tmp_path)
    assert check_new_epoch(_config(tmp_path), "p.toml") == (
        f"--new-epoch: the checkpoint at {tmp_path}/ckpt is new (no query has run on it yet), "
        "not epoch 0's (query q-old): its first batch starts epoch 1, for this run only "
        "(later runs refuse resets again)"
    )
    _checkpoint_of(tmp_path, NEW)
    assert check_new_epoch(_config(tmp_path), "p.toml").startswith(
        f"--new-epoch: the checkpoint at {tmp_path}/ckpt is of query q-new, not epoch 0's"
    )


def test_new_epoch_on_an_earlier_epochs_checkpoint_is_refused(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    ledger.start_epoch(LedgerEntry("p", "*", 0, "epoch", query_id=NEW, epoch=1))
    _checkpoint_of(tmp_path, OLD)
    with pytest.raises(ConfigurationError) as refused:
        check_new_epoch(_config(tmp_path), "p.toml")
    assert str(refused.value).startswith(
        f"--new-epoch: the checkpoint at {tmp_path}/ckpt is of query q-old, whose batches "
        "are epoch 0 of pipeline 'p', but the pipeline continues under epoch 1: an old "
        "checkpoint restored, which no new epoch may take"
    )


def test_new_epoch_of_a_pipeline_the_ledger_does_not_hold_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A first run, a misspelt name or ledger: before any Spark session starts, exit 2."""
    _ledger(tmp_path)
    file = tmp_path / "other.toml"
    file.write_text(
        f'[pipeline]\nname = "other"\nledger = "{tmp_path}/ledger"\ncheckpoint = '
        f'"{tmp_path}/ckpt"\n[source]\nformat = "rate"\n[[sinks]]\ntype = "delta"\n'
        f'name = "a"\npath = "{tmp_path}/a"\n'
    )
    assert main(["run", str(file), "--new-epoch"]) == 2
    assert capsys.readouterr().err == (
        f"fanout: configuration error: --new-epoch: the ledger at {tmp_path}/ledger holds "
        "nothing of pipeline 'other': there is no epoch to continue from (a first run starts "
        "epoch 0 by itself; check pipeline.name and pipeline.ledger in "
        f"{file}); run `fanout run {file}` without --new-epoch\n"
    )
    with pytest.raises(ConfigurationError, match=r"^--new-epoch: no ledger at "):
        check_new_epoch(_config(tmp_path / "nowhere"), "p.toml")


def test_new_epoch_on_the_checkpoint_of_another_pipeline_is_refused(tmp_path: Path) -> None:
    """A pipeline file copied for a second pipeline that kept the first one's checkpoint:
    its query is not the epoch's owner, so --new-epoch took it for a reset and started a new
    epoch of pipeline 'q' on pipeline 'p''s checkpoint, moving that checkpoint past batches
    'p''s sinks then never got (the contract: one pipeline name per query)."""
    ledger = _ledger(tmp_path)
    ledger.start_epoch(LedgerEntry("q", "*", 0, "epoch", query_id=NEW, epoch=0))
    ledger.mark_committed(LedgerEntry("q", "b", 0, "committed", query_id=NEW))
    _checkpoint_of(tmp_path, OLD)
    with pytest.raises(ConfigurationError) as refused:
        check_new_epoch(_config(tmp_path, "q"), "q.toml")
    assert str(refused.value) == (
        f"--new-epoch: the checkpoint at {tmp_path}/ckpt is of query q-old, whose batches "
        "are epoch 0 of pipeline 'p' in this ledger, not of pipeline 'q': two pipelines "
        "sharing one checkpoint, which no new epoch may take (the batches it plans next are "
        "pipeline 'p''s); give pipeline 'q' a checkpoint of its own (pipeline.checkpoint in "
        "q.toml), then run with --new-epoch"
    )


def test_new_epoch_on_the_epochs_own_checkpoint_rolled_back_says_it_is_refused_either_way(
    tmp_path: Path,
) -> None:
    """The epoch's own checkpoint with its offsets/ and commits/ deleted (a reset by hand
    that kept `metadata`): the refusal said "it was not reset ... it continues epoch 0", but
    run without the flag it is refused too (CheckpointRollbackError: Spark re-plans batch 0,
    which the ledger marked). It says what the guard will say, and the way out."""
    ledger = _ledger(tmp_path)
    ledger.mark_committed(LedgerEntry("p", "a", 1, "committed", query_id=OLD))
    _checkpoint_of(tmp_path, OLD)
    (tmp_path / "ckpt" / "offsets").mkdir()
    (tmp_path / "ckpt" / "offsets" / "0").write_text("v1\n{}\n{}\n")
    with pytest.raises(ConfigurationError) as refused:
        check_new_epoch(_config(tmp_path), "p.toml")
    assert str(refused.value) == (
        f"--new-epoch: the checkpoint at {tmp_path}/ckpt is the one epoch 0 of pipeline 'p' "
        "belongs to (query q-old), rolled back: its newest batch is 0, and the ledger holds "
        "batch 1 of epoch 0, so Spark re-plans batches the sinks hold, which is refused with "
        "or without --new-epoch (CheckpointRollbackError); restore the newest checkpoint and "
        "run `fanout run p.toml` without --new-epoch, or start a new checkpoint in an empty "
        "directory where `fanout recover --config p.toml` says and run with --new-epoch"
    )
    (tmp_path / "ckpt" / "offsets" / "0").unlink()
    with pytest.raises(ConfigurationError, match=r"rolled back: it holds no batch, and the "):
        check_new_epoch(_config(tmp_path), "p.toml")
