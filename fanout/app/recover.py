"""``fanout recover``: what the ledger knows when a checkpoint is lost.

Per sink: the last committed batch, its query id and the source offsets and planning time
(Spark's ``batchTimestampMs``) recorded with it: the newest checkpoint is the one whose
``offsets/<N>`` holds them.
The sink furthest behind decides where a new checkpoint must start: its batch's end
offsets. For a Kafka source those offsets are exactly the ``startingOffsets`` JSON of a
new query; for other sources the report says what they mean.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fanout.ledger.entry import LedgerEntry
from fanout.steps.guard import latest_per_sink
from fanout.steps.guard_text import describe_entry


@dataclass(frozen=True)
class Recovery:
    """The recovery facts of one pipeline."""

    pipeline: str
    latest: dict[str, LedgerEntry]

    @property
    def furthest_behind(self) -> LedgerEntry | None:
        """The sink mark with the lowest batch id: where a new checkpoint must resume."""
        if not self.latest:
            return None
        return min(self.latest.values(), key=lambda e: (e.batch_id, e.sink))

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


def render(recovery: Recovery) -> str:
    """The text ``fanout recover`` prints."""
    if not recovery.latest:
        return f"pipeline {recovery.pipeline!r}: the ledger holds no committed batch"
    lines = [f"pipeline {recovery.pipeline!r}: last committed batch per sink"]
    for sink in sorted(recovery.latest):
        lines.append(f"  {describe_entry(recovery.latest[sink])}")
    behind = recovery.furthest_behind
    assert behind is not None
    lines.append(
        f"Resume after batch {behind.batch_id} (sink {behind.sink!r} is furthest behind); "
        "sinks further ahead receive their last batches again, which they skip only under "
        "the same pipeline name."
    )
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
