"""The ledger in the commands a sink's errors print: named where fanout knows it (a
``FanOut``, ``fanout recover``, ``fanout validate``, ``fanout.testing.open_sink`` given
it); elsewhere (a sink opened by hand) ``--ledger LEDGER``, said what it stands for. No
JVM."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fanout_delta.plans import CommitPlan, replanned_message

from fanout import Batch, Sink, SinkContext
from fanout.app.cli import main
from fanout.contract.batch import BatchInfo
from fanout.ledger.gaps import ledger_note, skip_command
from fanout.testing import open_sink

NOTE = (
    " (LEDGER: the location of the pipeline's ledger, its pipeline.ledger or the ledger its "
    "FanOut is given; fanout cannot name it here, the sink having been opened outside a "
    "FanOut, without SinkContext.ledger)"
)


class _Remembers(Sink):
    """Remembers the ledger it was opened with."""

    def open(self, context: SinkContext) -> None:
        self.ledger = context.ledger

    def write(self, batch: Batch) -> int:
        return 0


def test_open_sink_hands_the_ledger_given_named_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert open_sink(_Remembers("s"), ledger="my ledger").ledger == f"'{tmp_path}/my ledger'"
    assert open_sink(_Remembers("s")).ledger is None


def test_a_command_of_an_unknown_ledger_names_a_word_to_replace_and_says_which() -> None:
    """Before: ``--ledger <the pipeline's ledger>``, which a shell reads as a redirection
    from a file of that name (and an unbalanced quote); Delta's rollback refusal printed
    ``--ledger`` with no value at all."""
    assert skip_command(None, "p", "s", 3, 1) == (
        "fanout ledger skip --ledger LEDGER --pipeline p --sink s --through 3 --epoch 1"
    )
    assert (ledger_note(None), ledger_note(f"{os.sep}data{os.sep}ledger")) == (NOTE, "")
    info = BatchInfo("p", 4, "q", batch_timestamp_ms=2000)
    recorded = CommitPlan("app", 4, 1000, None)
    unknown = replanned_message(info, "lake", "/lake", recorded).splitlines()[-1]
    assert unknown == (
        "  `fanout recover --ledger LEDGER --pipeline p` prints what the ledger knows per "
        f"sink, with Kafka startingOffsets{NOTE}."
    )
    known = replanned_message(info, "lake", "/lake", recorded, ledger="/data/ledger")
    assert known.splitlines()[-1] == (
        "  `fanout recover --ledger /data/ledger --pipeline p` prints what the ledger knows "
        "per sink, with Kafka startingOffsets."
    )


def test_a_skip_pasted_with_the_placeholder_ledger_is_refused_creating_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The skip a sink opened outside a FanOut prints, pasted without replacing
    ``LEDGER`` (or any ``--ledger`` naming no ledger): refused, saying there is no ledger
    there, and no ledger is created. Before, the skip created an empty ledger table in
    ``./LEDGER`` and was refused as a skip of a batch no sink ran."""
    monkeypatch.chdir(tmp_path)
    command = skip_command(None, "p", "s", 3, 1)
    assert main(command.split()[1:]) == 2
    assert capsys.readouterr().err == (
        f"fanout: configuration error: no ledger at {tmp_path}{os.sep}LEDGER: this command "
        "reads an existing ledger and creates none (a pipeline's run creates its ledger when "
        "it starts): check the path for a typo, or give --config PIPELINE.toml to use the "
        "pipeline file's pipeline.ledger\n"
    )
    assert list(tmp_path.iterdir()) == []
