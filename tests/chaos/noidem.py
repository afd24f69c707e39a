"""A sink with no idempotency of its own, so that only fanout's ledger keeps it exact.

The built-in sinks each skip a batch they already hold (Delta's app transaction,
PostgreSQL's upsert, Kafka's marker group): under kills the chaos checker sees the sum of
their skip and the ledger's, and a dispatcher that wrote every sink again would pass.
:class:`AppendOnlySink` skips nothing: it appends one line per write it receives (batch,
rows, attempt, and its ledger mark as the write begins) to a file, ``fsync``\\ ed before
the write returns. The chaos harness reads the lines each driver run added and the sink's
ledger mark after that run (:class:`NoidemRun`), and :func:`unexpected_writes` says where
they disagree with the one allowed replay: the batch the killer killed in, written and not
yet marked. The mark read as a write begins names a write of a batch the sink had marked
already (the ledger's skip broken) and, at every batch whatever the kills' timing, a
batch marked before its write (the mark ahead of the write).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from fanout import Sink
from fanout.contract.batch import Batch
from fanout.contract.sink import Guarantee, Reads

NAME = "noidem"
RECORD = "noidem.jsonl"
BETWEEN_WRITE_AND_MARK = ("sink_writing", "sink_done", "ledger_commit")
"""Kill points that can fall after this sink's write and before its mark (it writes in
parallel with the sink the point names); ``batch_start`` is before every write and
``batch_end`` after every mark."""


class AppendOnlySink(Sink):
    """Appends ``{"batch", "rows", "attempt", "marked"}`` per write to ``path``; never
    skips. ``marked``: the sink's mark in the ``ledger`` table (a path) as the write began
    (``-1``: none, or no ``ledger`` given)."""

    guarantees: ClassVar[tuple[Guarantee, ...]] = ("at_least_once",)

    def __init__(self, name: str, *, path: str, ledger: str | None = None) -> None:
        super().__init__(name)
        self.path = path
        self.ledger = ledger

    @property
    def reads(self) -> Reads:
        """The Arrow conversion the Delta sink makes anyway: no Spark job of its own."""
        return "arrow"

    def write(self, batch: Batch) -> int:
        """Read the sink's mark, append the write's line with one ``write`` call, ``fsync``
        it, return the rows."""
        marked = self._marked(batch)
        rows = batch.arrow().num_rows
        line = json.dumps(
            {"batch": batch.batch_id, "rows": rows, "attempt": batch.attempt, "marked": marked}
        )
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return rows

    def _marked(self, batch: Batch) -> int:
        """The sink's mark of ``batch``'s epoch in the ledger's log (``-1``: none)."""
        if self.ledger is None or not (Path(self.ledger) / "_delta_log").exists():
            return -1
        from deltalake import DeltaTable

        version = DeltaTable(self.ledger).transaction_version(batch.txn_app_id)
        return -1 if version is None else int(version)


@dataclass(frozen=True)
class Write:
    """One line of the record (``marked``: the sink's mark as the write began)."""

    batch: int
    rows: int
    attempt: int
    marked: int = -1


@dataclass
class NoidemRun:
    """One driver run as the sink saw it: the writes it received in that run and its
    ledger mark after it (``-1``: none), with the kill that ended the run, if any."""

    label: str
    mark: int
    writes: list[Write] = field(default_factory=list)
    kill_point: str | None = None
    kill_batch: int | None = None


def read_record(path: Path, offset: int) -> tuple[list[Write], int]:
    """The writes recorded in ``path`` from byte ``offset`` on, and the offset after them."""
    if not path.exists():
        return [], offset
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read()
    lines = [json.loads(line) for line in data.decode().splitlines()]
    writes = [Write(d["batch"], d["rows"], d["attempt"], d.get("marked", -1)) for d in lines]
    return writes, offset + len(data)


def expected_batches(before: int, run: NoidemRun) -> list[int]:
    """The batches ``run`` must have written, in order, given the sink's mark ``before``
    it: each batch after that mark up to the run's own mark, once (the ledger skips the
    marked ones); and the batch the kill fell in once more when the run wrote it and did
    not mark it and the kill point lies between a write and its mark."""
    batches = list(range(before + 1, run.mark + 1))
    written_unmarked = run.mark + 1
    if (
        run.kill_point in BETWEEN_WRITE_AND_MARK
        and run.kill_batch == written_unmarked
        and [w.batch for w in run.writes[-1:]] == [written_unmarked]
    ):
        batches.append(written_unmarked)
    return batches


def unexpected_writes(runs: Sequence[NoidemRun], total_rows: int, last_batch: int) -> list[str]:
    """What the sink received against what the ledger allows, run by run (empty: exact):
    the batches of each run (:func:`expected_batches`), every write a first attempt of a
    batch the sink had not marked as it began, one row count per batch, the rows of the
    distinct batches adding up to ``total_rows``, and the last run's mark at
    ``last_batch``."""
    problems: list[str] = []
    before = -1
    rows: dict[int, set[int]] = {}
    for number, run in enumerate(runs, 1):
        got = [w.batch for w in run.writes]
        want = expected_batches(before, run)
        if got != want:
            problems.append(
                f"run {number} ({run.label}): {NAME} got batches {got}, the ledger allows "
                f"{want} (its mark {before} before the run, {run.mark} after)"
            )
        problems += [
            f"run {number}: batch {w.batch} written at attempt {w.attempt}"
            for w in run.writes
            if w.attempt != 1
        ]
        problems += [
            f"run {number}: batch {w.batch} written with the sink's mark at {w.marked}"
            for w in run.writes
            if w.marked >= w.batch
        ]
        for w in run.writes:
            rows.setdefault(w.batch, set()).add(w.rows)
        before = run.mark
    problems += [f"batch {b} written with {sorted(n)} rows" for b, n in rows.items() if len(n) > 1]
    distinct = sum(min(n) for n in rows.values())
    if distinct != total_rows:
        problems.append(f"the distinct batches hold {distinct} rows, the input {total_rows}")
    if before != last_batch:
        problems.append(f"{NAME}'s last mark is {before}, the stream's last batch {last_batch}")
    return problems


def ledger_skips(runs: Sequence[NoidemRun]) -> list[int]:
    """The batches a kill left marked for this sink and not committed in Spark (every kill
    falls before Spark's commit log): the restart's plan had to skip the sink for them."""
    return [r.kill_batch for r in runs if r.kill_batch is not None and r.mark == r.kill_batch]
