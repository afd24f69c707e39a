"""bench/batch_timeline.py: a batch's time with no task, one, or two and more running,
from the lines of a Spark event log (no Spark here)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.unit.bench_modules import load_bench

(timeline,) = load_bench("batch_timeline")
EventLog, Occupancy, Task = timeline.EventLog, timeline.Occupancy, timeline.Task
occupancy, timeline_lines = timeline.occupancy, timeline.timeline_lines

START = 1_795_000_000_000  # 2026-11-18T11:06:40Z in epoch ms


def test_occupancy_counts_the_tasks_running_at_each_instant() -> None:
    # 0..100 none; 100..150 one; 150..300 two (a third overlaps: still "2+"); 300..350 one;
    # 350..400 none
    tasks = [Task(START + 100, START + 300), Task(START + 150, START + 350),
             Task(START + 200, START + 250)]  # fmt: skip
    assert occupancy(tasks, START, 400) == Occupancy(100, 150, 100, 150)


def test_occupancy_clips_tasks_to_the_batch_and_ignores_others() -> None:
    tasks = [
        Task(START - 50, START + 30),  # began in the batch before
        Task(START + 380, START + 500),  # runs on past the batch's end
        Task(START + 600, START + 700),  # the next batch's
        Task(START - 90, START - 10),  # the previous batch's
    ]
    assert occupancy(tasks, START, 400) == Occupancy(0, 350, 50, 0)


def test_one_task_of_a_stage_writing_a_shuffle_is_told_apart() -> None:
    # the source's scan (two map tasks, one ending at 150), then the sinks' two tasks
    tasks = [Task(START + 10, START + 150, final=False), Task(START + 10, START + 90, final=False),
             Task(START + 160, START + 300), Task(START + 160, START + 260)]  # fmt: skip
    assert occupancy(tasks, START, 320) == Occupancy(10, 40, 100, 180, one_map_task=60)


def test_a_batch_without_tasks_is_all_idle() -> None:
    assert occupancy([], START, 80) == Occupancy(80, 80, 0, 0)


def _progress(query: str, batch: int, start_iso: str, trigger: int, add: int, rows: int) -> str:
    event = {
        "Event": "org.apache.spark.sql.streaming.StreamingQueryListener$QueryProgressEvent",
        "progress": {
            "id": query, "batchId": batch, "timestamp": start_iso,
            "durationMs": {"triggerExecution": trigger, "addBatch": add},
            "sources": [{"numInputRows": rows - rows // 2}, {"numInputRows": rows // 2}],
        },
    }  # fmt: skip
    return json.dumps(event)


def _task(launch: int, finish: int, stage: int = 2, kind: str | None = None) -> str:
    info = {"Launch Time": launch, "Finish Time": finish}
    event = {"Event": "SparkListenerTaskEnd", "Stage ID": stage, "Task Info": info}
    return json.dumps(event if kind is None else {**event, "Task Type": kind})


def test_the_event_log_gives_each_querys_batches_and_the_tasks(tmp_path: Path) -> None:
    lines = [
        json.dumps({"Event": "SparkListenerJobStart", "Job ID": 1, "Stage IDs": [1, 2]}),
        _task(START + 20, START + 40, stage=1),  # the scan, alone for 20 ms
        _task(START + 40, START + 140),
        _task(START + 60, START + 160),
        _progress("q-a", 0, "2026-11-18T11:06:40.000Z", 200, 150, 10),
        _progress("q-a", 1, "2026-11-18T11:06:41.000Z", 30, 1, 0),  # no rows: left out
        _progress("q-b", 0, "2026-11-18T11:06:40.000Z", 200, 150, 10),
    ]
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "events_1_local-1").write_text("\n".join(lines) + "\n")
    log = EventLog.read(tmp_path)
    assert log.tasks == [
        Task(START + 20, START + 40, final=False),
        Task(START + 40, START + 140),
        Task(START + 60, START + 160),
    ]
    batches = log.batches_of(["q-a"])
    assert [(b.query_id, b.batch_id, b.start_ms, b.duration_ms) for b in batches] == [
        ("q-a", 0, START, 200)
    ]
    # batch 200 ms, Spark's own 50, first task at 20, none 20+40, one 20+20+20 (the first
    # 20 the scan's), two 80
    assert timeline_lines("a", log, ["q-a"]) == [
        "  a           1     200      50      20      60      60      20      80"
    ]
    assert timeline_lines("c", log, ["q-c"]) == ["  c         no batch with rows in the event log"]


def test_a_map_stage_run_as_a_job_of_its_own_is_told_apart_by_its_task_type(
    tmp_path: Path,
) -> None:
    lines = [  # a shared job's shuffle started early: its map stage is a job's last stage
        json.dumps({"Event": "SparkListenerJobStart", "Job ID": 1, "Stage IDs": [1]}),
        json.dumps({"Event": "SparkListenerJobStart", "Job ID": 2, "Stage IDs": [1, 2]}),
        _task(START + 20, START + 40, stage=1, kind="ShuffleMapTask"),
        _task(START + 40, START + 140, stage=2, kind="ResultTask"),
    ]
    (tmp_path / "events").write_text("\n".join(lines) + "\n")
    assert EventLog.read(tmp_path).tasks == [
        Task(START + 20, START + 40, final=False),
        Task(START + 40, START + 140),
    ]


CpuSample, idle_by_state, idle_lines = (
    timeline.CpuSample,
    timeline.idle_by_state,
    timeline.idle_lines,
)


def _samples(*steps: tuple[int, int, int]) -> list[object]:
    """Samples every ``dt`` ms from START, each adding ``busy`` of ``total`` ticks."""
    at, busy, total = START, 0, 0
    found = [CpuSample(at, busy, total)]
    for dt, add_busy, add_total in steps:
        at, busy, total = at + dt, busy + add_busy, total + add_total
        found.append(CpuSample(at, busy, total))
    return found


def test_idle_is_told_by_what_ran_at_each_samples_midpoint() -> None:
    # 0-100: nothing runs; 100-150: the scan's last task alone; 150-250: two sink tasks;
    # 250-300: one sink task
    tasks = [Task(START + 100, START + 150, final=False), Task(START + 150, START + 250),
             Task(START + 150, START + 300)]  # fmt: skip
    samples = _samples(
        (50, 1, 4),
        (50, 3, 4),  # no task: 4 of 8 ticks busy
        (50, 2, 4),  # the scan alone: half busy
        (50, 4, 4),
        (50, 3, 4),  # two tasks: 7 of 8
        (50, 4, 4),  # one task: all busy
        (50, 0, 4),  # after the batch: not counted
    )
    found = idle_by_state(tasks, samples, START, 300)
    assert {s: (v.wall_ms, v.busy_ticks, v.total_ticks) for s, v in found.items()} == {
        "no task": (100, 4, 8),
        "scan alone": (50, 2, 4),
        "2+ tasks": (100, 7, 8),
        "one task": (50, 4, 4),
    }
    assert found["no task"].idle_core_ms(2) == 100.0  # 100 ms x 2 cores x half idle
    assert found["2+ tasks"].idle_core_ms(2) == 25.0
    assert found["one task"].idle_core_ms(2) == 0.0


def test_samples_outside_the_batch_and_states_never_met_count_nothing() -> None:
    samples = _samples((40, 0, 4), (40, 4, 4), (40, 4, 4))  # START..START+120
    found = idle_by_state([], samples, START + 40, 40)  # only the second interval
    assert (found["no task"].wall_ms, found["no task"].busy_ticks) == (40, 4)
    assert found["2+ tasks"].wall_ms == 0 and found["2+ tasks"].idle_core_ms(2) == 0.0


def test_the_idle_line_sums_every_batch_then_divides_by_the_batches() -> None:
    log = EventLog(
        tasks=[Task(START + 100, START + 200), Task(START + 1100, START + 1200)],
        batches=[
            timeline.BatchSpan("q", 0, START, 200, 150, 10),
            timeline.BatchSpan("q", 1, START + 1000, 200, 150, 10),
            timeline.BatchSpan("q", 2, START + 2000, 200, 150, 0),  # no rows: left out
        ],
    )
    steps = [(100, 1, 2), (100, 2, 2), (800, 0, 16), (100, 0, 2), (100, 2, 2)]
    # batch 0: no task 100 ms half busy, then one task 100 ms all busy; batch 1: no task
    # all idle, then one task all busy. No task: 200 ms, 1 of 4 ticks busy: 300 idle
    # core-ms, 150 a batch
    assert idle_lines("a", log, ["q"], _samples(*steps), 2) == [
        "  a           100  25%   150      0   0%     0    100 100%     0      0   0%     0     150"
    ]


def test_cpu_samples_are_read_back_and_a_cut_last_line_is_left_out(tmp_path: Path) -> None:
    path = tmp_path / "cpu.txt"
    path.write_text(f"{START}.0 10 40\n{START + 5}.5 12 42\n{START + 10}.0 1")
    assert timeline.read_cpu_samples(path) == [
        CpuSample(START, 10, 40),
        CpuSample(START + 5.5, 12, 42),
    ]


def test_a_batch_is_cut_into_its_scan_the_wait_for_the_sinks_and_their_tasks() -> None:
    # the scan's two tasks 30-150, the sinks' first task at 170, the last ending at 380
    tasks = [Task(START + 30, START + 100, final=False), Task(START + 30, START + 150, final=False),
             Task(START + 170, START + 300), Task(START + 175, START + 380),
             Task(START + 600, START + 700)]  # fmt: skip
    assert timeline.stages(tasks, START, 400) == timeline.Stages(30, 120, 20, 210, 20)


def test_a_batch_without_a_scan_stage_then_sink_tasks_has_no_stages() -> None:
    sinks_only = [Task(START + 10, START + 90)]
    scan_only = [Task(START + 10, START + 90, final=False)]
    overlapping = [Task(START + 10, START + 90, final=False), Task(START + 50, START + 95)]
    for tasks in (sinks_only, scan_only, overlapping):
        assert timeline.stages(tasks, START, 100) is None


def test_the_stage_line_gives_each_parts_median() -> None:
    log = EventLog(
        tasks=[
            Task(START + 30, START + 150, final=False), Task(START + 170, START + 380),
            Task(START + 1010, START + 1100, final=False), Task(START + 1104, START + 1300),
            Task(START + 2000, START + 2050),  # batch 2: no scan stage, left out
        ],
        batches=[
            timeline.BatchSpan("q", 0, START, 400, 300, 10),
            timeline.BatchSpan("q", 1, START + 1000, 320, 300, 10),
            timeline.BatchSpan("q", 2, START + 2000, 60, 50, 10),
        ],
    )  # fmt: skip
    # to scan 30 and 10, scan 120 and 90, wait 20 and 4, sinks 210 and 196, after 20 and 20
    assert timeline.stage_lines("a", log, ["q"]) == [
        "  a           2      20     105      12     203      20"
    ]
    assert timeline.stage_lines("c", log, ["other"]) == [
        "  c         no batch with a shuffle's stage and then final tasks"
    ]
