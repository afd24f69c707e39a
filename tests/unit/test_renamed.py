"""The check at a run's first batch for a sink renamed between a crash and its replay
(fanout.steps.renamed): who is asked (only a sink without a mark in the epoch, only about a
sink the ledger names that is no longer configured, about the batch after its last mark),
what refuses (held, whole or part), what only warns (cannot tell, an error, no answer in
time, a harmless rewrite) and the refusal's text (a memory ledger, fake sinks: the real
sinks' answers are tested against their services)."""

from __future__ import annotations

import logging
import time

import pytest

from fanout import PartlyHeld, Sink
from fanout.ledger.entry import LedgerEntry
from fanout.ledger.memory import MemoryLedger
from fanout.steps.renamed import RenamedSinkError, refuse_renamed

Answer = bool | PartlyHeld | None


class Target(Sink):
    """Answers ``holds_batch_of`` with ``answer`` (raised when an exception); records the
    questions."""

    def __init__(self, name: str, answer: Answer | Exception = True, *, harmless: str | None = None,
                 wait_s: float = 0.0) -> None:  # fmt: skip
        super().__init__(name)
        self.answer, self.harmless, self.wait_s = answer, harmless, wait_s
        self.path = "/data/orders"
        self.asked: list[tuple[str, int, int]] = []

    def holds_batch_of(self, sink_name: str, pipeline: str, epoch: int, batch_id: int) -> Answer:
        self.asked.append((sink_name, epoch, batch_id))
        time.sleep(self.wait_s)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def harmless_rewrite(self) -> str | None:
        return self.harmless


def _ledger(marks: dict[str, list[int]], epoch: int = 0) -> MemoryLedger:
    ledger = MemoryLedger()
    for sink, batches in marks.items():
        for batch in batches:
            ledger.mark_committed(LedgerEntry("p", sink, batch, "committed", rows=1, epoch=epoch))
    return ledger


def _check(ledger: MemoryLedger, *sinks: Sink, batch: int = 3, epoch: int = 0,
           timeouts: dict[str, float] | None = None) -> dict[str, RenamedSinkError]:  # fmt: skip
    named = {s.name: s for s in sinks}
    marks = ledger.last_committed("p", named, epoch)
    return refuse_renamed("p", epoch, batch, ledger, named, named, marks, timeouts)


def test_a_new_sink_holding_a_vanished_sinks_next_batch_is_refused_naming_both() -> None:
    new, keep = Target("new"), Target("keep")
    refused = _check(_ledger({"keep": [0, 1, 2, 3], "old": [0, 1, 2]}), keep, new)
    assert set(refused) == {"new"} and new.asked == [("old", 0, 3)] and keep.asked == []
    text = str(refused["new"])
    assert text.startswith(
        "sink 'new', batch 3: path '/data/orders' holds batch 3 of sink 'old' (epoch 0, its "
        "records keyed 'fanout/p/old'), a sink the pipeline no longer configures, and sink "
        "'new' has no mark in the epoch. "
    )
    assert "rename the sink back to 'old' and restart" in text
    assert "or remove batch 3 from the target" in text
    assert (refused["new"].sink, refused["new"].batch_id) == ("new", 3)
    part = _check(_ledger({"old": [0, 1, 2]}), Target("new", PartlyHeld(1, 2)))
    assert "holds batch 3 of sink 'old' (part of it: some of its partitions)" in str(part["new"])


def test_nothing_is_asked_without_both_a_new_sink_and_a_vanished_one() -> None:
    marked = Target("old")  # every configured sink has a mark: no question, no ledger scan
    assert _check(_ledger({"old": [0, 1, 2], "gone": [0]}), marked) == {}
    new = Target("new")  # a new sink, no sink gone
    assert _check(_ledger({"keep": [0, 1, 2]}), Target("keep"), new) == {}
    assert marked.asked == [] and new.asked == []


def test_a_vanished_sink_without_a_mark_in_the_epoch_is_asked_about_the_runs_first_batch() -> None:
    ledger = _ledger({"old": [0, 1]})  # epoch 0; the run is in epoch 1, where nobody marked
    new = Target("new", False)
    assert _check(ledger, new, batch=5, epoch=1) == {}
    assert new.asked == [("old", 1, 5)]


def test_cannot_tell_an_error_no_answer_in_time_and_a_harmless_rewrite_only_warn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger = _ledger({"old": [0, 1, 2]})
    caplog.set_level(logging.WARNING, logger="fanout")
    assert _check(ledger, Target("new", None)) == {}
    said = (
        "pipeline p, sink new: cannot tell whether its target holds batch 3 of epoch 0 "
        "written by sink 'old', which the pipeline no longer configures. If 'new' is 'old' "
        "renamed"
    )
    assert said in caplog.text
    assert _check(ledger, Target("new", OSError("marker topic gone"))) == {}
    assert "no longer configures: OSError: marker topic gone. If 'new'" in caplog.text
    slow = Target("new", True, wait_s=1.0)
    assert _check(ledger, slow, timeouts={"new": 0.1}) == {}
    assert "cannot tell within its write_timeout_s=0.1 s whether its target" in caplog.text
    assert _check(ledger, Target("new", harmless="it upserts by key")) == {}
    harmless = (
        "holds batch 3 of sink 'old' (epoch 0, its records keyed 'fanout/p/old'), a sink the "
        "pipeline no longer configures, and sink 'new' has no mark in the epoch; it upserts "
        "by key, so writing the batch again is harmless: writing it"
    )
    assert harmless in caplog.text


def test_a_sink_type_without_the_hook_is_not_asked() -> None:
    plain = Sink("new")  # the default hook (cannot tell): not asked, no warning
    assert _check(_ledger({"old": [0]}), plain) == {}
