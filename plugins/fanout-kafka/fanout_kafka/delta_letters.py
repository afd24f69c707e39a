"""A Kafka sink's dead letters in a Delta table: its layout, and one append per batch (or
per partition) under a transaction id of its own, so a replay appends nothing twice."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from fanout.delta_tables import io as deltaio

SCHEMA = pa.schema(
    [
        ("pipeline", pa.string()),
        ("sink", pa.string()),
        ("batch_id", pa.int64()),
        ("partition", pa.int32()),
        ("topic", pa.string()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.string()),
        ("error", pa.string()),
        ("record_bytes", pa.int64()),
        ("failed_at", pa.timestamp("us", tz="UTC")),
    ]
)
"""The dead-letter table's columns (``headers``: JSON list of [name, text] pairs)."""


def app_id(txn_app_id: str, kind: str = "dead_letter") -> str:
    """The dead-letter table's idempotent-write application id: the sink's own
    transaction id (``fanout/<pipeline>/<sink>``) plus ``/dead_letter`` (the records
    the topic refused) or ``/route_dead_letter`` (the rows failing the route)."""
    return f"{txn_app_id}/{kind}"


def write(
    path: str,
    rows: Sequence[dict[str, Any]],
    *,
    txn_app_id: str,
    pipeline: str,
    sink: str,
    batch_id: int,
    topic: str,
    kind: str = "dead_letter",
) -> int:
    """Append one batch's dead letters once; returns the rows appended (0 when the table
    already holds this batch or there is nothing to write).

    :param kind: ``"dead_letter"`` or ``"route_dead_letter"`` (see :func:`app_id`).
    """
    if not rows:
        return 0
    now = datetime.now(UTC)
    table = pa.Table.from_pylist(
        [
            {
                "pipeline": pipeline,
                "sink": sink,
                "batch_id": batch_id,
                "partition": r["partition"],
                "topic": topic,
                "key": r["key"],
                "value": r["value"],
                "headers": json.dumps(
                    [[k, v.decode(errors="replace")] for k, v in r["headers"]], ensure_ascii=False
                ),
                "error": r["error"],
                "record_bytes": r["record_bytes"],
                "failed_at": now,
            }
            for r in rows
        ],
        schema=SCHEMA,
    )
    appended = deltaio.append_once(path, table, app_id(txn_app_id, kind), batch_id)
    return table.num_rows if appended else 0
