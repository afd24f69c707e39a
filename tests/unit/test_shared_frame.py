"""A shared job's input built while its members prepare, from the group's last layout
(:mod:`fanout.steps.shared_frame`), without Spark: stub DataFrames record each step."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from fanout.contract.batch import Batch, BatchInfo
from fanout.contract.sharing import SharedShape
from fanout.partitioned.outcome import PartitionOutcome
from fanout.partitioned.sink import PartitionedSink, PartitionInput, PreparedPartitions
from fanout.partitioned.task import CommitHooks, PartitionTask
from fanout.steps.share import SharedPass
from fanout.steps.shared_frame import JobLayout, RecentLayouts

PARTITIONS = 2


class Frame:
    """A batch DataFrame recording the steps built on it; each step a new frame naming its
    path from the batch."""

    def __init__(self, log: list[tuple[Any, ...]], path: tuple[Any, ...] = ()) -> None:
        self.log, self.path = log, path
        self.selected = threading.Event()

    def _step(self, *step: Any) -> Frame:
        self.log.append(step)
        return Frame(self.log, (*self.path, step))

    def selectExpr(self, *columns: Any) -> Frame:
        child = self._step("select", *columns)
        self.selected.set()
        return child

    def repartition(self, partitions: int, *by: Any) -> Frame:
        return self._step("repartition", partitions, *by)

    def sortWithinPartitions(self, *columns: Any) -> Frame:
        return self._step("sort", *columns)

    def mapInArrow(self, task: Any, schema: Any) -> Job:
        self.log.append(("job", self.path))
        return Job(len(task.members))


class Job:
    """The shared job: every member commits every partition."""

    def __init__(self, members: int) -> None:
        self.members = members

    def collect(self) -> list[dict[str, Any]]:
        return [
            {"member": m, "partition": p, "outcome": _committed(p)}
            for m in range(self.members)
            for p in range(PARTITIONS)
        ]


def _committed(partition: int) -> str:
    return PartitionOutcome(partition, "committed", rows=1, written=1).to_json()


class Member(PartitionedSink):
    """A member reading ``columns``; its preparation waits (up to 5 s) for the batch's
    frame to be selected from, and records whether that happened meanwhile."""

    def __init__(self, name: str, columns: Sequence[str], frame: Frame) -> None:
        self.name, self.partitions = name, PARTITIONS
        self.columns, self.frame = list(columns), frame
        self.saw_early_input: bool | None = None

    def partitioned_by(self) -> Sequence[str]:
        return ["id"]

    def prepare_partitions(self, batch: Any) -> PreparedPartitions:
        self.saw_early_input = self.frame.selected.wait(5)
        given = PartitionInput(
            self.frame, ["id"], membership=False, renamed=[(c, c) for c in self.columns]
        )
        task = PartitionTask(object(), CommitHooks("p", self.name, 0))  # type: ignore[arg-type]
        return PreparedPartitions(given, task, lambda: None)


def _run(frame: Frame, members: list[Member], layouts: RecentLayouts, batch_id: int) -> list[int]:
    batches = {m.name: Batch(frame, BatchInfo("p", batch_id), m.name, f"fanout/p/{m.name}")
               for m in members}  # fmt: skip
    shared = SharedPass(frame, {m.name: (m, batches[m.name]) for m in members}, layouts)
    return [shared.write(m.name).rows for m in members]


def test_the_layout_reads_each_column_once_and_adds_the_member_column_only_to_a_shape() -> None:
    shape = SharedShape(4, ("id",), ("ts",))
    members = [((("id", "id"), ("v", "value")), False), ((("v", "v"), ("ts", "ts")), True)]
    assert JobLayout.of(shape, members) == JobLayout(("id", "v", "ts"), shape, True)
    assert JobLayout.of(shape, [(m, False) for m, _ in members]).member_column is False
    assert JobLayout.of(None, members) == JobLayout(("id", "v", "ts"), None, False)


def test_the_next_batch_builds_its_job_input_while_the_members_prepare() -> None:
    layouts = RecentLayouts()
    first: list[tuple[Any, ...]] = []
    frame = Frame(first)
    members = [Member("pg", ["id", "v"], frame), Member("kafka", ["id"], frame)]
    # no layout yet: the input is built after the members prepared (the event is set so
    # that they do not wait 5 s for a select that comes only after them)
    frame.selected.set()
    assert _run(frame, members, layouts, 0) == [PARTITIONS, PARTITIONS]
    built = [("select", "`id`", "`v`"), ("repartition", PARTITIONS, "`id`")]
    assert first == [*built, ("job", tuple(built))]
    assert layouts.last(("pg", "kafka")) == JobLayout(
        ("id", "v"), SharedShape(PARTITIONS, ("id",)), False
    )

    second: list[tuple[Any, ...]] = []
    frame = Frame(second)
    members = [Member("pg", ["id", "v"], frame), Member("kafka", ["id"], frame)]
    assert _run(frame, members, layouts, 1) == [PARTITIONS, PARTITIONS]
    assert [m.saw_early_input for m in members] == [True, True]  # built while they prepared
    assert second == [*built, ("job", tuple(built))]  # once: the early input is the job's


def test_a_changed_layout_builds_the_input_again_and_the_job_reads_the_new_one() -> None:
    layouts = RecentLayouts()
    layouts.remember(("pg", "kafka"), JobLayout(("id",), SharedShape(PARTITIONS, ("id",)), False))
    log: list[tuple[Any, ...]] = []
    frame = Frame(log)
    members = [Member("pg", ["id", "v"], frame), Member("kafka", ["id"], frame)]
    assert _run(frame, members, layouts, 1) == [PARTITIONS, PARTITIONS]
    guessed = [("select", "`id`"), ("repartition", PARTITIONS, "`id`")]
    needed = [("select", "`id`", "`v`"), ("repartition", PARTITIONS, "`id`")]
    assert log == [*guessed, *needed, ("job", tuple(needed))]
    assert layouts.last(("pg", "kafka")) == JobLayout(
        ("id", "v"), SharedShape(PARTITIONS, ("id",)), False
    )


class Unbuildable(Frame):
    """A batch whose first ``select`` fails (the early build), and later ones succeed."""

    def selectExpr(self, *columns: Any) -> Frame:
        if not any(step[0] == "failed" for step in self.log):
            self.log.append(("failed", *columns))
            self.selected.set()
            raise RuntimeError("not now")
        return super().selectExpr(*columns)


def test_an_early_input_that_cannot_be_built_is_built_again_after_the_members() -> None:
    layouts = RecentLayouts()
    shape = SharedShape(PARTITIONS, ("id",))
    layouts.remember(("pg", "kafka"), JobLayout(("id",), shape, False))
    log: list[tuple[Any, ...]] = []
    frame = Unbuildable(log)
    members = [Member("pg", ["id"], frame), Member("kafka", ["id"], frame)]
    assert _run(frame, members, layouts, 1) == [PARTITIONS, PARTITIONS]
    built = [("select", "`id`"), ("repartition", PARTITIONS, "`id`")]
    assert log == [("failed", "`id`"), *built, ("job", tuple(built))]
