"""Faults for tests, injected only through fanout's hooks and protocols (product code has
no test-only branches): the one place the suite's killers live, shipped for plugin authors.

- :class:`KillAt` hard-kills a process at a chosen point of a batch: on the driver before
  any sink writes, after a sink wrote and before its ledger mark, after every mark; or on
  the executor right after a chosen partition committed (killing the driver).
- :class:`DieAfterWrite` raises :class:`DriverKilled` (a ``BaseException``, nothing
  catches it) after a sink wrote a batch and before its mark: the same window in the
  test's own process, no subprocess to start; :class:`DieBeforeWrites` as the batch
  starts, before any sink writes it.
- :class:`VetoOnce` aborts one partition's first commit with a transient error.
- :class:`MarkLost` is a ledger that loses a sink's marks (the driver died after the
  sink wrote).
- :class:`DownWhile` makes a sink's target down (every write fails) while its ``down``
  holds: a sink left behind, to lag or to catch up once ``down`` is set false.

Executors import this module by name (fanout is installed there): nothing to ship.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from fanout.contract.batch import Batch, BatchInfo
from fanout.contract.partitions import PartitionCommit
from fanout.contract.sink import SinkResult
from fanout.errors import SinkWriteError, TransientSinkError
from fanout.hooks.specs import hookimpl
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry

KILL_EXIT_CODE = 137
"""What a process killed by :class:`KillAt` reports: 128 + 9, like a SIGKILL."""

Point = Literal["batch_start", "sink_done", "batch_end", "partition_committed"]


class DownWhile:
    """Mixed in before a sink type (``class DownDelta(DownWhile, DeltaSink): ...``), its
    ``write`` raises :class:`~fanout.errors.SinkWriteError` (final: not retried) naming the
    sink and the batch while ``down`` holds, and writes as the sink type once it is set
    false: a target down from the start, to lag (``on_failure="lag"``) or be caught up.
    Only ``write`` is down: ``open``, ``holds_batch`` and the rest answer as the sink's.

    ``down`` is an attribute of the instance (``sink.down = False``), true to begin with;
    ``down_message`` is what the error says (set it on the subclass or the instance)."""

    down: bool = True
    down_message: str = "the target is down"

    def write(self, batch: Batch) -> SinkResult:
        """Fail while ``down``, else write as the sink type does."""
        if self.down:
            raise SinkWriteError(self.down_message, sink=batch.sink_name, batch_id=batch.batch_id)
        return super().write(batch)  # type: ignore[misc]


class KillAt:
    """Kills at ``point`` of batch ``batch_id`` (no cleanup, no ``finally``: a hard kill).

    :param point: ``batch_start`` (before any sink writes), ``sink_done`` (after ``sink``
        wrote, before its ledger mark), ``batch_end`` (after every mark, before Spark's
        commit log): the driver exits with :data:`KILL_EXIT_CODE`; or
        ``partition_committed`` (on the executor, right after ``partition`` of ``sink``, or
        any partition when ``None``, committed): ``driver_pid`` (its process group with
        ``group``) gets SIGKILL and the worker exits.
    :param note: a file to write what was killed into (a dying worker's stderr is lost).
    """

    def __init__(
        self,
        point: Point,
        batch_id: int,
        *,
        sink: str | None = None,
        partition: int | None = None,
        driver_pid: int | None = None,
        group: bool = False,
        note: str | None = None,
    ) -> None:
        self.point, self.batch_id, self.sink = point, batch_id, sink
        self.partition, self.driver_pid, self.group, self.note = partition, driver_pid, group, note

    def _say(self, text: str) -> None:
        print(f"KILL {text}", file=sys.stderr, flush=True)
        if self.note:
            Path(self.note).write_text(f"KILL {text}\n")

    def _die(self, info: BatchInfo, point: str, sink: str | None = None) -> None:
        if point == self.point and info.batch_id == self.batch_id and sink == self.sink:
            self._say(f"at {point} batch {info.batch_id} sink {sink}")
            os._exit(KILL_EXIT_CODE)

    @hookimpl
    def fanout_batch_start(
        self, info: BatchInfo, pending: Sequence[str], skipped: Sequence[str]
    ) -> None:
        """Kill before any sink writes."""
        self._die(info, "batch_start")

    @hookimpl
    def fanout_sink_done(
        self, info: BatchInfo, sink: str, result: SinkResult, duration_s: float
    ) -> None:
        """Kill after a sink's write, before its ledger mark."""
        self._die(info, "sink_done", sink)

    @hookimpl
    def fanout_batch_end(self, info: BatchInfo, results: Mapping[str, SinkResult]) -> None:
        """Kill after every mark, before Spark's commit log."""
        self._die(info, "batch_end")

    @hookimpl
    def fanout_partition_committed(self, commit: PartitionCommit) -> None:
        """On the executor: kill the driver right after the chosen partition committed."""
        chosen = self.partition is None or commit.partition == self.partition
        if self.point != "partition_committed" or commit.batch_id != self.batch_id:
            return
        if not chosen or (self.sink is not None and commit.sink != self.sink):
            return
        self._say(f"driver after batch {commit.batch_id} partition {commit.partition}")
        assert self.driver_pid is not None, "partition_committed needs driver_pid"
        if self.group:
            os.killpg(os.getpgid(self.driver_pid), signal.SIGKILL)
        else:
            os.kill(self.driver_pid, signal.SIGKILL)
        os._exit(KILL_EXIT_CODE)


class DriverKilled(BaseException):
    """The driver's death in a test's own process (:class:`DieAfterWrite`)."""


class DieAfterWrite:
    """Raises :class:`DriverKilled` once ``sink`` wrote batch ``batch_id``, before its
    ledger mark (and before the sinks after it write the batch)."""

    def __init__(self, sink: str, batch_id: int) -> None:
        self.sink, self.batch_id = sink, batch_id

    @hookimpl
    def fanout_sink_done(
        self, info: BatchInfo, sink: str, result: SinkResult, duration_s: float
    ) -> None:
        """Die after the chosen sink's write of the chosen batch."""
        if info.batch_id == self.batch_id and sink == self.sink:
            raise DriverKilled(f"killed after {sink} wrote batch {info.batch_id}, before its mark")


class DieBeforeWrites:
    """Raises :class:`DriverKilled` as batch ``batch_id`` starts, before any sink writes it
    (past the checks that may refuse it)."""

    def __init__(self, batch_id: int) -> None:
        self.batch_id = batch_id

    @hookimpl
    def fanout_batch_start(
        self, info: BatchInfo, pending: Sequence[str], skipped: Sequence[str]
    ) -> None:
        """Die before the writes of the chosen batch."""
        if info.batch_id == self.batch_id:
            raise DriverKilled(f"killed as batch {info.batch_id} started, before any write")


class VetoOnce:
    """Vetoes partition ``partition`` of batch ``batch`` once, after its rows were written
    and before its commit: an aborted attempt. Records what it vetoed in ``state`` (JSON),
    which also makes it veto only once across processes. With ``sink``, only that sink's
    partition is vetoed."""

    def __init__(self, *, batch: int, partition: int, state: str, sink: str | None = None) -> None:
        self.veto_batch, self.veto_partition, self.state = batch, partition, state
        self.veto_sink = sink

    @hookimpl
    def fanout_partition_commit(self, commit: PartitionCommit) -> None:
        """Abort the chosen partition's first attempt with a transient error."""
        state = Path(self.state)
        chosen = (commit.batch_id, commit.partition) == (self.veto_batch, self.veto_partition)
        chosen = chosen and self.veto_sink in (None, commit.sink)
        if chosen and not state.exists():
            vetoed = {"batch": commit.batch_id, "partition": commit.partition,
                      "records": commit.written}  # fmt: skip
            state.write_text(json.dumps(vetoed))
            raise TransientSinkError(
                "injected veto before commit", sink=commit.sink, batch_id=commit.batch_id
            )


class MarkLost(DeltaLedger):
    """A ledger that loses ``sink``'s marks: as if the driver died after the sink wrote
    (dead letters included), before its ledger mark. Run the batch again with a plain
    ledger on the same path for the replay."""

    def __init__(self, path: str, sink: str) -> None:
        super().__init__(path)
        self.sink = sink

    def mark_committed(self, entry: LedgerEntry) -> bool:
        """Fail for ``sink``; mark the others."""
        if entry.sink == self.sink:
            raise OSError("driver killed before the ledger mark")
        return super().mark_committed(entry)
