"""Where a micro-batch's time goes, from Spark's event log: how long the cores ran no task,
one task, or two and more, and when the batch's first task started.

``bench_three_sinks.py --timeline`` turns the event log on (uncompressed, under the
benchmark's work directory) and prints, per variant, the medians over the best run's
batches. A batch is the span Spark reports as ``triggerExecution`` in its progress event;
"Spark's own" is that span less ``addBatch`` (listing the source, writing ``offsets/N``
and ``commits/N``, planning), and "before the first task" is what Spark and the
foreachBatch function (fanout, the sinks' driver-side work) did before any task ran.
While no task runs, only the driver, PostgreSQL and the broker can use the cores.

It also cuts each batch into its stages: until the scan, the scan, the wait for the sinks'
job (the driver preparing and submitting it), the sinks' tasks, and after them.

With the machine's CPU samples (``cpu_sampler.py``), it also prints how busy the cores were
in each of those states: work the driver, PostgreSQL or the broker did while no task ran is
not idle, and two tasks running may still leave a core idle while they wait.

The event log costs time of its own: the numbers of a ``--timeline`` run are for finding
idle time, not for comparing with runs without it.
"""

from __future__ import annotations

import bisect
import itertools
import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any


def event_log_conf(directory: Path) -> dict[str, str]:
    """Session settings writing an uncompressed event log under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": directory.resolve().as_uri(),
        "spark.eventLog.compress": "false",
    }


@dataclass(frozen=True)
class Task:
    """One task's run, in epoch milliseconds; ``final``: of its job's last stage (not of a
    stage writing a shuffle, such as the source's scan before a ``repartition``)."""

    launched: int
    finished: int
    final: bool = True


@dataclass(frozen=True)
class BatchSpan:
    """One micro-batch of a query, from its progress event."""

    query_id: str
    batch_id: int
    start_ms: int
    duration_ms: int
    add_batch_ms: int
    rows: int


@dataclass(frozen=True)
class Occupancy:
    """How a batch's span was spent, in milliseconds."""

    first_task: int
    """From the batch's start to its first task (the whole span when none ran)."""
    no_task: int
    one_task: int
    more_tasks: int
    one_map_task: int = 0
    """Of ``one_task``: the time the one task ran a stage writing a shuffle (a core idles
    while the last task of the source's scan ends)."""


@dataclass
class EventLog:
    """The tasks and the batches an event log recorded."""

    tasks: list[Task]
    batches: list[BatchSpan]

    @classmethod
    def read(cls, directory: Path) -> EventLog:
        """Every event log file under ``directory`` (plain JSON lines; Spark writes them
        out when the session stops)."""
        files = [
            path for path in sorted(directory.rglob("*"))
            if path.is_file() and not path.name.startswith((".", "appstatus"))
        ]  # fmt: skip
        return cls.parse(
            line for path in files
            for line in path.read_text(errors="replace").splitlines()
            if line.startswith("{")
        )  # fmt: skip

    @classmethod
    def parse(cls, lines: Iterable[str]) -> EventLog:
        """The tasks and batches of an event log's lines."""
        ended, batches = [], []
        final_stages: set[int] = set()
        for line in lines:
            event = json.loads(line)
            kind = event.get("Event", "")
            if kind == "SparkListenerJobStart" and event.get("Stage IDs"):
                final_stages.add(max(event["Stage IDs"]))  # the result stage: the last
            elif kind == "SparkListenerTaskEnd":
                info = event["Task Info"]
                ended.append((int(info["Launch Time"]), int(info["Finish Time"]),
                              event.get("Stage ID"), event.get("Task Type")))  # fmt: skip
            elif kind.endswith("QueryProgressEvent"):
                progress = event["progress"]
                durations = progress["durationMs"]
                batches.append(
                    BatchSpan(
                        query_id=str(progress["id"]),
                        batch_id=int(progress["batchId"]),
                        start_ms=_epoch_ms(progress["timestamp"]),
                        duration_ms=int(durations.get("triggerExecution", 0)),
                        add_batch_ms=int(durations.get("addBatch", 0)),
                        rows=_input_rows(progress),
                    )
                )
        tasks = [
            Task(launched, finished, _final(kind, stage, final_stages))
            for launched, finished, stage, kind in ended
        ]
        return cls(tasks, batches)

    def batches_of(self, query_ids: Iterable[str]) -> list[BatchSpan]:
        """The batches of these queries that read rows."""
        wanted = set(query_ids)
        return [b for b in self.batches if b.query_id in wanted and b.rows > 0]


def _final(task_type: str | None, stage: int | None, final_stages: set[int]) -> bool:
    # Spark names a task's type; a map stage run as a job of its own (a shared job's
    # shuffle started early) is its job's last stage and still writes a shuffle
    if task_type is not None:
        return task_type != "ShuffleMapTask"
    return stage is None or stage in final_stages


def occupancy(tasks: Sequence[Task], start: int, duration: int) -> Occupancy:
    """How many tasks ran during ``[start, start + duration)``, as time spent with none,
    one and two or more running (every task of the session counts: concurrent queries
    share the cores)."""
    end = start + duration
    edges: list[tuple[int, int, int]] = []  # (when, +1 or -1, +1 or -1 for a map task)
    for task in tasks:
        if task.finished > start and task.launched < end:
            mapping = 0 if task.final else 1
            edges += [(max(task.launched, start), 1, mapping),
                      (min(task.finished, end), -1, -mapping)]  # fmt: skip
    edges.sort()
    spent = [0, 0, 0]
    alone_mapping = 0
    running, maps, at = 0, 0, start
    for when, step, map_step in edges:
        spent[min(running, 2)] += when - at
        if running == 1 and maps == 1:
            alone_mapping += when - at
        running, maps, at = running + step, maps + map_step, when
    spent[min(running, 2)] += end - at
    first = min((when for when, step, _ in edges if step > 0), default=end) - start
    return Occupancy(first, spent[0], spent[1], spent[2], one_map_task=alone_mapping)


STATES = ("no task", "scan alone", "one task", "2+ tasks")
"""What ran in the cores, as :func:`idle_by_state` tells the states apart."""


@dataclass(frozen=True)
class CpuSample:
    """The machine's busy and total CPU ticks (every core summed) at ``at_ms``."""

    at_ms: float
    busy: int
    total: int


def read_cpu_samples(path: Path) -> list[CpuSample]:
    """The samples ``cpu_sampler.py`` wrote to ``path`` (an unfinished last line is left
    out)."""
    samples = []
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) == 3:
            samples.append(CpuSample(float(fields[0]), int(fields[1]), int(fields[2])))
    return samples


@dataclass
class StateCpu:
    """Wall time spent in one state and the machine's busy share then."""

    wall_ms: float = 0.0
    busy_ticks: int = 0
    total_ticks: int = 0

    def add(self, wall_ms: float, busy_ticks: int, total_ticks: int) -> None:
        """Count more time in this state."""
        self.wall_ms += wall_ms
        self.busy_ticks += busy_ticks
        self.total_ticks += total_ticks

    def busy_share(self) -> float:
        return self.busy_ticks / self.total_ticks if self.total_ticks else 0.0

    def idle_core_ms(self, cores: int) -> float:
        """Core-milliseconds no process used while in this state."""
        return self.wall_ms * cores * (1 - self.busy_share()) if self.total_ticks else 0.0


def idle_by_state(
    tasks: Sequence[Task], samples: Sequence[CpuSample], start: int, duration: int
) -> dict[str, StateCpu]:
    """Each of :data:`STATES` during ``[start, start + duration)``: its wall time and the
    ticks of the sample intervals whose midpoint it held (a tick is 10 ms of one core:
    only sums over many intervals are meaningful)."""
    end = start + duration
    running = [t for t in tasks if t.finished > start and t.launched < end]
    found = {state: StateCpu() for state in STATES}
    first = bisect.bisect_left(samples, float(start), key=lambda sample: sample.at_ms)
    for before, after in itertools.pairwise(samples[first:]):
        if after.at_ms > end:
            break
        mid = (before.at_ms + after.at_ms) / 2
        now = [t for t in running if t.launched <= mid < t.finished]
        if not now:
            state = "no task"
        elif len(now) == 1:
            state = "one task" if now[0].final else "scan alone"
        else:
            state = "2+ tasks"
        found[state].add(after.at_ms - before.at_ms, after.busy - before.busy,
                         after.total - before.total)  # fmt: skip
    return found


def idle_lines(
    name: str, log: EventLog, query_ids: Iterable[str], samples: Sequence[CpuSample], cores: int
) -> list[str]:
    """One line: per state, the wall ms and idle core-ms a batch (means over the batches
    of ``query_ids``) and the cores' busy share."""
    batches = log.batches_of(query_ids)
    if not batches:
        return [f"  {name:<9} no batch with rows in the event log"]
    total = {state: StateCpu() for state in STATES}
    for batch in batches:
        for state, spent in idle_by_state(
            log.tasks, samples, batch.start_ms, batch.duration_ms
        ).items():
            total[state].add(spent.wall_ms, spent.busy_ticks, spent.total_ticks)
    n = len(batches)
    cells = [
        f"{spent.wall_ms / n:5.0f} {spent.busy_share():4.0%} {spent.idle_core_ms(cores) / n:5.0f}"
        for spent in total.values()
    ]
    idle = sum(total[s].idle_core_ms(cores) for s in STATES) / n
    return [f"  {name:<9} " + "  ".join(cells) + f"  {idle:6.0f}"]


def print_idle(
    log: EventLog, runs: dict[str, Sequence[str]], samples: Sequence[CpuSample], cores: int
) -> None:
    """Where the cores idled in each run's batches (``runs``: variant -> its query ids)."""
    print(
        "\nwhere the cores idled (the machine's CPU from /proc/stat every 5 ms, by what ran; "
        "means a batch over the best run's batches: wall ms, busy share, idle core-ms):"
    )
    _print_table(
        f"  {'variant':<9} " + "  ".join(f"{s:>16}" for s in STATES) + f"  {'idle':>6}",
        [line for name, ids in runs.items() for line in idle_lines(name, log, ids, samples, cores)],
    )


def median(values: Iterable[float]) -> float:
    """The median of ``values`` (any iterable)."""
    return float(statistics.median(list(values)))


def timeline_lines(name: str, log: EventLog, query_ids: Iterable[str]) -> list[str]:
    """One line of medians over the batches of ``query_ids``."""
    batches = log.batches_of(query_ids)
    if not batches:
        return [f"  {name:<9} no batch with rows in the event log"]
    spans = [occupancy(log.tasks, b.start_ms, b.duration_ms) for b in batches]

    return [
        f"  {name:<9} {len(batches):>3} {median(b.duration_ms for b in batches):7.0f} "
        f"{median(b.duration_ms - b.add_batch_ms for b in batches):7.0f} "
        f"{median(s.first_task for s in spans):7.0f} {median(s.no_task for s in spans):7.0f} "
        f"{median(s.one_task for s in spans):7.0f} {median(s.one_map_task for s in spans):7.0f} "
        f"{median(s.more_tasks for s in spans):7.0f}"
    ]


@dataclass(frozen=True)
class Stages:
    """A batch's tasks in order, in milliseconds: until the first task of a stage writing a
    shuffle (the source's scan), that stage, from its end to the first final task (the
    driver preparing and submitting the sinks' job), the final tasks, and after the last."""

    to_scan: int
    scan: int
    scan_to_sinks: int
    sinks: int
    after: int


def stages(tasks: Sequence[Task], start: int, duration: int) -> Stages | None:
    """The :class:`Stages` of the batch ``[start, start + duration)``; ``None`` when its
    tasks did not run a shuffle's stage and then final tasks, each within the batch."""
    end = start + duration
    within = [t for t in tasks if t.launched >= start and t.finished <= end]
    maps = [t for t in within if not t.final]
    finals = [t for t in within if t.final]
    if not maps or not finals:
        return None
    scan_start, scan_end = min(t.launched for t in maps), max(t.finished for t in maps)
    sinks_start, sinks_end = min(t.launched for t in finals), max(t.finished for t in finals)
    if sinks_start < scan_end:
        return None
    return Stages(
        scan_start - start,
        scan_end - scan_start,
        sinks_start - scan_end,
        sinks_end - sinks_start,
        end - sinks_end,
    )


def stage_lines(name: str, log: EventLog, query_ids: Iterable[str]) -> list[str]:
    """One line of medians over the batches of ``query_ids`` that ran a scan's stage and
    then the sinks' tasks."""
    found = [
        found
        for b in log.batches_of(query_ids)
        if (found := stages(log.tasks, b.start_ms, b.duration_ms)) is not None
    ]
    if not found:
        return [f"  {name:<9} no batch with a shuffle's stage and then final tasks"]

    return [
        f"  {name:<9} {len(found):>3} {median(s.to_scan for s in found):7.0f} "
        f"{median(s.scan for s in found):7.0f} {median(s.scan_to_sinks for s in found):7.0f} "
        f"{median(s.sinks for s in found):7.0f} {median(s.after for s in found):7.0f}"
    ]


def print_timeline(log: EventLog, runs: dict[str, Sequence[str]]) -> None:
    """The medians of each run's batches (``runs``: variant -> its query ids)."""
    print(
        "\nwhere each batch's time went (Spark's event log, medians over the best run's "
        "batches, ms; the event log slows every variant):"
    )
    _print_table(
        f"  {'variant':<9} {'n':>3} {'batch':>7} {'spark':>7} {'to 1st':>7} {'0 tasks':>7} "
        f"{'1 task':>7} {'of it':>7} {'2+':>7}",
        [line for name, ids in runs.items() for line in timeline_lines(name, log, ids)],
        "  (spark: triggerExecution - addBatch; to 1st: from the batch's start to its first "
        "task; 0 tasks / 1 task / 2+: time with that many tasks running; of it: the one task "
        "was of a stage writing a shuffle, such as the source's scan before the sinks' "
        "repartition)",
    )
    _print_table(
        f"\n  {'variant':<9} {'n':>3} {'to scan':>7} {'scan':>7} {'->sinks':>7} {'sinks':>7} "
        f"{'after':>7}",
        [line for name, ids in runs.items() for line in stage_lines(name, log, ids)],
        "  (batches whose scan wrote a shuffle read by the sinks' tasks: from the batch's "
        "start to the scan's first task; the scan's stage; from its end to the sinks' first "
        "task, the driver preparing and submitting their job; the sinks' tasks; after the "
        "last, their commits and Spark's steps)",
    )


def _print_table(header: str, lines: Sequence[str], note: str | None = None) -> None:
    print(header)
    for line in lines:
        print(line)
    if note is not None:
        print(note)


def _input_rows(progress: dict[str, Any]) -> int:
    # the event log holds the progress's fields, without the sum its JSON form adds
    sources = progress.get("sources") or []
    return sum(int(source.get("numInputRows", 0)) for source in sources)


def _epoch_ms(timestamp: str) -> int:
    return int(datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000)
