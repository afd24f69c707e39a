"""``fanout recover`` and a sink with no mark in the epoch (ARCHITECTURE §5, reset): the
pipeline's sinks come from ``--config``, or, without it, from the sinks with marks in
earlier epochs; such a sink pulls the resume point back to before the epoch's first batch,
or is named with the batches a resume gives up for it and the command accepting that.
Through the CLI on a real Delta ledger; the Delta sinks' tables do not exist (never
written), so they hold nothing."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from fanout.app.cli import main
from fanout.app.recover import (
    NO_CONFIG,
    NO_SPOOL,
    NOT_RECORDED,
    STOP_FIRST,
    STOP_FIRST_UNRECORDED,
)
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry
from tests.newest_lines import readout

OLD, NEW = "q-old", "q-new"


def _ledger(tmp_path: Path) -> DeltaLedger:
    ledger = DeltaLedger(str(tmp_path / "ledger"))
    ledger.open()
    return ledger


def _mark(ledger: DeltaLedger, sink: str, batch: int, epoch: int = 0, query: str = OLD) -> None:
    offsets = json.dumps([{"t": {"0": 10 * (batch + 1)}}])
    ledger.mark_committed(
        LedgerEntry(
            "p", sink, batch, "committed", query_id=query, epoch=epoch, source_offsets=offsets
        )
    )


def _start(ledger: DeltaLedger, epoch: int, query: str, batch: int = 0) -> None:
    ledger.start_epoch(LedgerEntry("p", "*", batch, "epoch", query_id=query, epoch=epoch))


def _config(tmp_path: Path, *sinks: str) -> str:
    file = tmp_path / "pipeline.toml"
    file.write_text(
        f'[pipeline]\nname = "p"\nledger = "{tmp_path / "ledger"}"\n'
        f'checkpoint = "{tmp_path / "ckpt"}"\n[source]\nformat = "rate"\n'
        + "".join(
            f'[[sinks]]\ntype = "delta"\nname = "{s}"\npath = "{tmp_path / s}"\n' for s in sinks
        )
    )
    return str(file)


def _out(capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    readout(capsys)
    assert main(["recover", *args]) == 0
    return readout(capsys).out.splitlines()


def _asked(config: str, epoch: int, answers: dict[str, str]) -> list[str]:
    return [
        f"Asked each sink of {config}, by its own records, whether it holds the batch after "
        f"its mark in epoch {epoch} (written, but never marked):",
        *(f"  {sink}: does not hold batch {batch}" for sink, batch in answers.items()),
    ]


def test_a_sink_without_a_mark_in_the_epochs_first_batch_pulls_the_resume_point_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The driver died in epoch 0's first batch after a's mark, before b's: `recover` said
    "resume after batch 0: every sink holds it", giving batch 0 up for b. With --config it
    resumes where the epoch began, or, after the skip it prints, after batch 0."""
    ledger = _ledger(tmp_path)
    _start(ledger, 0, OLD)
    _mark(ledger, "a", 0)
    config = _config(tmp_path, "a", "b")
    where = tmp_path / "ledger"
    skip = f"fanout ledger skip --ledger {where} --pipeline p --sink b --through 0 --epoch 0"

    assert _out(capsys, "--config", config) == [
        "pipeline 'p': last committed batch per sink",
        '  a: batch 0, query id q-old, source offsets [{"t": {"0": 10}}]',
        "  b: no mark in epoch 0 (no mark in the ledger)",
        *_asked(config, 0, {"a": "1", "b": "0"}),
        "Resume before batch 0, epoch 0's first: sink b has no mark in epoch 0 (the driver "
        "died in that batch before the mark, or never wrote it there), so resuming after "
        "batch 0 would give that batch up for it. Start the new query where epoch 0 began "
        "(the query's starting offsets; the ledger holds no offsets before batch 0): sink a "
        "already holds batch 0 and will write its rows again (a new epoch means new "
        "transaction ids, so nothing skips them): duplicates there, unless the sink upserts "
        "by key.",
        f"Or give batch 0 up for b: `{skip}`, then run this again: it resumes after batch 0.",
        STOP_FIRST,
        # no NO_SPOOL: the file configures no spool, and `--spool` with it is refused
        f"Recorded in the ledger as report 1: the next epoch (`fanout run {config} "
        "--new-epoch`) starts from it, and is refused if a batch of epoch 0 after it is "
        "committed first (then run this again).",
    ]
    report = ledger.read("p").to_pylist()
    assert sorted((r["sink"], r["batch_id"]) for r in report if r["status"] == "recovery") == [
        ("*", -1), ("a", 0),
    ]  # fmt: skip

    # without --config, b cannot be seen: the output says so
    lines = _out(capsys, "--ledger", str(where), "--pipeline", "p", "--no-record")
    assert lines[2] == (
        "Resume after batch 0: every sink the pipeline still writes holds it, so nothing is "
        "written twice."
    )
    assert NO_CONFIG in lines

    assert main(shlex.split(skip)[1:]) == 0
    lines = _out(capsys, "--config", config)
    assert lines[:3] == [
        "pipeline 'p': last committed batch per sink",
        '  a: batch 0, query id q-old, source offsets [{"t": {"0": 10}}]',
        '  b: batch 0, query id q-old, source offsets [{"t": {"0": 10}}]',
    ]
    assert lines[6] == (
        "Resume after batch 0: every sink the pipeline still writes holds it, so nothing is "
        "written twice."
    )


def test_without_config_a_sink_marked_only_in_an_earlier_epoch_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Epoch 1 started at batch 0; the driver died in it after a's mark, before b's. b's
    marks are of epoch 0 only: it counted as "not written since batch 5 of epoch 0:
    removed from the pipeline?", and the resume after batch 0 gave batch 0 of epoch 1 up
    for it. Without --config it now counts, and the resume point is pulled back."""
    ledger = _ledger(tmp_path)
    _start(ledger, 0, OLD)
    for batch in range(6):
        _mark(ledger, "a", batch)
        _mark(ledger, "b", batch)
    _start(ledger, 1, NEW)
    _mark(ledger, "a", 0, epoch=1, query=NEW)
    where = tmp_path / "ledger"

    lines = _out(capsys, "--ledger", str(where), "--pipeline", "p", "--no-record")
    assert lines[:5] == [
        "pipeline 'p' (epoch 1): last committed batch per sink",
        '  a: batch 0, query id q-new, source offsets [{"t": {"0": 10}}]',
        "  b: no mark in epoch 1 (last marked at batch 5 of epoch 0, query id q-old)",
        "Resume before batch 0, epoch 1's first: sink b has no mark in epoch 1 (the driver "
        "died in that batch before the mark, or never wrote it there), so resuming after "
        "batch 0 would give that batch up for it (without --config a sink with marks in "
        "earlier epochs only counts as the pipeline's: if b was taken out of it, run this "
        "again with --config PIPELINE.toml). Start the new query where epoch 1 began (the "
        "query's starting offsets; the ledger holds no offsets before batch 0): sink a "
        "already holds batch 0 and will write its rows again (a new epoch means new "
        "transaction ids, so nothing skips them): duplicates there, unless the sink upserts "
        "by key.",
        "Or give batch 0 up for b: `fanout ledger skip --ledger "
        f"{where} --pipeline p --sink b --through 0 --epoch 1`, then run this again: it "
        "resumes after batch 0.",
    ]
    # the pipeline file without b: b was taken out, and does not decide
    config = _config(tmp_path, "a")
    assert _out(capsys, "--config", config, "--no-record")[1:6] == [
        '  a: batch 0, query id q-new, source offsets [{"t": {"0": 10}}]',
        "  b: not written since batch 5 of epoch 0 (query id q-old): removed from the "
        "pipeline? It does not decide where to resume",
        *_asked(config, 1, {"a": "1"}),
        "Resume after batch 0: every sink the pipeline still writes holds it, so nothing is "
        "written twice.",
    ]


def test_a_sink_of_the_pipeline_file_added_since_is_named_with_the_batches_given_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """a and b hold batches 0-2; c, in the pipeline file, has no mark: batch 0 committed
    without it, so the resume point stays after batch 2, and c is named with the batches
    that gives up for it and the skip accepting that."""
    ledger = _ledger(tmp_path)
    _start(ledger, 0, OLD)
    for batch in range(3):
        _mark(ledger, "a", batch)
        _mark(ledger, "b", batch)
    config = _config(tmp_path, "a", "b", "c")
    skip = (
        f"fanout ledger skip --ledger {tmp_path / 'ledger'} --pipeline p --sink c "
        "--through 2 --epoch 0"
    )
    assert _out(capsys, "--config", config, "--no-record")[:11] == [
        "pipeline 'p': last committed batch per sink",
        '  a: batch 2, query id q-old, source offsets [{"t": {"0": 30}}]',
        '  b: batch 2, query id q-old, source offsets [{"t": {"0": 30}}]',
        "  c: no mark in epoch 0 (no mark in the ledger)",
        *_asked(config, 0, {"a": "3", "b": "3", "c": "0"}),
        "Resume after batch 2: every sink the pipeline still writes holds it, so nothing is "
        "written twice.",
        "c gets no batches 0-2 of epoch 0 from a new checkpoint resuming after batch 2: batch "
        "0 committed without it, so it was not in the pipeline then (added since; or taken "
        f"out, then nothing is missing). To accept that it never gets them: `{skip}`.",
        "Source 0 (Kafka): start a new checkpoint with",
    ]


def test_lost_marks_the_ledger_cannot_record_are_counted_and_said_so() -> None:
    """A read-only ledger: recover still counts the lost mark it found, and says the new
    epoch's start will be refused for it (the start asks the sink again)."""
    from fanout.app.recover import LOST_UNRECORDABLE, recovery_of, render
    from fanout.app.recover_sinks import Asked
    from fanout.steps.unmarked import Held

    held = Held("a", 0, True)
    asked = Asked("p.toml", 0, {"a": 0}, [held], offsets={"a": None}, unrecorded="denied")
    lost = LedgerEntry("p", "a", 1, "committed", query_id=OLD, error="unmarked: x")
    lines = render(recovery_of("p", [lost], sinks=["a"]), asked=asked).splitlines()
    assert lines[2:5] == [
        "Asked each sink of p.toml, by its own records, whether it holds the batch after its "
        "mark in epoch 0 (written, but never marked):",
        "  a: holds batch 1, which the ledger had no mark of",
        LOST_UNRECORDABLE.format(reason="denied"),
    ]
    assert LOST_UNRECORDABLE.format(reason="denied") == (
        "The lost marks could not be recorded in the ledger (denied): the counts here "
        "include each, the ledger does not, so a new epoch's start asks the sink about that "
        "batch again and is refused (UnmarkedBatchError), recording it then if it can."
    )


def test_a_spool_the_pipeline_file_does_not_configure_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As `ledger skip --config` refuses it: a --spool beside a file without one is another
    pipeline's spool (recover read its batches as this pipeline's)."""
    _mark(_ledger(tmp_path), "a", 0)
    config = _config(tmp_path, "a")

    assert main(["recover", "--config", config, "--spool", str(tmp_path / "spool")]) == 2

    assert (
        readout(capsys)
        .err.strip()
        .endswith(
            f"--spool {tmp_path / 'spool'}: {config} configures no spool (pipeline.spool): drop "
            "--spool or give the pipeline's own file"
        )
    )


def test_a_sink_the_pipeline_file_no_longer_names_does_not_decide_where_to_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """b marked batch 2, a batch 3, then the driver died; b was taken out of the pipeline
    file since. `recover --config` said "resume after batch 2 (b is furthest behind)": a,
    the only sink the new checkpoint writes, got batch 3's rows twice from an operator
    following it. The file's sinks decide; b is listed apart."""
    ledger = _ledger(tmp_path)
    _start(ledger, 0, OLD)
    for batch in range(4):
        _mark(ledger, "a", batch)
    for batch in range(3):
        _mark(ledger, "b", batch)
    config = _config(tmp_path, "a")

    assert _out(capsys, "--config", config)[:6] == [
        "pipeline 'p': last committed batch per sink",
        '  a: batch 3, query id q-old, source offsets [{"t": {"0": 40}}]',
        '  b: batch 2, query id q-old, source offsets [{"t": {"0": 30}}]; not a sink of the '
        "pipeline file: a new checkpoint writes it nothing, so it does not decide where to "
        "resume",
        *_asked(config, 0, {"a": "4"}),
        "Resume after batch 3: every sink the pipeline still writes holds it, so nothing is "
        "written twice.",
    ]

    # without --config b is one of the pipeline's sinks still: it decides
    lines = _out(capsys, "--ledger", str(tmp_path / "ledger"), "--pipeline", "p", "--no-record")
    assert lines[3].startswith("Resume after batch 2 (sink 'b' is furthest behind)")


def test_a_sink_that_cannot_tell_keeps_the_resume_point_from_promising_no_duplicates() -> None:
    """Every sink marked batch 0, and sink a cannot tell whether it holds batch 1 (its
    ``holds_batch`` failed): if it does, resuming after batch 0 writes batch 1 there again.
    The resume line said "nothing is written twice"; it names the sink and the batch."""
    from fanout.app.recover import recovery_of, render
    from fanout.app.recover_sinks import Asked
    from fanout.steps.unmarked import Held

    offsets = json.dumps([{"t": {"0": 10}}])
    marks = [
        LedgerEntry("p", s, 0, "committed", query_id=OLD, source_offsets=offsets) for s in "ab"
    ]
    answers = [Held("a", 0, None, why="OSError: no route to host"), Held("b", 0, False)]
    asked = Asked("p.toml", 0, {"a": 0, "b": 0}, answers)
    lines = render(recovery_of("p", marks, sinks=["a", "b"]), asked=asked).splitlines()
    assert lines[4:8] == [
        "  a: cannot tell whether it holds batch 1: OSError: no route to host",
        "  b: does not hold batch 1",
        "Resume after batch 0: every sink the pipeline still writes holds it; but sink a "
        "cannot tell whether it holds batch 1 (above): if it does, batch 1's rows are written "
        "there a second time (duplicates, unless the sink upserts by key). Make it answer "
        "(the reason above) and run this again.",
        "Source 0 (Kafka): start a new checkpoint with",
    ]


def test_sinks_that_cannot_tell_beside_a_sink_ahead_are_named_once() -> None:
    """Sink b is ahead (batch 1), and both cannot tell about the batch after their mark:
    the resume line names b's rows written again once, and adds sink a (furthest behind),
    whose batch 1 the resume writes again if it holds it."""
    from fanout.app.recover import recovery_of, render
    from fanout.app.recover_sinks import Asked
    from fanout.steps.unmarked import Held

    offsets = json.dumps([{"t": {"0": 10}}])
    marks = [
        LedgerEntry("p", "a", 0, "committed", query_id=OLD, source_offsets=offsets),
        LedgerEntry("p", "b", 1, "committed", query_id=OLD, source_offsets=offsets),
    ]
    answers = [Held("a", 0, None, why="OSError: a"), Held("b", 1, None, why="OSError: b")]
    asked = Asked("p.toml", 0, {"a": 0, "b": 1}, answers)
    lines = render(recovery_of("p", marks, sinks=["a", "b"]), asked=asked).splitlines()
    assert lines[6] == (
        "Resume after batch 0 (sink 'a' is furthest behind); sink b already holds batch 1 "
        "and will write its rows again (a new epoch or a new pipeline name means new "
        "transaction ids, so nothing skips them): duplicates there, unless the sink upserts "
        "by key. Also: sink a cannot tell whether it holds batch 1 (above): if it does, "
        "batch 1's rows are written there a second time (duplicates, unless the sink "
        "upserts by key). Make it answer (the reason above) and run this again."
    )


def test_recover_of_a_pipeline_file_without_a_spool_asks_for_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The file configures no spool: `recover --config` ended with "The spool was not read
    (--spool): ... if the pipeline has a spool, run this again with --spool", and that
    command is refused (exit 2: the file configures no spool)."""
    ledger = _ledger(tmp_path)
    _start(ledger, 0, OLD)
    _mark(ledger, "a", 0)
    config = _config(tmp_path, "a")
    out = _out(capsys, "--config", config, "--no-record")
    assert NO_SPOOL not in out
    assert out[-2:] == [STOP_FIRST_UNRECORDED, NOT_RECORDED]
    assert main(["recover", "--config", config, "--spool", str(tmp_path / "s")]) == 2
    assert readout(capsys).err == (
        f"fanout: configuration error: --spool {tmp_path / 's'}: {config} configures no "
        "spool (pipeline.spool): drop --spool or give the pipeline's own file\n"
    )
