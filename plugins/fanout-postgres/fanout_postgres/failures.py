"""The one error of a PostgreSQL batch whose partitions failed: a refused row named by table,
column, value and row; any other failure by its partition and the server's message."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fanout.errors import SinkError, SinkWriteError, TransientSinkError
from fanout.observe.secrets import redact
from fanout.partitioned.outcome import PartitionOutcome
from fanout_postgres.encode import show


def batch_error(
    table: Any, failed: Sequence[PartitionOutcome], secrets: Sequence[str], sink: str, batch_id: int
) -> SinkError:
    """A refused row names table, column, value and row; any other failure its
    partition and the server's message. Transient when every failure is."""
    first = failed[0].failure
    assert first is not None
    if first.kind == "data":
        detail = first.details
        where = f"table {table}"
        if detail.get("column"):
            where += f", column {detail['column']!r}, value {show(detail.get('value'))}"
        message = f"{where}: {first.message}"
        if detail.get("row"):
            message += f"; row {detail['row'][:500]}"
        message += (
            "; nothing of this partition was written. Fix the data, or set option "
            "'dead_letter' to divert refused rows"
        )
    else:
        message = f"table {table}, partition {failed[0].partition}: {first.message}"
    if len(failed) > 1:
        message += f" (and {len(failed) - 1} more failed partition(s))"
    message = redact(message, secrets)
    if all(o.failure is not None and o.failure.kind == "transient" for o in failed):
        return TransientSinkError(message, sink=sink, batch_id=batch_id)
    return SinkWriteError(message, sink=sink, batch_id=batch_id)
