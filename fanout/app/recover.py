"""``fanout recover``: what the ledger knows when a checkpoint is lost.

Per sink: the last committed batch, its query id and the source offsets and planning time
(Spark's ``batchTimestampMs``) recorded with it: the newest checkpoint is the one whose
``offsets/<N>`` holds them.
The sink furthest behind among those the pipeline still writes (a mark in the newest epoch
at or after its high-water mark minus one: :func:`fanout.steps.guard_text.sink_marks`)
decides where a new checkpoint must start: its batch's end offsets. Sinks whose last mark is
older (taken out of the pipeline, or of an earlier epoch) are listed apart: resuming after
them would write every later batch again to the sinks that hold it. For a Kafka source those
offsets are exactly the ``startingOffsets`` JSON of a new query; for other sources the report
says what they mean.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fanout.ledger.entry import LedgerEntry
from fanout.steps.guard import latest_per_sink
from fanout.steps.guard_text import SinkMarks, describe_entry, not_written_line, sink_marks


@dataclass(frozen=True)
class Recovery:
    """The recovery facts of one pipeline."""

    pipeline: str
    latest: dict[str, LedgerEntry]

    @property
    def marks(self) -> SinkMarks:
        """The sinks' last marks, split into the sinks the pipeline still writes and the
        others."""
        return sink_marks(self.latest)

    @property
    def epoch(self) -> int:
        """The newest epoch the ledger holds marks of."""
        return max((e.epoch for e in self.latest.values()), default=0)

    @property
    def furthest_behind(self) -> LedgerEntry | None:
        """The mark with the lowest batch id among the sinks the pipeline still writes, in
        its newest epoch: where a new checkpoint must resume."""
        return self.marks.furthest_behind

    def starting_offsets(self) -> list[Any] | None:
        """Per source, Kafka ``startingOffsets`` JSON after the furthest-behind batch
        (``None`` for a source whose offsets are not Kafka's)."""
        behind = self.furthest_behind
        offsets = behind.offsets() if behind else None
        if offsets is None:
            return None
        return [offset if is_kafka_offsets(offset) else None for offset in offsets]


def is_kafka_offsets(offset: Any) -> bool:
    """Whether a recorded source offset has Kafka's shape: ``{topic: {partition: n}}``."""
    return (
        isinstance(offset, dict)
        and bool(offset)
        and all(
            isinstance(parts, dict)
            and bool(parts)
            and all(str(p).lstrip("-").isdigit() and isinstance(n, int) for p, n in parts.items())
            for parts in offset.values()
        )
    )


def recovery_of(pipeline: str, committed: Sequence[LedgerEntry]) -> Recovery:
    """The recovery facts from the committed entries of one pipeline."""
    return Recovery(pipeline, latest_per_sink([e for e in committed if e.pipeline == pipeline]))


def _resume_line(behind: LedgerEntry, marks: SinkMarks) -> str:
    ahead = sorted(s for s, e in marks.written.items() if e.batch_id > behind.batch_id)
    if not ahead:
        return (
            f"Resume after batch {behind.batch_id}: every sink the pipeline still writes "
            "holds it, so nothing is written twice."
        )
    high = max(e.batch_id for e in marks.written.values())
    return (
        f"Resume after batch {behind.batch_id} (sink {behind.sink!r} is furthest behind); "
        f"{'sink' if len(ahead) == 1 else 'sinks'} {', '.join(ahead)} already "
        f"{'holds' if len(ahead) == 1 else 'hold'} batch {high} and will write its rows "
        "again (a new epoch or a new pipeline name means new transaction ids, so nothing "
        "skips them): duplicates there, unless the sink upserts by key."
    )


def render(recovery: Recovery) -> str:
    """The text ``fanout recover`` prints."""
    if not recovery.latest:
        return f"pipeline {recovery.pipeline!r}: the ledger holds no committed batch"
    marks = recovery.marks
    epoch = "" if recovery.epoch == 0 else f" (epoch {recovery.epoch})"
    lines = [f"pipeline {recovery.pipeline!r}{epoch}: last committed batch per sink"]
    for sink in sorted(marks.written):
        lines.append(f"  {describe_entry(marks.written[sink])}")
    for sink in sorted(marks.not_written):
        lines.append(f"  {not_written_line(marks.not_written[sink], recovery.epoch)}")
    behind = marks.furthest_behind
    assert behind is not None
    lines.append(_resume_line(behind, marks))
    starting = recovery.starting_offsets()
    if starting is None:
        lines.append("No source offsets were recorded for that batch.")
        return "\n".join(lines)
    for index, offsets in enumerate(starting):
        if offsets is None:
            lines.append(
                f"Source {index}: offsets {json.dumps(behind.offsets()[index])} are not Kafka "
                "offsets; start the new query so that it reads what comes after them (for a "
                "file source: only files newer than those of that batch)."
            )
        else:
            lines.append(f"Source {index} (Kafka): start a new checkpoint with")
            lines.append(f"  .option(\"startingOffsets\", '{json.dumps(offsets)}')")
    return "\n".join(lines)
