"""Reads of the ledger's rows on one snapshot of its Delta table (ARCHITECTURE §4): filtered
scans of a few columns, each a function of the table it is given and nothing else (no
lock, no state: :class:`fanout.ledger.delta.DeltaLedger` takes the snapshot under its
lock, then reads it here).

Every reader of the ledger's rows reads them as of the log (:func:`as_of_log`: a lost mark
a write's own mark replaced is left out): :func:`committed_as_of_log`, the epochs' owners
(:func:`owners`), ``DeltaLedger.rows``. The rows as written are read on purpose only:
:func:`committed_as_written` (a refused query's check), ``DeltaLedger.read`` (tests,
people), the compaction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fanout.delta_tables.io import Filter, read_arrow
from fanout.ledger.begun import BEGUN
from fanout.ledger.entry import (
    OWN_ROWS,
    LedgerEntry,
    as_of_log,
    entries_from_arrow,
    epoch_owners,
)
from fanout.ledger.refusals import ADMITTED, REFUSED
from fanout.ledger.target_records import DEAD_LETTER, TargetRecord, records_of

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable


def _columns(table: DeltaTable) -> set[str]:
    """The table's column names (a ledger from an older fanout lacks some)."""
    return {f.name for f in table.schema().fields}


def committed_as_of_log(
    table: DeltaTable, pipeline: str, min_batch_id: int, epoch: int | None
) -> list[LedgerEntry]:
    """``DeltaLedger.committed_entries`` as ``table`` holds them."""
    return as_of_log(committed_as_written(table, pipeline, min_batch_id, epoch))


def committed_as_written(
    table: DeltaTable, pipeline: str, min_batch_id: int, epoch: int | None
) -> list[LedgerEntry]:
    """``DeltaLedger.committed_entries_with_replaced`` as ``table`` holds them."""
    rows = read_arrow(
        table,
        filters=[
            ("pipeline", "=", pipeline),
            ("status", "=", "committed"),
            ("batch_id", ">=", min_batch_id),
        ],
    )
    entries = entries_from_arrow(rows)
    return entries if epoch is None else [e for e in entries if e.epoch == epoch]


def owners(table: DeltaTable, pipeline: str, high: int | None) -> dict[int, str]:
    """``DeltaLedger.epoch_owners`` as ``table`` holds them, epoch 0's high-water mark at
    ``high``."""
    present = _columns(table)  # older ledgers lack columns
    wanted = ["pipeline", "sink", "batch_id", "status", "query_id", "epoch", "error"]
    columns = [c for c in wanted if c in present]
    scope: list[Filter] = [("pipeline", "=", pipeline)]
    recent: list[Filter] = [*scope, ("batch_id", ">=", high if high is not None else 0)]
    reads = [[*scope, ("status", "=", "epoch")]] if "epoch" in present else []
    if "epoch" in present:  # epoch 0: the column's 0, or null in rows from before it
        reads += [[*recent, ("epoch", "=", 0)], [*recent, ("epoch", "=", None)]]
    else:
        reads.append(recent)
    entries = [
        entry
        for filters in reads
        for entry in entries_from_arrow(read_arrow(table, columns=columns, filters=filters))
    ]
    return epoch_owners(e for e in as_of_log(entries) if e.status == "epoch" or e.epoch == 0)


def epoch_start(table: DeltaTable, pipeline: str, epoch: int) -> int | None:
    """``DeltaLedger.epoch_start`` as ``table`` holds it."""
    if "epoch" not in _columns(table):
        return None
    filters: list[Filter] = [
        ("pipeline", "=", pipeline),
        ("status", "=", "epoch"),
        ("epoch", "=", epoch),
    ]
    rows = read_arrow(table, columns=["batch_id"], filters=filters).column("batch_id")
    return min((int(b) for b in rows.to_pylist() if b is not None), default=None)


def failed_batches(
    table: DeltaTable, pipeline: str, min_batch_id: int, epoch: int, sink: str | None,
    error: str | None,
) -> list[int]:  # fmt: skip
    """``DeltaLedger.failed_batches`` as ``table`` holds them."""
    columns = ["batch_id", "epoch"] if "epoch" in _columns(table) else ["batch_id"]
    filters: list[Filter] = [
        ("pipeline", "=", pipeline),
        ("status", "=", "failed"),
        ("batch_id", ">=", min_batch_id),
    ]
    if sink is not None:
        filters.append(("sink", "=", sink))
    if error is not None:
        columns.append("error")
    read = read_arrow(table, columns=columns, filters=filters).to_pylist()
    return sorted(
        {
            int(r["batch_id"])
            for r in read
            if (r.get("epoch") or 0) == epoch
            and (error is None or (r["error"] or "").startswith(error))
        }
    )


def dead_letter_records(table: DeltaTable, pipeline: str, sink: str) -> list[TargetRecord]:
    """``DeltaLedger.dead_letter_records`` as ``table`` holds them."""
    if "dead_letter" not in _columns(table):
        return []
    scope: list[Filter] = [("pipeline", "=", pipeline), ("sink", "=", sink)]
    rows = read_arrow(table, filters=[*scope, ("status", "=", DEAD_LETTER)])
    return records_of(entries_from_arrow(rows))


def refusal_rows(table: DeltaTable, pipeline: str, epoch: int, batch_id: int) -> list[LedgerEntry]:
    """``DeltaLedger.refusal_rows`` as ``table`` holds them."""
    filters: list[Filter] = [("pipeline", "=", pipeline), ("batch_id", "=", batch_id)]
    rows = entries_from_arrow(read_arrow(table, filters=filters))
    return [e for e in rows if e.status in (REFUSED, ADMITTED) and e.epoch == epoch]


def begun(table: DeltaTable, pipeline: str, sink: str, epoch: int, batch_id: int) -> bool:
    """``DeltaLedger.begun`` as ``table`` holds it."""
    filters: list[Filter] = [
        ("pipeline", "=", pipeline), ("sink", "=", sink), ("epoch", "=", epoch),
        ("batch_id", "=", batch_id), ("status", "=", BEGUN),
    ]  # fmt: skip
    return read_arrow(table, columns=["status"], filters=filters).num_rows > 0


def rows_as_written(table: DeltaTable, pipeline: str | None) -> pa.Table:
    """``DeltaLedger.read`` as ``table`` holds them."""
    return read_arrow(table, filters=[("pipeline", "=", pipeline)] if pipeline else ())


def mark_times(table: DeltaTable, pipeline: str | None) -> pa.Table:
    """``DeltaLedger.mark_times`` as ``table`` holds them."""
    filters: list[Any] = [("status", "=", "committed")]
    if pipeline:
        filters.append(("pipeline", "=", pipeline))
    columns = ["pipeline", "sink", "epoch", "batch_id", "status", "error", "finished_at"]
    return read_arrow(table, columns=columns, filters=filters)


def sink_names(table: DeltaTable, pipeline: str) -> list[str]:
    """``DeltaLedger.sink_names`` as ``table`` holds them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    read = read_arrow(table, columns=["sink", "status"], filters=[("pipeline", "=", pipeline)])
    own = pc.is_in(read.column("status"), value_set=pa.array(OWN_ROWS))
    names = read.column("sink").filter(pc.invert(own)).unique()
    return sorted(str(name) for name in names.to_pylist())


def pipelines(table: DeltaTable) -> list[str]:
    """``DeltaLedger.pipelines`` as ``table`` holds them."""
    names = read_arrow(table, columns=["pipeline"]).column("pipeline").unique()
    return sorted(str(name) for name in names.to_pylist())
