"""Step 4 partitions a batch once when two or more pending sinks would each hash it the
same way (logic only, without Spark: a fake frame records ``repartition``; the plans Spark
makes of it are tests/integration/test_shared_partitioning.py)."""

from __future__ import annotations

from typing import Any

from fanout import Sink
from fanout.contract.batch import BatchInfo
from fanout.contract.partitions import BatchPartitioning
from fanout.routes.route import Route
from fanout.sink_spec import SinkSpec
from fanout.steps.partition import most_shared, partition_if_shared
from fanout.steps.state import BatchState

BY_ID = BatchPartitioning(4, ("id",))


class Schema:
    """``StructType.fieldNames()``, all the steps ask of a schema."""

    def fieldNames(self) -> list[str]:
        return ["id", "v"]


class Frame:
    """A DataFrame that records ``repartition`` and answers ``schema``."""

    def __init__(self, parent: Frame | None = None, by: tuple[Any, ...] = ()) -> None:
        self.schema = Schema()
        self.parent, self.by = parent, by

    def repartition(self, n: int, *cols: str) -> Frame:
        return Frame(self, (n, *cols))


class Partitioned(Sink):
    """Reports ``partitioning`` (or raises ``error``) and writes nothing."""

    def __init__(
        self,
        name: str,
        partitioning: BatchPartitioning | None = BY_ID,
        *,
        reads: str = "dataframe",
        error: Exception | None = None,
    ) -> None:
        super().__init__(name)
        self.partitioning, self._reads, self.error = partitioning, reads, error
        self.asked: list[Any] = []

    @property
    def reads(self) -> str:  # type: ignore[override]
        return self._reads

    def batch_partitioning(self, schema: Any) -> BatchPartitioning | None:
        self.asked.append(schema)
        if self.error is not None:
            raise self.error
        return self.partitioning

    def write(self, batch: Any) -> int:
        return 0


def step(*specs: SinkSpec) -> BatchState:
    state = BatchState(Frame(), BatchInfo("p", 7), pending=[s.name for s in specs])
    partition_if_shared(state, {s.name: s for s in specs})
    return state


def test_two_sinks_hashing_alike_get_the_batch_partitioned_once() -> None:
    state = step(SinkSpec(Partitioned("kafka")), SinkSpec(Partitioned("pg")))
    assert state.partitioning == BY_ID
    assert state.df.by == (4, "`id`")  # quoted: a name with a dot is one column
    assert state.df.parent is not None and state.df.parent.parent is None


def test_one_partitioned_sink_alone_is_left_to_partition_its_own_write() -> None:
    state = step(SinkSpec(Partitioned("kafka")), SinkSpec(Partitioned("other", None)))
    assert state.partitioning is None
    assert state.df.parent is None


def test_other_counts_or_columns_are_not_shared() -> None:
    state = step(
        SinkSpec(Partitioned("a", BatchPartitioning(4, ("id",)))),
        SinkSpec(Partitioned("b", BatchPartitioning(3, ("id",)))),
        SinkSpec(Partitioned("c", BatchPartitioning(4, ("id", "v")))),
        SinkSpec(Partitioned("d", BatchPartitioning(4, ("v", "id")))),  # order matters
    )
    assert state.partitioning is None
    assert state.df.parent is None


def test_the_partitioning_most_sinks_share_wins() -> None:
    by_v = BatchPartitioning(2, ("v",))
    state = step(
        SinkSpec(Partitioned("a", BY_ID)),
        SinkSpec(Partitioned("b", by_v)),
        SinkSpec(Partitioned("c", by_v)),
        SinkSpec(Partitioned("d", BY_ID)),
        SinkSpec(Partitioned("e", by_v)),
    )
    assert state.partitioning == by_v
    assert state.df.by == (2, "`v`")


def test_a_select_route_or_an_arrow_reader_takes_no_part() -> None:
    # a select renames columns; an Arrow reader is not partitioned: neither asks or counts
    selecting = Partitioned("selecting")
    arrow = Partitioned("arrow", reads="arrow")
    state = step(
        SinkSpec(Partitioned("kafka")),
        SinkSpec(selecting, route=Route(select=("id AS key",))),
        SinkSpec(arrow),
    )
    assert state.partitioning is None
    assert selecting.asked == [] and arrow.asked == []


def test_a_where_route_keeps_the_columns_and_shares() -> None:
    state = step(
        SinkSpec(Partitioned("kafka")), SinkSpec(Partitioned("pg"), route=Route(where="id > 0"))
    )
    assert state.partitioning == BY_ID


def test_a_sink_failing_to_tell_is_left_out_and_the_rest_still_share(caplog: Any) -> None:
    state = step(
        SinkSpec(Partitioned("broken", error=RuntimeError("no plan"))),
        SinkSpec(Partitioned("kafka")),
        SinkSpec(Partitioned("pg")),
    )
    assert state.partitioning == BY_ID
    assert "sink 'broken': batch_partitioning failed (no plan)" in caplog.text


def test_most_shared_needs_two() -> None:
    assert most_shared({"a": BY_ID, "b": None}) is None
    assert most_shared({"a": BY_ID, "b": BatchPartitioning(4, ("id",))}) == BY_ID
    assert (
        most_shared({"a": BatchPartitioning(0, ("id",)), "b": BatchPartitioning(0, ("id",))})
        is None
    )
    assert most_shared({"a": BatchPartitioning(4, ()), "b": BatchPartitioning(4, ())}) is None


class Sharing(Partitioned):
    """Reports ``BY_ID`` and may share its tasks."""

    def shares_tasks(self) -> bool:
        return True


class Persistable(Frame):
    """A batch frame grouping may ask about (``mapInArrow``), counting the ``persist``
    calls on it or on what it was repartitioned into."""

    def __init__(self, parent: Persistable | None = None, by: tuple[Any, ...] = ()) -> None:
        super().__init__(parent, by)
        self.persists: list[int] = parent.persists if parent is not None else []

    @property
    def persisted(self) -> int:
        return len(self.persists)

    def repartition(self, n: int, *cols: str) -> Persistable:
        return Persistable(self, (n, *cols))

    def mapInArrow(self, *args: Any) -> Any:
        raise AssertionError("step 4 runs no job")

    def persist(self) -> Persistable:
        self.persists.append(1)
        return self


def test_a_batch_read_once_by_one_shared_job_is_neither_partitioned_nor_persisted() -> None:
    from fanout.steps.persist import prepare_reads

    specs = {n: SinkSpec(Sharing(n)) for n in ("kafka", "pg")}
    for share, groups, partitioned, persisted in ((True, [("kafka", "pg")], None, 0),
                                                  (False, [], BY_ID, 1)):  # fmt: skip
        frame = Persistable()
        state = BatchState(frame, BatchInfo("p", 7), pending=list(specs))
        prepare_reads(state, specs, share_tasks=share)
        assert (state.share_groups, state.partitioning) == (groups, partitioned), share
        assert (state.persisted, frame.persisted) == (bool(persisted), persisted), share
    # a third reader (a sink of its own) makes the cache worth partitioning once
    specs["lake"] = SinkSpec(Partitioned("lake", None))
    frame = Persistable()
    state = BatchState(frame, BatchInfo("p", 7), pending=list(specs))
    prepare_reads(state, specs)
    assert (state.share_groups, state.partitioning) == ([("kafka", "pg")], BY_ID)
    assert frame.persisted == 1
