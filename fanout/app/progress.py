"""Progress of a running pipeline, one compact line per batch: what ``fanout run`` prints.

:class:`ProgressObserver` is an ordinary observer plugin on the lifecycle hooks: it keeps,
per batch, which sinks were skipped, and each written sink's rows and time. Spark knows
what fanout cannot see from inside ``foreachBatch`` — the batch's input rows and when its
trigger started — and reports it once the batch is over, in the query's progress.
:meth:`ProgressObserver.report` joins the two and writes the lines of the batches that are
over; ``fanout run`` calls it from its wait loop and once more at the end, then prints
:meth:`ProgressObserver.summary`. An application's own driver can do the same::

    progress = ProgressObserver()
    fan = FanOut(..., plugins=[progress])
    query = df.writeStream.foreachBatch(fan).start()
    while query.isActive:
        progress.report(query.recentProgress, sys.stdout)
        time.sleep(1)

A line reads ``batch 3: 30 rows in | bronze 30 rows 0.41s, paid 12 rows 0.38s |
skipped latest | lag 1.2s``: the written sinks in the configured order. ``bronze 30 rows
already written by an earlier run 0.05s``: the successful attempt found, by the sink's own
records, the batch committed before it (:attr:`SinkResult.already_written`), in the run's
first batch (the one Spark replays after a crash; no later batch can have been written by
an earlier run) and at the batch's first attempt: a run that crashed after the write,
before its ledger mark; ``... by an earlier attempt``: a later batch, so an attempt in this
run committed the rows (a retry's predecessor that committed and then failed, a Kafka
partition's speculative copy); ``... by an earlier run or attempt``: a retry in the first
batch, which cannot tell the two apart (the failed attempt may have written nothing).
``skipped`` only when the ledger said some sinks already held the batch (a replay); lag is
the time from the start of the batch's trigger (Spark picked its input up) to the last
sink's ledger mark.
A sink that set rows aside (its route's or its target's refusals, counted in
:attr:`SinkResult.dead_lettered`) shows them: ``files 4 rows + 1 dead-lettered 0.14s``, and
the summary ``files: 16 rows written in 0.52s, 4 rows dead-lettered``; else ``rows in``
less the rows written reads as rows lost.
A sink that is behind (``on_failure="lag"``) shows as ``pg lagging 3 batch(es) / 120
row(s) since 10:02:11`` (or ``catching up``), and the batches it catches up as ``pg caught
up 2 batch(es)``. A failed batch reads ``batch 3 FAILED | bronze 30 rows 0.41s | orders_pg failed:
<error>``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

from fanout.contract.batch import BatchInfo
from fanout.contract.lag import SinkLag, SpoolSize
from fanout.contract.sink import SinkResult
from fanout.errors import BatchFailedError
from fanout.hooks.specs import hookimpl
from fanout.observe.logs import known_secrets
from fanout.observe.secrets import redact


@dataclass
class BatchProgress:
    """What the hooks told about one batch."""

    batch_id: int
    pending: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    sinks: dict[str, tuple[int, float]] = field(default_factory=dict)  # name: (rows, seconds)
    letters: dict[str, int] = field(default_factory=dict)  # name: rows it dead-lettered
    held: set[str] = field(default_factory=set)  # sinks whose own records held the batch
    retried: set[str] = field(default_factory=set)  # sinks written by a retry here
    failures: dict[str, str] = field(default_factory=dict)
    lags: list[str] = field(default_factory=list)  # sinks behind, described
    caught_up: dict[str, int] = field(default_factory=dict)  # sink: batches caught up
    rows_in: int | None = None  # a failed batch's, from fanout (Spark reports none)
    ended_at: datetime | None = None

    @property
    def over(self) -> bool:
        """Whether the batch committed or failed (its line can be written)."""
        return self.ended_at is not None


class ProgressObserver:
    """Collects per-batch progress from the hooks and writes one line per batch."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # sink hooks run in the sinks' threads
        self._batches: dict[int, BatchProgress] = {}
        self._reported: set[int] = set()
        self.input_rows = 0
        self.rows: dict[str, int] = {}  # written by the batches' attempts
        self.held_rows: dict[str, int] = {}  # found already written (a replay, a retry)
        self.letters: dict[str, int] = {}  # set aside as dead letters by the batches' writes
        self.seconds: dict[str, float] = {}
        self.skipped = 0
        self.failed = 0
        self._live: int | None = None  # the batch in flight
        self._first: int | None = None  # the run's first batch: the only possible replay
        self._caught_up: dict[str, int] = {}  # since the last line
        self.caught_up_rows: dict[str, int] = {}  # the catch-up's writes, for the summary
        self.caught_up_batches: dict[str, int] = {}

    @hookimpl
    def fanout_batch_start(
        self, info: BatchInfo, pending: Sequence[str], skipped: Sequence[str]
    ) -> None:
        """A batch began: remember the sinks the ledger says already hold it."""
        with self._lock:
            self._live = info.batch_id
            if self._first is None:
                self._first = info.batch_id
            self._batches[info.batch_id] = BatchProgress(
                info.batch_id, pending=list(pending), skipped=list(skipped)
            )

    @hookimpl
    def fanout_sink_start(self, info: BatchInfo, sink: str, attempt: int) -> None:
        """An attempt of a sink's write: a retry of the live batch is remembered."""
        with self._lock:
            batch = self._batches.get(info.batch_id)
            if attempt > 1 and batch is not None and info.batch_id == self._live:
                batch.retried.add(sink)

    @hookimpl
    def fanout_sink_done(
        self, info: BatchInfo, sink: str, result: SinkResult, duration_s: float
    ) -> None:
        """A sink wrote the batch (or, for an older batch, caught it up)."""
        with self._lock:
            if self._live is not None and info.batch_id != self._live:
                if result.already_written:  # an abandoned write's commit landed meanwhile
                    self.held_rows[sink] = self.held_rows.get(sink, 0) + result.rows
                else:
                    self._caught_up[sink] = self._caught_up.get(sink, 0) + 1
                    self.caught_up_batches[sink] = self.caught_up_batches.get(sink, 0) + 1
                    self.caught_up_rows[sink] = self.caught_up_rows.get(sink, 0) + result.rows
                return
            batch = self._batches.setdefault(info.batch_id, BatchProgress(info.batch_id))
            batch.sinks[sink] = (result.rows, duration_s)
            if result.dead_lettered:
                batch.letters[sink] = result.dead_lettered
            if result.already_written:
                batch.held.add(sink)

    @hookimpl
    def fanout_sink_lag(
        self, info: BatchInfo, lags: Mapping[str, SinkLag], spool: SpoolSize | None
    ) -> None:
        """The sinks behind after this batch, and what the catch-up wrote meanwhile."""
        with self._lock:
            batch = self._batches.setdefault(info.batch_id, BatchProgress(info.batch_id))
            batch.lags = [lag.describe() for lag in lags.values() if lag.state != "live"]
            batch.caught_up, self._caught_up = self._caught_up, {}

    @hookimpl
    def fanout_batch_end(self, info: BatchInfo, results: Mapping[str, SinkResult]) -> None:
        """Every pending sink committed the batch."""
        self._end(info.batch_id, {})

    @hookimpl
    def fanout_batch_failed(
        self,
        info: BatchInfo,
        failures: Mapping[str, BaseException],
        results: Mapping[str, SinkResult],
        error: BatchFailedError,
    ) -> None:
        """One or more sinks failed the batch; its input rows come with ``error``."""
        self._end(
            info.batch_id,
            {
                name: _first_line(error, f"sink {name!r}, batch {info.batch_id}: ")
                for name, error in failures.items()
            },
            rows_in=error.rows_in,
        )

    def _end(self, batch_id: int, failures: dict[str, str], *, rows_in: int | None = None) -> None:
        with self._lock:
            batch = self._batches.setdefault(batch_id, BatchProgress(batch_id))
            batch.failures = failures
            batch.rows_in = rows_in
            batch.ended_at = datetime.now(UTC)

    def report(self, spark_progress: Sequence[Mapping[str, Any]], out: TextIO) -> int:
        """Write the line of every batch that is over and whose Spark progress is in
        ``spark_progress`` (``query.recentProgress``); returns how many lines it wrote."""
        return self._write(_by_batch(spark_progress), out, final=False)

    def flush(self, spark_progress: Sequence[Mapping[str, Any]], out: TextIO) -> int:
        """Write the lines of every batch that is over, with or without Spark's progress
        (at the end of a run: a stopped query reports no progress for its last batch)."""
        return self._write(_by_batch(spark_progress), out, final=True)

    def _write(self, progress: dict[int, Mapping[str, Any]], out: TextIO, *, final: bool) -> int:
        with self._lock:
            ready = [
                b
                for batch_id, b in sorted(self._batches.items())
                if b.over and batch_id not in self._reported and (final or batch_id in progress)
            ]
            for batch in ready:
                self._reported.add(batch.batch_id)
                out.write(self._line(batch, progress.get(batch.batch_id)) + "\n")
        if ready:
            out.flush()
        return len(ready)

    def _line(self, batch: BatchProgress, spark: Mapping[str, Any] | None) -> str:
        rows_in = batch.rows_in if spark is None else int(spark.get("numInputRows") or 0)
        order = [s for s in batch.pending if s in batch.sinks]
        order += [s for s in batch.sinks if s not in order]
        written = ", ".join(
            f"{name} {batch.sinks[name][0]} rows"
            + (f" + {batch.letters[name]} dead-lettered" if name in batch.letters else "")
            + _held(name, batch, first=batch.batch_id == self._first)
            + f" {batch.sinks[name][1]:.2f}s"
            for name in order
        )
        for name, (rows, seconds) in batch.sinks.items():
            counts = self.held_rows if name in batch.held else self.rows
            counts[name] = counts.get(name, 0) + rows
            self.rows.setdefault(name, 0)
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        for name, letters in batch.letters.items():
            self.letters[name] = self.letters.get(name, 0) + letters
        self.skipped += len(batch.skipped)
        self.input_rows += rows_in or 0
        if batch.failures:
            self.failed += 1
            parts = [f"batch {batch.batch_id} FAILED"]
            if written:
                parts.append(written)
            parts += [f"{name} failed: {error}" for name, error in batch.failures.items()]
            return " | ".join(parts)
        head = f"batch {batch.batch_id}: " + (
            "? rows in" if rows_in is None else f"{rows_in} rows in"
        )
        parts = [head, written or "nothing to write"]
        if batch.skipped:
            parts.append("skipped " + ", ".join(batch.skipped))
        parts += batch.lags
        parts += [f"{name} caught up {n} batch(es)" for name, n in batch.caught_up.items()]
        lag = _lag(spark, batch.ended_at)
        if lag is not None:
            parts.append(f"lag {lag:.1f}s")
        return " | ".join(parts)

    def summary(self, pipeline: str) -> str:
        """One paragraph over the batches reported so far (call after :meth:`flush`)."""
        with self._lock:
            count = len(self._reported)
            lines = [
                f"pipeline {pipeline!r}: {count} batch{'' if count == 1 else 'es'}, "
                f"{self.input_rows} rows in"
                + (f", {self.failed} failed" if self.failed else "")
                + (
                    f", {self.skipped} sink writes skipped (already committed)"
                    if self.skipped
                    else ""
                )
            ]
            names = {*self.rows, *self.caught_up_rows, *self.held_rows}
            lines += [self._sink_summary(name) for name in sorted(names)]
        return "\n".join(lines)

    def _sink_summary(self, name: str) -> str:
        """``  clicks_pg: 2800 rows written in 58.32s, 2160 rows in 5 batches caught up, 30
        rows already there``: a lagging sink's catch-up writes count too, or it would look
        short of the rows it holds; rows its writes found already written (a replay, a
        retry after a commit) are counted apart, or a replay that wrote nothing would
        report them written."""
        parts = []
        if name in self.seconds:
            parts.append(f"{self.rows.get(name, 0)} rows written in {self.seconds[name]:.2f}s")
        if batches := self.caught_up_batches.get(name):
            parts.append(
                f"{self.caught_up_rows.get(name, 0)} rows in {batches} batch"
                f"{'' if batches == 1 else 'es'} caught up"
            )
        if name in self.held_rows:
            parts.append(f"{self.held_rows[name]} rows already there")
        if name in self.letters:
            parts.append(f"{self.letters[name]} rows dead-lettered")
        return f"  {name}: {', '.join(parts)}"


def _held(name: str, batch: BatchProgress, *, first: bool) -> str:
    """What the line says of a sink whose write found the batch already written: by whom.
    ``first``: the run's first batch, the only one an earlier run can have written."""
    if name not in batch.held:
        return ""
    if not first:
        return " already written by an earlier attempt"
    if name in batch.retried:
        return " already written by an earlier run or attempt"
    return " already written by an earlier run"


def _by_batch(spark_progress: Sequence[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    """Spark's progress of each batch that ran (idle triggers report the next batch id
    without running it; they have no ``addBatch`` duration)."""
    found: dict[int, Mapping[str, Any]] = {}
    for progress in spark_progress:
        if "addBatch" in (progress.get("durationMs") or {}):
            found[int(progress["batchId"])] = progress
    return found


def _lag(spark: Mapping[str, Any] | None, ended_at: datetime | None) -> float | None:
    if spark is None or ended_at is None or not spark.get("timestamp"):
        return None
    started = datetime.fromisoformat(str(spark["timestamp"]).replace("Z", "+00:00"))
    return max(0.0, (ended_at - started).total_seconds())


def _first_line(error: BaseException, known_prefix: str) -> str:
    """The error's first line, masked, without the "sink 'x', batch n: " the line says."""
    text = redact(str(error), known_secrets()).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    return first.removeprefix(known_prefix)
