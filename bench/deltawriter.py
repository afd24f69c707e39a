"""The hand-written single-target Delta writer of the baseline variants (b), (c) and (d).

It does, for one target, the work fanout's Delta sink (engine ``rs``, mode ``append``)
does: look up the target's idempotent-write transaction, convert the batch to Arrow,
append it with delta-rs in a commit that records ``(app_id, batch_id)``. It deliberately
uses ``deltalake`` directly (not ``fanout``), so the baselines are what a user would
write by hand.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Timings:
    """Per-call timers, appended from whichever thread Spark runs foreachBatch in."""

    rows: list[tuple[str, int, float, float]] = field(
        default_factory=list
    )  # target, batch, arrow_s, write_s
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, target: str, batch_id: int, arrow_s: float, write_s: float) -> None:
        with self._lock:
            self.rows.append((target, batch_id, arrow_s, write_s))

    def totals(self) -> tuple[float, float]:
        """Summed (toArrow seconds, write seconds)."""
        with self._lock:
            return sum(r[2] for r in self.rows), sum(r[3] for r in self.rows)


class DeltaTarget:
    """One Delta table written exactly once per batch id with delta-rs from the driver."""

    def __init__(self, path: str, app_id: str, timings: Timings | None = None) -> None:
        self.path = path
        self.app_id = app_id
        self.timings = timings

    def already_written(self, batch_id: int) -> bool:
        """Whether the table's log holds this app id's transaction at ``batch_id`` or later
        (delta-rs records transactions but does not skip by itself)."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            version = DeltaTable(self.path).transaction_version(self.app_id)
        except TableNotFoundError:
            return False
        return version is not None and int(version) >= batch_id

    def write_arrow(self, table: Any, batch_id: int) -> int:
        """Append an Arrow table as batch ``batch_id``; returns rows written (0: skipped)."""
        from deltalake import CommitProperties, Transaction, write_deltalake

        if self.already_written(batch_id) or table.num_rows == 0:
            return 0
        write_deltalake(
            self.path,
            table,
            mode="append",
            commit_properties=CommitProperties(
                app_transactions=[Transaction(app_id=self.app_id, version=batch_id)]
            ),
        )
        return table.num_rows

    def write_df(self, df: Any, batch_id: int) -> int:
        """``df.toArrow()`` then :meth:`write_arrow`, each timed."""
        t0 = time.perf_counter()
        table = df.toArrow()
        t1 = time.perf_counter()
        rows = self.write_arrow(table, batch_id)
        t2 = time.perf_counter()
        if self.timings is not None:
            self.timings.add(self.path, batch_id, t1 - t0, t2 - t1)
        return rows
