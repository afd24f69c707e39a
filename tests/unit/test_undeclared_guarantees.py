"""A sink type that declares no ``guarantees`` is at-least-once: fanout cannot know its write
is idempotent, so it warns at start saying how to declare it, and ``fanout plugins`` shows
the guarantee as not declared (it once defaulted to ``idempotent`` and said nothing)."""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

import fanout
from fanout import Batch, FanOut, Sink
from fanout.app.cli import main
from fanout.contract.sink import declared_guarantees, declares_guarantees
from fanout.ledger.memory import MemoryLedger


class NaiveCsvSink(Sink):
    """A newcomer's sink: appends every batch to one file, declares nothing."""

    def write(self, batch: Batch) -> int:
        return 0


class UpsertingSink(Sink):
    guarantees: ClassVar = ("idempotent",)

    def write(self, batch: Batch) -> int:
        return 0


class EmptyTupleSink(Sink):
    """The README's 'a type declaring none', written as an empty tuple: refused at load,
    saying it expected a tuple (which it was), and its ``guarantee`` an IndexError."""

    guarantees: ClassVar = ()

    def write(self, batch: Batch) -> int:
        return 0


HINT = (
    "its type NaiveCsvSink declares no guarantees, so fanout cannot know its write() is "
    "idempotent: once write() leaves the same state when a batch is written again (it skips "
    "a batch its records hold, by holds_batch and batch.idempotency_key, or writes "
    'idempotently), declare guarantees = ("idempotent",) (or ("transactional",)) on the '
    "class; fanout.testing's conformance kit checks it (README, 'Writing a sink plugin')"
)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name.startswith("fanout")
    ]


def test_a_sink_type_declaring_nothing_is_at_least_once_and_the_warning_says_what_to_do(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="fanout")
    assert NaiveCsvSink.guarantees == ("at_least_once",)
    assert NaiveCsvSink("csv").guarantee == "at_least_once"
    assert not declares_guarantees(NaiveCsvSink)

    FanOut("orders", MemoryLedger(), [NaiveCsvSink("csv")]).close()
    assert _warnings(caplog) == [
        "pipeline orders: sink 'csv' is at-least-once: if the driver dies between its write "
        f"and its ledger mark, the replay can write duplicates; {HINT}"
    ]


def test_an_empty_guarantees_tuple_declares_none_as_leaving_it_out_does(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="fanout")
    assert not declares_guarantees(EmptyTupleSink)
    assert declared_guarantees(EmptyTupleSink) == ("at_least_once",)
    assert EmptyTupleSink("csv").guarantee == "at_least_once"
    FanOut("orders", MemoryLedger(), [EmptyTupleSink("csv")]).close()
    assert _warnings(caplog) == [
        "pipeline orders: sink 'csv' is at-least-once: if the driver dies between its write "
        "and its ledger mark, the replay can write duplicates; "
        + HINT.replace("NaiveCsvSink", "EmptyTupleSink")
    ]
    assert EmptyTupleSink.guarantees == ()  # the author's class is left as written


def test_a_sink_type_declaring_idempotent_gets_no_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="fanout")
    assert declares_guarantees(UpsertingSink)
    assert UpsertingSink("pg").guarantee == "idempotent"
    FanOut("orders", MemoryLedger(), [UpsertingSink("pg")]).close()
    assert _warnings(caplog) == []


def test_a_subclass_of_a_declaring_type_inherits_its_declaration() -> None:
    class Tuned(UpsertingSink):
        pass

    assert declares_guarantees(Tuned)
    assert Tuned("pg").guarantee == "idempotent"


PLUGIN = """
import fanout


class NaiveCsvSink(fanout.Sink):
    def write(self, batch):
        return 0


@fanout.hookimpl
def fanout_sink_types():
    return {"naive_csv": NaiveCsvSink}
"""


@pytest.fixture(params=["left out", "()"])
def naive_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[None]:
    """A distribution installed as pip leaves it, registering ``naive_csv``, whose class
    leaves ``guarantees`` out or sets it to ``()``."""
    declared = "" if request.param == "left out" else "    guarantees = ()\n\n"
    (tmp_path / "fanout_naive_probe.py").write_text(
        PLUGIN.replace("    def write", f"{declared}    def write")
    )
    info = tmp_path / "fanout_naive-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fanout-naive\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fanout]\nnaive = fanout_naive_probe\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("fanout_naive_probe", None)


def test_fanout_plugins_shows_an_undeclared_guarantee(
    naive_plugin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plugins"]) == 0
    rows = {
        cells[0]: cells
        for line in capsys.readouterr().out.splitlines()
        if (cells := re.split(r"\s{2,}", line.strip()))
    }
    assert rows["naive_csv"] == [
        "naive_csv",
        "at_least_once (not declared)",
        "fanout-naive",
        "0.1",
        "fanout_naive_probe.NaiveCsvSink",
    ]
    assert rows["delta"][1] == "transactional"
    assert rows["postgres"][1] == "idempotent or transactional"


def test_fanout_plugins_json_adds_whether_the_guarantees_are_declared(
    naive_plugin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plugins", "--json"]) == 0
    listed: dict[str, Any] = {p["type"]: p for p in json.loads(capsys.readouterr().out)}
    assert listed["naive_csv"]["guarantees"] == ["at_least_once"]
    assert listed["naive_csv"]["guarantees_declared"] is False
    assert listed["delta"]["guarantees"] == ["transactional"]
    assert listed["delta"]["guarantees_declared"] is True


def test_a_flaky_sink_wrapping_an_undeclaring_type_keeps_the_warnings_hint(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``FlakySink`` declares every guarantee (its ``guarantee`` is the wrapped sink's), so
    the warning for a wrapped type that declares none lost its hint: the wrapper's
    declaration was read, not the wrapped type's."""
    from fanout.testing import FlakySink

    caplog.set_level(logging.WARNING, logger="fanout")
    FanOut("orders", MemoryLedger(), [FlakySink(NaiveCsvSink("csv"), fail_on=[])]).close()
    assert _warnings(caplog) == [
        "pipeline orders: sink 'csv' is at-least-once: if the driver dies between its write "
        f"and its ledger mark, the replay can write duplicates; {HINT}"
    ]


class ModalSink(Sink):
    """Declares ``idempotent`` only, but its option ``mode = "append"`` makes its
    ``guarantee`` ``transactional``: a promise the type does not make."""

    guarantees: ClassVar = ("idempotent",)

    def __init__(self, name: str, *, mode: str = "upsert") -> None:
        super().__init__(name)
        self.mode = mode

    @property
    def guarantee(self) -> Any:
        return "transactional" if self.mode == "append" else "idempotent"

    def write(self, batch: Batch) -> int:
        return 0


def test_a_guarantee_its_type_does_not_declare_is_refused_before_start() -> None:
    """Nothing compared a configured sink's ``guarantee`` with its type's ``guarantees``
    (only with the guarantees fanout knows): ``fanout plugins`` said ``idempotent`` while
    the sink ran promising ``transactional``."""
    from fanout.errors import ConfigurationError

    FanOut("orders", MemoryLedger(), [ModalSink("m")]).close()  # upsert: declared
    with pytest.raises(ConfigurationError) as caught:
        FanOut("orders", MemoryLedger(), [ModalSink("m", mode="append")])
    assert str(caught.value) == (
        "sink 'm': guarantee 'transactional' (as its options make it) is not one its "
        "type ModalSink declares (idempotent): configure it for one of those, or, if the type "
        "gives 'transactional' too, add it to the class's 'guarantees = (...)' (what `fanout "
        "plugins` shows and the conformance kit checks)"
    )


class _NaivePlugin:
    @staticmethod
    @fanout.hookimpl
    def fanout_sink_types() -> dict[str, type[Sink]]:
        return {"naive": NaiveCsvSink, "empty": EmptyTupleSink, "upserting": UpsertingSink}


def test_validate_warns_for_an_at_least_once_sink_as_run_does(
    tmp_path: Path, with_test_sinks: Callable[[object], None]
) -> None:
    """Only the summary under the checklist said ``(not declared)``: no WARN line."""
    from fanout.app.runner import load_pipeline
    from fanout.app.validate import run_checks

    with_test_sinks(_NaivePlugin())
    file = tmp_path / "p.toml"
    file.write_text(
        f'[pipeline]\nname = "p"\nledger = "{tmp_path}/ledger"\n'
        f'checkpoint = "{tmp_path}/checkpoint"\n[source]\nformat = "rate"\n'
        '[[sinks]]\ntype = "naive"\nname = "csv"\n'
        '[[sinks]]\ntype = "empty"\nname = "csv2"\n'
        '[[sinks]]\ntype = "upserting"\nname = "pg"\n'
    )
    checklist = run_checks(None, load_pipeline(str(file)), lambda spark, config: None)
    warned = [c.line() for c in checklist.checks if c.kind == "warned"]
    risk = "is at-least-once: if the driver dies between its write and its ledger mark, the "
    assert warned == [
        f"  WARN  sink csv: guarantee: sink 'csv' {risk}replay can write duplicates; {HINT}",
        f"  WARN  sink csv2: guarantee: sink 'csv2' {risk}replay can write duplicates; "
        + HINT.replace("NaiveCsvSink", "EmptyTupleSink"),
    ]
    assert not [c for c in checklist.checks if c.failed]  # a warning, exit 0
