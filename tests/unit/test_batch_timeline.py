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
