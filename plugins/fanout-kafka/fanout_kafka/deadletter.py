"""Dead letters in a Delta table, written by the driver once per batch.

The partitions' dead letters come back to the driver with their outcomes; the driver
appends them after every partition committed, with the Delta transaction
``("fanout/<pipeline>/<sink>/dead_letter", batch_id)``, so a replay (after the driver died
between the Kafka commits and this write) writes them once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from fanout import deltaio

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


def app_id(txn_app_id: str) -> str:
    """The dead-letter table's idempotent-write application id: the sink's own
    transaction id (``fanout/<pipeline>/<sink>``) plus ``/dead_letter``."""
    return f"{txn_app_id}/dead_letter"


def written_version(path: str, txn_app_id: str) -> int | None:
    """The last batch whose dead letters are in the table at ``path``, if any."""
    return deltaio.transaction_version(deltaio.open_table(path), app_id(txn_app_id))


def write(
    path: str,
    rows: Sequence[dict[str, Any]],
    *,
    txn_app_id: str,
    pipeline: str,
    sink: str,
    batch_id: int,
    topic: str,
) -> int:
    """Append one batch's dead letters once; returns the rows appended (0 when the table
    already holds this batch or there is nothing to write)."""
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
    appended = deltaio.append_once(path, table, app_id(txn_app_id), batch_id)
    return table.num_rows if appended else 0
