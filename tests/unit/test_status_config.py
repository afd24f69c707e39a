"""``fanout status --config PIPELINE.toml``: the ledger, pipeline and spool from the file
(as ``recover`` and ``ledger skip`` read them), every sink of the file listed, one the
ledger holds no row of as "no mark yet". A real (delta-rs) ledger; no Spark."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from fanout.app.cli import main
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry
from tests.newest_lines import readout

AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def _setup(tmp_path: Path) -> str:
    ledger = DeltaLedger(str(tmp_path / "ledger"))
    ledger.open()
    for batch in range(2):
        ledger.mark_committed(
            LedgerEntry("p", "a", batch, "committed", query_id="q", rows=5, finished_at=AT)
        )
    ledger.record_failure(
        LedgerEntry("p", "b", 0, "failed", query_id="q", error="SinkWriteError: boom",
                    finished_at=AT)
    )  # fmt: skip
    ledger.mark_committed(LedgerEntry("other", "x", 0, "committed", query_id="q2", rows=1))
    file = tmp_path / "pipeline.toml"
    file.write_text(
        f'[pipeline]\nname = "p"\nledger = "{tmp_path}/ledger"\ncheckpoint = '
        f'"{tmp_path}/ckpt"\n[source]\nformat = "rate"\n'
        + "".join(
            f'[[sinks]]\ntype = "delta"\nname = "{s}"\npath = "{tmp_path}/{s}"\n'
            for s in ("a", "b", "c")
        )
    )
    return str(file)


def test_status_lists_every_sink_of_the_pipeline_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sink c never wrote a batch: without --config it was missing from the list."""
    config = _setup(tmp_path)
    assert main(["status", "--config", config]) == 0
    assert readout(capsys).out.splitlines() == [
        "pipeline  sink  state        last batch  rows (total)  failed  last commit (UTC)",
        "--------  ----  -----------  ----------  ------------  ------  -------------------",
        "p         a     live         1           10            0       2026-01-02 03:04:05",
        "p         b     stopped      -           0             1       -",
        "p         c     no mark yet  -           0             0       -",
        "",
        "1 sink has failed attempts; `fanout status --wide` or `--json` shows the last error.",
        "",
        f"checkpoint {tmp_path}/ckpt: none there, but the ledger holds batches of pipeline "
        "'p' (query q): deleted or moved (or on a disk this machine does not see)? A run "
        "starts a new query, which fanout refuses (CheckpointResetError): restore it, or see "
        f"`fanout recover --config {config}`",
    ]
    assert main(["status", "--config", config, "--json"]) == 0
    listed = json.loads(readout(capsys).out)
    newest = [s.pop("pipeline_newest_mark") for s in listed]  # the pipeline's, in each
    assert newest[0] == newest[1] == newest[2]
    assert (newest[0]["sink"], newest[0]["batch_id"], newest[0]["looks_running"]) == ("a", 1, False)
    assert [(s["pipeline"], s["sink"], s["state"]) for s in listed] == [
        ("p", "a", "live"),
        ("p", "b", "stopped"),
        ("p", "c", "no mark yet"),
    ]
    assert listed[2] == {
        "pipeline": "p", "sink": "c", "last_committed_batch": None, "last_batch_rows": None,
        "committed_batches": 0, "rows_total": 0, "dead_lettered_total": 0,
        "last_commit_at": None, "failed_attempts": 0, "last_error": None,
        "state": "no mark yet", "lag_batches": 0, "lag_rows": 0, "lagging_since": None,
        "kept": [], "given_up": [],
        "checkpoint": {"location": f"{tmp_path}/ckpt", "state": "missing", "batch": None,
                       "said": listed[2]["checkpoint"]["said"]},
    }  # fmt: skip


def test_a_short_password_in_the_pipeline_file_leaves_status_output_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Tables at ``s3://k:1@...`` and ``s3://k:fanout@...`` (the example pipeline's
    password): the CLI masked each standalone ``1`` and ``fanout`` in all it printed, so the
    table read ``***`` for batch 1, the next step ``*** recover``, and ``--json`` was no
    JSON (``"last_committed_batch": ***``)."""
    config = _setup(tmp_path)
    text = Path(config).read_text()
    text = text.replace(f'"{tmp_path}/b"', '"s3://k:1@bucket/b"')
    Path(config).write_text(text.replace(f'"{tmp_path}/c"', '"s3://k:fanout@bucket/c"'))
    assert main(["status", "--config", config]) == 0
    out = readout(capsys).out.splitlines()
    assert (
        out[2]
        == "p         a     live         1           10            0       2026-01-02 03:04:05"
    )
    assert out[3] == "p         b     stopped      -           0             1       -"
    assert out[-1].endswith(f"restore it, or see `fanout recover --config {config}`")
    assert main(["status", "--config", config, "--json"]) == 0
    listed = json.loads(readout(capsys).out)
    assert [(s["sink"], s["last_committed_batch"], s["failed_attempts"]) for s in listed] == [
        ("a", 1, 0),
        ("b", None, 1),
        ("c", None, 0),
    ]
    assert listed[0]["checkpoint"]["said"].endswith(f"`fanout recover --config {config}`")


def test_status_of_a_pipeline_file_not_run_yet_lists_its_sinks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The ledger holds other pipelines only: with --pipeline that was an unknown pipeline
    (exit 1); the file says the pipeline exists, its sinks have no mark yet."""
    config = _setup(tmp_path)
    Path(config).write_text(Path(config).read_text().replace('name = "p"', 'name = "new"', 1))
    assert main(["status", "--config", config]) == 0
    assert readout(capsys).out.splitlines()[2:] == [
        "new       a     no mark yet  -           0             0       -",
        "new       b     no mark yet  -           0             0       -",
        "new       c     no mark yet  -           0             0       -",
        "",
        f"checkpoint {tmp_path}/ckpt: none yet (the first run creates it)",
    ]


def test_status_before_the_first_run_lists_the_sinks_of_a_file_with_no_ledger_yet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A new pipeline file, never run: no ledger at its path. `fanout status --config`
    failed (exit 1, "LedgerError: no ledger at ...: a FanOut creates it when it starts"),
    where the README promises every sink "no mark yet" and the checkpoint "none yet"."""
    config = tmp_path / "pipeline.toml"
    config.write_text(
        f'[pipeline]\nname = "p"\nledger = "{tmp_path}/ledger"\ncheckpoint = '
        f'"{tmp_path}/ckpt"\n[source]\nformat = "rate"\n'
        + "".join(
            f'[[sinks]]\ntype = "delta"\nname = "{s}"\npath = "{tmp_path}/{s}"\n'
            for s in ("a", "b")
        )
    )
    assert main(["status", "--config", str(config)]) == 0
    captured = readout(capsys)
    assert captured.out.splitlines() == [
        "pipeline  sink  state        last batch  rows (total)  failed  last commit (UTC)",
        "--------  ----  -----------  ----------  ------------  ------  -----------------",
        "p         a     no mark yet  -           0             0       -",
        "p         b     no mark yet  -           0             0       -",
        "",
        f"checkpoint {tmp_path}/ckpt: none yet (the first run creates it)",
    ]
    assert captured.err == (
        f"pipeline 'p': no ledger at {tmp_path}/ledger yet: the first run creates it (if "
        f"{config} has run, check pipeline.ledger)\n"
    )
    assert main(["status", "--config", str(config), "--json"]) == 0
    listed = json.loads(readout(capsys).out)
    assert [(s["sink"], s["state"], s["checkpoint"]["state"]) for s in listed] == [
        ("a", "no mark yet", "none yet"),
        ("b", "no mark yet", "none yet"),
    ]
    assert not (tmp_path / "ledger").exists()  # status creates nothing


def test_status_refuses_a_flag_contradicting_the_file_and_needs_a_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _setup(tmp_path)
    assert main(["status", "--config", config, "--pipeline", "other"]) == 2
    assert readout(capsys).err == (
        f"fanout: configuration error: --pipeline other: {config} says p: drop --pipeline "
        "(the pipeline file says which it is) or give the pipeline's own file\n"
    )
    assert main(["status"]) == 2
    assert readout(capsys).err == (
        "fanout: configuration error: --ledger required: give it, or --config PIPELINE.toml\n"
    )


def _checkpoint(root: Path, query: str, offsets: int, commits: int) -> None:
    """A checkpoint as Spark leaves it: ``metadata``, ``offsets/0..N``, ``commits/0..M``."""
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    (root / "metadata").write_text(json.dumps({"id": query}) + "\n")
    for batch in range(offsets + 1):
        (root / "offsets" / str(batch)).write_text("v1\n{}\n{}\n")
    for batch in range(commits + 1):
        (root / "commits" / str(batch)).write_text("v1\n{}\n")


def test_status_says_what_the_checkpoint_holds_beyond_the_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A driver killed mid-batch, then a checkpoint deleted: `fanout status --config` showed
    the same table both times, the batch in flight and the coming refusal invisible until
    `fanout run` started Spark (its refusal came a minute later)."""
    config = _setup(tmp_path)
    ckpt = tmp_path / "ckpt"
    _checkpoint(ckpt, "q", offsets=2, commits=1)
    assert main(["status", "--config", config]) == 0
    assert readout(capsys).out.splitlines()[-2:] == [
        "",
        f"checkpoint {ckpt}: batch 2 planned, not committed: in flight if the pipeline runs; "
        "else the run stopped or died during it, and the next run replays it, writing it only "
        "to the sinks whose last batch is before it",
    ]
    (ckpt / "commits" / "2").write_text("v1\n{}\n")
    assert main(["status", "--config", config]) == 0
    out = readout(capsys).out.splitlines()
    assert out[-1] == f"checkpoint {ckpt}: batch 2 committed last, none in flight"
    (ckpt / "metadata").write_text(json.dumps({"id": "q9"}) + "\n")
    assert main(["status", "--config", config]) == 0
    assert readout(capsys).out.splitlines()[-1] == (
        f"checkpoint {ckpt}: of query q9, but pipeline 'p' belongs to query q: replaced? A "
        "run is refused (CheckpointResetError) unless started with --new-epoch: restore it, "
        f"or see `fanout recover --config {config}`"
    )
    for path in sorted(ckpt.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    assert main(["status", "--config", config]) == 0
    assert readout(capsys).out.splitlines()[-1] == (
        f"checkpoint {ckpt}: none there, but the ledger holds batches of pipeline 'p' (query "
        "q): deleted or moved (or on a disk this machine does not see)? A run starts a new "
        "query, which fanout refuses (CheckpointResetError): restore it, or see `fanout "
        f"recover --config {config}`"
    )
    assert main(["status", "--config", config, "--json"]) == 0
    listed = json.loads(readout(capsys).out)
    assert [s["checkpoint"] for s in listed] == [listed[0]["checkpoint"]] * 3
    assert listed[0]["checkpoint"] == {
        "location": str(ckpt), "state": "missing", "batch": None,
        "said": "none there, but the ledger holds batches of pipeline 'p' (query q): deleted "
        "or moved (or on a disk this machine does not see)? A run starts a new query, which "
        f"fanout refuses (CheckpointResetError): restore it, or see `fanout recover --config "
        f"{config}`",
    }  # fmt: skip
    _checkpoint(ckpt, "q", offsets=3, commits=2)
    assert main(["status", "--config", config, "--json"]) == 0
    assert json.loads(readout(capsys).out)[0]["checkpoint"] == {
        "location": str(ckpt), "state": "in flight", "batch": 3,
        "said": "batch 3 planned, not committed: in flight if the pipeline runs; else the run "
        "stopped or died during it, and the next run replays it, writing it only to the sinks "
        "whose last batch is before it",
    }  # fmt: skip
    assert main(["status", "--ledger", str(tmp_path / "ledger"), "--json"]) == 0
    assert "checkpoint" not in readout(capsys).out  # no pipeline file, no checkpoint known


def test_status_of_a_pipeline_whose_first_start_failed_does_not_blame_a_spool_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wrong password stopped the first `fanout run` before its spool was created:
    `fanout status --config` then failed (exit 2) with `--spool PATH: no spool there ...
    or leave --spool out`, a flag the on-call never gave, and showed no sink."""
    config = _setup(tmp_path)
    text = Path(config).read_text().replace("[source]", f'spool = "{tmp_path}/spool"\n[source]')
    Path(config).write_text(text)
    assert main(["status", "--config", config]) == 0
    captured = readout(capsys)
    assert captured.err == (
        f"pipeline 'p': spool {tmp_path}/spool (pipeline.spool in {config}): none there, "
        "though the ledger holds batches of the pipeline: a start that failed before "
        "creating it, or a spool deleted, moved, or another path in the file than the runs "
        "had (its spooled batches and the sinks lagging on them are not shown: give the "
        "spool the runs had by --ledger, --pipeline and --spool instead of --config)\n"
    )
    assert captured.out.splitlines()[2:5] == [
        "p         a     live         1           10            0       2026-01-02 03:04:05",
        "p         b     stopped      -           0             1       -",
        "p         c     no mark yet  -           0             0       -",
    ]
    assert not (tmp_path / "spool").exists()  # nothing created there
    assert main(["status", "--config", config, "--spool", f"{tmp_path}/spool"]) == 2
    assert "no spool there" in readout(capsys).err  # a spool given by hand: checked


def _with_checkpoint(config: str, checkpoint: str) -> None:
    text = Path(config).read_text()
    start = text.index("checkpoint = ")
    end = text.index("\n", start)
    Path(config).write_text(text[:start] + f'checkpoint = "{checkpoint}"' + text[end:])


def test_status_of_a_checkpoint_on_a_store_it_cannot_read_still_lists_the_sinks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint on Azure (abfss://), read without Spark: pyarrow raised a bare
    ArrowException, which the footer did not catch, and `fanout status --config` ended in a
    traceback (exit 1) for a pipeline it showed before the footer existed. A dbfs: path was
    read as a local one, not found, and called deleted."""
    config = _setup(tmp_path)
    _with_checkpoint(config, "abfss://c@nowhere.dfs.core.windows.net/ckpt")
    assert main(["status", "--config", config]) == 0
    out = readout(capsys).out.splitlines()
    assert out[2].startswith("p         a     live")
    assert out[-1].startswith(
        "checkpoint abfss://c@nowhere.dfs.core.windows.net/ckpt: cannot be read here ("
    )
    _with_checkpoint(config, "dbfs:/pipelines/p/ckpt")
    assert main(["status", "--config", config]) == 0
    assert readout(capsys).out.splitlines()[-1] == (
        "checkpoint dbfs:/pipelines/p/ckpt: cannot be read here (a dbfs: location: fanout "
        "reads a checkpoint without Spark on a local path, file: and the stores pyarrow "
        "knows)"
    )


def test_status_does_not_call_a_running_batch_died(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`fanout status --config --watch` beside a running pipeline: every batch Spark was
    writing was shown as 'planned, never committed (the run stopped or died during it)'."""
    config = _setup(tmp_path)
    _checkpoint(tmp_path / "ckpt", "q", offsets=2, commits=1)
    assert main(["status", "--config", config]) == 0
    assert readout(capsys).out.splitlines()[-1] == (
        f"checkpoint {tmp_path}/ckpt: batch 2 planned, not committed: in flight if the "
        "pipeline runs; else the run stopped or died during it, and the next run replays it, "
        "writing it only to the sinks whose last batch is before it"
    )


def test_status_of_a_pipeline_never_run_says_its_spool_holds_nothing_yet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The note for a spool not there said 'no batch is spooled' also for a pipeline the
    ledger holds batches of, whose spool may have been deleted or renamed in the file (the
    lagging sinks' spooled batches then unseen); it is right only before any run."""
    config = _setup(tmp_path)
    text = Path(config).read_text().replace('name = "p"', 'name = "new"')
    Path(config).write_text(text.replace("[source]", f'spool = "{tmp_path}/spool"\n[source]'))
    assert main(["status", "--config", config]) == 0
    assert readout(capsys).err == (
        f"pipeline 'new': spool {tmp_path}/spool (pipeline.spool in {config}): none there "
        "yet, which a run of the pipeline creates when it starts: no batch is spooled (if "
        "the pipeline ran with another spool, give it: --ledger, --pipeline and --spool "
        "instead of --config)\n"
    )


def test_status_masks_a_password_in_the_checkpoint_and_spool_locations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint at ``s3://KEY:SECRET@bucket/...`` (or any URI with ``user:password@``):
    `fanout status --config` printed it as written, the password with it."""
    config = _setup(tmp_path)
    secret, spool_secret = "S3cretPassw0rd", "Sp00lSecr3t!"
    _with_checkpoint(config, f"file://u:{secret}@localhost{tmp_path}/ckpt")
    text = (
        Path(config)
        .read_text()
        .replace(
            "[source]", f'spool = "file://u:{spool_secret}@localhost{tmp_path}/spool"\n[source]'
        )
    )
    Path(config).write_text(text)
    assert main(["status", "--config", config]) == 0
    captured = readout(capsys)
    assert secret not in captured.out + captured.err
    assert spool_secret not in captured.out + captured.err
    assert captured.out.splitlines()[-1] == (
        f"checkpoint file://u:***@localhost{tmp_path}/ckpt: none there, but the ledger holds "
        "batches of pipeline 'p' (query q): deleted or moved (or on a disk this machine does "
        "not see)? A run starts a new query, which fanout refuses (CheckpointResetError): "
        f"restore it, or see `fanout recover --config {config}`"
    )
    assert captured.err.startswith(
        f"pipeline 'p': spool file://u:***@localhost{tmp_path}/spool (pipeline.spool in "
    )
    assert main(["status", "--config", config, "--json"]) == 0
    captured = readout(capsys)
    assert secret not in captured.out + captured.err
    assert json.loads(captured.out)[0]["checkpoint"]["location"] == (
        f"file://u:***@localhost{tmp_path}/ckpt"
    )
    pw = "L3dgerPassw0rd"
    assert main(["status", "--ledger", f"s3://KEY:{pw}@127.0.0.1:9/none/ledger"]) == 1
    captured = readout(capsys)
    assert pw not in captured.out + captured.err
    assert "s3://KEY:***@127.0.0.1:9/none/ledger" in captured.err


def test_a_password_of_digits_leaves_status_json_whole_and_masked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A password ``12345678`` (8 characters: masked wherever it occurs in printed text)
    turned a count holding those digits into ``***``: ``--json`` printed no JSON. Its
    strings are masked, its numbers are not."""
    config = _setup(tmp_path)
    ledger = DeltaLedger(str(tmp_path / "ledger"))
    ledger.mark_committed(
        LedgerEntry("p", "a", 2, "committed", query_id="q", rows=12345678, finished_at=AT)
    )
    ledger.record_failure(
        LedgerEntry("p", "b", 1, "failed", query_id="q", finished_at=AT,
                    error="SinkWriteError: login with 12345678 refused")
    )  # fmt: skip
    text = Path(config).read_text()
    Path(config).write_text(text.replace(f'"{tmp_path}/c"', '"s3://k:12345678@bucket/c"'))
    assert main(["status", "--config", config, "--json"]) == 0
    out = readout(capsys).out
    listed = json.loads(out)
    a, b = listed[0], listed[1]
    assert (a["last_committed_batch"], a["last_batch_rows"], a["rows_total"]) == (
        2, 12345678, 12345688,
    )  # fmt: skip
    assert b["last_error"] == "SinkWriteError: login with *** refused"
    assert "login with 12345678" not in out


def test_a_password_of_digits_leaves_each_draw_of_status_json_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``status --json --count N`` (and ``--watch``) drew through stdout's masking, which
    turned a count holding a password of digits into ``***``, as ``--json`` alone did."""
    config = _setup(tmp_path)
    DeltaLedger(str(tmp_path / "ledger")).mark_committed(
        LedgerEntry("p", "a", 2, "committed", query_id="q", rows=12345678, finished_at=AT)
    )
    text = Path(config).read_text()
    Path(config).write_text(text.replace(f'"{tmp_path}/c"', '"s3://k:12345678@bucket/c"'))
    assert main(["status", "--config", config, "--json", "--count", "1"]) == 0
    title, blank, *drawn = readout(capsys).out.splitlines()
    assert title.startswith(f"fanout status --config {config}: ") and blank == ""
    listed = json.loads("\n".join(drawn))
    assert (listed[0]["last_batch_rows"], listed[0]["rows_total"]) == (12345678, 12345688)


def test_the_recover_status_names_runs_as_printed_from_a_directory_a_shell_would_split(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The pipeline file in a directory named ``it's orders & co``: the ``fanout recover``
    that status names for a missing checkpoint, pasted into a shell (``sh -c``, a real
    subprocess), reads that file and records its report in the ledger; so does the
    ``fanout run ... --new-epoch`` that report names, as one word. Unquoted, the shell
    stopped at the unbalanced quote and nothing was recorded."""
    root = tmp_path / "it's orders & co"
    root.mkdir()
    config = _setup(root)
    assert main(["status", "--config", config]) == 0
    last = readout(capsys).out.splitlines()[-1]
    command = last.split("`")[1]
    assert command == "fanout recover --config " + shlex.quote(config)
    before = DeltaLedger(str(root / "ledger")).rows()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["sh", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines()[-1] == (
        "Recorded in the ledger as report 1: the next epoch (`fanout run "
        f"{shlex.quote(config)} --new-epoch`) starts from it, and is refused if a batch of "
        "epoch 0 after it is committed first (then run this again)."
    )
    after = DeltaLedger(str(root / "ledger")).rows()
    added = [r for r in after if r not in before]
    assert sorted(
        (r["pipeline"], r["sink"], r["batch_id"], r["status"], r["epoch"]) for r in added
    ) == [
        ("p", "*", 1, "recovery", 0),  # report 1: resume after batch 1
        ("p", "a", 1, "recovery", 0),  # sink a counted at its mark
    ]
