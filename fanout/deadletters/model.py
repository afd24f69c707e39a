"""Dead letters: one model for every sink.

A row a sink's target rejects (a constraint violation, an oversize record, a null key)
either fails the batch, naming sink, batch, column and value, or — when the sink has a
``dead_letter`` target — is written there as a :class:`DeadLetter` with the reason, the
sink, the batch id and the original row, and counted in the ledger mark
(``SinkResult.dead_lettered``), ``fanout status`` and the metrics.

Targets are named by a string: a Delta table path (``"/data/dead/orders"``, optionally
``"delta:/data/dead/orders"``) is understood by every sink through
:class:`DeltaDeadLetters`; a sink may accept its own kinds too (``"postgres:schema.table"``,
``"kafka:topic"``). Writes are idempotent per batch, like the sinks' own: a replayed batch
does not duplicate its dead letters.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from fanout.delta_tables import io as deltaio
from fanout.errors import ConfigurationError

if TYPE_CHECKING:
    import pyarrow as pa

    from fanout.contract.batch import Batch


@dataclass(frozen=True)
class DeadLetter:
    """One rejected row: why, where (column and value, when known), and the row itself."""

    row: Mapping[str, Any]
    reason: str
    column: str | None = None
    value: Any = None


def split_target(target: str, sink: str, kinds: Sequence[str] = ("delta",)) -> tuple[str, str]:
    """``(kind, location)`` of a dead-letter target string; a bare path is Delta.

    :param kinds: the kinds this sink supports; others are a configuration error.
    """
    kind, sep, location = target.partition(":")
    if not sep or kind not in ("delta", "postgres", "kafka") or location.startswith("//"):
        kind, location = "delta", target  # a path (or an object-store URI) is a Delta table
    if kind not in kinds:
        raise ConfigurationError(
            f"sink {sink!r}: dead_letter {target!r} is a {kind} target; this sink supports "
            f"{', '.join(kinds)} (a Delta table path works for every sink)"
        )
    if not location:
        raise ConfigurationError(f"sink {sink!r}: dead_letter target {target!r} names nothing")
    return kind, location


def dead_letter_schema() -> pa.Schema:
    """The columns of a dead-letter table."""
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("pipeline", pa.string(), nullable=False),
            pa.field("sink", pa.string(), nullable=False),
            pa.field("batch_id", pa.int64(), nullable=False),
            pa.field("reason", pa.string(), nullable=False),
            pa.field("column", pa.string()),
            pa.field("value", pa.string()),
            pa.field("row", pa.string(), nullable=False),
            pa.field("recorded_at", pa.timestamp("us", tz="UTC"), nullable=False),
        ]
    )


def to_records(batch: Batch, letters: Sequence[DeadLetter]) -> list[dict[str, Any]]:
    """Dead letters as rows of :func:`dead_letter_schema` (the row and value as JSON)."""
    now = datetime.now(UTC)
    return [
        {
            "pipeline": batch.pipeline,
            "sink": batch.sink_name,
            "batch_id": batch.batch_id,
            "reason": letter.reason,
            "column": letter.column,
            "value": None if letter.value is None else json.dumps(letter.value, default=str),
            "row": json.dumps(dict(letter.row), default=str),
            "recorded_at": now,
        }
        for letter in letters
    ]


SINK_LETTERS = "dead_letters"
"""The transaction suffix of the rows a sink's target rejected."""
ROUTE_LETTERS = "route_dead_letters"
"""The transaction suffix of the rows that failed the sink's route (``where``/``select``):
a transaction of its own, so that a batch's route letters and the sink's own letters are
each written once, whichever comes first."""


class DeltaDeadLetters:
    """A Delta table of dead letters, written from the driver with delta-rs.

    Each batch's letters land in one commit carrying the transaction
    ``(<batch.txn_app_id>#<suffix>, batch_id)``, so a replay writes them once.

    :param suffix: :data:`SINK_LETTERS` (default) for the rows the sink's target rejected,
        :data:`ROUTE_LETTERS` for the rows that failed its route.
    """

    def __init__(
        self,
        path: str,
        storage_options: Mapping[str, str] | None = None,
        *,
        suffix: str = SINK_LETTERS,
    ) -> None:
        self.path = path
        self.storage_options = dict(storage_options or {})
        self.suffix = suffix

    def write(self, batch: Batch, letters: Sequence[DeadLetter]) -> int:
        """Write the batch's dead letters (once); return how many the batch has."""
        import pyarrow as pa

        if letters:
            data = pa.Table.from_pylist(to_records(batch, letters), schema=dead_letter_schema())
            app_id = f"{batch.txn_app_id}#{self.suffix}"
            deltaio.append_once(self.path, data, app_id, batch.batch_id, self.storage_options)
        return len(letters)
