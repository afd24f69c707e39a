"""The shared partition task (one Spark task, several sinks' writers, each in a thread) and
who shares, without Spark: fake writers read Arrow batches as the kit's writers do."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pytest

from fanout.contract.partitions import BatchPartitioning
from fanout.contract.sharing import ANY_PARTITIONING, SharedShape, SharedWrite
from fanout.contract.sink import Sink
from fanout.partitioned.membership import MEMBER_COLUMN, MemberDigest
from fanout.partitioned.outcome import PartitionOutcome
from fanout.partitioned.shared import FEED_DEPTH, SharedMember, SharedPartitionTask
from fanout.partitioned.sink import PartitionedSink
from fanout.partitioned.task import CommitHooks, PartitionTask
from fanout.routes.route import Route
from fanout.sink_spec import SinkSpec
from fanout.steps.share import share_groups, shared_members, shares_tasks

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int32(), nullable=False),
        pa.field("v", pa.string()),
        pa.field(MEMBER_COLUMN, pa.int64()),
    ]
)


def _batches(count: int, rows: int = 3) -> list[pa.RecordBatch]:
    out = []
    for b in range(count):
        ids = list(range(b * rows, (b + 1) * rows))
        out.append(
            pa.RecordBatch.from_pydict(
                {"id": ids, "v": [f"v{i}" for i in ids], MEMBER_COLUMN: [i * 10 for i in ids]},
                schema=SCHEMA,
            )
        )
    return out


class Writer:
    """Reads its partition; fails after ``fail_after`` batches, or returns at once
    (``skip``), or commits what it read (the outcome's ``rows``)."""

    def __init__(self, *, fail_after: int | None = None, skip: bool = False) -> None:
        self.fail_after, self.skip = fail_after, skip
        self.seen: list[pa.RecordBatch] = []
        self.committed = False
        self.digest: tuple[int, int] | None = None

    def write_partition(
        self, partition: int, batches: Iterator[pa.RecordBatch], hooks: CommitHooks,
        digest: MemberDigest,
    ) -> PartitionOutcome:  # fmt: skip
        if self.skip:
            return PartitionOutcome(partition, "skipped")
        for batch in batches:
            if self.fail_after is not None and len(self.seen) == self.fail_after:
                raise ValueError(f"bad row after {len(self.seen)} batches")
            self.seen.append(batch)
        self.committed = True
        self.digest = (digest.rows, digest.checksum)
        rows = sum(b.num_rows for b in self.seen)
        return PartitionOutcome(partition, "committed", rows=rows, written=rows)


def _member(writer: Writer, columns: Sequence[tuple[str, str]], membership: bool) -> SharedMember:
    return SharedMember(PartitionTask(writer, CommitHooks("p", "s", 0)), tuple(columns), membership)


def _outcomes(task: SharedPartitionTask, partition: int, batches: Any) -> list[PartitionOutcome]:
    return [PartitionOutcome.from_json(text) for text in task.outcomes(partition, batches)]


def test_each_writer_reads_its_own_columns_under_its_own_names() -> None:
    a, b = Writer(), Writer()
    task = SharedPartitionTask(
        (_member(a, [("id", "id"), ("v", "v")], True), _member(b, [("id", "key")], False))
    )
    outcomes = _outcomes(task, 2, iter(_batches(3)))
    assert [(o.partition, o.status, o.rows) for o in outcomes] == [
        (2, "committed", 9),
        (2, "committed", 9),
    ]
    assert [s.names for s in (a.seen[0].schema, b.seen[0].schema)] == [["id", "v"], ["key"]]
    assert b.seen[0].schema.field("key").nullable is False  # the batch's Arrow field, renamed
    assert [x for s in a.seen for x in s.column("v").to_pylist()] == [f"v{i}" for i in range(9)]
    assert [x for s in b.seen for x in s.column("key").to_pylist()] == list(range(9))
    assert a.digest == (9, sum(i * 10 for i in range(9)))  # its member column, summed
    assert b.digest == (0, 0)  # no membership: no member column


def test_a_writer_failing_midway_fails_alone() -> None:
    bad, good = Writer(fail_after=1), Writer()
    task = SharedPartitionTask(
        (_member(bad, [("id", "id")], True), _member(good, [("id", "id")], True))
    )
    failed, committed = _outcomes(task, 0, iter(_batches(2 * FEED_DEPTH + 3)))
    assert failed.status == "failed" and failed.failure is not None
    assert failed.failure.message == "ValueError: bad row after 1 batches"
    assert not bad.committed
    assert (committed.status, committed.rows) == ("committed", 3 * (2 * FEED_DEPTH + 3))


def test_a_writer_that_stops_reading_is_no_longer_fed() -> None:
    skipper, good = Writer(skip=True), Writer()
    task = SharedPartitionTask(
        (_member(skipper, [("id", "id")], True), _member(good, [("v", "v")], False))
    )
    found: list[list[PartitionOutcome]] = []
    thread = threading.Thread(target=lambda: found.append(_outcomes(task, 1, iter(_batches(20)))))
    thread.start()
    thread.join(20)
    assert not thread.is_alive(), "the task waited for a writer that stopped reading"
    [(skipped, committed)] = found
    assert (skipped.status, committed.status, committed.rows) == ("skipped", "committed", 60)


def test_an_input_failing_midway_reaches_every_writer_and_fails_the_task() -> None:
    def failing() -> Iterator[pa.RecordBatch]:
        yield from _batches(2)
        raise OSError("shuffle block lost")

    a, b = Writer(), Writer()
    task = SharedPartitionTask((_member(a, [("id", "id")], True), _member(b, [("v", "v")], True)))
    with pytest.raises(OSError, match="shuffle block lost"):
        task.outcomes(0, failing())
    assert not a.committed and not b.committed  # neither commits a part of its partition
    assert len(a.seen) == len(b.seen) == 2


def test_the_task_yields_one_row_per_member() -> None:
    a, b = Writer(), Writer(skip=True)
    task = SharedPartitionTask((_member(a, [("id", "id")], True), _member(b, [("id", "id")], True)))
    [result] = list(task(iter(_batches(1))))
    assert result.column("member").to_pylist() == [0, 1]
    assert result.column("partition").to_pylist() == [0, 0]  # outside Spark: partition 0
    statuses = [PartitionOutcome.from_json(o).status for o in result.column("outcome").to_pylist()]
    assert statuses == ["committed", "skipped"]


# -- who shares ------------------------------------------------------------------------------


class KitSink(PartitionedSink):
    """A kit sink hashing by ``by`` into ``partitions`` (never written here)."""

    def __init__(self, name: str, by: Sequence[str] | None, partitions: int = 4) -> None:
        self.name, self.by, self.partitions = name, by, partitions

    def partitioned_by(self) -> Sequence[str] | None:
        return self.by


class OwnWrite(KitSink):
    """A kit sink with a ``write`` of its own: never bypassed by a shared task."""

    def write(self, batch: Any) -> Any:
        return super().write(batch)


class OwnInput(KitSink):
    """A kit sink with an input of its own: it shares only when it says so."""

    def __init__(self, name: str, says: bool) -> None:
        super().__init__(name, ["order_id"])
        self.says = says

    def partition_input(self, batch: Any) -> Any:
        return super().partition_input(batch)

    def shares_tasks(self) -> bool:
        return self.says if self.says else super().shares_tasks()


def test_a_sink_with_an_input_of_its_own_shares_only_when_it_says_so() -> None:
    silent, says = SinkSpec(OwnInput("silent", False)), SinkSpec(OwnInput("says", True))
    assert (shares_tasks(silent), shares_tasks(says)) == (False, True)
    specs = {"silent": silent, "says": says, "kit": SinkSpec(KitSink("kit", ["order_id"]))}
    assert share_groups(list(specs), specs, schema=None) == [("says", "kit")]


def test_sinks_reporting_the_same_partitioning_are_grouped() -> None:
    specs = {
        "pg": SinkSpec(KitSink("pg", ["order_id"])),
        "kafka": SinkSpec(KitSink("kafka", ["order_id"])),
        "eight": SinkSpec(KitSink("eight", ["order_id"], partitions=8)),
        "other": SinkSpec(KitSink("other", ["customer"])),
        "other2": SinkSpec(KitSink("other2", ["customer"])),
        "unkeyed": SinkSpec(KitSink("unkeyed", None)),
        "own": SinkSpec(OwnWrite("own", ["order_id"])),
        "routed": SinkSpec(KitSink("routed", ["order_id"]), route=Route(where="amount > 0")),
    }
    assert KitSink("x", ["a"]).batch_partitioning(None) == BatchPartitioning(4, ("a",))
    assert [shares_tasks(s) for s in specs.values()] == [True] * 6 + [False, False]
    assert share_groups(list(specs), specs, schema=None) == [("pg", "kafka"), ("other", "other2")]
    assert share_groups(["pg", "eight", "own", "routed"], specs, schema=None) == []


class FrameStub:
    """What grouping asks of a DataFrame: that it is one, and its schema."""

    schema = None

    def mapInArrow(self, *args: Any) -> Any:
        raise AssertionError("grouping runs no job")


def test_a_group_larger_than_the_parallelism_is_not_formed() -> None:
    from fanout.contract.batch import BatchInfo
    from fanout.steps.share import group_shared_tasks
    from fanout.steps.state import BatchState

    specs = {n: SinkSpec(KitSink(n, ["order_id"])) for n in ("pg", "kafka", "pg2")}
    for parallelism, expected in ((None, [("pg", "kafka", "pg2")]), (3, [("pg", "kafka", "pg2")]),
                                  (2, []), (1, [])):  # fmt: skip
        state = BatchState(FrameStub(), BatchInfo("p", 0, "q"), pending=list(specs))
        group_shared_tasks(state, specs, parallelism)
        assert state.share_groups == expected, parallelism


class PreparedKit(KitSink):
    """A kit sink whose preparation is counted and needs no Spark."""

    def __init__(self, name: str) -> None:
        super().__init__(name, ["order_id"])
        self.prepared = 0

    def prepare_partitions(self, batch: Any) -> Any:
        from fanout.partitioned.sink import PartitionInput, PreparedPartitions

        self.prepared += 1
        given = PartitionInput(
            None, ["order_id"], membership=False, renamed=[("order_id", "order_id")]
        )
        task = PartitionTask(Writer(), CommitHooks("p", "s", 0))
        return PreparedPartitions(given, task, lambda: None)


class CountingFrame:
    """A partition input's DataFrame that records the plan steps built on it."""

    def __init__(self) -> None:
        self.steps: list[tuple[Any, ...]] = []

    def repartition(self, *args: Any) -> CountingFrame:
        self.steps.append(("repartition", *args))
        return self

    def sortWithinPartitions(self, *columns: Any) -> CountingFrame:
        self.steps.append(("sort", *columns))
        return self


class SortedKit(KitSink):
    """A kit sink without membership, sorting each partition (so it needs no Spark)."""

    def __init__(self, frame: CountingFrame) -> None:
        super().__init__("sorted", ["order id"])
        self.frame = frame

    def partition_input(self, batch: Any) -> Any:
        from fanout.partitioned.sink import PartitionInput

        renamed = [("order id", "order id"), ("ts", "ts")]
        return PartitionInput(self.frame, ["order id"], membership=False, sort=["ts"],
                              renamed=renamed)  # fmt: skip

    def partition_writer(self, batch: Any, plan: Any) -> Any:
        return Writer()


def test_a_shared_write_builds_no_partitioned_frame_of_its_own() -> None:
    from fanout.contract.batch import Batch, BatchInfo

    frame = CountingFrame()
    sink = SortedKit(frame)
    batch = Batch(frame, BatchInfo("p", 3), "sorted", "fanout/p/sorted")
    write = sink.shared_write(batch)
    assert write.shape == SharedShape(4, ("order id",), ("ts",))
    assert frame.steps == []  # the shared job partitions the batch itself
    prepared = sink.prepare_partitions(batch)
    assert prepared.parted is prepared.parted is frame
    # built once; the sort column quoted like the partitioning one (a dot is part of a name)
    assert frame.steps == [("repartition", 4, "`order id`"), ("sort", "`ts`")]


class Unplannable:
    """A batch DataFrame whose shared job cannot be planned."""

    def selectExpr(self, *columns: Any) -> Any:
        raise RuntimeError("cannot plan the shared job")


def test_a_shared_job_that_cannot_be_planned_fails_every_member_once() -> None:
    from fanout.steps.share import SharedPass

    a, b = PreparedKit("a"), PreparedKit("b")
    shared = SharedPass(Unplannable(), {"a": (a, object()), "b": (b, object())})
    for name in ("a", "b", "a"):
        with pytest.raises(RuntimeError, match="cannot plan the shared job"):
            shared.write(name)
    assert (a.prepared, b.prepared) == (1, 1)  # prepared once, by the first to ask


class Interrupted:
    """A batch DataFrame whose shared job is interrupted while it is planned."""

    def selectExpr(self, *columns: Any) -> Any:
        raise KeyboardInterrupt


def test_a_shared_job_interrupted_while_planned_is_not_run_again_by_another_member() -> None:
    from fanout.steps.share import SharedPass

    a, b = PreparedKit("a"), PreparedKit("b")
    shared = SharedPass(Interrupted(), {"a": (a, object()), "b": (b, object())})
    for name in ("a", "b"):
        with pytest.raises(KeyboardInterrupt):
            shared.write(name)
    assert (a.prepared, b.prepared) == (1, 1)  # the first to ask prepared both, once


class AnySink(Sink):
    """A sink sharing tasks whatever their partitioning (as a Delta append does); alone, it
    reads the DataFrame (from the executors) or Arrow (from the driver)."""

    def __init__(self, name: str, reads: str = "dataframe") -> None:
        super().__init__(name)
        self._reads = reads

    @property
    def reads(self) -> Any:
        return self._reads

    def shares_tasks(self) -> bool:
        return True

    def batch_partitioning(self, schema: Any) -> BatchPartitioning | None:
        return ANY_PARTITIONING


def test_a_sink_taking_any_partitioning_joins_the_largest_group_where_there_is_room() -> None:
    specs = {
        "other": SinkSpec(KitSink("other", ["customer"])),
        "pg": SinkSpec(KitSink("pg", ["order_id"])),
        "lake": SinkSpec(AnySink("lake")),
        "kafka": SinkSpec(KitSink("kafka", ["order_id"])),
        "other2": SinkSpec(KitSink("other2", ["customer"])),
        "plain": SinkSpec(Sink("plain")),
    }
    assert shares_tasks(specs["lake"]) and not shares_tasks(specs["plain"])
    everyone = list(specs)
    # the first of the largest: "other" and "pg" groups are both of two; "other" came first
    assert share_groups(everyone, specs, None) == [("other", "lake", "other2"), ("pg", "kafka")]
    assert share_groups(["pg", "kafka", "lake"], specs, None) == [("pg", "kafka", "lake")]
    assert share_groups(["pg", "kafka", "lake"], specs, None, parallelism=2) == [("pg", "kafka")]
    assert share_groups(["lake", "pg"], specs, None) == [("lake", "pg")]  # configuration order
    lakes = {"a": SinkSpec(AnySink("a")), "b": SinkSpec(AnySink("b"))}
    assert share_groups(["a", "b"], lakes, None) == [("a", "b")]  # one job, no repartition
    assert share_groups(["a"], lakes, None) == []
    # reading Arrow alone, they share one conversion already: no job of their own
    arrow = {n: SinkSpec(AnySink(n, reads="arrow")) for n in ("a", "b")}
    assert share_groups(["a", "b"], arrow, None) == []
    assert share_groups(["a", "b", "pg"], {**arrow, **specs}, None) == [("a", "b", "pg")]


def _write(shape: Any, task: Any = "task") -> SharedWrite:
    def never(*args: Any) -> Any:
        raise AssertionError("not called")

    return SharedWrite(task, (("id", "id"),), shape, never, never)


def test_the_shared_job_takes_the_most_needed_partitioning_and_every_sink_taking_any() -> None:
    by_id, by_v = SharedShape(4, ("id",)), SharedShape(4, ("v",))
    writes = {"pg": _write(by_id), "lake": _write("any"), "kafka": _write(by_id)}
    assert shared_members(writes) == (by_id, ["pg", "lake", "kafka"])
    writes = {"pg": _write(by_id), "other": _write(by_v), "lake": _write("any")}
    assert shared_members(writes) == (by_id, ["pg", "lake"])  # the first wins a tie
    # a member that cannot share this batch (shape None) never matches "no partitioning"
    assert shared_members({"own": _write(None), "lake": _write("any")}) == (None, [])
    assert shared_members({"a": _write("any"), "b": _write("any")}) == (None, ["a", "b"])
    writes = {"lake": _write(None, task=None), "pg": _write(by_id), "kafka": _write(by_id)}
    assert shared_members(writes) == (by_id, ["pg", "kafka"])


def test_every_member_of_an_interrupted_shared_job_records_its_failed_attempt() -> None:
    """The first member to ask plans the job and is interrupted; each member's runner
    records its own failed attempt and hands back that very interrupt to raise on."""
    from concurrent.futures import ThreadPoolExecutor

    from fanout.contract.batch import Batch, BatchInfo
    from fanout.hooks.caller import HookCaller
    from fanout.hooks.registry import new_plugin_manager
    from fanout.ledger.memory import MemoryLedger
    from fanout.retry import RetryPolicy
    from fanout.routes.batch_routes import SinkInput
    from fanout.steps.record import Recorder
    from fanout.steps.share import SharedPass
    from fanout.steps.write import SinkRunner

    ledger, retry = MemoryLedger(), RetryPolicy(retries=2, backoff_s=0)
    frame = Interrupted()
    sinks = {name: PreparedKit(name) for name in ("a", "b")}
    batches = {n: Batch(frame, BatchInfo("p", 5), n, f"fanout/p/{n}") for n in sinks}
    shared = SharedPass(frame, {n: (sinks[n], batches[n]) for n in sinks})
    runners = [
        SinkRunner(sinks[n], batches[n], SinkInput(frame), Recorder(ledger, retry), retry,
                   HookCaller(new_plugin_manager()), shared=shared)
        for n in sinks
    ]  # fmt: skip
    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(lambda runner: runner.run(), runners))

    [stop] = {id(o.abort): o.abort for o in outcomes}.values()
    assert isinstance(stop, KeyboardInterrupt)
    assert [(o.sink, o.result, str(o.error)) for o in outcomes] == [
        ("a", None, "sink 'a', batch 5: KeyboardInterrupt: "),
        ("b", None, "sink 'b', batch 5: KeyboardInterrupt: "),
    ]
    assert sorted((e.sink, e.status, e.attempt) for e in ledger.entries) == [
        ("a", "failed", 1),
        ("b", "failed", 1),
    ]  # not retried alone
    assert (sinks["a"].prepared, sinks["b"].prepared) == (1, 1)
