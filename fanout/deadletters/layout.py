"""The one layout every dead-letter table has, whatever the sink (:func:`letter_schema`).

A row a sink's route or target refuses (a failing ``CAST``, a constraint violation, an
oversize record, a null key) either fails the batch, naming sink, batch, column and value,
or -- when the sink has a ``dead_letter`` target (:mod:`fanout.deadletters.target`) -- is
kept there as a :class:`fanout.contract.dead_letters.DeadLetter`, counted in the ledger
mark (``SinkResult.dead_lettered``), ``fanout status`` and the metrics.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

    from fanout.contract.batch import Batch
    from fanout.contract.dead_letters import DeadLetter, Source


def letter_schema() -> pa.Schema:
    """The columns of every dead-letter Delta table, whatever the sink.

    ``value``, ``row`` and ``details`` hold JSON text; ``partition`` is null for a route's
    letters and for sinks without partitions.
    """
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("pipeline", pa.string(), nullable=False),
            pa.field("sink", pa.string(), nullable=False),
            pa.field("batch_id", pa.int64(), nullable=False),
            pa.field("epoch", pa.int64(), nullable=False),
            pa.field("source", pa.string(), nullable=False),
            pa.field("partition", pa.int32()),
            pa.field("reason", pa.string(), nullable=False),
            pa.field("column", pa.string()),
            pa.field("value", pa.string()),
            pa.field("row", pa.string()),
            pa.field("details", pa.string()),
            pa.field("recorded_at", pa.timestamp("us", tz="UTC"), nullable=False),
        ]
    )


def to_records(batch: Batch, letters: Sequence[DeadLetter], source: Source) -> list[dict[str, Any]]:
    """Dead letters as rows of :func:`letter_schema`."""
    now = datetime.now(UTC)
    return [
        {
            "pipeline": batch.pipeline,
            "sink": batch.sink_name,
            "batch_id": batch.batch_id,
            "epoch": batch.info.epoch,
            "source": source,
            "partition": letter.partition,
            "reason": letter.reason,
            "column": letter.column,
            "value": None if letter.value is None else _json(letter.value),
            "row": None if letter.row is None else _json(dict(letter.row)),
            "details": _json(dict(letter.details)) if letter.details else None,
            "recorded_at": now,
        }
        for letter in letters
    ]


def _json(value: Any) -> str:
    return json.dumps(value, default=_text, ensure_ascii=False)


def _text(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)
