"""Executor kills: SIGKILL an executor JVM of a ``local-cluster`` session while a sink
writes.

- From inside (:class:`ExecutorKiller`, a plugin pickled to the executors with every
  partition task of the partitioned-sink kit): the per-partition commit hooks of a chosen
  sink, batch and partition kill the executor JVM running them, ``before`` the partition's
  transaction commits (``fanout_partition_commit``) or ``after`` (``fanout_partition_committed``),
  then the Python worker itself (a whole executor gone: its connection or producer dies
  with it). A marker file decides once, across processes: Spark's retry of the task, on
  another executor or a relaunched one, runs through.
- From outside (:class:`OutsideKiller`, a thread of the harness): once the driver says a
  sink started writing (:class:`WritingNotes`, a driver-side plugin), it waits a random
  delay and SIGKILLs a random executor JVM of that driver.

Executors import this module by name: put the repository on ``PYTHONPATH`` of the driver
process (the executors inherit its environment).
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from fanout import hookimpl
from fanout.contract.batch import BatchInfo
from fanout.contract.partitions import PartitionCommit

EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
When = Literal["before", "after"]


@dataclass(frozen=True)
class ExecutorKill:
    """Kill the executor writing ``partition`` of ``sink``'s batch ``batch_id``, ``before``
    or ``after`` the partition's transaction commits (first attempt only)."""

    sink: str
    batch_id: int
    partition: int
    when: When = "before"

    def describe(self) -> str:
        """A short label for tables and logs."""
        return (
            f"executor {self.when} commit of {self.sink} p{self.partition} @ batch {self.batch_id}"
        )

    @property
    def point(self) -> str:
        """The kill point, for the per-point counts: ``executor <sink> <when> commit``."""
        return f"executor {self.sink} {self.when} commit"

    def marker(self) -> str:
        """The marker file's name (one per kill)."""
        return f"{self.sink}-b{self.batch_id}-p{self.partition}-{self.when}.json"


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def executor_jvm(pid: int | None = None) -> int | None:
    """The executor JVM among the ancestors of ``pid`` (this process): a Python worker's
    parent is the pyspark daemon, whose parent is the executor; None on ``local[N]``
    (the executors are threads of the driver's JVM)."""
    pid = os.getpid() if pid is None else pid
    while pid > 1:
        if EXECUTOR_CLASS in _cmdline(pid):
            return pid
        pid = _parent(pid)
    return None


def executors_of(driver_pid: int) -> list[int]:
    """The executor JVMs descending from ``driver_pid`` (other drivers' are left alone)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or EXECUTOR_CLASS not in _cmdline(int(entry.name)):
            continue
        pid = int(entry.name)
        try:
            while pid > 1 and pid != driver_pid:
                pid = _parent(pid)
        except (OSError, ValueError):
            continue
        if pid == driver_pid:
            found.append(int(entry.name))
    return sorted(found)


class ExecutorKiller:
    """Kills the executor JVM at each planned :class:`ExecutorKill` (on the executor, in
    the per-partition commit hooks); notes each kill as a JSON file in ``state``."""

    def __init__(self, kills: list[ExecutorKill], state: str) -> None:
        self.kills, self.state = list(kills), state

    def _hit(self, commit: PartitionCommit, when: When) -> None:
        for kill in self.kills:
            if (kill.sink, kill.batch_id, kill.partition, kill.when) != (
                commit.sink, commit.batch_id, commit.partition, when
            ):  # fmt: skip
                continue
            jvm = executor_jvm()
            if jvm is None:
                return  # no executor process to kill (local[N])
            try:  # the marker decides once, across the executors' processes
                fd = os.open(Path(self.state, kill.marker()), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return
            note = {**asdict(kill), "point": kill.point, "label": kill.describe(),
                    "written": commit.written, "executor_pid": jvm,
                    "time": time.time()}  # fmt: skip
            os.write(fd, json.dumps(note).encode())
            os.close(fd)
            os.kill(jvm, signal.SIGKILL)
            os._exit(137)  # the worker dies with its executor, its transaction open

    @hookimpl
    def fanout_partition_commit(self, commit: PartitionCommit) -> None:
        """Just before the partition commits."""
        self._hit(commit, "before")

    @hookimpl
    def fanout_partition_committed(self, commit: PartitionCommit) -> None:
        """Right after the partition committed."""
        self._hit(commit, "after")


def kills_done(state: Path) -> list[dict[str, object]]:
    """The kills :class:`ExecutorKiller` made (and :class:`OutsideKiller` noted), oldest first."""
    notes = [json.loads(p.read_text()) for p in state.glob("*.json") if p.stat().st_size]
    return sorted(notes, key=lambda n: float(n["time"]))  # type: ignore[arg-type]


class WritingNotes:
    """On the driver: appends ``<batch> <sink>`` to ``path`` when a sink starts writing."""

    def __init__(self, path: str) -> None:
        self.path = path

    @hookimpl
    def fanout_sink_start(self, info: BatchInfo, sink: str, attempt: int) -> None:
        """Note the start of a sink's write."""
        with open(self.path, "a") as notes:
            notes.write(f"{info.batch_id} {sink}\n")


@dataclass(frozen=True)
class OutsideKill:
    """Once ``sink`` starts writing batch ``batch_id``, wait ``delay_s``, SIGKILL a random
    executor JVM."""

    sink: str
    batch_id: int
    delay_s: float

    @property
    def point(self) -> str:
        """The kill point, for the per-point counts."""
        return f"outside, {self.sink} writing"

    def describe(self) -> str:
        """A short label for tables and logs."""
        return (
            f"outside while {self.sink} writes batch {self.batch_id} +{self.delay_s * 1000:.0f}ms"
        )


class OutsideKiller(threading.Thread):
    """Watches the driver's :class:`WritingNotes` and makes the planned
    :class:`OutsideKill` s; each kill made is noted in ``state`` like the inside ones."""

    def __init__(
        self, kills: list[OutsideKill], notes: Path, state: Path, driver_pid: int, seed: int
    ) -> None:
        super().__init__(daemon=True)
        self.kills, self.notes, self.state = list(kills), notes, state
        self.driver_pid, self.rng = driver_pid, random.Random(seed)
        self.stopped = threading.Event()

    def _writing(self, kill: OutsideKill) -> bool:
        if not self.notes.exists():
            return False
        return f"{kill.batch_id} {kill.sink}" in self.notes.read_text().splitlines()

    def run(self) -> None:
        """Kill each planned executor in turn, until stopped."""
        for n, kill in enumerate(self.kills):
            while not self._writing(kill):
                if self.stopped.wait(0.05):
                    return
            time.sleep(kill.delay_s)
            executors = executors_of(self.driver_pid)
            if not executors:
                continue
            victim = self.rng.choice(executors)
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                continue
            label, point = kill.describe(), kill.point
            note = {**asdict(kill), "when": "outside", "point": point, "label": label,
                    "executor_pid": victim, "time": time.time()}  # fmt: skip
            (self.state / f"outside-{n}.json").write_text(json.dumps(note))
