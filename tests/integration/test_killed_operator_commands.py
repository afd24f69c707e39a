"""The operator commands killed (SIGKILL) mid-way, then run again as an operator would, and
the pipeline on: no row lost or written twice, one mark per batch and sink, nothing left in
the spool that should have gone (docs/architecture.md, "Operator commands killed mid-way").

Each command runs in a process of its own, killed at a named point of its code by
``tests.kill_at`` (a test-only wrapper: fanout's code has no hook). Delta ledger and spool
(delta-rs); the pipeline is a ``FanOut`` driven with Arrow frames (no Spark start)."""

from __future__ import annotations

import shlex
from collections import Counter
from pathlib import Path

from deltalake import DeltaTable

from fanout import FanOut, SinkWriteError
from fanout.app.recover import recorded_text
from fanout.contract.batch import BatchInfo
from fanout.delta_tables.io import transaction_version
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry
from fanout.ledger.recovery import recovery_app_id, started_from_app_id
from fanout.sink_spec import SinkSpec, lag_policy
from fanout.spool.table import Spool
from tests.cli_process import fanout_process
from tests.kill_at import KILLED, fanout_killed_at
from tests.unit.fakes import SchemaFrame, ScriptedSink, spooled_ids

FRAMES = {b: SchemaFrame([b * 10, b * 10 + 1]) for b in range(8)}


def _marks(ledger: str, pipeline: str, epoch: int = 0) -> Counter[tuple[str, int]]:
    """How many committed rows each (sink, batch) of ``epoch`` has in the ledger, as of
    its log."""
    return Counter(
        (r["sink"], r["batch_id"])
        for r in DeltaLedger(ledger).rows(pipeline)
        if r["status"] == "committed" and r["epoch"] == epoch
    )


def _spooled(spool: str, pipeline: str) -> dict[int, list[str]]:
    """Per batch the spool's index holds, the sinks it is held for."""
    opened = Spool(spool, pipeline)
    opened.open()
    return {b.batch_id: sorted(b.needed_by) for b in opened.batches()}


def test_skip_release_spooled_killed_at_each_step_then_run_again_releases_what_it_gave_up(
    tmp_path: Path,
) -> None:
    """``fanout ledger skip --release-spooled`` records the sink's mark, then deletes the
    sink's index rows of the spooled batches (one Delta commit per batch), then the rows no
    index row names, then vacuums their files. Killed after each of those steps, the same
    command run again finds the mark there ("no mark recorded") and releases what is left;
    the pipeline then cleans the rows an index deletion left orphaned, and the sink's next
    batch is the only one written to it."""
    ledger, spool = str(tmp_path / "ledger"), str(tmp_path / "spool")
    good = ScriptedSink("good")
    down = ScriptedSink("down", always_fail=SinkWriteError("refused", sink="down"))
    lag = SinkSpec(down, lag=lag_policy("down", {"on_failure": "lag"}))
    fan = FanOut("cut", ledger, [good, lag], backoff_s=0, spool=spool, probe_interval_s=3600)
    try:
        fan.catchup.stop()
        for batch in range(3):
            fan.process(FRAMES[batch], BatchInfo("cut", batch, "q"))
    finally:
        fan.close()
    assert _spooled(spool, "cut") == {0: ["down"], 1: ["down"], 2: ["down"]}
    skip = ["ledger", "skip", "--ledger", ledger, "--pipeline", "cut", "--sink", "down",
            "--through", "2", "--spool", spool, "--release-spooled"]  # fmt: skip

    # killed right after the mark's commit: the mark is there, the spool untouched
    cut = fanout_killed_at("fanout.ledger.delta:DeltaLedger.mark_committed", "after", 1, *skip)
    assert cut.returncode == KILLED, cut.stderr
    assert DeltaLedger(ledger).last_committed("cut", ["good", "down"]) == {"good": 2, "down": 2}
    assert _spooled(spool, "cut") == {0: ["down"], 1: ["down"], 2: ["down"]}
    # status names them, and the command releasing them: the operator runs that
    status = fanout_process("status", "--ledger", ledger, "--pipeline", "cut", "--spool", spool)
    kept = [line for line in status.stdout.splitlines() if "kept in the spool" in line]
    assert kept == [
        "pipeline cut, down: 3 batch(es) / 6 row(s) of epoch 0 (0-2) kept in the spool after a "
        "`fanout ledger skip` without --spool (or one with --release-spooled stopped before it "
        "released them), neither written nor released: release them with `fanout ledger skip "
        f"--ledger {ledger} --pipeline cut --sink down --through 2 --epoch 0 --spool {spool} "
        "--release-spooled`"
    ], status.stdout
    skip = shlex.split(kept[0].split("`")[-2])[1:]  # as printed, `fanout` left out

    # run again, killed after its first index deletion: batch 0 leaves the index
    cut = fanout_killed_at("deltalake:DeltaTable.delete", "after", 1, *skip)
    assert cut.returncode == KILLED, cut.stderr
    assert _spooled(spool, "cut") == {1: ["down"], 2: ["down"]}
    assert spooled_ids(Spool(spool, "cut"), (0, 0)) == [0, 1]  # its rows orphaned

    # run again, killed after the index deletions, before the rows': all orphaned
    cut = fanout_killed_at("fanout.spool.table:Spool._delete_rows", "before", 1, *skip)
    assert cut.returncode == KILLED, cut.stderr
    assert _spooled(spool, "cut") == {}
    assert [spooled_ids(Spool(spool, "cut"), (0, b)) for b in range(3)] == [
        [0, 1],
        [10, 11],
        [20, 21],
    ]

    # run again to its end: nothing to record, nothing indexed to release
    done = fanout_process(*skip)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        "pipeline 'cut', sink 'down', epoch 0: already holds batch 2 (its mark: 2); no mark "
        "recorded\n"
    )

    # the pipeline on: its start removes the orphaned rows, the sink gets batch 3 only
    down.always_fail = None
    fan = FanOut("cut", ledger, [good, lag], backoff_s=0, spool=spool, probe_interval_s=3600)
    try:
        assert [spooled_ids(Spool(spool, "cut"), (0, b)) for b in range(3)] == [[], [], []]
        fan.process(FRAMES[3], BatchInfo("cut", 3, "q"))
    finally:
        fan.close()
    assert down.calls == [(0, 1), (3, 1)]  # its failed live attempt, then batch 3
    assert [b for b, _ in good.calls] == [0, 1, 2, 3]
    # one mark each: good's four, the skip's of 0-2 at batch 2 (made once), down's of 3
    assert _marks(ledger, "cut") == {
        **{("good", b): 1 for b in range(4)},
        ("down", 2): 1,
        ("down", 3): 1,
    }
    assert _spooled(spool, "cut") == {}


def test_ledger_maintain_killed_after_each_commit_beside_a_pipeline_marking_the_ledger(
    tmp_path: Path,
) -> None:
    """``fanout ledger maintain`` commits its compaction (one overwrite of the ledger with
    its own rows), then its vacuum, then writes a log checkpoint, then cleans the log.
    Killed after each (the compaction's check against a racing OPTIMIZE, the vacuum and
    the checkpoint never run), with a pipeline marking the same ledger from a snapshot
    older than the kill, then run again to its end: every mark is there once, and the
    marks' transactions (the sinks' last batches, the high-water mark) are the last
    batch's."""
    path = str(tmp_path / "ledger")
    running = DeltaLedger(path, compact_after_files=None)  # a pipeline's ledger, kept open
    running.open()

    def mark(batch: int) -> None:
        for sink in ("a", "b"):
            assert running.mark_committed(_mark("m", sink, batch))

    for batch in range(6):
        mark(batch)
    maintain = ["ledger", "maintain", "--ledger", path, "--retention-hours", "0"]
    points = [
        ("fanout.ledger.delta_table:overwrite_with_own_rows", "after"),
        ("deltalake:DeltaTable.vacuum", "after"),
        ("deltalake:DeltaTable.create_checkpoint", "after"),
        ("deltalake:DeltaTable.cleanup_metadata", "before"),
    ]
    for batch, (target, when) in enumerate(points, start=6):
        cut = fanout_killed_at(target, when, 1, *maintain)
        assert cut.returncode == KILLED, (target, cut.stderr)
        assert len(DeltaTable(path).file_uris()) == 1  # its compaction committed
        checkpoints = list((tmp_path / "ledger" / "_delta_log").glob("*.checkpoint.parquet"))
        assert bool(checkpoints) == (batch >= 8), target
        mark(batch)  # the pipeline's snapshot is from before the killed command's commits
    done = fanout_process(*maintain)
    assert done.returncode == 0, done.stderr
    assert "log checkpoint written" in done.stdout
    mark(10)

    fresh = DeltaLedger(path)
    assert _marks(path, "m") == {(s, b): 1 for s in ("a", "b") for b in range(11)}
    assert fresh.last_committed("m", ["a", "b"]) == {"a": 10, "b": 10}
    assert fresh.high_water("m") == 10
    assert running.last_committed("m", ["a", "b"]) == {"a": 10, "b": 10}
    assert not running.mark_committed(_mark("m", "a", 10))  # marked twice: a no-op


def _mark(pipeline: str, sink: str, batch: int, query: str = "q") -> LedgerEntry:
    return LedgerEntry(pipeline, sink, batch, "committed", query_id=query, rows=2)


def test_recover_killed_before_or_after_recording_its_report_prints_none_of_it(
    tmp_path: Path,
) -> None:
    """``fanout recover`` records its report in the ledger (one commit), then prints it
    with the line naming it. Killed before the commit, it printed nothing: before, it had
    printed the offsets to start from and "the report is recorded in the ledger, so a new
    epoch started from it is refused when ..." with nothing recorded, so a new epoch
    started from them was checked against nothing. Killed after the commit, it printed
    nothing either; run again, it prints the same report, recorded as the next number, and
    the new epoch starts from that one (the first, identical, is never read)."""
    path = str(tmp_path / "ledger")
    ledger = DeltaLedger(path)
    ledger.open()
    for sink, through in (("lake", 2), ("pg", 1)):
        for batch in range(through + 1):
            assert ledger.mark_committed(_mark("r", sink, batch, "q-old"))
    recover = ["recover", "--ledger", path, "--pipeline", "r"]
    target = "fanout.ledger.delta:DeltaLedger.record_recovery"

    for when, number in (("before", None), ("after", 1)):
        cut = fanout_killed_at(target, when, 1, *recover)
        assert cut.returncode == KILLED, cut.stderr
        assert "Resume after" not in cut.stdout and "recorded" not in cut.stdout, cut.stdout
        assert transaction_version(DeltaTable(path), recovery_app_id("r")) == number

    done = fanout_process(*recover)
    assert done.returncode == 0, done.stderr
    assert "Resume after batch 1 (sink 'pg' is furthest behind)" in done.stdout
    assert done.stdout.endswith(recorded_text(2, 0, None) + "\n")

    lake, pg = ScriptedSink("lake"), ScriptedSink("pg")
    fan = FanOut("r", DeltaLedger(path), [lake, pg], on_checkpoint_reset="new_epoch")
    try:
        fan.process(FRAMES[0], BatchInfo("r", 0, "q-new"))  # a new checkpoint's first batch
    finally:
        fan.close()
    table = DeltaTable(path)
    assert transaction_version(table, started_from_app_id("r", 1)) == 2
    assert (lake.calls, pg.calls) == ([(0, 1)], [(0, 1)])
    assert DeltaLedger(path).last_committed("r", ["lake", "pg"], 1) == {"lake": 0, "pg": 0}
    assert _marks(path, "r") == {
        **{("lake", b): 1 for b in range(3)},
        **{("pg", b): 1 for b in range(2)},
    }
    assert _marks(path, "r", 1) == {("lake", 0): 1, ("pg", 0): 1}
