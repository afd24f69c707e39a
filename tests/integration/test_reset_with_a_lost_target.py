"""A checkpoint reset (``on_checkpoint_reset="new_epoch"``, ``fanout run --new-epoch``) while a
sink's target was lost (its Delta table dropped): the new epoch has no marks yet, so the
lost-target check (docs/architecture.md §5, "A target lost behind fanout's back") asked no
sink, and the new epoch's first write created the table again empty (the replaced epoch's
batches gone from it, the ledger still counting them, nothing said); a sink lagging across
the reset had its spooled batches of the replaced epoch written into the new empty target
by the catch-up. A sink with no mark in the current epoch is now asked about its last mark
of the newest epoch before that holds one, at a reset before the new epoch's claim and
fences (``TargetChecks.refuse_unmarked``): a refused reset leaves the ledger and the sinks as
they were, so the replaced checkpoint still resumes, and the same reset run again once the
target is restored starts the new epoch. The start's unmarked-batch question passes
rightly: the dropped table holds no batch after the mark, and a lagging sink whose spool
holds the batches after its mark is not asked. Real Spark, Delta lake, ledger and spool."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from fanout import FanOut
from fanout.sink_spec import SinkSpec, lag_policy
from tests.in_process_cli import Cli
from tests.integration.streams import (
    bronze_pipeline,
    committed_marks,
    delta_rows,
    id_counts,
    run_stream,
    write_input,
)
from tests.integration.test_lost_target_catch_up import _Target


def _fan(tmp_path: Path, copy: Any, **kw: Any) -> FanOut:
    return FanOut(
        "lostreset", str(tmp_path / "ledger"),
        [{"type": "delta", "name": "lake", "path": str(tmp_path / "lake")}, copy],
        retries=0, backoff_s=0, spool=str(tmp_path / "spool"), probe_interval_s=3600, **kw,
    )  # fmt: skip


def _run(spark: Any, tmp_path: Path, fan: FanOut) -> None:
    try:
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")
    finally:
        fan.close()


def _reset(tmp_path: Path, files: int, start_file: int) -> None:
    """The checkpoint deleted; the new query reads only new files."""
    shutil.rmtree(tmp_path / "checkpoint")
    shutil.move(tmp_path / "input", tmp_path / "input-done")
    write_input(tmp_path / "input", files, 3, start_file=start_file)


def _ids(path: Path) -> list[int]:
    return sorted(r["order_id"] for r in delta_rows(path))


def _marks(tmp_path: Path) -> list[tuple[int, str, int]]:
    return sorted(
        (r["epoch"], r["sink"], r["batch_id"])
        for r in delta_rows(tmp_path / "ledger")
        if r["status"] == "committed"
    )


def _epochs(tmp_path: Path) -> list[int]:
    """The epochs the ledger's ``epoch`` rows start or claim."""
    return sorted(r["epoch"] for r in delta_rows(tmp_path / "ledger") if r["status"] == "epoch")


def test_a_reset_refuses_a_dropped_delta_table_and_its_printed_acceptance_writes_on(
    spark: Any, tmp_path: Path
) -> None:
    write_input(tmp_path / "input", 3, 3)  # ids 0-8, batches 0-2
    copy = {"type": "delta", "name": "copy", "path": str(tmp_path / "copy")}
    _run(spark, tmp_path, _fan(tmp_path, copy))
    shutil.rmtree(tmp_path / "copy")
    _reset(tmp_path, 2, 3)  # ids 9-14

    with pytest.raises(StreamingQueryException) as refused:
        _run(spark, tmp_path, _fan(tmp_path, copy, on_checkpoint_reset="new_epoch"))
    message = str(refused.value)
    assert "TargetLostError" in message and "sink 'copy', batch 2:" in message, message
    assert f"path '{tmp_path / 'copy'}' no longer holds batch 2 of epoch 0" in message
    accept = "(FanOut(on_checkpoint_reset='new_epoch', accept_lost_targets=['copy']))"
    assert accept in message, message
    assert not (tmp_path / "copy").exists()  # before: created again, holding ids 9-14 only
    assert _ids(tmp_path / "lake") == list(range(9))
    epoch0 = [(0, s, b) for s in ("copy", "lake") for b in range(3)]
    assert _marks(tmp_path) == epoch0
    assert _epochs(tmp_path) == [0]  # no claim of epoch 1

    # the way on, as printed: the reset accepted with the loss (before the fix the refused
    # reset owned epoch 1 already, and the printed command had no --new-epoch)
    _run(
        spark, tmp_path,
        _fan(tmp_path, copy, on_checkpoint_reset="new_epoch", accept_lost_targets=["copy"]),
    )  # fmt: skip
    assert _ids(tmp_path / "copy") == list(range(9, 15))
    assert _ids(tmp_path / "lake") == list(range(15))
    epoch1 = [(1, s, b) for s in ("copy", "lake") for b in range(2)]
    assert _marks(tmp_path) == sorted(epoch0 + epoch1)
    write_input(tmp_path / "input", 1, 3, start_file=5)  # and the next run needs no flag
    _run(spark, tmp_path, _fan(tmp_path, copy))
    assert _ids(tmp_path / "copy") == list(range(9, 18))


def test_a_sink_lagging_across_a_reset_is_not_caught_up_into_its_lost_target(
    spark: Any, tmp_path: Path
) -> None:
    write_input(tmp_path / "input", 4, 3)  # ids 0-11; copy down from batch 2: 2, 3 spooled
    down = _Target("copy", down_from=2)
    _run(
        spark,
        tmp_path,
        _fan(tmp_path, SinkSpec(down, lag=lag_policy("copy", {"on_failure": "lag"}))),
    )
    assert committed_marks(tmp_path / "ledger", "lostreset")[("copy", 1)] == 1
    _reset(tmp_path, 2, 4)  # ids 12-17

    lost = _Target("copy", down_from=None)  # its target deleted, created again empty
    spec = SinkSpec(lost, lag=lag_policy("copy", {"on_failure": "lag"}))
    second = _fan(tmp_path, spec, on_checkpoint_reset="new_epoch")
    try:
        run_stream(spark, tmp_path / "input", second, tmp_path / "checkpoint")
        second.catch_up(30)
        lag = second.lagging.lag_of("copy")
    finally:
        second.close()
    assert lost.calls == []  # before: batches 2 and 3 of epoch 0, then 0 and 1 of epoch 1
    assert lost.asked == [1]
    assert (lag.state, lag.batches) == ("lagging", 4)
    assert lag.error is not None and lag.error.startswith(
        "TargetLostError: sink 'copy', batch 1: pipeline 'lostreset': its target no longer "
        "holds batch 1 of epoch 0"
    ), lag.error
    assert "(FanOut(accept_lost_targets=['copy']))" in lag.error
    assert _ids(tmp_path / "lake") == list(range(18))

    # a restart without the flag asks again (the sink still has no mark in epoch 1)
    again = _fan(tmp_path, SinkSpec(lost, lag=lag_policy("copy", {"on_failure": "lag"})))
    try:
        assert again.catch_up(30)["copy"].state == "lagging" and lost.calls == []
    finally:
        again.close()
    # the way on, as printed: the catch-up writes the spooled batches into it as it is
    accepted = _fan(
        tmp_path, SinkSpec(lost, lag=lag_policy("copy", {"on_failure": "lag"})),
        accept_lost_targets=["copy"],
    )  # fmt: skip
    try:
        assert accepted.catch_up(30)["copy"].state == "live"
    finally:
        accepted.close()
    assert lost.calls == [(2, 1), (3, 1), (0, 1), (1, 1)]
    assert sorted(r["order_id"] for r in lost.rows()) == list(range(6, 18))


def test_fanout_run_new_epoch_refused_for_a_dropped_table_goes_on_with_the_printed_command(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """Through ``fanout run PIPELINE.toml --new-epoch``: refused for the dropped table before
    the new epoch's claim, the command the refusal prints, run exactly as printed (the reset
    again, ``--new-epoch`` with ``--accept-lost-target``), starts the new epoch and writes
    its batch into the table as it is, and the next run needs no flag."""
    config = tmp_path / "pipeline.toml"
    config.write_text(bronze_pipeline(tmp_path))
    write_input(tmp_path / "input", 1, 3)  # batch 0: orders 0-2
    assert fanout_cli("run", str(config)).returncode == 0
    shutil.rmtree(tmp_path / "bronze")  # dropped behind fanout's back
    shutil.rmtree(tmp_path / "checkpoint")  # and the checkpoint lost: orders 3-5 new
    shutil.rmtree(tmp_path / "input")
    write_input(tmp_path / "input", 1, 3, start_file=1)

    ran = fanout_cli("run", str(config), "--new-epoch")
    out = ran.stdout + ran.stderr
    assert ran.returncode == 1, out[-3000:]
    assert f"path '{tmp_path / 'bronze'}' no longer holds batch 0 of epoch 0" in out, out
    (printed,) = re.findall(r"`(fanout run [^`]*--accept-lost-target[^`]*)`", out)
    assert printed == f"fanout run {config} --new-epoch --accept-lost-target bronze"
    assert not (tmp_path / "bronze").exists()  # before: created again, holding orders 3-5
    assert _epochs(tmp_path) == [0]  # before: epoch 1 claimed by the refused reset

    ran = fanout_cli(*shlex.split(printed)[1:])
    assert ran.returncode == 0, (ran.stdout + ran.stderr)[-3000:]
    assert id_counts(delta_rows(tmp_path / "bronze")) == {3: 1, 4: 1, 5: 1}
    assert _marks(tmp_path) == [(0, "bronze", 0), (1, "bronze", 0)]
    write_input(tmp_path / "input", 1, 3, start_file=2)  # orders 6-8: no flag needed
    ran = fanout_cli("run", str(config))
    assert ran.returncode == 0, (ran.stdout + ran.stderr)[-3000:]
    assert id_counts(delta_rows(tmp_path / "bronze")) == {i: 1 for i in range(3, 9)}
    assert _marks(tmp_path) == [(0, "bronze", 0), (1, "bronze", 0), (1, "bronze", 1)]


def test_a_path_changed_on_purpose_at_a_reset_goes_on_under_a_new_name_as_printed(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """A reset that also points the sink at a new table on purpose is refused (the old
    table still holds epoch 0's batches); its printed way on, a new name for the sink and the
    reset run again, starts the new table afresh with the new epoch's batch, the old one
    untouched."""
    config = tmp_path / "pipeline.toml"
    config.write_text(bronze_pipeline(tmp_path))
    write_input(tmp_path / "input", 1, 3)  # batch 0: orders 0-2
    assert fanout_cli("run", str(config)).returncode == 0
    shutil.rmtree(tmp_path / "checkpoint")
    shutil.rmtree(tmp_path / "input")
    write_input(tmp_path / "input", 1, 3, start_file=1)  # orders 3-5
    moved = f'path = "{tmp_path}/bronze"'
    assert moved in config.read_text()
    config.write_text(config.read_text().replace(moved, f'path = "{tmp_path}/fresh"'))

    ran = fanout_cli("run", str(config), "--new-epoch")
    out = ran.stdout + ran.stderr
    assert ran.returncode == 1, out[-3000:]
    assert f"path '{tmp_path / 'fresh'}' no longer holds batch 0 of epoch 0" in out, out
    assert (
        "If 'bronze''s path was changed on purpose to a new target (the old one still holds "
        "those batches), set it back; or give the sink a new name too and run the reset again"
    ) in out, out
    assert _epochs(tmp_path) == [0]

    config.write_text(config.read_text().replace('name = "bronze"', 'name = "fresh"'))
    ran = fanout_cli("run", str(config), "--new-epoch")
    assert ran.returncode == 0, (ran.stdout + ran.stderr)[-3000:]
    assert id_counts(delta_rows(tmp_path / "fresh")) == {3: 1, 4: 1, 5: 1}
    assert id_counts(delta_rows(tmp_path / "bronze")) == {0: 1, 1: 1, 2: 1}
    assert _marks(tmp_path) == [(0, "bronze", 0), (1, "fresh", 0)]


ADMITTED_1_0 = ("admitted", 1, "*", 0)
"""Batch 0 of epoch 1 written by a replay (Spark runs the batch the refused reset left
again): recorded admitted before its first write (docs/architecture.md §4)."""


def _ledger_rows(tmp_path: Path) -> list[tuple[str, int, str, int]]:
    """Every ledger row: (status, epoch, sink, batch id)."""
    return sorted(
        (r["status"], r["epoch"], r["sink"], r["batch_id"]) for r in delta_rows(tmp_path / "ledger")
    )


def _refused_reset(spark: Any, tmp_path: Path, copy: dict[str, str]) -> None:
    """Batches 0-2 (ids 0-8) into ``lake`` and ``copy``; the old checkpoint kept aside,
    ``copy``'s table moved away (dropped; the move is its backup), then a reset (a new
    checkpoint reading ids 9-14) refused for the dropped table: nothing of it in the ledger
    or the sinks."""
    write_input(tmp_path / "input", 3, 3)
    _run(spark, tmp_path, _fan(tmp_path, copy))
    shutil.copytree(tmp_path / "checkpoint", tmp_path / "checkpoint-old")
    shutil.move(tmp_path / "copy", tmp_path / "copy-backup")
    _reset(tmp_path, 2, 3)
    from deltalake import DeltaTable

    before = _ledger_rows(tmp_path)
    epoch0 = [("committed", 0, s, b) for s in ("copy", "lake") for b in range(3)]
    assert before == sorted([*epoch0, ("epoch", 0, "*", 0)])
    with pytest.raises(StreamingQueryException) as refused:
        _run(spark, tmp_path, _fan(tmp_path, copy, on_checkpoint_reset="new_epoch"))
    message = str(refused.value)
    assert f"path '{tmp_path / 'copy'}' no longer holds batch 2 of epoch 0" in message, message
    assert (
        "The checkpoint reset is refused before it started: epoch 1 was not started and no "
        "sink was fenced or written"
    ) in message, message
    assert "`fanout run PIPELINE.toml --new-epoch` (FanOut(on_checkpoint_reset='new_epoch'))" in (
        message
    )
    # no epoch row of epoch 1, no lost mark, no failure row (before: ("epoch", 1, "*", 0))
    assert _ledger_rows(tmp_path) == before
    # no fence: lake's last commit is still batch 2's (before: version 3, the fence)
    assert DeltaTable(str(tmp_path / "lake")).version() == 2
    assert _ids(tmp_path / "lake") == list(range(9))
    assert not (tmp_path / "copy").exists()


def _old_checkpoint_resumes(spark: Any, tmp_path: Path, copy: dict[str, Any]) -> None:
    """The old checkpoint (``checkpoint-old``) and its input back, ids 9-14 written as its
    batches 3-4: epoch 0 resumes (not refused as superseded), then a catch-up (a lag sink
    behind a spooled batch of another epoch is written from the spool); each id 0-14 once
    in each sink, the ledger's rows those of epoch 0 alone."""
    shutil.rmtree(tmp_path / "checkpoint")
    shutil.move(tmp_path / "checkpoint-old", tmp_path / "checkpoint")
    shutil.rmtree(tmp_path / "input")
    shutil.move(tmp_path / "input-done", tmp_path / "input")
    write_input(tmp_path / "input", 2, 3, start_file=3)
    fan = _fan(tmp_path, copy)
    try:
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")
        fan.catch_up(30)
    finally:
        fan.close()
    for sink in ("lake", "copy"):
        assert id_counts(delta_rows(tmp_path / sink)) == {i: 1 for i in range(15)}, sink
    epoch0 = [("committed", 0, s, b) for s in ("copy", "lake") for b in range(5)]
    assert _ledger_rows(tmp_path) == sorted([*epoch0, ("epoch", 0, "*", 0)])


def test_a_reset_refused_for_a_dropped_table_leaves_the_old_checkpoint_resuming(
    spark: Any, tmp_path: Path
) -> None:
    """The refused reset claimed nothing: the table restored, the OLD checkpoint resumes
    epoch 0 (before: refused as superseded by the epoch the refusal had claimed) and writes
    the new input once into each sink."""
    copy = {"type": "delta", "name": "copy", "path": str(tmp_path / "copy")}
    _refused_reset(spark, tmp_path, copy)

    shutil.move(tmp_path / "copy-backup", tmp_path / "copy")  # the operator restores it
    _old_checkpoint_resumes(spark, tmp_path, copy)  # and goes back to the old checkpoint


def test_a_reset_refused_for_a_dropped_table_starts_once_the_table_is_restored(
    spark: Any, tmp_path: Path
) -> None:
    """The same reset, run again once the table is restored, starts epoch 1 (its claim
    written now, by this run) and writes the new input once into each sink."""
    copy = {"type": "delta", "name": "copy", "path": str(tmp_path / "copy")}
    _refused_reset(spark, tmp_path, copy)

    shutil.move(tmp_path / "copy-backup", tmp_path / "copy")
    _run(spark, tmp_path, _fan(tmp_path, copy, on_checkpoint_reset="new_epoch"))
    for sink in ("lake", "copy"):
        assert id_counts(delta_rows(tmp_path / sink)) == {i: 1 for i in range(15)}, sink
    epoch0 = [("committed", 0, s, b) for s in ("copy", "lake") for b in range(3)]
    epoch1 = [("committed", 1, s, b) for s in ("copy", "lake") for b in range(2)]
    assert _ledger_rows(tmp_path) == sorted(
        [*epoch0, *epoch1, ("epoch", 0, "*", 0), ("epoch", 1, "*", 0), ADMITTED_1_0]
    )


def _lag_run(spark: Any, tmp_path: Path, copy: dict[str, Any], **kw: Any) -> Any:
    """One run of the current checkpoint, then a catch-up; ``copy``'s lag after them."""
    fan = _fan(tmp_path, copy, **kw)
    try:
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")
        fan.catch_up(30)
        return fan.lagging.lag_of("copy")
    finally:
        fan.close()


def test_a_lag_sink_lost_at_a_reset_never_catches_up_into_its_table_created_again_empty(
    spark: Any, tmp_path: Path
) -> None:
    """A Delta sink with ``on_failure="lag"`` whose table was dropped at a reset lags with
    its loss and the reset goes on (epoch 1 started, ``lake`` written). Walked on: a
    restart, then a restart after the table was created again empty, both leave it
    lagging with its loss (its spooled batches of epoch 1 are not caught up into the empty
    table: a silent loss of ids 0-8); the table restored from its backup, the next restart
    catches it up from the spool, every id 0-17 once."""
    copy = {"type": "delta", "name": "copy", "path": str(tmp_path / "copy"), "on_failure": "lag"}
    write_input(tmp_path / "input", 3, 3)  # ids 0-8, batches 0-2 of epoch 0
    _run(spark, tmp_path, _fan(tmp_path, copy))
    shutil.move(tmp_path / "copy", tmp_path / "copy-backup")  # dropped (the move: a backup)
    _reset(tmp_path, 2, 3)  # ids 9-14

    lag = _lag_run(spark, tmp_path, copy, on_checkpoint_reset="new_epoch")
    assert (lag.state, lag.batches) == ("lagging", 2)
    assert lag.error is not None and lag.error.startswith(
        "TargetLostError: sink 'copy', batch 2: pipeline 'lostreset': path "
    ), lag.error
    assert "epoch 1 was not started" not in lag.error  # it lags; the reset went on
    assert _epochs(tmp_path) == [0, 1]
    epoch0 = [(0, s, b) for s in ("copy", "lake") for b in range(3)]
    assert _marks(tmp_path) == sorted([*epoch0, (1, "lake", 0), (1, "lake", 1)])
    assert _ids(tmp_path / "lake") == list(range(15))
    assert not (tmp_path / "copy").exists()

    write_input(tmp_path / "input", 1, 3, start_file=5)  # ids 15-17: batch 2 of epoch 1
    lag = _lag_run(spark, tmp_path, copy)  # a restart: asked again, lost again
    assert (lag.state, lag.batches) == ("lagging", 3)
    assert not (tmp_path / "copy").exists()

    from deltalake import DeltaTable, write_deltalake

    empty = DeltaTable(str(tmp_path / "copy-backup")).to_pyarrow_table().slice(0, 0)
    write_deltalake(str(tmp_path / "copy"), empty)  # created again empty by hand
    lag = _lag_run(spark, tmp_path, copy)
    assert (lag.state, lag.batches) == ("lagging", 3)
    assert _ids(tmp_path / "copy") == []  # before any fix too: not caught up into it

    shutil.rmtree(tmp_path / "copy")
    shutil.move(tmp_path / "copy-backup", tmp_path / "copy")  # restored
    lag = _lag_run(spark, tmp_path, copy)
    assert (lag.state, lag.batches) == ("live", 0)
    for sink in ("lake", "copy"):
        assert id_counts(delta_rows(tmp_path / sink)) == {i: 1 for i in range(18)}, sink
    epoch1 = [(1, s, b) for s in ("copy", "lake") for b in range(3)]
    assert _marks(tmp_path) == sorted(epoch0 + epoch1)


def test_a_reset_refused_by_the_spool_claims_nothing_and_the_old_checkpoint_resumes(
    spark: Any, tmp_path: Path
) -> None:
    """The spool holds batch 0 of epoch 1 of another query (a spool that outlived its
    ledger) for the lag sink ``copy``: a reset's first batch is refused by the spool's
    check (``Spool.check``), whose ways on start with the original checkpoint. Now before
    the claim and fences: no ``epoch`` row of epoch 1, ``lake`` unfenced, and the original
    checkpoint, as the message says, resumes epoch 0, each id once. Before, the refusal came
    after the claim: the original checkpoint was refused as superseded."""
    from datetime import UTC, datetime

    from deltalake import DeltaTable

    from fanout.contract.batch import BatchInfo
    from fanout.spool.table import Spool

    copy = {"type": "delta", "name": "copy", "path": str(tmp_path / "copy"), "on_failure": "lag"}
    write_input(tmp_path / "input", 3, 3)  # ids 0-8, batches 0-2
    _run(spark, tmp_path, _fan(tmp_path, copy))
    shutil.copytree(tmp_path / "checkpoint", tmp_path / "checkpoint-old")
    ghost = BatchInfo("lostreset", 0, "ghost", [{"s": {"0": 1}}], batch_timestamp_ms=5, epoch=1)
    frame = spark.createDataFrame([(99, "x", 1.0, "new")], "order_id LONG, customer STRING, "
                                  "amount DOUBLE, status STRING")  # fmt: skip
    Spool(str(tmp_path / "spool"), "lostreset").add(frame, ghost, ["copy"], datetime.now(UTC))
    before = _ledger_rows(tmp_path)
    _reset(tmp_path, 2, 3)  # ids 9-14

    with pytest.raises(StreamingQueryException) as refused:
        _run(spark, tmp_path, _fan(tmp_path, copy, on_checkpoint_reset="new_epoch"))
    message = str(refused.value)
    assert "checkpoint reset detected. Spark handed batch 0 (epoch 1) of query " in message
    assert "holds batch 0 (epoch 1) of query ghost for sink(s) copy" in message, message
    assert "1. Restore the original checkpoint directory and restart the query" in message
    assert _ledger_rows(tmp_path) == before  # before: ("epoch", 1, "*", 0) too
    assert DeltaTable(str(tmp_path / "lake")).version() == 2  # before: 3, the fence

    _old_checkpoint_resumes(spark, tmp_path, copy)  # the message's way on


def test_a_reset_of_a_reset_refused_for_a_dropped_table_asks_about_the_epoch_before(
    spark: Any, tmp_path: Path
) -> None:
    """Epoch 1 started by a reset refused once (the table dropped) and accepted once it was
    restored; a second reset (epoch 2) with the table dropped again is refused about its
    last mark of epoch 1 (not epoch 0's), before epoch 2's claim and fences; restored, the
    second reset run again starts epoch 2, each id 0-17 once in each sink."""
    from deltalake import DeltaTable

    copy = {"type": "delta", "name": "copy", "path": str(tmp_path / "copy")}
    _refused_reset(spark, tmp_path, copy)
    shutil.move(tmp_path / "copy-backup", tmp_path / "copy")
    _run(spark, tmp_path, _fan(tmp_path, copy, on_checkpoint_reset="new_epoch"))  # epoch 1

    shutil.move(tmp_path / "copy", tmp_path / "copy-backup")  # dropped again
    shutil.rmtree(tmp_path / "checkpoint")  # the second reset: ids 15-17
    shutil.rmtree(tmp_path / "input")
    write_input(tmp_path / "input", 1, 3, start_file=5)
    before = _ledger_rows(tmp_path)
    epoch0 = [("committed", 0, s, b) for s in ("copy", "lake") for b in range(3)]
    epoch1 = [("committed", 1, s, b) for s in ("copy", "lake") for b in range(2)]
    assert before == sorted(
        [*epoch0, *epoch1, ("epoch", 0, "*", 0), ("epoch", 1, "*", 0), ADMITTED_1_0]
    )
    version = DeltaTable(str(tmp_path / "lake")).version()
    with pytest.raises(StreamingQueryException) as refused:
        _run(spark, tmp_path, _fan(tmp_path, copy, on_checkpoint_reset="new_epoch"))
    message = str(refused.value)
    assert f"path '{tmp_path / 'copy'}' no longer holds batch 1 of epoch 1" in message, message
    assert "epoch 2 was not started and no sink was fenced or written" in message, message
    assert _ledger_rows(tmp_path) == before
    assert DeltaTable(str(tmp_path / "lake")).version() == version  # no fence

    shutil.move(tmp_path / "copy-backup", tmp_path / "copy")
    _run(spark, tmp_path, _fan(tmp_path, copy, on_checkpoint_reset="new_epoch"))
    for sink in ("lake", "copy"):
        assert id_counts(delta_rows(tmp_path / sink)) == {i: 1 for i in range(18)}, sink
    epoch2 = [("committed", 2, s, 0) for s in ("copy", "lake")]
    assert _ledger_rows(tmp_path) == sorted(
        [*before, *epoch2, ("epoch", 2, "*", 0), ("admitted", 2, "*", 0)]
    )
