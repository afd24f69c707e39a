"""A sink that says it does not hold the batch after its mark, its own records of its
last written batch gone (:func:`refuse_records_gone`): its answer tells nothing, and the
start is refused."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from fanout.contract.batch import BatchInfo
from fanout.contract.sink import Sink
from fanout.errors import SinkRecordsGoneError
from fanout.ledger.entry import Ledger
from fanout.steps.holds import answers_records_gone, gone_reason
from fanout.steps.lost_target import gone_passes, last_kept, written_marks
from fanout.steps.unmarked.held import Held
from fanout.steps.unmarked.start_text import gone_message


def refuse_records_gone(
    info: BatchInfo,
    ledger: Ledger,
    sinks: Mapping[str, Sink],
    marks: Mapping[str, int | None],
    answers: Sequence[Held],
    bounds: Mapping[str, float],
    accepted: Collection[str] = (),
) -> None:
    """Refuse the start with :class:`fanout.SinkRecordsGoneError` when a sink that said it
    does not hold the batch after its mark has lost its own records of its last mark that
    wrote rows, its target still holding rows (:meth:`fanout.Sink.records_gone`): its
    "does not hold" is then no answer, and the new epoch would write that batch a second
    time if it was written and never marked. Asked only of a sink answering that hook with
    a mark in the epoch and a ``False`` (one ledger scan of the epoch's marks each); one of
    ``accepted`` is logged instead."""
    for answer in answers:
        sink, mark = sinks[answer.sink], marks.get(answer.sink)
        if answer.holds is not False or mark is None or not answers_records_gone(sink):
            continue
        written = last_kept(written_marks(ledger, info.pipeline, info.epoch, sink.name, mark,
                                          info.query_id, sinks))  # fmt: skip
        if written is None:
            continue
        gone = gone_reason(sink, info.pipeline, info.epoch, written, bounds.get(sink.name))
        then = (
            f"epoch {info.epoch + 1} starts, and batch {mark + 1}, if it was written and never "
            "marked, is written a second time"
        )
        if gone is None or gone_passes(sink, info.pipeline, info.epoch, written, gone,
                                       sink.name in accepted, then):  # fmt: skip
            continue
        raise SinkRecordsGoneError(
            gone_message(info, sink, written, mark + 1, gone),
            sink=sink.name,
            batch_id=mark + 1,
        )
