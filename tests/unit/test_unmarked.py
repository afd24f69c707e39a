"""The check before a new epoch starts (fanout.steps.unmarked): which sinks are asked, what
a sink that cannot tell does, and that the lost mark is recorded (a memory ledger, fake
sinks: the real sinks' hooks are tested against their services)."""

from __future__ import annotations

import copy
import logging
import pickle
from typing import Any

import pytest

from fanout import BatchInfo, PartlyHeld, Sink, UnmarkedBatchError
from fanout.ledger.entry import LedgerEntry
from fanout.ledger.memory import MemoryLedger
from fanout.steps.unmarked import refuse_unmarked


class Answering(Sink):
    """Holds the batches in ``held`` of epoch 0; records what it was asked."""

    def __init__(self, name: str, held: set[int] | None = None, fails: bool = False) -> None:
        super().__init__(name)
        self.held, self.fails, self.asked = held, fails, []

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool | None:
        self.asked.append((epoch, batch_id))
        if self.fails:
            raise OSError("target unreachable")
        return None if self.held is None else batch_id in self.held


def _ledger(marks: dict[str, int]) -> MemoryLedger:
    ledger = MemoryLedger()
    for sink, last in marks.items():
        for batch in range(last + 1):
            ledger.mark_committed(LedgerEntry("p", sink, batch, "committed", query_id="old"))
    return ledger


INFO = BatchInfo("p", 0, "new", epoch=0)


def _about(error: UnmarkedBatchError) -> tuple[object, ...]:
    """What ``error``'s attributes say it is about: its sinks, sink, batch, epoch, answer."""
    return (error.sinks, error.sink, error.batch_id, error.epoch, error.holds)


def test_no_sink_holds_the_next_batch_passes_and_records_nothing() -> None:
    ledger = _ledger({"a": 2, "b": 2})
    sinks = {"a": Answering("a", {0, 1, 2}), "b": Answering("b", set())}
    refuse_unmarked(INFO, ledger, sinks)
    assert sinks["a"].asked == [(0, 3)] and sinks["b"].asked == [(0, 3)]
    assert ledger.last_committed("p", ["a", "b"]) == {"a": 2, "b": 2}


def test_a_sink_holding_the_next_batch_is_refused_and_its_mark_recorded() -> None:
    ledger = _ledger({"a": 2, "b": 2, "c": 2})
    sinks = {"a": Answering("a", {3}), "b": Answering("b", set()), "c": Answering("c")}
    with pytest.raises(UnmarkedBatchError) as refused:
        refuse_unmarked(INFO, ledger, sinks)
    assert "sink a holds batch 3 of epoch 0" in str(refused.value)
    assert "sinks without it: b (mark 2), c (mark 2, cannot tell)." in str(refused.value)
    assert "--sink b --through 3 --epoch 0" in str(refused.value)
    assert _about(refused.value) == (("a",), "a", 3, 0, True)
    assert ledger.last_committed("p", ["a", "b", "c"]) == {"a": 3, "b": 2, "c": 2}
    refuse_unmarked(INFO, ledger, sinks)  # asked again: a about batch 4 now
    assert sinks["a"].asked == [(0, 3), (0, 4)]


def test_a_sink_with_its_next_batch_in_the_spool_is_not_asked() -> None:
    ledger = _ledger({"a": 2, "lagging": 0})
    sinks = {"a": Answering("a", set()), "lagging": Answering("lagging", {1}),
             "new": Answering("new", set())}  # fmt: skip
    refuse_unmarked(INFO, ledger, sinks, lambda epoch: {"lagging": 2, "new": 0})
    assert sinks["lagging"].asked == [] and sinks["new"].asked == []
    assert sinks["a"].asked == [(0, 3)]


def test_a_sink_without_a_mark_is_asked_about_the_epochs_first_batch() -> None:
    """The driver died in epoch 1's first batch (5: the reset's query started it there),
    after sink a committed it: no sink has a mark of epoch 1. Before, nobody was asked and
    epoch 2 wrote batch 5's rows to a again; now a is asked about batch 5 (the epoch row's
    batch), refuses, and its lost mark is recorded."""
    ledger = MemoryLedger()
    ledger.start_epoch(LedgerEntry("p", "*", 5, "epoch", query_id="one", epoch=1))
    sinks = {"a": Answering("a", {5}), "b": Answering("b", set())}
    with pytest.raises(UnmarkedBatchError) as refused:
        refuse_unmarked(BatchInfo("p", 0, "two", epoch=1), ledger, sinks)
    message = str(refused.value)
    assert message.startswith(
        "pipeline 'p': query two cannot start epoch 2: sink a holds batch 5 of epoch 1"
    )
    assert "sinks without it: b (no mark)." in message
    assert (
        "  1. Resume at epoch 1's start, before its first batch 5 (where it began: the "
        "replaced checkpoint's offsets/4 file; `fanout recover --ledger"
    ) in message
    assert "--sink b --through 5 --epoch 1`" in message
    assert sinks["a"].asked == [(1, 5)] and sinks["b"].asked == [(1, 5)]
    assert ledger.last_committed("p", ["a", "b"], 1) == {"a": 5, "b": None}
    [lost] = ledger.committed_entries("p", 0, 1)
    assert (lost.sink, lost.batch_id, lost.query_id, lost.rows, lost.lost) == (
        "a",
        5,
        "one",
        None,
        True,
    )


class Upserting(Answering):
    """An :class:`Answering` whose rewrite of a held batch is harmless."""

    def harmless_rewrite(self) -> str | None:
        return "it upserts by key"


def test_a_sink_whose_rewrite_is_harmless_is_not_refused_but_its_mark_recorded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before, an upserting sink holding batch 3 refused the start like an appending one.
    Now the start passes, the lost mark is recorded (marked as rewritten, so a report
    made before is not stale for it) and a warning names the sink and the batch."""
    ledger = _ledger({"up": 2, "b": 2})
    sinks = {"up": Upserting("up", {3}), "b": Answering("b", set())}
    with caplog.at_level(logging.WARNING, logger="fanout"):
        refuse_unmarked(INFO, ledger, sinks)
    assert ledger.last_committed("p", ["up", "b"]) == {"up": 3, "b": 2}
    [lost] = ledger.committed_entries("p", 3)
    assert lost.lost and (lost.error or "").startswith(
        "unmarked, rewritten: recorded when query new asked to start epoch 1: the sink's own "
        "records hold the batch, its mark was lost; writing it again changes nothing: it "
        "upserts by key"
    )
    assert (
        "pipeline p, sink up: holds batch 3 of epoch 0 by its own records without its ledger mark"
    ) in caplog.text
    assert (
        "Epoch 1 starts anyway and may write that batch's rows to the sink again, which "
        "changes nothing: it upserts by key"
    ) in caplog.text


def test_a_harmless_rewrite_beside_a_refused_one_is_named_apart() -> None:
    ledger = _ledger({"up": 2, "a": 2, "b": 2})
    sinks = {"up": Upserting("up", {3}), "a": Answering("a", {3}), "b": Answering("b", set())}
    with pytest.raises(UnmarkedBatchError) as refused:
        refuse_unmarked(INFO, ledger, sinks)
    message = str(refused.value)
    assert message.startswith("pipeline 'p': query new cannot start epoch 1: sink a holds batch 3")
    assert (
        " Sink up holds batch 3 too (mark recorded), but writing it again changes nothing "
        "there: it upserts by key."
    ) in message
    assert "- sink up" not in message and "sinks without it: b (mark 2)." in message
    assert ledger.last_committed("p", ["up", "a", "b"]) == {"up": 3, "a": 3, "b": 2}


def test_a_failing_hook_cannot_tell_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    ledger = _ledger({"a": 1})
    with caplog.at_level(logging.WARNING, logger="fanout"):
        refuse_unmarked(INFO, ledger, {"a": Answering("a", fails=True)})
    assert (
        "pipeline p, sink a: cannot tell whether it holds batch 2 of epoch 0 (written but "
        "never marked) before the new epoch starts: OSError: target unreachable"
    ) in caplog.text


def test_a_failing_hooks_error_is_in_its_answer() -> None:
    """``fanout recover`` prints the answer: it said only "the warning logged says why".
    Asked about several batches in turn, the error of the one it could not tell about."""
    from fanout.steps.unmarked import ask_in_turn

    class FailsOnce(Answering):
        def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool | None:
            self.fails = batch_id == 2
            return super().holds_batch(pipeline, epoch, batch_id)

    held = ask_in_turn(FailsOnce("a", held=set()), "p", 0, (1, 2))
    assert (held.mark, held.holds, held.why) == (2, None, "OSError: target unreachable")


def test_the_refused_query_again_when_every_sink_counts_the_batch_is_refused_again() -> None:
    """A one-sink pipeline: the refusal records a's lost mark 3, so recover resumes after
    batch 3; the refused query (its checkpoint starts after batch 2) started again would
    write batch 3 to a a second time (it was asked about batch 4 only, and passed). Another
    query (a new checkpoint) passes; so does the refused one once a no longer holds 3."""
    ledger = _ledger({"a": 2})
    a = Answering("a", {3})
    with pytest.raises(UnmarkedBatchError, match="sink a holds batch 3 of epoch 0"):
        refuse_unmarked(INFO, ledger, {"a": a})
    with pytest.raises(UnmarkedBatchError) as again:
        refuse_unmarked(INFO, ledger, {"a": a})
    assert str(again.value).startswith(
        "pipeline 'p': query new cannot start epoch 1: it was refused before because sink a "
        "held batch 3 of epoch 0 unmarked, so its checkpoint starts before that batch"
    )
    assert _about(again.value) == (("a",), "a", 3, 0, True)  # asked again: still holds it
    assert a.asked == [(0, 3), (0, 3)]
    refuse_unmarked(BatchInfo("p", 0, "newer", epoch=0), ledger, {"a": a})
    a.held = set()
    refuse_unmarked(INFO, ledger, {"a": a})
    assert ledger.last_committed("p", ["a"]) == {"a": 3}


def test_the_refused_query_again_resuming_at_the_epochs_start_passes() -> None:
    """Sink a held epoch 1's first batch (5), b has no mark: the refusal's choice 1 resumes
    at the epoch's start, so the refused query (its checkpoint starts there) started again
    passes and a gets batch 5 a second time, as that choice says. It was refused as if
    every sink counted batch 5 (b's missing mark left out). With b's batch 5 given up
    (choice 2), every sink counts it, and the query is refused again."""
    ledger = MemoryLedger()
    ledger.start_epoch(LedgerEntry("p", "*", 5, "epoch", query_id="one", epoch=1))
    sinks = {"a": Answering("a", {5}), "b": Answering("b", set())}
    two = BatchInfo("p", 0, "two", epoch=1)
    with pytest.raises(UnmarkedBatchError, match="sink a holds batch 5 of epoch 1"):
        refuse_unmarked(two, ledger, sinks)
    refuse_unmarked(two, ledger, sinks)
    assert sinks["a"].asked == [(1, 5), (1, 6)]
    ledger.mark_committed(LedgerEntry("p", "b", 5, "committed", query_id=None, epoch=1))
    with pytest.raises(UnmarkedBatchError, match="it was refused before because sink a held"):
        refuse_unmarked(two, ledger, sinks)


def test_a_harmless_rewrite_no_sink_needs_is_refused_as_before_and_stays_refused() -> None:
    """silver marked batch 3, up wrote it and lost its mark: recover (counting up at 2) said
    resume after batch 2, so the new epoch would write batch 3 again to silver too. Before,
    up's harmless rewrite let the start pass (silver's rows twice); now nothing lacks batch
    3, so the start is refused as for any held batch, and so is the refused query again.
    A pipeline of harmless sinks only still passes."""
    ledger = _ledger({"up": 2, "silver": 3})
    sinks = {"up": Upserting("up", {3}), "silver": Answering("silver", {3})}
    with pytest.raises(UnmarkedBatchError) as refused:
        refuse_unmarked(INFO, ledger, sinks)
    assert "sink up holds batch 3 of epoch 0" in str(refused.value)
    assert "sinks without it: none." in str(refused.value)
    [lost] = [e for e in ledger.committed_entries("p", 3, 0) if e.sink == "up"]
    assert (lost.error or "").startswith("unmarked: recorded when query new was refused")
    with pytest.raises(UnmarkedBatchError, match="it was refused before because sink up held"):
        refuse_unmarked(INFO, ledger, sinks)

    alone = _ledger({"up": 2, "up2": 3})
    refuse_unmarked(INFO, alone, {"up": Upserting("up", {3}), "up2": Upserting("up2", {3})})
    assert alone.last_committed("p", ["up", "up2"]) == {"up": 3, "up2": 3}


def test_the_refused_query_again_after_the_copy_was_removed_stays_refused_when_a_sink_marked_it(
) -> None:  # fmt: skip
    """silver marked batch 3, a wrote it and lost its mark, and the start from recover's
    offsets (after batch 2) was refused. The refusal named a restore of a's copy although no
    sink lacked the batch; done, the refused query passed and wrote batch 3 to silver a
    second time (and recover, counting a's lost mark, resumed after the batch a no longer
    held). Now the refusal names no removal when a sink marked the batch, and the refused
    query stays refused while one did, copy removed or not."""
    ledger = _ledger({"a": 2, "silver": 3})
    a = Answering("a", {3})
    a.remove_batch_hint = lambda *_: "restore the table to version 2"  # type: ignore[method-assign]
    sinks = {"a": a, "silver": Answering("silver", {3})}
    with pytest.raises(UnmarkedBatchError) as refused:
        refuse_unmarked(INFO, ledger, sinks)
    assert "sinks without it: none." in str(refused.value)
    assert "restore the table" not in str(refused.value)
    a.held = set()  # its copy removed all the same
    with pytest.raises(UnmarkedBatchError) as again:
        refuse_unmarked(INFO, ledger, sinks)
    assert str(again.value).startswith(
        "pipeline 'p': query new cannot start epoch 1: it was refused before because sink a "
        "held batch 3 of epoch 0 unmarked, so its checkpoint starts before that batch, and "
        "sink silver wrote and marked batch 3: started again, this query would write batch "
        "3's rows a second time there."
    )
    assert _about(again.value) == (("a",), "a", 3, 0, None)  # not asked again
    refuse_unmarked(BatchInfo("p", 0, "newer", epoch=0), ledger, sinks)  # a new checkpoint


class Partly(Sink):
    """Holds ``committed`` of ``partitions`` partitions of batch ``batch`` of epoch 0."""

    def __init__(self, name: str, batch: int, committed: int, partitions: int | None) -> None:
        super().__init__(name)
        self.batch, self.part = batch, PartlyHeld(committed, partitions)

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool | PartlyHeld | None:
        return self.part if batch_id == self.batch else False

    def harmless_rewrite(self) -> str | None:
        return "upserts by key"  # not for part of a batch: the old checkpoint completes it


def test_a_sink_holding_part_of_the_next_batch_is_refused_and_no_mark_recorded() -> None:
    """A lost mark says the sink holds the whole batch: recorded for part of it, a replay
    of the old checkpoint skipped the partitions that never committed (rows lost). The
    start is refused (even for a harmless rewrite), nothing is recorded, and asked again it
    is refused again, until the old checkpoint completes the batch or a skip marks it."""
    ledger = _ledger({"a": 2, "b": 3})
    sinks = {"a": Partly("a", 3, 1, 4), "b": Answering("b", {0, 1, 2, 3})}
    for _ in range(2):
        with pytest.raises(UnmarkedBatchError) as refused:
            refuse_unmarked(INFO, ledger, sinks)
        assert ledger.last_committed("p", ["a", "b"]) == {"a": 2, "b": 3}
    text = str(refused.value)
    assert "cannot start epoch 1: sink a holds part of batch 3 of epoch 0 by its own " in text
    assert _about(refused.value) == (("a",), "a", 3, 0, PartlyHeld(1, 4))
    assert "Nothing was written under epoch 1.\n" in text and "now records" not in text
    lines = text.splitlines()
    assert lines[1] == (
        "- sink a: part of batch 3 of epoch 0, 1 of 4 partitions committed (by its own "
        "records); no lost mark is recorded for it: a mark says the sink holds the whole "
        "batch, and a replay of batch 3 would then skip the other 3 of 4 partitions."
    )
    assert lines[2].startswith(
        "  1. Restart the query on its old checkpoint (the one that wrote the batch, not a "
        "new one, and without a reset): it replays batch 3, skips the 1 committed partitions "
        "and writes the other 3 of 4 partitions: nothing lost, nothing twice."
    )
    assert "--sink a --through 3 --epoch 0`" in lines[3]
    assert lines[4] == (
        "  2. Resume after batch 2: a gets the 1 committed partitions' rows of batch 3 a "
        "second time (b marked batch 3: it gets it a second time too)."
    )
    assert lines[5].startswith("  3. Or resume after batch 3 (the source offsets of batch 3")
    assert lines[5].endswith("a never gets the other 3 of 4 partitions' rows of batch 3.")


def test_a_part_of_unknown_size_is_named_so() -> None:
    ledger = _ledger({"a": 2})
    with pytest.raises(UnmarkedBatchError) as refused:
        refuse_unmarked(INFO, ledger, {"a": Partly("a", 3, 2, None)})
    assert "2 of ? partitions committed" in str(refused.value)
    assert "would then skip the other partitions." in str(refused.value)
    assert ledger.last_committed("p", ["a"]) == {"a": 2}


class OrLater(Answering):
    """Answers as the Delta sink does: holds ``batch_id`` when it holds that batch or a
    later one (its app transaction's version)."""

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool | None:
        self.asked.append((epoch, batch_id))
        return batch_id <= max(self.held or {-1})


def test_a_sink_added_mid_epoch_is_asked_about_the_batches_at_the_others_high_water_mark() -> None:
    """gold joined at batch 5 and lost its mark of it; a and b marked batches 0-5. Asked
    about the epoch's first batch, it said "held" (that batch or a later one), and its
    lost mark was recorded at batch 0, which it never got. Now it is asked about batch 6,
    then 5, and the mark is recorded at 5."""
    ledger = _ledger({"a": 5, "b": 5})
    sinks = {"a": Answering("a", set()), "b": Answering("b", set()), "gold": OrLater("gold", {5})}
    with pytest.raises(UnmarkedBatchError) as refused:  # this query starts before batch 5
        refuse_unmarked(INFO, ledger, sinks)
    assert "sink gold holds batch 5 of epoch 0" in str(refused.value)
    assert "Every sink holds batch 5, so resume after it" in str(refused.value)
    assert sinks["gold"].asked == [(0, 6), (0, 5)]
    assert ledger.last_committed("p", ["a", "b", "gold"]) == {"a": 5, "b": 5, "gold": 5}


def test_a_sink_added_mid_epoch_holding_the_batch_in_flight_is_refused_at_it() -> None:
    ledger = _ledger({"a": 5})
    sinks = {"a": Answering("a", set()), "gold": OrLater("gold", {6})}
    with pytest.raises(UnmarkedBatchError) as refused:
        refuse_unmarked(INFO, ledger, sinks)
    assert sinks["gold"].asked == [(0, 6)]
    assert "sink gold holds batch 6 of epoch 0" in str(refused.value)
    assert "  1. Resume after batch 5, where `fanout recover" in str(refused.value)
    assert ledger.last_committed("p", ["a", "gold"]) == {"a": 5, "gold": 6}


def test_a_sink_added_mid_epoch_holding_nothing_is_asked_down_to_the_epochs_first() -> None:
    ledger = _ledger({"a": 5})
    sinks = {"a": Answering("a", set()), "gold": Answering("gold", set())}
    refuse_unmarked(INFO, ledger, sinks)
    assert sinks["gold"].asked == [(0, 6), (0, 5), (0, 0)]
    assert ledger.last_committed("p", ["a", "gold"]) == {"a": 5, "gold": None}


class ReplacedUpserting(Upserting):
    """An :class:`Upserting` whose target was re-created empty since (``reason``; ``None``:
    the same target), or whose identity check raises (``identity_fails``)."""

    def __init__(
        self,
        name: str,
        held: set[int] | None,
        reason: str | None,
        identity_fails: bool = False,
    ) -> None:
        super().__init__(name, held)
        self.reason, self.identity_fails = reason, identity_fails
        self.replaced_asked: list[tuple[int, int]] = []

    def target_replaced(self, pipeline: str, epoch: int, batch_id: int) -> str | None:
        self.replaced_asked.append((epoch, batch_id))
        if self.identity_fails:
            raise OSError("no identity")
        return self.reason


def test_a_target_re_created_empty_holds_nothing_at_a_new_epochs_start() -> None:
    """Its records say it holds batch 3, its identity that the table was re-created empty
    since: it does not hold it (as holds_batch said when it checked the identity itself). A
    lost mark recorded for it (its rewrite harmless) would count a batch the target no
    longer holds; an appending one would refuse the start for a copy that is not there."""
    ledger = _ledger({"up": 2, "app": 2})
    up = ReplacedUpserting("up", {3}, "table t has OID 7 now, not 5, and holds no row")
    sinks = {"up": up, "app": Answering("app", set())}
    refuse_unmarked(INFO, ledger, sinks)
    assert ledger.last_committed("p", ["up", "app"]) == {"up": 2, "app": 2}
    assert ledger.committed_entries("p", 3) == []
    assert up.replaced_asked == [(0, 3)]


def test_the_identity_is_asked_only_of_a_held_batch_and_a_failing_one_leaves_held() -> None:
    """Not asked when holds_batch said no; a check that raises (logged) or says the same
    target leaves holds_batch's answer: the lost mark recorded, the harmless rewrite."""
    from fanout.steps.unmarked import ask

    none = ReplacedUpserting("none", set(), "never asked")
    assert ask(none, "p", 0, 2).holds is False and none.replaced_asked == []
    for sink in (
        ReplacedUpserting("same", {3}, None),
        ReplacedUpserting("fails", {3}, "never returned", identity_fails=True),
    ):
        held = ask(sink, "p", 0, 2)
        assert (held.holds, held.replaced, held.harmless) == (True, None, "it upserts by key")
        assert sink.replaced_asked == [(0, 3)]


def test_fanout_recover_says_a_re_created_target_does_not_hold_the_batch_and_why() -> None:
    from fanout.app.recover import _answer_text
    from fanout.steps.unmarked import ask

    held = ask(ReplacedUpserting("up", {3}, "topic t has id B now, not A"), "p", 0, 2)
    assert (held.holds, held.replaced) == (False, "topic t has id B now, not A")
    assert _answer_text(held) == (
        "does not hold batch 3: its records say it does, but the target was replaced since "
        "by one created again empty (topic t has id B now, not A)"
    )


def test_an_identity_check_that_does_not_answer_in_time_leaves_held(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A timed sink whose records answered "held" in time but whose target_replaced hangs:
    as the contract says, logged and counted as no reason (holds_batch's answer stands: its
    lost mark, its harmless rewrite), in a thread of its own; not a SinkTimeoutError blaming
    a holds_batch() that returned."""
    import threading

    from fanout.steps.unmarked import ask

    gate = threading.Event()
    names: list[str] = []

    class Hangs(ReplacedUpserting):
        def target_replaced(self, pipeline: str, epoch: int, batch_id: int) -> str | None:
            names.append(threading.current_thread().name)
            gate.wait(10)
            return "returned too late"

    try:
        with caplog.at_level(logging.WARNING, logger="fanout"):
            held = ask(Hangs("slow", {3}, None), "p", 0, 2, 0.2)
    finally:
        gate.set()
    assert (held.holds, held.replaced, held.harmless) == (True, None, "it upserts by key")
    assert names == ["fanout-p-slow-target-replaced"]
    assert [r.getMessage() for r in caplog.records] == [
        "pipeline p, sink slow: cannot tell within its write_timeout_s=0.2 s whether its "
        "target is still the one batch 3 of epoch 0 was written to"
    ]


class Fencing(Answering):
    """An :class:`Answering` that closes earlier epochs (:meth:`Sink.fence_earlier_epochs`);
    ``log``, shared by the sinks, records every call in order."""

    def __init__(self, name: str, log: list[tuple[str, ...]], held: set[int] | None = None,
                 fence_fails: bool = False) -> None:  # fmt: skip
        super().__init__(name, held)
        self.log, self.fence_fails = log, fence_fails

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool | None:
        self.log.append(("holds", self.name, f"{epoch}/{batch_id}"))
        return super().holds_batch(pipeline, epoch, batch_id)

    def fence_earlier_epochs(self, pipeline: str, epoch: int) -> None:
        self.log.append(("fence", self.name, str(epoch)))
        if self.fence_fails:
            raise OSError("fence: target unreachable")

    def lift_epoch_fence(self, pipeline: str, epoch: int) -> None:
        self.log.append(("lift", self.name, str(epoch)))


LIFT_BY_HAND = (
    "lift it with `fanout ledger lift-fence --config PIPELINE.toml --epoch 1` (PIPELINE.toml: "
    "the pipeline's file; every sink of it that fences, or --sink NAME for one), or, for a "
    "sink built in code, from Python, with the sink opened "
    "(sink.open(fanout.SinkContext(pipeline))), by sink.lift_epoch_fence('p', 1); then "
    "restart that checkpoint"
)
"""How the core's refusals and warnings say to lift the fence of pipeline p's epoch 1."""


class Lands(Fencing):
    """A :class:`Fencing` that the replaced query's write in flight reaches after its first
    answer: it holds ``lands`` from its second question on (the batch committed between
    the question before the fences and the fence)."""

    def __init__(self, name: str, log: list[tuple[str, ...]], lands: set[int]) -> None:
        super().__init__(name, log, set())
        self.lands = lands

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool | None:
        answer = super().holds_batch(pipeline, epoch, batch_id)
        assert self.held is not None
        self.held |= self.lands  # landed after this answer
        return answer


def test_every_asked_sink_is_asked_then_fenced_then_asked_again_and_a_start_keeps_the_fences(
) -> None:  # fmt: skip
    """A writer of the replaced query committing between the question and a fence would
    be read again by the new epoch: each sink to be asked closes the replaced epoch, then
    each is asked (a lagging sink whose spool holds its batch is neither asked nor fenced:
    its catch-up writes that epoch after the reset); the start passing lifts nothing. The
    sinks are asked once before the fences too, so that a start refused fences nothing;
    that first question, finding nothing, records nothing."""
    log: list[tuple[str, ...]] = []
    ledger = _ledger({"a": 2, "b": 2, "lagging": 0})
    sinks = {"a": Fencing("a", log, set()), "b": Fencing("b", log, set()),
             "lagging": Fencing("lagging", log, {1})}  # fmt: skip
    assert refuse_unmarked(INFO, ledger, sinks, lambda epoch: {"lagging": 2}) == [
        sinks["a"],
        sinks["b"],
    ]
    assert log == [
        ("holds", "a", "0/3"), ("holds", "b", "0/3"),
        ("fence", "a", "1"), ("fence", "b", "1"), ("holds", "a", "0/3"), ("holds", "b", "0/3"),
    ]  # fmt: skip
    assert ledger.last_committed("p", ["a", "b", "lagging"]) == {"a": 2, "b": 2, "lagging": 0}


def test_a_start_refused_by_a_sink_holding_its_batch_fences_nothing() -> None:
    """Before, every asked sink was fenced, then asked, and a refusal lifted the fences:
    two commits in a Delta sink's table (fence, lift) per refused start, a Kafka sink's
    producers fenced, and the replaced query, if it still ran, refused its writes between
    the fence and the lift. Now a sink holding the batch at the first question refuses the
    start before any fence (the log was fence a, fence b, holds a, holds b, lift a, lift b),
    with the lost mark recorded once."""
    log: list[tuple[str, ...]] = []
    ledger = _ledger({"a": 2, "b": 2})
    sinks = {"a": Fencing("a", log, {3}), "b": Fencing("b", log, set())}
    with pytest.raises(UnmarkedBatchError) as refused:
        refuse_unmarked(INFO, ledger, sinks)
    assert str(refused.value).startswith(
        "pipeline 'p': query new cannot start epoch 1: sink a holds batch 3 of epoch 0"
    )
    assert log == [("holds", "a", "0/3"), ("holds", "b", "0/3")]
    assert ledger.last_committed("p", ["a", "b"]) == {"a": 3, "b": 2}
    assert [(e.sink, e.batch_id) for e in ledger.committed_entries("p", 3)] == [("a", 3)]


class FencingFails(Fencing):
    """A :class:`Fencing` whose ``holds_batch`` raises (cannot tell)."""

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool | None:
        self.log.append(("holds", self.name, f"{epoch}/{batch_id}"))
        raise OSError("target unreachable")


def test_a_sink_that_cannot_tell_is_warned_of_once_per_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Asked before the fences and after, a sink whose ``holds_batch`` raises was logged by
    both questions: one warning per start, of the answer that counts (after the fences);
    also when a refusal stops the start before the second question (the ledger's check, a
    sink holding its batch), and nothing recorded for it either way."""
    said = (
        "pipeline p, sink a: cannot tell whether it holds batch 3 of epoch 0 (written but "
        "never marked) before the new epoch starts: OSError: target unreachable"
    )

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]

    log: list[tuple[str, ...]] = []
    ledger = _ledger({"a": 2, "b": 2})
    sinks = {"a": FencingFails("a", log), "b": Fencing("b", log, set())}
    caplog.set_level(logging.WARNING, logger="fanout")
    assert refuse_unmarked(INFO, ledger, sinks) == [sinks["a"], sinks["b"]]
    assert [e for e in log if e[0] == "holds"] == [("holds", "a", "0/3"), ("holds", "b", "0/3")] * 2
    assert warnings() == [said]
    caplog.clear()

    def ledger_refuses() -> None:
        raise UnmarkedBatchError("the ledger refuses")

    with pytest.raises(UnmarkedBatchError, match="the ledger refuses"):
        refuse_unmarked(INFO, ledger, sinks, before_fence=ledger_refuses)
    assert warnings() == [said]  # the first question's, the only one made
    caplog.clear()
    sinks["b"] = Fencing("b", log, {3})
    with pytest.raises(UnmarkedBatchError, match="sink b holds batch 3 of epoch 0"):
        refuse_unmarked(INFO, ledger, sinks)
    assert warnings() == [said]
    assert ledger.last_committed("p", ["a", "b"]) == {"a": 2, "b": 3}


def test_a_write_landing_between_the_first_question_and_the_fence_refuses_and_lifts() -> None:
    """The answer that counts is the one after the fences: sink b's batch 3, in flight,
    committed after b's first answer (not held) and before its fence. The start is
    refused, the lost mark recorded once, and the fences lifted (the replaced query
    still writes)."""
    log: list[tuple[str, ...]] = []
    ledger = _ledger({"a": 2, "b": 2})
    sinks = {"a": Fencing("a", log, set()), "b": Lands("b", log, {3})}
    with pytest.raises(UnmarkedBatchError) as refused:
        refuse_unmarked(INFO, ledger, sinks)
    assert str(refused.value).startswith(
        "pipeline 'p': query new cannot start epoch 1: sink b holds batch 3 of epoch 0"
    )
    assert log == [
        ("holds", "a", "0/3"), ("holds", "b", "0/3"),
        ("fence", "a", "1"), ("fence", "b", "1"), ("holds", "a", "0/3"), ("holds", "b", "0/3"),
        ("lift", "a", "1"), ("lift", "b", "1"),
    ]  # fmt: skip
    assert [(e.sink, e.batch_id) for e in ledger.committed_entries("p", 3)] == [("b", 3)]


def test_a_harmless_rewrite_found_first_is_recorded_once_after_the_fences(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A held batch whose rewrite is harmless does not refuse: the first question passes
    it over (no record, no warning), the one after the fences records its lost mark and
    warns, once."""

    class FencingUpsert(Fencing):
        def harmless_rewrite(self) -> str | None:
            return "it upserts by key"

    log: list[tuple[str, ...]] = []
    ledger = _ledger({"up": 2, "b": 2})
    sinks = {"up": FencingUpsert("up", log, {3}), "b": Fencing("b", log, set())}
    with caplog.at_level(logging.WARNING, logger="fanout"):
        refuse_unmarked(INFO, ledger, sinks)
    assert log == [
        ("holds", "b", "0/3"), ("holds", "up", "0/3"),
        ("fence", "b", "1"), ("fence", "up", "1"), ("holds", "b", "0/3"), ("holds", "up", "0/3"),
    ]  # fmt: skip
    [lost] = ledger.committed_entries("p", 3)
    assert (lost.sink, lost.batch_id, lost.lost) == ("up", 3, True)
    assert [r.getMessage()[:40] for r in caplog.records] == [
        "pipeline p, sink up: holds batch 3 of ep"
    ]


def test_a_fence_that_fails_refuses_the_start_unasked_and_lifts_every_fence() -> None:
    """The failing sink's fence is lifted too: it may have closed part of its records."""
    log: list[tuple[str, ...]] = []
    ledger = _ledger({"a": 2, "b": 2})
    sinks = {"a": Fencing("a", log, set()), "b": Fencing("b", log, set(), fence_fails=True)}
    with pytest.raises(OSError, match="fence: target unreachable"):
        refuse_unmarked(INFO, ledger, sinks)
    assert log == [
        ("holds", "a", "0/3"),
        ("holds", "b", "0/3"),
        ("fence", "a", "1"),
        ("fence", "b", "1"),
        ("lift", "a", "1"),
        ("lift", "b", "1"),
    ]
    assert ledger.last_committed("p", ["a", "b"]) == {"a": 2, "b": 2}


class FencesPartWay(Fencing):
    """A :class:`Fencing` whose fence closes its first scope, then fails at its second (a
    statement failing, a broker not answering): ``fenced``, the scopes still closed."""

    def __init__(self, name: str, log: list[tuple[str, ...]]) -> None:
        super().__init__(name, log, set())
        self.fenced: set[int] = set()

    def fence_earlier_epochs(self, pipeline: str, epoch: int) -> None:
        self.log.append(("fence", self.name, str(epoch)))
        self.fenced.add(epoch - 1)
        raise OSError("fence: scope 2 of 2 failed")

    def lift_epoch_fence(self, pipeline: str, epoch: int) -> None:
        super().lift_epoch_fence(pipeline, epoch)
        self.fenced.discard(epoch - 1)


def test_a_fence_that_fails_part_way_is_lifted_too() -> None:
    """Before, a sink whose fence raised after closing part of its records was not lifted
    (only the sinks fenced before it were): the replaced epoch's checkpoint, restarted as
    the refusal allows, was refused by that sink until someone lifted it by hand."""
    log: list[tuple[str, ...]] = []
    ledger = _ledger({"a": 2, "b": 2})
    b = FencesPartWay("b", log)
    sinks = {"a": Fencing("a", log, set()), "b": b}
    with pytest.raises(OSError, match="fence: scope 2 of 2 failed"):
        refuse_unmarked(INFO, ledger, sinks)
    assert log == [
        ("holds", "a", "0/3"),
        ("holds", "b", "0/3"),
        ("fence", "a", "1"),
        ("fence", "b", "1"),
        ("lift", "a", "1"),
        ("lift", "b", "1"),
    ]
    assert b.fenced == set()
    assert ledger.last_committed("p", ["a", "b"]) == {"a": 2, "b": 2}


def test_a_fence_that_does_not_answer_in_time_is_not_lifted_and_the_refusal_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A fence still running in its thread when write_timeout_s ran out may complete after
    a lift (closing again what it opened): it is not lifted (the sinks fenced before it
    are), and the refusal says a fence may be left and how to lift it by hand."""
    import threading

    from fanout import SinkTimeoutError

    gate = threading.Event()
    log: list[tuple[str, ...]] = []

    class Hangs(Fencing):
        def fence_earlier_epochs(self, pipeline: str, epoch: int) -> None:
            super().fence_earlier_epochs(pipeline, epoch)
            gate.wait(10)

    ledger = _ledger({"a": 2, "b": 2})
    sinks = {"a": Fencing("a", log, set()), "b": Hangs("b", log, set())}
    try:
        with pytest.raises(SinkTimeoutError) as refused:
            refuse_unmarked(INFO, ledger, sinks, timeouts={"b": 0.2})
    finally:
        gate.set()
    assert log == [
        ("holds", "a", "0/3"),
        ("holds", "b", "0/3"),
        ("fence", "a", "1"),
        ("fence", "b", "1"),
        ("lift", "a", "1"),
    ]
    assert str(refused.value) == (
        "sink 'b': could not close epoch 0 to its writes still in flight within its "
        "write_timeout_s=0.2 s (fence_earlier_epochs() did not return): epoch 1 does not "
        "start, since a task of the replaced query could then commit a batch the new epoch "
        "reads again. Find what holds the sink's target (a transaction of that query left "
        "open, a stalled connection) and restart the query, or raise write_timeout_s. "
        "The fence may still complete (it was not lifted, since a lift could be overtaken by "
        "it): a restart of epoch 0's checkpoint may then be refused by the sink; " + LIFT_BY_HAND
    )


def test_a_fence_still_running_when_its_wait_is_interrupted_is_not_lifted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The wait for a bounded fence interrupted (Ctrl-C, KeyboardInterrupt in the driver's
    thread) while the fence still runs in its own thread: as for a fence that did not
    answer in time, a lift could be overtaken by it, so that sink is not lifted (the sinks
    fenced before it are). Before, every exception lifted the failing sink, whether its
    fence had returned (raised) or was still running."""
    import threading

    import fanout.steps.unmarked.epoch_fence as epoch_fence

    gate = threading.Event()
    log: list[tuple[str, ...]] = []
    real = epoch_fence.bounded

    class Hangs(Fencing):
        def fence_earlier_epochs(self, pipeline: str, epoch: int) -> None:
            super().fence_earlier_epochs(pipeline, epoch)
            gate.wait(10)

    def interrupted(sink: Sink, pipeline: str, ask: Any, timeout_s: Any, hook: str = "") -> Any:
        if hook != "fence" or sink.name != "b":
            return real(sink, pipeline, ask, timeout_s, hook)
        threading.Thread(target=ask, daemon=True).start()  # the fence runs on
        while ("fence", "b", "1") not in log:
            gate.wait(0.01)
        raise KeyboardInterrupt  # the wait for it interrupted

    monkeypatch.setattr(epoch_fence, "bounded", interrupted)
    ledger = _ledger({"a": 2, "b": 2})
    sinks = {"a": Fencing("a", log, set()), "b": Hangs("b", log, set())}
    try:
        with pytest.raises(KeyboardInterrupt):
            refuse_unmarked(INFO, ledger, sinks, timeouts={"b": 5.0})
    finally:
        gate.set()
    assert log == [
        ("holds", "a", "0/3"),
        ("holds", "b", "0/3"),
        ("fence", "a", "1"),
        ("fence", "b", "1"),
        ("lift", "a", "1"),
    ]


def test_a_refused_start_leaves_the_fences_of_the_epoch_another_query_started_meanwhile(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two new checkpoints (or one started twice) starting the same epoch at once: the
    other's start passes and is committed while this one is asked (or this one's question
    fails, or finds a batch); this one's refusal must not lift the replaced epoch's fence
    the other, now running that epoch, relies on against the replaced query's stragglers.
    The warning that the fences stay is said word for word."""
    log: list[tuple[str, ...]] = []
    ledger = _ledger({"a": 2})

    class StartedMeanwhile(Lands):
        def fence_earlier_epochs(self, pipeline: str, epoch: int) -> None:
            super().fence_earlier_epochs(pipeline, epoch)
            ledger.start_epoch(LedgerEntry("p", "*", 0, "epoch", query_id="other", epoch=1))

    with caplog.at_level(logging.WARNING, logger="fanout"), pytest.raises(UnmarkedBatchError):
        refuse_unmarked(INFO, ledger, {"a": StartedMeanwhile("a", log, {3})})
    assert log == [("holds", "a", "0/3"), ("fence", "a", "1"), ("holds", "a", "0/3")]
    assert [r.getMessage() for r in caplog.records] == [
        "pipeline p: epoch 1's start was refused; the sinks' fences closing epoch 0 to writes "
        "still in flight stay (another query started epoch 1 meanwhile and relies on them). "
        "A restart of epoch 0's checkpoint is refused by those sinks; each refusal says how "
        "to lift its fence by hand"
    ]


def test_a_lift_that_fails_is_logged_whole_and_the_refusal_stands(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A refused start whose lift raises: the refusal stands (the sink's batch, its lost
    mark recorded), and the warning says, word for word, which fence stays and how to lift
    it by hand."""
    log: list[tuple[str, ...]] = []
    ledger = _ledger({"b": 2})

    class LiftFails(Lands):
        def lift_epoch_fence(self, pipeline: str, epoch: int) -> None:
            super().lift_epoch_fence(pipeline, epoch)
            raise OSError("lift: target unreachable")

    with caplog.at_level(logging.WARNING, logger="fanout"), pytest.raises(UnmarkedBatchError):
        refuse_unmarked(INFO, ledger, {"b": LiftFails("b", log, {3})})
    assert log == [
        ("holds", "b", "0/3"),
        ("fence", "b", "1"),
        ("holds", "b", "0/3"),
        ("lift", "b", "1"),
    ]
    assert [(e.sink, e.batch_id) for e in ledger.committed_entries("p", 3)] == [("b", 3)]
    assert [r.getMessage() for r in caplog.records] == [
        "pipeline p, sink b: epoch 1 was refused, but the fence closing epoch 0 to writes "
        "still in flight could not be lifted (OSError: lift: target unreachable): a restart "
        "of that epoch's checkpoint is refused by the sink until it is; " + LIFT_BY_HAND
    ]


def test_the_ledgers_own_refusal_is_read_after_the_first_question_and_before_the_fences(
) -> None:  # fmt: skip
    """``before_fence`` (the ledger's check of the start, ``Admission.check_start``: a
    batch committed after the report, another query's start first) runs after the first
    question and before any fence: a start it refuses fences nothing (before, the ledger
    refused at the start's commit, after the fences, which were then lifted). A start it
    passes goes on to the fences and the question that counts."""
    from fanout import ZombieBatchError

    log: list[tuple[str, ...]] = []
    ledger = _ledger({"a": 2})

    def zombie() -> None:
        log.append(("ledger",))
        raise ZombieBatchError("a batch of epoch 0 committed after the report")

    with pytest.raises(ZombieBatchError):
        refuse_unmarked(INFO, ledger, {"a": Fencing("a", log, set())}, before_fence=zombie)
    assert log == [("holds", "a", "0/3"), ("ledger",)]
    log.clear()
    refuse_unmarked(INFO, ledger, {"a": Fencing("a", log, set())},
                    before_fence=lambda: log.append(("ledger",)))  # fmt: skip
    assert log == [("holds", "a", "0/3"), ("ledger",), ("fence", "a", "1"), ("holds", "a", "0/3")]


def test_a_start_another_query_made_first_is_refused_before_any_fence(tmp_path: Any) -> None:
    """Two new checkpoints of one pipeline: the other query started epoch 1 already. The
    ledger's check (``Admission.check_start``, ``DeltaLedger.check_start``) refuses this
    start after the first question and before its fences, with the start commit's own
    text; before, it fenced the sinks (a Delta commit each, the running epoch's fence made
    again) and was refused at its start commit only."""
    from functools import partial

    from fanout import CheckpointResetError
    from fanout.ledger.delta import DeltaLedger
    from fanout.steps.admit import Admission

    ledger = DeltaLedger(str(tmp_path / "ledger"))
    ledger.open()
    for batch in range(3):
        ledger.mark_committed(LedgerEntry("p", "a", batch, "committed", query_id="old"))
    ledger.start_epoch(LedgerEntry("p", "*", 3, "epoch", query_id="other", epoch=1))
    log: list[tuple[str, ...]] = []
    check = partial(Admission(ledger, "new_epoch").check_start, INFO)
    with pytest.raises(CheckpointResetError) as refused:
        refuse_unmarked(INFO, ledger, {"a": Fencing("a", log, set())}, before_fence=check)
    assert log == [("holds", "a", "0/3")]
    assert (
        "query new cannot start epoch 1: the pipeline is at epoch 1 already (another query "
        "accepted a checkpoint reset meanwhile)"
    ) in str(refused.value)


def test_sinks_holding_different_batches_are_named_and_what_differs_is_none() -> None:
    """One refusal for two sinks: ``sinks`` names both, ``sink`` neither, and the batch and
    the answer, which differ, are ``None``; the epoch is theirs."""
    ledger = _ledger({"a": 2, "b": 3})
    sinks = {"a": Answering("a", {3}), "b": Partly("b", 4, 1, 2)}
    with pytest.raises(UnmarkedBatchError) as refused:
        refuse_unmarked(INFO, ledger, sinks)
    assert str(refused.value).startswith(
        "pipeline 'p': query new cannot start epoch 1: sink a holds batch 3, sink b holds part "
        "of batch 4 of epoch 0"
    )
    assert _about(refused.value) == (("a", "b"), None, None, 0, None)


def test_sinks_that_could_not_be_opened_are_named_not_asked() -> None:
    """The refusal of sinks that could not be asked: ``holds`` is ``None``; ``batch_id`` is
    the batch after their mark, ``None`` when one has no mark in the epoch (asked about
    several in turn)."""
    down = OSError("connection refused")
    ledger = _ledger({"a": 2, "b": 2, "c": 2})
    sinks = {"a": Answering("a", set())}
    with pytest.raises(UnmarkedBatchError) as refused:
        refuse_unmarked(INFO, ledger, sinks, unopened={"b": down, "c": down})
    assert str(refused.value).startswith(
        "pipeline 'p': query new cannot start epoch 1: sink b could not be opened, so it was "
        "not asked whether it holds batch 3 of epoch 0 (the batch after its mark 2)"
    )
    assert _about(refused.value) == (("b", "c"), None, 3, 0, None)
    assert sinks["a"].asked == []  # refused before anything is asked
    with pytest.raises(UnmarkedBatchError) as refused:
        refuse_unmarked(INFO, ledger, sinks, unopened={"b": down, "new": down})
    assert _about(refused.value) == (("b", "new"), None, None, 0, None)
    with pytest.raises(UnmarkedBatchError) as refused:
        refuse_unmarked(INFO, ledger, sinks, unopened={"new": down})
    assert _about(refused.value) == (("new",), "new", None, 0, None)


def test_the_refusal_keeps_its_attributes_through_pickle_and_copy() -> None:
    """A query's error travels (pickled by Spark's Python worker, copied by a retry):
    the attributes come back with the message."""
    ledger = _ledger({"a": 2})
    with pytest.raises(UnmarkedBatchError) as refused:
        refuse_unmarked(INFO, ledger, {"a": Partly("a", 3, 1, None)})
    for again in (pickle.loads(pickle.dumps(refused.value)), copy.copy(refused.value)):
        assert type(again) is UnmarkedBatchError and str(again) == str(refused.value)
        assert _about(again) == (("a",), "a", 3, 0, PartlyHeld(1, None))
