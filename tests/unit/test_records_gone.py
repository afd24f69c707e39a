"""A sink whose own records of its last marked batch are gone while its target holds rows
(fanout.steps.lost_target and, at a new epoch's start, fanout.steps.unmarked;
:meth:`fanout.Sink.records_gone`): refused with a
SinkRecordsGoneError naming the sink, the batch, what is gone and the ways on, not a
"created again empty" TargetLostError; lagging or accepted as a lost target is; asked only
after holds_batch said False with no replaced reason (a memory ledger, fake sinks)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest

from fanout import BatchInfo, SinkRecordsGoneError, TargetLostError
from fanout.ledger.entry import LedgerEntry
from fanout.ledger.memory import MemoryLedger
from fanout.steps.lost_target import refuse_lost_targets
from fanout.steps.unmarked import refuse_unmarked
from tests.unit.test_lost_target import Replaced, _ledger

INFO = BatchInfo("p", 0, "new", epoch=0)
GONE = "its progress rows were deleted (password s3cr3t)"


class Gone(Replaced):
    """A :class:`Replaced` that answers ``records_gone`` with ``gone`` (``fails``: raises;
    ``hangs``: blocks until released), recording what it was asked."""

    def __init__(self, name: str, held: set[int], gone: str | None = GONE, **kw: object) -> None:
        super().__init__(name, held, **kw)  # type: ignore[arg-type]
        self.gone = gone
        self.gone_asked: list[tuple[int, int, str]] = []
        self.gone_fails, self.gone_hangs = False, threading.Event()
        self.gone_hangs.set()

    def records_gone(self, pipeline: str, epoch: int, batch_id: int) -> str | None:
        self.gone_asked.append((epoch, batch_id, threading.current_thread().name))
        self.gone_hangs.wait(10)
        if self.gone_fails:
            raise OSError("cannot read the records (s3cr3t)")
        return self.gone


def _refuse(*sinks: Gone, lags: tuple[str, ...] = (), accepted: tuple[str, ...] = (),
            timeouts: dict[str, float] | None = None) -> dict[str, TargetLostError]:  # fmt: skip
    ledger = _ledger({s.name: [3, 3, 0] for s in sinks})  # batch 2 wrote no row
    named = {s.name: s for s in sinks}
    return refuse_lost_targets("p", 0, ledger, named, ledger.last_committed("p", named),
                               accepted, timeouts, lags=lags)  # fmt: skip


def _refused_for(call: Callable[[], object], sink: str, batch: int) -> str:
    """The text of the SinkRecordsGoneError ``call`` raises, naming ``sink`` and ``batch``."""
    with pytest.raises(SinkRecordsGoneError) as refused:
        call()
    assert (refused.value.sink, refused.value.batch_id) == (sink, batch)
    return str(refused.value)


def test_records_gone_refuse_naming_sink_batch_what_is_gone_and_the_ways_on() -> None:
    a = Gone("a", set())
    text = _refused_for(lambda: _refuse(a), "a", 1)
    assert text.startswith(
        "sink 'a', batch 1: pipeline 'p', sink 'a': its own records of batch 1 of epoch 0, "
        "which the ledger marks written to path '/data/silver' (its last marked batch that "
        "wrote rows), are gone, and the target still holds rows: its progress rows were "
        "deleted (password ***). Its target was not found lost"
    )
    assert "a batch written after batch 1 and never marked" in text
    assert "Nothing was written by this run.\nWays on: restore the sink's records" in text
    assert "`fanout run PIPELINE.toml --accept-lost-target a`" in text
    assert "holds no row of batch 2" in text
    assert "created again empty" not in text and "s3cr3t" not in text
    assert a.asked == [(0, 2), (0, 1)] and [q[:2] for q in a.gone_asked] == [(0, 1)]


def test_no_records_gone_leaves_the_lost_target_refusal_and_held_is_never_asked() -> None:
    lost, held = Gone("lost", set(), gone=None), Gone("held", {0, 1})
    with pytest.raises(TargetLostError) as refused:
        _refuse(held, lost)
    assert type(refused.value) is TargetLostError
    assert "created again empty" in str(refused.value)
    assert held.gone_asked == [] and [q[:2] for q in lost.gone_asked] == [(0, 1)]


def test_a_replaced_reason_is_not_asked_whether_the_records_are_gone() -> None:
    a = Gone("a", {0, 1}, reason="table t has OID 7 now, not 5, and holds no row")
    with pytest.raises(TargetLostError, match="created again empty: table t has OID 7"):
        _refuse(a)
    assert a.gone_asked == []


def test_records_gone_of_a_lagging_sink_lag_and_of_an_accepted_one_write_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lag, ok = Gone("lag", set()), Gone("ok", set())
    with caplog.at_level(logging.WARNING, logger="fanout"):
        lost = _refuse(lag, ok, lags=("lag",), accepted=("ok",))
    assert list(lost) == ["lag"] and isinstance(lost["lag"], SinkRecordsGoneError)
    assert "with on_failure='lag' it lags" in str(lost["lag"])
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "pipeline p, sink ok: its own records of batch 1 of epoch 0 are gone (its progress "
        "rows were deleted (password ***)); accepted (accept_lost_targets): it writes on, and "
        "a batch written after that mark and never marked is written a second time"
    ]


def test_a_records_gone_hook_that_fails_or_hangs_cannot_tell(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Logged (masked), and holds_batch's False stands: the lost-target refusal."""
    fails = Gone("fails", set())
    fails.gone_fails = True
    with caplog.at_level(logging.WARNING, logger="fanout"), pytest.raises(TargetLostError) as r:
        _refuse(fails)
    assert type(r.value) is TargetLostError
    assert caplog.records[-1].getMessage() == (
        "pipeline p, sink fails: cannot tell whether its own records of batch 1 of epoch 0 "
        "are gone: OSError: cannot read the records (***)"
    )
    hangs = Gone("hangs", set())
    hangs.gone_hangs.clear()
    try:
        with pytest.raises(TargetLostError) as r:
            _refuse(hangs, timeouts={"hangs": 0.2})
    finally:
        hangs.gone_hangs.set()
    assert type(r.value) is TargetLostError
    assert [q[2] for q in hangs.gone_asked] == ["fanout-p-hangs-records-gone"]


def _epoch_ledger(sinks: dict[str, int]) -> MemoryLedger:
    """Marks of epoch 0 up to each sink's last, each with 3 rows (the old query's)."""
    ledger = MemoryLedger()
    for sink, last in sinks.items():
        for batch in range(last + 1):
            ledger.mark_committed(LedgerEntry("p", sink, batch, "committed", rows=3,
                                              query_id="old"))  # fmt: skip
    return ledger


def test_a_new_epoch_is_refused_when_a_sink_saying_not_held_lost_its_records() -> None:
    """Its "does not hold batch 3" is no answer: asked about its last mark that wrote rows
    (2), its records are gone; the start is refused, nothing recorded; the same sink with
    its records there, or without the hook, lets the epoch start."""
    ledger = _epoch_ledger({"a": 2, "b": 2})
    a, b = Gone("a", set()), Gone("b", {0, 1, 2}, gone=None)
    text = _refused_for(lambda: refuse_unmarked(INFO, ledger, {"a": a, "b": b}), "a", 3)
    assert text.startswith(
        "sink 'a', batch 3: pipeline 'p': query new cannot start epoch 1: the records sink "
        "'a' keeps of batch 2 of epoch 0, which the ledger marks written to path "
        "'/data/silver', are gone, and the target still holds rows: its progress rows were "
        "deleted (password ***). Without them its answer that it does not hold batch 3"
    )
    assert "Nothing was written under epoch 1.\nWays on: restore the sink's records" in text
    assert "`--accept-lost-target a`" in text and "s3cr3t" not in text
    assert [q[:2] for q in a.gone_asked] == [(0, 2)] and b.gone_asked == []
    assert ledger.last_committed("p", ["a", "b"]) == {"a": 2, "b": 2}  # no lost mark
    a.gone = None
    refuse_unmarked(INFO, ledger, {"a": a, "b": b})


def test_a_new_epoch_starts_for_an_accepted_sink_whose_records_are_gone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger = _epoch_ledger({"a": 2})
    with caplog.at_level(logging.WARNING, logger="fanout"):
        refuse_unmarked(INFO, ledger, {"a": Gone("a", set())}, accepted=("a",))
    assert [r.getMessage() for r in caplog.records] == [
        "pipeline p, sink a: its own records of batch 2 of epoch 0 are gone (its progress "
        "rows were deleted (password ***)); accepted (accept_lost_targets): epoch 1 starts, "
        "and batch 3, if it was written and never marked, is written a second time"
    ]


class HarmlessGone(Gone):
    """A :class:`Gone` whose rewrite of a batch is harmless (an upsert by key)."""

    def harmless_rewrite(self) -> str | None:
        return "it upserts by key"


def test_records_gone_of_a_sink_rewriting_harmlessly_pass_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No loss and no second copy to refuse for: a replay of a batch written unmarked
    rewrites its keys. At a run's check and at a new epoch's start, logged (masked)."""
    up = HarmlessGone("up", set())
    with caplog.at_level(logging.WARNING, logger="fanout"):
        assert _refuse(up) == {}
        refuse_unmarked(INFO, _epoch_ledger({"up": 2}), {"up": HarmlessGone("up", set())})
    said = (
        "pipeline p, sink up: its own records of batch {} of epoch 0 are gone (its progress "
        "rows were deleted (password ***)); it writes on, as a batch written again is "
        "harmless there (it upserts by key): a batch written after that mark and never "
        "marked is written again over itself"
    )
    assert [r.getMessage() for r in caplog.records] == [said.format(1), said.format(2)]
