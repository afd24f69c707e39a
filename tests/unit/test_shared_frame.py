"""A shared job's input built while its members prepare, from the group's last layout
(:mod:`fanout.steps.shared_frame`), without Spark: stub DataFrames record each step."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest

from fanout.contract.batch import Batch, BatchInfo
from fanout.contract.sharing import SharedShape
from fanout.dispatch.settle import read_as_given
from fanout.partitioned.outcome import PartitionOutcome
from fanout.partitioned.sink import PartitionedSink, PartitionInput, PreparedPartitions
from fanout.partitioned.task import CommitHooks, PartitionTask
from fanout.steps.share import SharedPass
from fanout.steps.shared_frame import JobLayout, RecentLayouts
from fanout.steps.shuffle_ahead import StartedShuffle
from fanout.steps.state import BatchState

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


def _run(
    frame: Frame, members: Sequence[Member], layouts: RecentLayouts, batch_id: int
) -> list[int]:
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


class Stage:
    """A started shuffle's map stage: records its cancellation."""

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ShuffleStarter:
    """Stands in for :func:`fanout.steps.shuffle_ahead.start_shuffle`: the frame it gives
    names its path as ``("shuffle", <the frame's path>)`` (with ``failing``, a job on it
    fails); ``started`` is set once it ran."""

    def __init__(self, failing: bool = False) -> None:
        self.started = threading.Event()
        self.stages: list[Stage] = []
        self.kind = FailingJob if failing else Frame

    def __call__(self, frame: Frame) -> StartedShuffle:
        self.stages.append(Stage())
        self.started.set()
        return StartedShuffle(self.kind(frame.log, (("shuffle", frame.path),)), self.stages[-1])


class WaitsForShuffle(Member):
    """A member whose preparation waits (up to 5 s) for the job's shuffle to start."""

    def __init__(self, name: str, columns: Sequence[str], frame: Frame, starter: ShuffleStarter):
        super().__init__(name, columns, frame)
        self.starter = starter

    def prepare_partitions(self, batch: Any) -> PreparedPartitions:
        self.saw_early_input = self.starter.started.wait(5)
        return super().prepare_partitions(batch)


def _starting(monkeypatch: pytest.MonkeyPatch, failing: bool = False) -> ShuffleStarter:
    starter = ShuffleStarter(failing)
    monkeypatch.setattr("fanout.steps.shared_frame.start_shuffle", starter)
    return starter


def test_the_job_reads_the_shuffle_started_while_the_members_prepared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    starter = _starting(monkeypatch)
    shape = SharedShape(PARTITIONS, ("id",))
    layouts = RecentLayouts()
    layouts.remember(("pg", "kafka"), JobLayout(("id", "v"), shape, False))
    log: list[tuple[Any, ...]] = []
    frame = Frame(log)
    frame.selected.set()
    members = [WaitsForShuffle(n, ["id", "v"], frame, starter) for n in ("pg", "kafka")]
    assert _run(frame, members, layouts, 1) == [PARTITIONS, PARTITIONS]
    assert [m.saw_early_input for m in members] == [True, True]
    built = (("select", "`id`", "`v`"), ("repartition", PARTITIONS, "`id`"))
    assert log == [*built, ("job", (("shuffle", built),))]  # built once, read from the shuffle
    assert [stage.cancelled for stage in starter.stages] == [False]


def test_a_shuffle_started_for_a_changed_layout_is_cancelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    starter = _starting(monkeypatch)
    layouts = RecentLayouts()
    layouts.remember(("pg", "kafka"), JobLayout(("id",), SharedShape(PARTITIONS, ("id",)), False))
    log: list[tuple[Any, ...]] = []
    frame = Frame(log)
    frame.selected.set()
    members = [WaitsForShuffle(n, ["id", "v"], frame, starter) for n in ("pg", "kafka")]
    assert _run(frame, members, layouts, 1) == [PARTITIONS, PARTITIONS]
    guessed = [("select", "`id`"), ("repartition", PARTITIONS, "`id`")]
    needed = (("select", "`id`", "`v`"), ("repartition", PARTITIONS, "`id`"))
    assert log == [*guessed, *needed, ("job", needed)]  # the members' own frame, not started
    assert [stage.cancelled for stage in starter.stages] == [True]


class Refusing(WaitsForShuffle):
    """A member whose preparation refuses the batch (after the shuffle started)."""

    def prepare_partitions(self, batch: Any) -> PreparedPartitions:
        super().prepare_partitions(batch)
        raise RuntimeError(f"{self.name} refuses")


class FailingJob(Frame):
    """A frame whose job fails."""

    def mapInArrow(self, task: Any, schema: Any) -> Job:
        raise RuntimeError("the job failed")


@pytest.mark.parametrize("failure", ["members", "job"])
def test_a_shuffle_no_job_reads_is_cancelled(monkeypatch: pytest.MonkeyPatch, failure: str) -> None:
    starter = _starting(monkeypatch, failing=failure == "job")
    layouts = RecentLayouts()
    layouts.remember(("pg", "kafka"), JobLayout(("id",), SharedShape(PARTITIONS, ("id",)), False))
    frame = Frame([])
    frame.selected.set()
    kind = Refusing if failure == "members" else WaitsForShuffle
    members = [kind(n, ["id"], frame, starter) for n in ("pg", "kafka")]
    batches = {m.name: Batch(frame, BatchInfo("p", 1), m.name, f"fanout/p/{m.name}")
               for m in members}  # fmt: skip
    shared = SharedPass(frame, {m.name: (m, batches[m.name]) for m in members}, layouts)
    for member in members:
        with pytest.raises(RuntimeError, match="refuses" if failure == "members" else "job"):
            shared.write(member.name)
    assert [stage.cancelled for stage in starter.stages] == [True]


def _ahead(layouts: RecentLayouts, group: tuple[str, ...], columns: tuple[str, ...]) -> None:
    """``group`` shared a job with ``columns`` and read its batch as handed over."""
    layouts.remember(group, JobLayout(columns, SharedShape(PARTITIONS, ("id",)), False))
    layouts.end_batch(follow=group)


def test_the_group_that_read_the_last_batch_starts_the_next_ones_input_as_it_arrives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    starter = _starting(monkeypatch)
    layouts = RecentLayouts()
    _ahead(layouts, ("pg", "kafka"), ("id", "v"))
    log: list[tuple[Any, ...]] = []
    frame = Frame(log)
    layouts.start_ahead(frame)  # before the guard, the plan and the members
    built = (("select", "`id`", "`v`"), ("repartition", PARTITIONS, "`id`"))
    assert log == list(built) and len(starter.stages) == 1
    members = [Member(n, ["id", "v"], frame) for n in ("pg", "kafka")]
    assert _run(frame, members, layouts, 1) == [PARTITIONS, PARTITIONS]
    assert log == [*built, ("job", (("shuffle", built),))]  # built once, read from the shuffle
    layouts.end_batch(follow=("pg", "kafka"))
    assert [stage.cancelled for stage in starter.stages] == [False]


@pytest.mark.parametrize("other", ["group", "dataframe"])
def test_an_input_started_ahead_for_another_group_or_dataframe_is_cancelled_at_once(
    monkeypatch: pytest.MonkeyPatch, other: str
) -> None:
    starter = _starting(monkeypatch)
    layouts = RecentLayouts()
    _ahead(layouts, ("pg", "kafka"), ("id",))
    layouts.remember(("kafka", "pg"), JobLayout(("id",), SharedShape(PARTITIONS, ("id",)), False))
    log: list[tuple[Any, ...]] = []
    given = Frame(log)
    layouts.start_ahead(given)
    # the pass reads a persisted copy of the batch, or is another group's
    frame = Frame(log) if other == "dataframe" else given
    names = ("kafka", "pg") if other == "group" else ("pg", "kafka")
    members = [WaitsForShuffle(n, ["id"], frame, starter) for n in names]
    assert _run(frame, members, layouts, 1) == [PARTITIONS, PARTITIONS]
    assert [stage.cancelled for stage in starter.stages] == [True, False]  # then its own
    built = (("select", "`id`"), ("repartition", PARTITIONS, "`id`"))
    assert log == [*built, *built, ("job", (("shuffle", built),))]


def test_an_input_started_ahead_that_no_group_took_is_cancelled_when_the_batch_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    starter = _starting(monkeypatch)  # e.g. the batch was refused, or replayed: nothing to write
    layouts = RecentLayouts()
    _ahead(layouts, ("pg", "kafka"), ("id",))
    layouts.start_ahead(Frame([]))
    assert [stage.cancelled for stage in starter.stages] == [False]
    layouts.end_batch(follow=None)
    assert [stage.cancelled for stage in starter.stages] == [True]
    layouts.start_ahead(Frame([]))  # no group read the last batch as handed over: nothing
    assert len(starter.stages) == 1


def test_an_input_started_ahead_and_left_over_is_cancelled_by_the_next_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    starter = _starting(monkeypatch)  # e.g. one FanOut given to two queries
    layouts = RecentLayouts()
    _ahead(layouts, ("pg", "kafka"), ("id",))
    layouts.start_ahead(Frame([]))
    layouts.start_ahead(Frame([]))
    assert [stage.cancelled for stage in starter.stages] == [True, False]


def test_only_a_single_group_reading_the_batch_as_handed_over_is_followed() -> None:
    given = Frame([])
    state = BatchState(given, BatchInfo("p", 1), share_groups=[("pg", "kafka")])
    assert read_as_given(state, given) == ("pg", "kafka")
    assert read_as_given(None, given) is None  # refused before a state existed
    copy = BatchState(Frame([]), BatchInfo("p", 1), share_groups=[("pg", "kafka")])
    assert read_as_given(copy, given) is None  # persisted or repartitioned for more readers
    two = BatchState(given, BatchInfo("p", 1), share_groups=[("pg", "kafka"), ("a", "b")])
    assert read_as_given(two, given) is None
    assert read_as_given(BatchState(given, BatchInfo("p", 1)), given) is None  # none shared
    cached = BatchState(given, BatchInfo("p", 1), share_groups=[("pg", "kafka")], persisted=True)
    assert read_as_given(cached, given) is None  # persist() caches the very same DataFrame


def test_an_input_started_ahead_is_cancelled_once_the_batch_is_persisted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    starter = _starting(monkeypatch)
    layouts = RecentLayouts()
    _ahead(layouts, ("pg", "kafka"), ("id",))
    batch = Frame([])
    layouts.start_ahead(batch)
    layouts.cancel_ahead()
    assert [stage.cancelled for stage in starter.stages] == [True]
    assert layouts.take_ahead(("pg", "kafka"), batch) is None  # the pass builds its own
