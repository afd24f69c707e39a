"""The conformance kit's reading of fanout's refusal of a new epoch
(:func:`fanout.testing.conformance.refusals.for_the_author`): from the
:class:`fanout.UnmarkedBatchError`'s attributes, not its message (a memory ledger, a fake
sink: the kit's run against a flawed sink is tests/integration/test_conformance_catches.py)."""

from __future__ import annotations

import pytest

from fanout import BatchInfo, PartlyHeld, Sink, UnmarkedBatchError
from fanout.ledger.entry import LedgerEntry
from fanout.ledger.memory import MemoryLedger
from fanout.steps.unmarked import refuse_unmarked
from fanout.testing.conformance.case import NAME
from fanout.testing.conformance.refusals import HOLDS_BATCH, for_the_author

INFO = BatchInfo("kit", 0, "new", epoch=0)


class HoldsEvery(Sink):
    """Answers ``answer`` about every batch: a batch never written too."""

    def __init__(self, name: str, answer: bool | PartlyHeld = True) -> None:
        super().__init__(name)
        self.answer = answer

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool | PartlyHeld | None:
        return self.answer


def _marked_batch_0(*sinks: str) -> MemoryLedger:
    """A ledger where each of ``sinks`` marked batch 0 of epoch 0, as the kit's first run."""
    ledger = MemoryLedger()
    for sink in sinks:
        ledger.mark_committed(LedgerEntry("kit", sink, 0, "committed", query_id="old"))
    return ledger


def _refusal(sink: Sink, ledger: MemoryLedger) -> UnmarkedBatchError:
    with pytest.raises(UnmarkedBatchError) as refused:
        refuse_unmarked(INFO, ledger, {sink.name: sink})
    return refused.value


def test_a_sink_answering_true_about_a_batch_never_written_is_told_so() -> None:
    sink = HoldsEvery(NAME)
    ledger = _marked_batch_0(NAME)
    refused = _refusal(sink, ledger)
    told = for_the_author(refused, sink, ledger, INFO)
    assert told == (
        "FanOut refused batch 0 of a new epoch with UnmarkedBatchError: when a checkpoint "
        "reset starts a new epoch fanout asks the sink whether it holds the batch after its "
        "last mark (docs/writing-sinks.md: holds_batch), and holds_batch returned True about "
        "batch 1 of epoch 0, which the kit never wrote: expected False (True or a PartlyHeld "
        "says the sink wrote it and the driver died before its mark, and refuses the new "
        f"epoch): {HOLDS_BATCH}\nfanout's refusal, for an operator: {refused}"
    )


def test_a_sink_answering_part_of_a_batch_never_written_is_told_so() -> None:
    sink = HoldsEvery(NAME, PartlyHeld(1, 2))
    ledger = _marked_batch_0(NAME)
    told = for_the_author(_refusal(sink, ledger), sink, ledger, INFO)
    assert told is not None
    assert "holds_batch returned PartlyHeld(committed=1, partitions=2, letters=0) about " in told
    assert "batch 1 of epoch 0, which the kit never wrote" in told


def test_the_message_alone_is_not_read() -> None:
    """The same refusal's text in an error without its attributes (one raised by an older
    raise site, or by hand) is fanout's refusal as it is: the kit does not read the
    operator's words, so a change of them cannot make it tell the author something else."""
    sink = HoldsEvery(NAME)
    ledger = _marked_batch_0(NAME)
    text = str(_refusal(sink, ledger))
    assert f"sink {NAME} holds batch 1 of epoch 0" in text
    assert for_the_author(UnmarkedBatchError(text), sink, ledger, INFO) is None


def test_a_refusal_the_sink_was_not_asked_for_is_not_its_answer() -> None:
    """A sink that could not be opened refuses unasked (``holds`` ``None``), and a refusal
    about another sink is not about the kit's: both are fanout's refusal as it is."""
    sink = HoldsEvery(NAME)
    ledger = _marked_batch_0(NAME, "other")
    with pytest.raises(UnmarkedBatchError) as unasked:
        refuse_unmarked(INFO, ledger, {}, unopened={NAME: OSError("down")})
    assert (unasked.value.sink, unasked.value.batch_id, unasked.value.holds) == (NAME, 1, None)
    assert for_the_author(unasked.value, sink, ledger, INFO) is None
    other = _refusal(HoldsEvery("other"), ledger)
    assert other.sink == "other"
    assert for_the_author(other, sink, ledger, INFO) is None
