"""A reused Spark Python worker collects garbage after every task (pyspark's daemon); the
partitioned kit's task freezes the worker's long-lived objects after its first partition,
so those collections walk only what later tasks create (fanout.partitioned.worker_gc)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from fanout.partitioned.outcome import PartitionOutcome
from fanout.partitioned.task import CommitHooks, PartitionTask


@dataclass(frozen=True)
class ReportingWriter:
    """Writes nothing; its outcome says which worker ran the partition and how many objects
    that worker's collector had frozen when the partition began."""

    def write_partition(
        self, partition: int, batches: Iterator[Any], hooks: CommitHooks, digest: Any
    ) -> PartitionOutcome:
        rows = sum(b.num_rows for b in batches)
        counters = {"pid": os.getpid(), "frozen": gc.get_freeze_count()}
        return PartitionOutcome(partition, "committed", rows=rows, counters=counters)


def test_freezing_happens_once_per_process() -> None:
    script = (
        "import gc\n"
        "from fanout.partitioned.worker_gc import freeze_long_lived_objects as f\n"
        "assert gc.get_freeze_count() == 0\n"
        "first = f(); frozen = gc.get_freeze_count(); second = f()\n"
        "print(first, frozen > 1000, second, gc.get_freeze_count() == frozen)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "False", "True"]


@pytest.mark.integration
def test_a_worker_that_ran_a_partition_task_has_frozen_its_objects(spark: Any) -> None:
    from pyspark import cloudpickle

    from fanout.partitioned.outcome import RESULT_DDL

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors need not import it
    task = PartitionTask(ReportingWriter(), CommitHooks("p", "s", 0))
    df = spark.range(0, 400).repartition(4)

    def run() -> list[PartitionOutcome]:
        rows = df.mapInArrow(task, RESULT_DDL).collect()
        return [PartitionOutcome.from_json(r["outcome"]) for r in rows]

    first = run()
    assert sorted(o.partition for o in first) == [0, 1, 2, 3]
    assert sum(o.rows for o in first) == 400
    seen = {o.counters["pid"] for o in first}
    again = [o.counters for o in run() if o.counters["pid"] in seen]
    assert again, "no worker of the first job ran a task of the second"
    # each of those workers froze its objects after its first partition
    assert all(c["frozen"] > 1000 for c in again), again
