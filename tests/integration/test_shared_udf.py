"""With real Spark: a shared job's UDF is made once per layout, applied to each batch's frame
in one py4j round trip, and each job runs the task it carries in its local property
(:mod:`fanout.partitioned.shared_udf`)."""

from __future__ import annotations

import base64
import functools
import threading
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet, InvalidToken

from fanout.contract.sessions import result_schema, spark_threads
from fanout.partitioned.shared_udf import (
    PROPERTY,
    SEALING_KEY,
    SharedUdfs,
    TaskFromProperty,
    carrying,
    decode,
)
from tests.integration.py4j_calls import round_trips

SCHEMA = "`k` BIGINT, `a b` STRING"
COLUMNS = ["k", "a b"]
RESULT = "member INT, partition INT, outcome STRING"


@dataclass(frozen=True)
class Labels:
    """A batch's task: one result row per partition, its rows' keys summed, under a label."""

    label: str

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        import pyarrow.compute as pc
        from pyspark import TaskContext

        total = sum(int(pc.sum(b.column("k")).as_py() or 0) for b in batches)
        partition = TaskContext.get().partitionId()  # type: ignore[union-attr]
        yield pa.RecordBatch.from_pydict(
            {"member": [0], "partition": [partition], "outcome": [f"{self.label}:{total}"]},
            schema=pa.schema(
                [("member", pa.int32()), ("partition", pa.int32()), ("outcome", pa.string())]
            ),
        )


def _frame(spark: Any, start: int) -> Any:
    rows = [(start + i, f"r{i}") for i in range(20)]
    return spark.createDataFrame(rows, SCHEMA).repartition(2, "k")


def _run(udfs: SharedUdfs, frame: Any, label: str) -> list[str]:
    job = udfs.map(frame, COLUMNS, result_schema(RESULT))
    with carrying(frame.sparkSession.sparkContext, Labels(label)):
        rows = job.collect()
    return sorted(row["outcome"] for row in rows)


def _expected(frame: Any, label: str) -> list[str]:
    sums = frame.rdd.glom().map(lambda rows: sum(r["k"] for r in rows)).collect()
    return sorted(f"{label}:{total}" for total in sums)


def test_each_job_runs_the_task_it_carries_through_one_udf(spark: Any) -> None:
    udfs = SharedUdfs()
    first, second = _frame(spark, 0), _frame(spark, 100)
    assert _run(udfs, first, "batch-0") == _expected(first, "batch-0")
    assert sum(int(o.split(":")[1]) for o in _run(udfs, first, "x")) == sum(range(20))
    with round_trips() as counted:
        job = udfs.map(second, COLUMNS, result_schema(RESULT))
    assert counted[0] == 1  # the next batch's frame: mapInArrow with the UDF made before
    with carrying(spark.sparkContext, Labels("batch-1")):
        rows = job.collect()
    assert sorted(r["outcome"] for r in rows) == _expected(second, "batch-1")
    assert sum(int(r["outcome"].split(":")[1]) for r in rows) == sum(range(100, 120))
    assert spark.sparkContext.getLocalProperty(PROPERTY) is None  # cleared after the job


def test_a_job_started_without_its_task_fails_saying_so(spark: Any) -> None:
    job = SharedUdfs().map(_frame(spark, 0), COLUMNS, result_schema(RESULT))
    with pytest.raises(Exception, match="found no 'fanout.shared.task' local property"):
        job.collect()


@dataclass(frozen=True)
class LabelFromZip:
    """A task whose label comes from a module only a zip added with ``addPyFile`` holds."""

    module: str

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import importlib

        label = importlib.import_module(self.module).LABEL
        yield from Labels(label)(batches)


def test_a_zip_added_after_the_udf_was_made_reaches_the_next_job(
    spark: Any, tmp_path: Path
) -> None:
    udfs = SharedUdfs()
    frame = _frame(spark, 0)
    assert _run(udfs, frame, "before") == _expected(frame, "before")
    module = f"fanout_probe_{uuid.uuid4().hex[:8]}"
    archive = tmp_path / f"{module}.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr(f"{module}.py", "LABEL = 'from-the-zip'\n")
    spark.sparkContext.addPyFile(str(archive))
    job = udfs.map(frame, COLUMNS, result_schema(RESULT))  # made again: the zip ships with it
    with carrying(spark.sparkContext, LabelFromZip(module)):
        rows = job.collect()
    assert sorted(r["outcome"] for r in rows) == _expected(frame, "from-the-zip")


def _in_threads(spark: Any, *targets: Any) -> list[Any]:
    """Run each target in a thread of its own, all wrapped by one capture of this thread's
    Spark properties (as a batch's sink threads are); their results in order."""
    wrap = spark_threads(spark.range(1))
    results: list[Any] = [None] * len(targets)

    def run(index: int, target: Any) -> None:
        results[index] = target()

    threads = [
        threading.Thread(target=wrap(functools.partial(run, i, target)))
        for i, target in enumerate(targets)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


def test_threads_wrapped_by_one_capture_keep_their_own_local_properties(spark: Any) -> None:
    both_set = threading.Barrier(2, timeout=60)
    context = spark.sparkContext

    def label(value: str) -> Any:
        def set_then_read() -> str | None:
            context.setLocalProperty("fanout.test.label", value)
            both_set.wait()  # the other thread has set its own value too
            return context.getLocalProperty("fanout.test.label")

        return set_then_read

    assert _in_threads(spark, label("first"), label("second")) == ["first", "second"]
    assert context.getLocalProperty("fanout.test.label") is None  # nor the caller's


def test_jobs_of_threads_wrapped_by_one_capture_run_their_own_tasks(spark: Any) -> None:
    udfs = SharedUdfs()
    frames = {"group-a": _frame(spark, 0), "group-b": _frame(spark, 1000)}
    both_carry = threading.Barrier(2, timeout=60)

    def shared_job(label: str) -> Any:
        def run() -> list[str]:
            job = udfs.map(frames[label], COLUMNS, result_schema(RESULT))
            with carrying(spark.sparkContext, Labels(label)):
                both_carry.wait()  # both tasks set before either job starts
                rows = job.collect()
            return sorted(r["outcome"] for r in rows)

        return run

    found = _in_threads(spark, shared_job("group-a"), shared_job("group-b"))
    assert found == [
        _expected(frames["group-a"], "group-a"),
        _expected(frames["group-b"], "group-b"),
    ]


@dataclass(frozen=True)
class WithPassword(Labels):
    """A task holding a secret, as a PostgreSQL writer holds its URL."""

    url: str = "postgresql://app:S3cret-Pw@db/orders"


def test_the_property_holds_the_task_sealed_and_jobs_still_open_it(spark: Any) -> None:
    frame = _frame(spark, 0)
    job = SharedUdfs().map(frame, COLUMNS, result_schema(RESULT))
    context = spark.sparkContext
    with carrying(context, WithPassword("sealed")):
        text = context.getLocalProperty(PROPERTY)  # what Spark's listener events record
        rows = job.collect()
    assert sorted(r["outcome"] for r in rows) == _expected(frame, "sealed")
    assert "S3cret-Pw" not in text
    assert b"S3cret-Pw" not in base64.urlsafe_b64decode(text)  # nor once unwrapped
    assert SEALING_KEY.decode() not in text
    assert decode(text, SEALING_KEY) == WithPassword("sealed")
    with pytest.raises(InvalidToken):
        decode(text, Fernet.generate_key())
    assert "key" not in repr(TaskFromProperty(SEALING_KEY))
