"""``fanout run PIPELINE.toml --new-epoch``: after a lost checkpoint, the refusal names the
command; the flag starts the new epoch for that run only; kept on a later command line, it
is refused (the checkpoint is no longer reset), and a later reset without it is refused as
before. Real Spark (the tests' session, reused by ``fanout run`` in this process), real
Delta ledger and sink."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path
from typing import Any

from tests.in_process_cli import Cli
from tests.integration.streams import (
    bronze_pipeline,
    committed_marks,
    delta_rows,
    id_counts,
    write_input,
)


def _run(fanout_cli: Cli, *args: str) -> tuple[int, str, str]:
    ran = fanout_cli("run", *args)
    return ran.returncode, ran.stdout, ran.stderr


def _new_checkpoint(data: Path, file: int) -> None:
    """Delete the checkpoint and start the input after what the sinks hold (as `fanout
    recover` says for a file source: only newer files): input file ``file`` alone."""
    shutil.rmtree(data / "checkpoint")
    shutil.rmtree(data / "input")
    write_input(data / "input", 1, 3, start_file=file)


def test_new_epoch_is_accepted_for_one_run_only(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    config = tmp_path / "pipeline.toml"
    config.write_text(bronze_pipeline(tmp_path))
    write_input(tmp_path / "input", 1, 3)
    assert _run(fanout_cli, str(config))[0] == 0

    _new_checkpoint(tmp_path, 1)
    code, out, _ = _run(fanout_cli, str(config))
    assert code == 1
    assert (
        "  3. Or, accepting that the new query's batches are written as new data even where "
        f"they repeat old input, continue under a new epoch: `fanout run {config} "
        "--new-epoch` (this run only: later runs refuse resets again)."
    ) in out.splitlines()
    assert (
        f"  `fanout recover --config {config}` prints these facts again, with Kafka "
        "startingOffsets, and asks each sink whether it holds a batch written but never marked."
    ) in out.splitlines()
    assert "on_checkpoint_reset" not in out

    code, out, _ = _run(fanout_cli, str(config), "--new-epoch")
    assert code == 0, out
    started = [line for line in out.splitlines() if line.startswith("--new-epoch: ")]
    assert len(started) == 1
    assert started[0].endswith(
        "its first batch starts epoch 1, for this run only (later runs refuse resets again)"
    )
    assert id_counts(delta_rows(tmp_path / "bronze")) == {i: 1 for i in range(6)}
    epochs = sorted(
        (r["epoch"], r["batch_id"])
        for r in delta_rows(tmp_path / "ledger")
        if r["status"] == "committed"
    )
    assert epochs == [(0, 0), (1, 0)]

    # the flag kept on the command line: the checkpoint now is epoch 1's, nothing to start
    write_input(tmp_path / "input", 1, 3, start_file=2)
    code, out, err = _run(fanout_cli, str(config), "--new-epoch")
    assert code == 2
    assert out == ""
    assert err.startswith(
        f"fanout: configuration error: --new-epoch: the checkpoint at {tmp_path}/checkpoint "
        "is the one epoch 1 of pipeline 'clicks' belongs to (query "
    )
    assert err.endswith(
        f"it was not reset, so there is no new epoch to start; run `fanout run {config}` "
        "without --new-epoch (it continues epoch 1; a rolled-back checkpoint is refused with "
        "or without the flag)\n"
    )
    assert id_counts(delta_rows(tmp_path / "bronze")) == {i: 1 for i in range(6)}

    # without the flag: the run continues epoch 1, and the next reset is refused again
    assert _run(fanout_cli, str(config))[0] == 0
    assert id_counts(delta_rows(tmp_path / "bronze")) == {i: 1 for i in range(9)}
    _new_checkpoint(tmp_path, 3)
    code, out, _ = _run(fanout_cli, str(config))
    assert code == 1
    assert "pipeline 'clicks': checkpoint reset detected." in out
    assert id_counts(delta_rows(tmp_path / "bronze")) == {i: 1 for i in range(9)}
    assert committed_marks(tmp_path / "ledger", "clicks") == {("bronze", 0): 2, ("bronze", 1): 1}


def test_new_epoch_killed_after_its_start_row_goes_on_by_the_command_its_rerun_prints(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """``fanout run --new-epoch`` killed (SIGKILL) in its first batch right after the new
    epoch's start row was committed, before any sink wrote: the epoch is there, owned by
    the checkpoint's query, with no mark. The command run again says so, and the command
    it prints (without the flag) writes the batch once, in the epoch the killed run
    started."""
    from tests.kill_at import KILLED, fanout_killed_at

    config = tmp_path / "pipeline.toml"
    config.write_text(bronze_pipeline(tmp_path))
    write_input(tmp_path / "input", 1, 3)
    assert _run(fanout_cli, str(config))[0] == 0
    _new_checkpoint(tmp_path, 1)

    cut = fanout_killed_at(
        "fanout.ledger.delta:DeltaLedger.start_epoch", "after", 1, "run", str(config),
        "--new-epoch",
    )  # fmt: skip
    assert cut.returncode == KILLED, cut.stderr[-3000:]
    epochs = sorted(
        (r["epoch"], r["batch_id"], r["status"]) for r in delta_rows(tmp_path / "ledger")
    )
    assert epochs == [(0, 0, "committed"), (0, 0, "epoch"), (1, 0, "epoch")]
    assert id_counts(delta_rows(tmp_path / "bronze")) == {i: 1 for i in range(3)}

    code, out, err = _run(fanout_cli, str(config), "--new-epoch")
    assert (code, out) == (2, "")
    assert err.startswith(
        f"fanout: configuration error: --new-epoch: epoch 1 of pipeline 'clicks' was started "
        f"with the checkpoint at {tmp_path}/checkpoint (query "
    ), err
    way = re.search(r"run `(fanout run [^`]*)`", err)
    assert way is not None and "--new-epoch" not in way.group(1), err
    assert err.endswith(
        "by a run that stopped before any sink marked a batch of it (killed, or failed): "
        f"there is no other epoch to start; run `fanout run {config}` without --new-epoch, "
        "it continues epoch 1 from its first batch\n"
    ), err

    code, out, _ = _run(fanout_cli, *shlex.split(way.group(1))[2:])
    assert code == 0, out
    assert id_counts(delta_rows(tmp_path / "bronze")) == {i: 1 for i in range(6)}
    assert committed_marks(tmp_path / "ledger", "clicks") == {("bronze", 0): 2}
    marks = sorted((r["epoch"], r["batch_id"]) for r in delta_rows(tmp_path / "ledger")
                   if r["status"] == "committed")  # fmt: skip
    assert marks == [(0, 0), (1, 0)]


def test_new_epoch_killed_between_its_fences_and_its_start_row_names_both_ways_on(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """``fanout run --new-epoch`` killed after its sinks fenced epoch 0, before the ledger
    recorded epoch 1: the old checkpoint restored is refused by the Delta sink's fence,
    whose message said only "if that new epoch's start was refused" (a killed one is not)
    and named a lift from Python alone. It now names the killed start too, and the way on
    with the new checkpoint, which, run again with the flag as it says, starts epoch 1 and
    writes its batch once."""
    from tests.kill_at import KILLED, fanout_killed_at

    config = tmp_path / "pipeline.toml"
    config.write_text(bronze_pipeline(tmp_path))
    write_input(tmp_path / "input", 1, 3)
    assert _run(fanout_cli, str(config))[0] == 0
    shutil.copytree(tmp_path / "checkpoint", tmp_path / "checkpoint-old")
    _new_checkpoint(tmp_path, 1)

    cut = fanout_killed_at(
        "fanout.ledger.delta:DeltaLedger.start_epoch", "before", 1, "run", str(config),
        "--new-epoch",
    )  # fmt: skip
    assert cut.returncode == KILLED, cut.stderr[-3000:]
    assert sorted(
        (r["epoch"], r["batch_id"], r["status"]) for r in delta_rows(tmp_path / "ledger")
    ) == [(0, 0, "committed"), (0, 0, "epoch")]

    # the old checkpoint restored: its batch 1 (ids 3-5) is refused by the fence
    (tmp_path / "checkpoint").rename(tmp_path / "checkpoint-new")
    (tmp_path / "checkpoint-old").rename(tmp_path / "checkpoint")
    code, out, err = _run(fanout_cli, str(config))
    assert code != 0
    said = out + err
    assert "closes this query's app transaction" in said, said[-3000:]
    assert (
        "If that new epoch's start was refused, or killed before the ledger recorded it, and "
        "this checkpoint must complete the batch, its fence was not lifted"
    ) in said, said[-3000:]
    assert (
        "to go on with the new epoch instead, start its new checkpoint again as that start "
        'was made, `fanout run` with --new-epoch or on_checkpoint_reset="new_epoch": it '
        "fences again and starts it)"
    ) in said, said[-3000:]
    assert id_counts(delta_rows(tmp_path / "bronze")) == {i: 1 for i in range(3)}

    # the way on with the new epoch, as said: the new checkpoint, run with --new-epoch
    (tmp_path / "checkpoint").rename(tmp_path / "checkpoint-old")
    (tmp_path / "checkpoint-new").rename(tmp_path / "checkpoint")
    code, out, _ = _run(fanout_cli, str(config), "--new-epoch")
    assert code == 0, out
    assert id_counts(delta_rows(tmp_path / "bronze")) == {i: 1 for i in range(6)}
    marks = sorted((r["epoch"], r["batch_id"]) for r in delta_rows(tmp_path / "ledger")
                   if r["status"] == "committed")  # fmt: skip
    assert marks == [(0, 0), (1, 0)]


def test_new_epoch_killed_after_its_lost_target_check_before_its_claim_changed_nothing(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """``fanout run --new-epoch`` killed (SIGKILL) right after the reset's lost-target
    check passed, before its fences and claim (``TargetChecks.refuse_lost``, now asked before
    them): the ledger and the table are as before the reset (no ``epoch`` row of epoch 1,
    no fence commit), and the same command run again starts epoch 1 and writes its batch
    once."""
    from deltalake import DeltaTable

    from tests.kill_at import KILLED, fanout_killed_at

    config = tmp_path / "pipeline.toml"
    config.write_text(bronze_pipeline(tmp_path))
    write_input(tmp_path / "input", 1, 3)
    assert _run(fanout_cli, str(config))[0] == 0
    version = DeltaTable(str(tmp_path / "bronze")).version()
    _new_checkpoint(tmp_path, 1)

    cut = fanout_killed_at(
        "fanout.dispatch.targets:TargetChecks.refuse_lost",
        "after",
        1,
        "run",
        str(config),
        "--new-epoch",
    )
    assert cut.returncode == KILLED, cut.stderr[-3000:]
    rows = sorted((r["status"], r["epoch"], r["batch_id"]) for r in delta_rows(tmp_path / "ledger"))
    assert rows == [("committed", 0, 0), ("epoch", 0, 0)]
    assert DeltaTable(str(tmp_path / "bronze")).version() == version  # no fence
    assert id_counts(delta_rows(tmp_path / "bronze")) == {i: 1 for i in range(3)}

    code, out, _ = _run(fanout_cli, str(config), "--new-epoch")
    assert code == 0, out
    assert id_counts(delta_rows(tmp_path / "bronze")) == {i: 1 for i in range(6)}
    rows = sorted((r["status"], r["epoch"], r["batch_id"]) for r in delta_rows(tmp_path / "ledger"))
    # batch 0 of epoch 1 is the killed run's batch, replayed: admitted before its write
    assert rows == [("admitted", 1, 0), ("committed", 0, 0), ("committed", 1, 0), ("epoch", 0, 0),
                    ("epoch", 1, 0)]  # fmt: skip
