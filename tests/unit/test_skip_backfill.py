"""``fanout ledger skip --config``: a skip never gives up batches the sink's backfill
source holds (by its ledger marks) unless told to, on a real Delta ledger."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from fanout import FanOut, MissedBatchesError
from fanout.app.cli import main
from fanout.app.runner import build_fanout, load_pipeline
from fanout.errors import ConfigurationError
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.gaps import OlderEpochSkipError, skip_batches
from tests.newest_lines import readout
from tests.unit.fakes import ScriptedSink
from tests.unit.test_missed_batches import _run


def _lake_holds_2_and_3(path: str) -> None:
    """ "pg" commits batch 0 and is left out; "lake" joins at batch 2: its ledger marks
    batches 2-3 committed (what a backfill from it gives back), not batch 1."""
    _run(FanOut("gap", DeltaLedger(path), [ScriptedSink("good"), ScriptedSink("pg")]), range(1))
    _run(FanOut("gap", DeltaLedger(path), [ScriptedSink("good")]), range(1, 2))
    sinks = [ScriptedSink("good"), ScriptedSink("lake")]
    _run(FanOut("gap", DeltaLedger(path), sinks), range(2, 4))


def _config(tmp_path: Path, ledger: str, backfill: bool = True) -> str:
    file = tmp_path / "pipeline.toml"
    file.write_text(
        f'[pipeline]\nname = "gap"\nledger = "{ledger}"\ncheckpoint = "{tmp_path / "ckpt"}"\n'
        '[source]\nformat = "rate"\n'
        f'[[sinks]]\ntype = "delta"\nname = "lake"\npath = "{tmp_path / "lake"}"\n'
        f'[[sinks]]\ntype = "delta"\nname = "pg"\npath = "{tmp_path / "pg"}"\n'
        + ('backfill_from = "lake"\n' if backfill else "")
    )
    return str(file)


def test_skip_with_config_refuses_batches_the_backfill_source_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / "ledger")
    _lake_holds_2_and_3(path)
    config = _config(tmp_path, path)
    readout(capsys)

    assert main(["ledger", "skip", "--config", config, "--sink", "pg", "--through", "3"]) == 2
    assert readout(capsys).err == (
        "fanout: configuration error: pipeline 'gap', sink 'pg': its backfill source 'lake' "
        "holds batch(es) 2-3 for it (its ledger marks them committed; after its mark 0): a "
        "skip through 3 would give up rows that exist and can be delivered. Either skip only "
        "the batches before them (--through 1); let it catch up from them first (start the "
        "pipeline with the sink configured: the backfill gives it 'lake''s batches, in "
        "order), then skip only what it never got; or, to give them up anyway, add "
        "--give-up-backfill (in Python: give_up_backfill=True)\n"
    )
    assert DeltaLedger(path).last_committed("gap", ["pg"]) == {"pg": 0}

    assert main(["ledger", "skip", "--config", config, "--sink", "pg", "--through", "1"]) == 0
    assert readout(capsys).out == (
        "pipeline 'gap', sink 'pg', epoch 0: batches 1-1 recorded as skipped (never written "
        "to it); the next batch writes it\n"
    )
    assert DeltaLedger(path).last_committed("gap", ["pg"]) == {"pg": 1}

    args = ["ledger", "skip", "--config", config, "--sink", "pg", "--through", "3"]
    assert main([*args, "--give-up-backfill"]) == 0
    assert readout(capsys).out == (
        "pipeline 'gap', sink 'pg', epoch 0: batches 2-3 recorded as skipped (never written "
        "to it); the next batch writes it\n"
        "pipeline 'gap', sink 'pg', epoch 0: gave up batch(es) 2-3 its backfill source "
        "'lake' holds (--give-up-backfill)\n"
    )
    assert DeltaLedger(path).last_committed("gap", ["pg"]) == {"pg": 3}


def test_a_skip_mark_of_the_backfill_source_holds_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger")
    _lake_holds_2_and_3(path)
    _run(FanOut("gap", DeltaLedger(path), [ScriptedSink("good")]), range(4, 5))
    ledger = DeltaLedger(path)
    assert skip_batches(ledger, "gap", "lake", 4).recorded  # lake's mark of 4: no rows
    with pytest.raises(ConfigurationError, match=r"holds batch\(es\) 2-3 for it \(its"):
        skip_batches(ledger, "gap", "pg", 4, backfill_from="lake")
    done = skip_batches(ledger, "gap", "pg", 3, backfill_from="lake", give_up_backfill=True)
    assert (done.before, done.through, done.backfill_held) == (0, 3, (2, 3))
    done = skip_batches(ledger, "gap", "pg", 4, backfill_from="lake")
    assert (done.before, done.through, done.recorded, done.backfill_held) == (3, 4, True, ())


def test_skip_config_flags_must_agree_with_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / "ledger")
    _lake_holds_2_and_3(path)
    config = _config(tmp_path, path)
    base = ["ledger", "skip", "--config", config, "--sink", "pg", "--through", "1"]
    readout(capsys)

    assert main([*base, "--pipeline", "other"]) == 2
    assert readout(capsys).err == (
        f"fanout: configuration error: --pipeline other: {config} says gap: drop --pipeline "
        "(the pipeline file says which it is) or give the pipeline's own file\n"
    )
    assert main([*base, "--ledger", str(tmp_path / "elsewhere")]) == 2
    assert readout(capsys).err == (
        f"fanout: configuration error: --ledger {tmp_path / 'elsewhere'}: {config} says "
        f"{path}: drop --ledger (the pipeline file says where it is) or give the "
        "pipeline's own file\n"
    )
    assert main([*base, "--spool", str(tmp_path / "spool")]) == 2
    assert readout(capsys).err == (
        f"fanout: configuration error: --spool {tmp_path / 'spool'}: {config} configures no "
        "spool (pipeline.spool): drop --spool or give the pipeline's own file\n"
    )
    assert main([*base, "--ledger", f"{path}/", "--pipeline", "gap"]) == 0  # the same place
    assert DeltaLedger(path).last_committed("gap", ["pg"]) == {"pg": 1}


def test_skip_config_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tmp_path / "ledger")
    _lake_holds_2_and_3(path)
    readout(capsys)
    missing = str(tmp_path / "nowhere.toml")
    assert main(["ledger", "skip", "--config", missing, "--sink", "pg", "--through", "1"]) == 2
    assert readout(capsys).err == (
        f"fanout: configuration error: {missing}: no such pipeline file\n"
    )
    assert main(["ledger", "skip", "--pipeline", "gap", "--sink", "pg", "--through", "1"]) == 2
    assert readout(capsys).err == (
        "fanout: configuration error: --ledger required: give them, or --config PIPELINE.toml\n"
    )
    args = ["ledger", "skip", "--ledger", path, "--pipeline", "gap", "--sink", "pg"]
    assert main([*args, "--through", "3", "--give-up-backfill"]) == 2
    assert readout(capsys).err == (
        "fanout: configuration error: --give-up-backfill needs --config PIPELINE.toml: the "
        "sink's backfill_from is in the pipeline file\n"
    )
    assert DeltaLedger(path).last_committed("gap", ["pg"]) == {"pg": 0}


def test_skip_without_config_says_the_backfill_source_was_not_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / "ledger")
    _lake_holds_2_and_3(path)
    readout(capsys)
    args = ["ledger", "skip", "--ledger", path, "--pipeline", "gap", "--sink", "pg"]
    assert main([*args, "--through", "3"]) == 0  # gives up 2-3: it cannot know
    assert readout(capsys).out == (
        "pipeline 'gap', sink 'pg', epoch 0: batches 1-3 recorded as skipped (never written "
        "to it); the next batch writes it\n"
        "pipeline 'gap', sink 'pg', epoch 0: the backfill source was not checked (no "
        "--config): if the sink has backfill_from in the pipeline file, batches that source "
        "holds through this mark were given up too (they are not backfilled to it)\n"
        "pipeline 'gap', sink 'pg', epoch 0: the spool was not checked (no --spool): batches "
        "it still holds for the sink through this mark are kept, neither written nor "
        "released; the pipeline's start-up names them and how to release them\n"
    )


def test_skip_with_config_of_a_sink_without_backfill_or_not_configured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(tmp_path / "ledger")
    _lake_holds_2_and_3(path)
    readout(capsys)
    config = _config(tmp_path, path, backfill=False)
    assert main(["ledger", "skip", "--config", config, "--sink", "pg", "--through", "3"]) == 0
    assert readout(capsys).out == (
        "pipeline 'gap', sink 'pg', epoch 0: batches 1-3 recorded as skipped (never written "
        "to it); the next batch writes it\n"
    )
    assert main(["ledger", "skip", "--config", config, "--sink", "good", "--through", "3"]) == 0
    assert readout(capsys).out == (
        f"pipeline 'gap', sink 'good', epoch 0: sink 'good' is not in {config}: it has no "
        "backfill source to check\n"
        "pipeline 'gap', sink 'good', epoch 0: already holds batch 3 (its mark: 3); no mark "
        "recorded\n"
    )


def test_skip_with_config_checks_the_pipelines_spool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.unit.test_missed_batches import _held_then_missed

    path, spool = str(tmp_path / "ledger"), str(tmp_path / "spool")
    _held_then_missed(DeltaLedger(path), spool)  # "down": mark 0, spool holds 1-2, missed 3
    file = tmp_path / "pipeline.toml"
    file.write_text(
        f'[pipeline]\nname = "gap"\nledger = "{path}"\ncheckpoint = "{tmp_path / "ckpt"}"\n'
        f'spool = "{spool}"\n[source]\nformat = "rate"\n'
        f'[[sinks]]\ntype = "delta"\nname = "down"\npath = "{tmp_path / "down"}"\n'
        'on_failure = "lag"\n'
    )
    readout(capsys)
    args = ["ledger", "skip", "--config", str(file), "--sink", "down", "--through", "3"]
    assert main(args) == 2
    assert readout(capsys).err.startswith(
        f"fanout: configuration error: pipeline 'gap', sink 'down': the spool at {spool} "
        "still holds batch(es) 1-2 for it (after its mark 0): a skip through 3 would give "
        "their rows up."
    )
    assert DeltaLedger(path).last_committed("gap", ["down"]) == {"down": 0}

    file.write_text(file.read_text().replace(spool, str(tmp_path / "nowhere")))
    assert main(args) == 2
    assert readout(capsys).err.startswith(
        f"fanout: configuration error: pipeline.spool of {file} {tmp_path / 'nowhere'}: no "
        "spool there"
    )


def test_the_gap_refusal_of_a_pipeline_file_names_a_skip_with_its_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run from a pipeline file (given relative), the refusal's skip carries `--config`
    with the file's absolute path, and runs as printed (checking the backfill source);
    built in Python without one, it has no `--config`."""
    monkeypatch.chdir(tmp_path)
    path = str(tmp_path / "ledger")
    _run(FanOut("gap", DeltaLedger(path), [ScriptedSink("good"), ScriptedSink("pg")]), range(2))
    _run(FanOut("gap", DeltaLedger(path), [ScriptedSink("good")]), range(2, 5))  # pg: 2-4
    _config(tmp_path, path, backfill=False)
    skip = (
        f"fanout ledger skip --config {tmp_path}/pipeline.toml --ledger {path} --pipeline gap "
        "--sink pg --through 4 --epoch 0"
    )
    for file, command in (("pipeline.toml", skip), (None, skip.replace(
        f" --config {tmp_path}/pipeline.toml", ""
    ))):  # fmt: skip
        sinks = [ScriptedSink("good"), ScriptedSink("pg")]
        with pytest.raises(MissedBatchesError) as refused:
            _run(FanOut("gap", DeltaLedger(path), sinks, pipeline_file=file), range(5, 6))
        assert str(refused.value).endswith(
            f"or accept that 'pg' never gets them: `{command}` (in Python: "
            "fanout.ledger.gaps.skip_batches), then restart."
        )
    readout(capsys)
    assert main(shlex.split(skip)[1:]) == 0
    assert readout(capsys).out == (
        "pipeline 'gap', sink 'pg', epoch 0: batches 2-4 recorded as skipped (never written "
        "to it); the next batch writes it\n"
    )


def test_fanout_run_hands_its_pipeline_file_to_the_fanout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _config(tmp_path, str(tmp_path / "ledger"), backfill=False)
    fan = build_fanout(None, load_pipeline("pipeline.toml"))
    try:
        assert fan.pipeline_file == f"{tmp_path}/pipeline.toml"
    finally:
        fan.close()


def test_the_printed_skip_runs_from_another_directory_with_a_relative_pipeline_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pipeline file naming its ledger relative (to the directory `fanout run` runs in):
    the gap refusal's skip, printed with `--config` and the ledger absolute, runs as
    printed from any other directory (the file's relative ledger cannot say where it is
    from there: the printed --ledger does), and records the skip in the pipeline's ledger,
    not in a new one."""
    run_dir, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run_dir.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(run_dir)
    _run(FanOut("gap", DeltaLedger("ledger"), [ScriptedSink("good"), ScriptedSink("pg")]), range(2))
    _run(FanOut("gap", DeltaLedger("ledger"), [ScriptedSink("good")]), range(2, 5))  # pg: 2-4
    _config(run_dir, "ledger", backfill=False)
    sinks = [ScriptedSink("good"), ScriptedSink("pg")]
    fan = FanOut("gap", DeltaLedger("ledger"), sinks, pipeline_file="pipeline.toml")
    with pytest.raises(MissedBatchesError) as refused:
        _run(fan, range(5, 6))
    skip = str(refused.value).split("`")[1]
    assert skip == (
        f"fanout ledger skip --config {run_dir}/pipeline.toml --ledger {run_dir}/ledger "
        "--pipeline gap --sink pg --through 4 --epoch 0"
    )

    monkeypatch.chdir(elsewhere)
    readout(capsys)
    assert main(shlex.split(skip)[1:]) == 0
    assert readout(capsys).out == (
        f"pipeline 'gap', sink 'pg', epoch 0: {run_dir}/pipeline.toml names the ledger "
        "relative ('ledger', from the directory fanout run runs in): --ledger "
        f"{run_dir}/ledger names it\n"
        "pipeline 'gap', sink 'pg', epoch 0: batches 2-4 recorded as skipped (never written "
        "to it); the next batch writes it\n"
    )
    assert DeltaLedger(str(run_dir / "ledger")).last_committed("gap", ["pg"]) == {"pg": 4}
    assert not (elsewhere / "ledger").exists()


def test_skip_with_config_refuses_a_sink_neither_the_file_nor_the_ledger_knows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A misspelt --sink recorded marks for a sink that never was (exit 0), which
    `fanout status` then listed beside the real ones."""
    path = str(tmp_path / "ledger")
    _lake_holds_2_and_3(path)
    readout(capsys)
    config = _config(tmp_path, path, backfill=False)
    assert main(["ledger", "skip", "--config", config, "--sink", "gd", "--through", "3"]) == 2
    assert readout(capsys) == (
        "",
        f"fanout: configuration error: --sink gd: no sink of that name in {config} (lake, pg) "
        "nor in the ledger's pipeline 'gap' (good, lake, pg); check the name\n",
    )
    ledger = DeltaLedger(path)
    assert ledger.last_committed("gap", ["gd", "good", "lake", "pg"]) == {
        "gd": None, "good": 3, "lake": 3, "pg": 0,
    }  # fmt: skip


def test_skip_checks_the_sink_against_the_ledgers_sink_names_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unknown-sink check made every ledger row of the pipeline a dict of every column
    (``DeltaLedger.rows``: 0.69 s on 100k rows, against 0.07 s for the names): it reads the
    sink names, epochs' and recoveries' rows left out, lost marks never hiding a sink."""
    path = str(tmp_path / "ledger")
    _lake_holds_2_and_3(path)
    ledger = DeltaLedger(path)
    assert {r["status"] for r in ledger.rows("gap")} == {"epoch", "committed"}
    assert ledger.sink_names("gap") == ["good", "lake", "pg"]
    assert ledger.sink_names("nope") == []
    assert ledger.sink_names("gap") == sorted(
        {str(r["sink"]) for r in ledger.rows("gap") if r["status"] not in ("epoch", "recovery")}
    )

    def every_column(*_args: object, **_kw: object) -> None:
        raise AssertionError("the check read every column of the ledger's rows")

    monkeypatch.setattr(DeltaLedger, "rows", every_column)
    readout(capsys)
    config = _config(tmp_path, path, backfill=False)
    assert main(["ledger", "skip", "--config", config, "--sink", "gd", "--through", "3"]) == 2
    assert readout(capsys).err == (
        f"fanout: configuration error: --sink gd: no sink of that name in {config} (lake, pg) "
        "nor in the ledger's pipeline 'gap' (good, lake, pg); check the name\n"
    )


def test_a_skip_without_epoch_is_refused_while_the_backfill_source_holds_an_older_epoch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sink "pg" backfills from "lake", which committed batches 0-1 of epoch 0 and, after a
    checkpoint reset, 0-1 of epoch 1; "pg" has none. A skip typed without ``--epoch``
    defaulted to epoch 1 (with ``--give-up-backfill``, the way on its own refusal named, it
    gave up epoch 1's batches 0-1, which "pg" gets from "lake" after epoch 0's): refused,
    naming epoch 0 and the command with ``--epoch 0``; nothing recorded."""
    path = str(tmp_path / "ledger")
    _run(FanOut("gap", DeltaLedger(path), [ScriptedSink("good"), ScriptedSink("lake")]), range(2))
    sinks = [ScriptedSink("good"), ScriptedSink("lake")]
    fan = FanOut("gap", DeltaLedger(path), sinks, on_checkpoint_reset="new_epoch")
    _run(fan, range(2), query="q-new")
    ledger = DeltaLedger(path)
    assert ledger.lookup("gap", ["pg"]).epoch == 1
    config = _config(tmp_path, path)
    readout(capsys)
    args = ["ledger", "skip", "--config", config, "--sink", "pg", "--through", "1"]
    for extra in ([], ["--give-up-backfill"]):
        assert main([*args, *extra]) == 2
        flags = "".join(f" {flag}" for flag in extra)
        printed = f"fanout ledger skip --config {config} --sink pg --through 1 --epoch 0{flags}"
        assert readout(capsys).err == (
            "fanout: configuration error: pipeline 'gap', sink 'pg': the oldest batch it "
            "misses is batch 0 of epoch 0, before the pipeline's current epoch 1, the one a "
            "skip without an epoch acts in: this skip would record epoch 1's batches through "
            "1 as never written to it (it gets them after epoch 0's: their rows lost to it) "
            "and leave batch 0 of epoch 0 missing; nothing was recorded. To skip epoch 0's "
            f"batches, run `{printed}`; to skip epoch 1's anyway, the same with --epoch 1\n"
        )
    with pytest.raises(OlderEpochSkipError) as refused:  # in Python too
        skip_batches(ledger, "gap", "pg", 1, backfill_from="lake", give_up_backfill=True)
    assert (refused.value.epoch, refused.value.batch_id, refused.value.current) == (0, 0, 1)
    assert str(refused.value).endswith(
        "nothing was recorded. Give the epoch: epoch=0 skips epoch 0's batches; epoch=1 "
        "skips epoch 1's anyway"
    )
    assert [e for e in DeltaLedger(path).committed_entries("gap") if e.sink == "pg"] == []

    # run as printed, it gives up epoch 0's batches (those lake holds: --give-up-backfill)
    assert main(printed.split()[1:]) == 0
    marks = [e for e in DeltaLedger(path).committed_entries("gap") if e.sink == "pg"]
    assert [(e.epoch, e.batch_id, e.rows) for e in marks] == [(0, 1, 0)]
    # epoch 0 held now, a skip of epoch 1 is checked as before
    assert main([*args, "--epoch", "1"]) == 2
    assert "its backfill source 'lake' holds batch(es) 0-1 of epoch 1" in readout(capsys).err


@pytest.mark.parametrize("last", [1, 2])
def test_an_older_epochs_batch_given_up_with_its_checkpoint_is_missed_by_no_sink(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], last: int
) -> None:
    """Sinks "down" and "ff" have batch 0 of epoch 0, "good" batches 0 through ``last``;
    then a reset: epoch 1's batches 0-1 run without "down". Epoch 0's batch 1 is settled
    only when a mark is past it (``last`` 2: Spark planned batch 2 after committing it):
    "down" misses it, and a skip without ``--epoch`` is refused. As the epoch's last batch,
    which "ff" lacks too, it was given up with its checkpoint (the new epoch reads its rows
    again): "down" misses nothing of epoch 0, and the skip of epoch 1 is recorded."""
    path = str(tmp_path / "ledger")
    _run(
        FanOut("gap", DeltaLedger(path), [ScriptedSink(n) for n in ("good", "down", "ff")]),
        range(1),
    )
    _run(FanOut("gap", DeltaLedger(path), [ScriptedSink("good")]), range(1, last + 1))
    sinks = [ScriptedSink("good"), ScriptedSink("ff")]
    _run(FanOut("gap", DeltaLedger(path), sinks, on_checkpoint_reset="new_epoch"), range(2), "q2")
    readout(capsys)
    args = ["ledger", "skip", "--ledger", path, "--pipeline", "gap", "--sink", "down"]
    code = main([*args, "--through", "1"])
    marks = [e for e in DeltaLedger(path).committed_entries("gap") if e.sink == "down"]
    if last == 2:
        assert code == 2
        assert "the oldest batch it misses is batch 1 of epoch 0" in readout(capsys).err
        assert [(e.epoch, e.batch_id) for e in marks] == [(0, 0)]
    else:  # more than one epoch: without --epoch refused all the same, naming no batch
        assert code == 2
        assert "the ledger shows no batch of an older epoch the sink still misses" in (
            readout(capsys).err
        )
        assert [(e.epoch, e.batch_id) for e in marks] == [(0, 0)]
        assert main([*args, "--through", "1", "--epoch", "1"]) == 0
        assert readout(capsys).out.startswith(
            "pipeline 'gap', sink 'down', epoch 1: batches 0-1 recorded as skipped"
        )
        marks = [e for e in DeltaLedger(path).committed_entries("gap") if e.sink == "down"]
        assert sorted((e.epoch, e.batch_id) for e in marks) == [(0, 0), (1, 1)]


def test_a_skip_without_epoch_is_refused_once_the_pipeline_has_two_epochs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sink "late" has no mark in epoch 0 (left out of it, or lagging from its first batch
    with the spool not given): the ledger cannot tell whether it misses epoch 0's batches.
    In epoch 0 alone a skip without ``--epoch`` is taken (the one-epoch case, as before);
    after a checkpoint reset it is refused, nothing recorded, naming the command with
    ``--epoch 1``, which, run as printed, records epoch 1's skip."""
    path = str(tmp_path / "ledger")
    _run(FanOut("gap", DeltaLedger(path), [ScriptedSink("good"), ScriptedSink("pg")]), range(1))
    _run(FanOut("gap", DeltaLedger(path), [ScriptedSink("good")]), range(1, 2))
    one = ["ledger", "skip", "--ledger", path, "--pipeline", "gap", "--sink", "pg"]
    assert main([*one, "--through", "1"]) == 0  # one epoch: --epoch not needed
    assert readout(capsys).out.startswith(
        "pipeline 'gap', sink 'pg', epoch 0: batches 1-1 recorded as skipped"
    )
    sinks = [ScriptedSink("good"), ScriptedSink("pg")]
    _run(FanOut("gap", DeltaLedger(path), sinks, on_checkpoint_reset="new_epoch"), range(2), "q2")
    readout(capsys)
    args = ["ledger", "skip", "--ledger", path, "--pipeline", "gap", "--sink", "late"]
    assert main([*args, "--through", "1"]) == 2
    printed = f"fanout ledger skip --ledger {path} --pipeline gap --sink late --through 1 --epoch 1"
    assert readout(capsys).err == (
        "fanout: configuration error: pipeline 'gap', sink 'late': the pipeline has more than "
        "one epoch (its current one is 1, the one a skip without an epoch acts in), and the "
        "ledger cannot tell whether the sink still misses batches of epoch 0 (it has no "
        "mark there: it may not have been in the pipeline then, or it may have lagged from "
        "that epoch's first batch), which it gets before epoch 1's: a skip of epoch 1's "
        "batches through 1 would lose their rows to it; nothing was recorded. To skip epoch "
        f"1's batches, run `{printed}`; to skip an older epoch's, the same with --epoch of it\n"
    )
    assert [e for e in DeltaLedger(path).committed_entries("gap") if e.sink == "late"] == []
    with pytest.raises(OlderEpochSkipError) as refused:  # in Python too
        skip_batches(DeltaLedger(path), "gap", "late", 1)
    assert (refused.value.epoch, refused.value.batch_id, refused.value.older) == (1, None, False)

    assert main(printed.split()[1:]) == 0
    marks = [e for e in DeltaLedger(path).committed_entries("gap") if e.sink == "late"]
    assert [(e.epoch, e.batch_id, e.rows) for e in marks] == [(1, 1, 0)]


def test_a_skip_without_epoch_of_a_sink_caught_up_in_the_older_epoch_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sink "pg" holds every batch of epoch 0 (its mark there is the epoch's last) and
    misses epoch 1's batches 0-1: the ledger tells it misses nothing older, and the refusal
    of a skip without ``--epoch`` (the pipeline has two epochs) says that, not that it has
    no mark in the older epoch (which it printed before: untrue of this sink). The printed
    command records epoch 1's skip."""
    path = str(tmp_path / "ledger")
    _run(FanOut("gap", DeltaLedger(path), [ScriptedSink("good"), ScriptedSink("pg")]), range(2))
    sinks = [ScriptedSink("good")]
    _run(FanOut("gap", DeltaLedger(path), sinks, on_checkpoint_reset="new_epoch"), range(2), "q2")
    readout(capsys)
    args = ["ledger", "skip", "--ledger", path, "--pipeline", "gap", "--sink", "pg"]
    assert main([*args, "--through", "1"]) == 2
    printed = f"fanout ledger skip --ledger {path} --pipeline gap --sink pg --through 1 --epoch 1"
    assert readout(capsys).err == (
        "fanout: configuration error: pipeline 'gap', sink 'pg': the pipeline has more than "
        "one epoch (its current one is 1, the one a skip without an epoch acts in); the "
        "ledger shows no batch of an older epoch the sink still misses, but a skip without "
        "an epoch is taken only while the pipeline has one, so that none typed for an older "
        "epoch's batches gives up epoch 1's instead; nothing was recorded. To skip epoch "
        f"1's batches, run `{printed}`; to skip an older epoch's, the same with --epoch of it\n"
    )
    marks = [e for e in DeltaLedger(path).committed_entries("gap") if e.sink == "pg"]
    assert sorted((e.epoch, e.batch_id) for e in marks) == [(0, 0), (0, 1)]
    assert main(shlex.split(printed)[1:]) == 0
    marks = [e for e in DeltaLedger(path).committed_entries("gap") if e.sink == "pg"]
    assert sorted((e.epoch, e.batch_id, e.rows) for e in marks) == [
        (0, 0, 2),
        (0, 1, 2),
        (1, 1, 0),
    ]
