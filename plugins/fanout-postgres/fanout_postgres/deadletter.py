"""Dead-letter targets: where rows the target table refuses are recorded, never dropped.

Two kinds, chosen by option ``dead_letter``:

- a PostgreSQL table in the target database (``"errors"``, ``"ops.pg_rejects"`` or
  ``{"table": ...}``): written by each partition in the same transaction as its rows, so
  a record exists exactly when the rows around it committed (a replay replaces the
  partition's records, never duplicates them). Created when missing.
- a Delta table (a path: ``"/data/rejects"``, ``"s3://..."`` or ``{"delta": ...}``):
  written by the driver after the partitions, once per batch, with the idempotent-write
  transaction ``(<sink txn app id>/dead_letter, batch_id)``. In append mode each
  partition's rejects are also kept in its progress mark, so a replay that skips the
  partition still writes them.

Each record: pipeline, sink, batch_id, partition, target (table), reason (the server's
message), column_name, value (as text), row (JSON of the batch row), rejected_at.

Rows failing the sink's *route* (its ``where``/``select``, evaluated by fanout before any
partition writes) go to the same target through :class:`RouteDeadLetters`, with partition
:data:`ROUTE_PARTITION` (-1) and the row as it was before the route: in a PostgreSQL table
one transaction replaces the batch's route records; in a Delta table one commit carries
the transaction ``(<sink txn app id>/route_dead_letter, batch_id)``. Either way a replay
writes them once, apart from the sink's own records of the batch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from fanout_postgres.names import TableName, parse_table

if TYPE_CHECKING:
    from fanout.contract.batch import Batch
    from fanout.deadletters.model import DeadLetter as Letter

ROUTE_PARTITION = -1
"""The ``partition`` of a record of a row that failed the sink's route (it never reached
a partition)."""


@dataclass(frozen=True)
class DeadLetter:
    """A parsed ``dead_letter`` option."""

    kind: str  # "postgres" or "delta"
    table: TableName | None = None
    path: str | None = None

    def describe(self) -> str:
        """For logs: the table or the path."""
        return f"table {self.table}" if self.table is not None else f"Delta table {self.path}"


def parse_dead_letter(value: Any) -> DeadLetter | None:
    """``None``, a table name, a Delta path (holds ``/``), or ``{"table"|"delta": ...}``."""
    if value is None:
        return None
    if isinstance(value, Mapping) and len(value) == 1:
        ((kind, target),) = value.items()
        if kind == "table":
            return DeadLetter("postgres", table=parse_table(target))
        if kind == "delta" and isinstance(target, str) and target:
            return DeadLetter("delta", path=target)
    elif isinstance(value, str) and value:
        if "/" in value or "://" in value:
            return DeadLetter("delta", path=value)
        return DeadLetter("postgres", table=parse_table(value))
    raise ValueError(
        "option 'dead_letter' must be a PostgreSQL table name ('rejects', 'ops.rejects'), a "
        "Delta path ('/data/rejects', 's3://...'), or {'table': ...} / {'delta': ...}; "
        f"got {value!r}"
    )


def ensure_table(conn: Any, table: TableName) -> None:
    """Create the dead-letter table when missing, else check it has the expected columns."""
    import sqlalchemy as sa
    from sqlalchemy.schema import CreateTable

    from fanout_postgres.statements import DEAD_LETTER_COLUMNS, dead_letter_table

    inspector = sa.inspect(conn)
    if not inspector.has_table(table.name, schema=table.schema):
        conn.execute(CreateTable(dead_letter_table(table), if_not_exists=True))
        return
    present = {c["name"] for c in inspector.get_columns(table.name, schema=table.schema)}
    missing = [c for c in DEAD_LETTER_COLUMNS if c not in present]
    if missing:
        raise ValueError(
            f"dead-letter table {table} exists without column(s) {', '.join(missing)}; "
            "drop it or name another table (the sink creates it with the right layout)"
        )


def write_delta(
    path: str, app_id: str, batch_id: int, records: Sequence[Mapping[str, Any]], base: Any
) -> bool:
    """Append ``records`` for one batch once; returns False when the batch was already
    recorded (the transaction ``(app_id, batch_id)`` is in the table's log).

    :param base: the pipeline, sink and target common to every record.
    """
    import pyarrow as pa

    from fanout.delta_tables import io as deltaio

    now = datetime.now(UTC)
    schema = pa.schema(
        [
            ("pipeline", pa.string()),
            ("sink", pa.string()),
            ("batch_id", pa.int64()),
            ("partition", pa.int32()),
            ("target", pa.string()),
            ("reason", pa.string()),
            ("column_name", pa.string()),
            ("value", pa.string()),
            ("row", pa.string()),
            ("rejected_at", pa.timestamp("us", tz="UTC")),
        ]
    )
    rows = [
        {
            **base,
            "batch_id": batch_id,
            "partition": r["partition"],
            "reason": r["reason"],
            "column_name": r["column"],
            "value": r["value"],
            "row": r["row"],
            "rejected_at": now,
        }
        for r in records
    ]
    return deltaio.append_once(path, pa.Table.from_pylist(rows, schema=schema), app_id, batch_id)


class RouteDeadLetters:
    """Writes the rows failing a PostgreSQL sink's route to its dead-letter target, once
    per batch (see the module docstring); what ``PostgresSink.route_dead_letters`` returns.

    :param url: the sink's resolved SQLAlchemy URL (for a PostgreSQL table target).
    :param dead: the parsed ``dead_letter`` option.
    :param target: the sink's table, recorded in every record.
    """

    def __init__(self, url: Any, dead: DeadLetter, target: str) -> None:
        self.url = url
        self.dead = dead
        self.target = target

    def write(self, batch: Batch, letters: Sequence[Letter]) -> int:
        """Record ``letters`` for ``batch`` once; return how many the batch has."""
        records = [
            {
                "partition": ROUTE_PARTITION,
                "reason": letter.reason,
                "column": letter.column,
                "value": None if letter.value is None else str(letter.value),
                "row": json.dumps(dict(letter.row), default=str),
            }
            for letter in letters
        ]
        if self.dead.path is not None:
            if records:
                base = {"pipeline": batch.pipeline, "sink": batch.sink_name, "target": self.target}
                key = batch.idempotency_key.derived("route_dead_letter")
                write_delta(self.dead.path, key.app_id, key.version, records, base)
        elif self.dead.table is not None:
            self._replace(batch, self.dead.table, records)
        return len(letters)

    def _replace(self, batch: Batch, name: TableName, records: Sequence[Mapping[str, Any]]) -> None:
        """One transaction: delete the batch's route records, insert these."""
        import sqlalchemy as sa

        from fanout.contract.batch import pipeline_scope
        from fanout_postgres.statements import dead_letter_table

        table = dead_letter_table(name)
        key = {
            # the scope of the partitions' own records: a new epoch starts afresh
            "pipeline": pipeline_scope(batch.pipeline, batch.info.epoch),
            "sink": batch.sink_name,
            "batch_id": batch.batch_id,
            "partition": ROUTE_PARTITION,
        }
        engine = sa.create_engine(self.url, poolclass=sa.NullPool)
        try:
            with engine.begin() as conn:
                conn.execute(sa.delete(table).where(*[table.c[k] == v for k, v in key.items()]))
                if records:
                    rows = [
                        {
                            **key,
                            "target": self.target,
                            "reason": r["reason"],
                            "column_name": r["column"],
                            "value": r["value"],
                            "row": json.loads(r["row"]),
                        }
                        for r in records
                    ]
                    conn.execute(sa.insert(table), rows)
        finally:
            engine.dispose()
