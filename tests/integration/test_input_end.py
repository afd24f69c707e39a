"""With real Spark: a partition whose input the JVM fails to compute part-way is not
committed, though pyarrow ends its Arrow stream cleanly where the bytes stop
(:mod:`fanout.partitioned.input_end`); whole partitions still commit.

The writers here commit by appending a line to a file once their input ends: the line
count of what each committed, against the partition's real size, shows a part committed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fanout.contract.sessions import result_schema
from fanout.partitioned.outcome import RESULT_DDL, PartitionOutcome
from fanout.partitioned.shared import SHARED_RESULT_DDL, SharedMember, SharedPartitionTask
from fanout.partitioned.task import CommitHooks, PartitionTask

ROWS = 20_000
"""Two partitions of 10 000 rows; at 10 rows per Arrow batch the JVM sends a partition in
several buffers (64 KiB each), so a failure at row 7 000 comes after some were sent."""

FAILING = 7_000


@dataclass(frozen=True)
class FileWriter:
    """Commits a partition by appending ``COMMITTED <sink> <partition> <rows>`` to ``path``
    once its input ends; what the input raises appends ``ABORTED`` instead."""

    path: str
    sink: str

    def write_partition(
        self, partition: int, batches: Iterator[Any], hooks: Any, digest: Any
    ) -> PartitionOutcome:
        rows = 0
        try:
            for batch in batches:
                rows += batch.num_rows
        except Exception as exc:
            _append(self.path, f"ABORTED {self.sink} {partition} {rows} {type(exc).__name__}")
            raise
        _append(self.path, f"COMMITTED {self.sink} {partition} {rows}")
        return PartitionOutcome(partition, "committed", rows=rows, written=rows)


def _append(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as out:
        out.write(line + "\n")


@pytest.fixture
def small_batches(spark: Any) -> Iterator[None]:
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)
    spark.conf.set(key, "10")
    yield
    spark.conf.set(key, before)


def _input(spark: Any, fail_at: int | None) -> Any:
    from pyspark.sql import functions as F

    frame = spark.range(0, ROWS, 1, 2).withColumnRenamed("id", "k")  # p0: 0..9999
    if fail_at is None:
        return frame
    failing = F.when(F.col("k") == fail_at, F.raise_error(F.lit(f"failing at {fail_at}")))
    return frame.select(failing.otherwise(F.col("k")).alias("k"))


def _ends(path: Path, sinks: int, partitions: int = 2, wait_s: float = 30.0) -> list[str]:
    """The lines of ``path`` once each sink's partition that started has ended (the
    Python workers of a failed job finish after the driver has seen the failure)."""
    deadline = time.monotonic() + wait_s
    lines: list[str] = []
    while time.monotonic() < deadline:
        lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
        if len(lines) >= sinks * partitions:
            break
        time.sleep(0.2)
    time.sleep(1.0)  # a partition the failed job never started writes nothing
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def _committed_parts(lines: list[str]) -> list[str]:
    """The lines of partitions committed with fewer rows than they hold."""
    return [
        line for line in lines if line.startswith("COMMITTED") and int(line.split()[3]) != ROWS // 2
    ]


def test_a_partition_whose_input_fails_part_way_is_not_committed(
    spark: Any, small_batches: None, tmp_path: Path
) -> None:
    path = tmp_path / "commits.txt"
    task = PartitionTask(FileWriter(str(path), "s"), CommitHooks("p", "s", 0))
    job = _input(spark, FAILING).mapInArrow(task, result_schema(RESULT_DDL))
    with pytest.raises(Exception, match=f"failing at {FAILING}"):
        job.collect()
    lines = _ends(path, sinks=1)
    assert _committed_parts(lines) == [], lines
    aborted = [line for line in lines if line.startswith("ABORTED s 0 ")]
    assert aborted and aborted[0].endswith("PartitionInputError"), lines
    assert 0 < int(aborted[0].split()[3]) < FAILING  # it did receive part of the rows


def test_a_shared_partition_whose_input_fails_part_way_is_committed_by_no_member(
    spark: Any, small_batches: None, tmp_path: Path
) -> None:
    path = tmp_path / "commits.txt"
    members = tuple(
        SharedMember(PartitionTask(FileWriter(str(path), name), CommitHooks("p", name, 0)),
                     (("k", "k"),), False)
        for name in ("a", "b")
    )  # fmt: skip
    job = _input(spark, FAILING).mapInArrow(
        SharedPartitionTask(members), result_schema(SHARED_RESULT_DDL)
    )
    with pytest.raises(Exception, match=f"failing at {FAILING}"):
        job.collect()
    lines = _ends(path, sinks=2)
    assert _committed_parts(lines) == [], lines
    for name in ("a", "b"):
        assert any(line.startswith(f"ABORTED {name} 0 ") for line in lines), lines


def test_whole_partitions_still_commit(spark: Any, small_batches: None, tmp_path: Path) -> None:
    path = tmp_path / "commits.txt"
    task = PartitionTask(FileWriter(str(path), "s"), CommitHooks("p", "s", 0))
    rows = _input(spark, None).mapInArrow(task, result_schema(RESULT_DDL)).collect()
    outcomes = sorted(PartitionOutcome.from_json(r["outcome"]).status for r in rows)
    assert outcomes == ["committed", "committed"]
    lines = sorted(path.read_text(encoding="utf-8").splitlines())
    assert lines == [f"COMMITTED s 0 {ROWS // 2}", f"COMMITTED s 1 {ROWS // 2}"]


@dataclass(frozen=True)
class HeldWriter:
    """Reads one batch, notes ``START``, waits for ``release`` to exist (so the JVM fills
    the socket and blocks), then reads the rest and commits like :class:`FileWriter`."""

    path: str
    release: str

    def write_partition(
        self, partition: int, batches: Iterator[Any], hooks: Any, digest: Any
    ) -> PartitionOutcome:
        import os

        rows = 0
        try:
            for batch in batches:
                if rows == 0:
                    _append(self.path, f"START h {partition}")
                    deadline = time.monotonic() + 60
                    while not os.path.exists(self.release) and time.monotonic() < deadline:
                        time.sleep(0.05)
                rows += batch.num_rows
        except Exception as exc:
            _append(self.path, f"ABORTED h {partition} {rows} {type(exc).__name__}")
            raise
        _append(self.path, f"COMMITTED h {partition} {rows}")
        return PartitionOutcome(partition, "committed", rows=rows, written=rows)


CANCELLED_ROWS = 1_000_000
"""Two partitions larger than what the JVM pushes ahead into the sockets' buffers (~150 000
rows of 10-row batches where this was written), so a cancelled task still had rows to
send."""


@pytest.mark.parametrize("interrupt", [False, True], ids=["kill", "interrupt"])
def test_a_partition_whose_job_is_cancelled_while_feeding_it_is_not_committed(
    spark: Any, small_batches: None, tmp_path: Path, interrupt: bool
) -> None:
    import threading

    path, release = tmp_path / "commits.txt", tmp_path / "release"
    context = spark.sparkContext
    task = PartitionTask(HeldWriter(str(path), str(release)), CommitHooks("p", "h", 0))
    frame = spark.range(0, CANCELLED_ROWS, 1, 2).withColumnRenamed("id", "k")
    job = frame.repartition(2, "k").mapInArrow(task, result_schema(RESULT_DDL))
    tag = f"fanout-input-end-{interrupt}"

    def cancel() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            started = path.read_text(encoding="utf-8") if path.exists() else ""
            if started.count("START") == 2:
                break
            time.sleep(0.05)
        time.sleep(0.5)  # the JVM fills the socket while the writers wait
        context.cancelJobsWithTag(tag)
        release.touch()

    canceller = threading.Thread(target=cancel, daemon=True)
    context.addJobTag(tag)
    context.setInterruptOnCancel(interrupt)
    try:
        canceller.start()
        with pytest.raises(Exception, match="cancel"):
            job.collect()
    finally:
        context.removeJobTag(tag)
        context.setInterruptOnCancel(False)
        release.touch()
        canceller.join()
    ended = _ends(path, sinks=2)  # a START line and an end line per partition
    lines = [line for line in ended if not line.startswith("START")]
    from pyspark.sql import functions as F

    counted = frame.repartition(2, "k").groupBy(F.spark_partition_id().alias("p")).count()
    sizes = {int(r["p"]): int(r["count"]) for r in counted.collect()}
    short = [
        line
        for line in lines
        if line.startswith("COMMITTED") and int(line.split()[3]) != sizes[int(line.split()[2])]
    ]
    assert short == [], (lines, sizes)
    assert any(line.startswith("ABORTED h") for line in lines), lines
