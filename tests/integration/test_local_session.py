"""What ``fanout.spark.local_session`` sets for speed on a small machine: Arrow batches to
Python bounded by rows only, and the parallel garbage collector in the JVM."""

from __future__ import annotations

from typing import Any

import pytest

from fanout.spark import ARROW_MAX_BYTES_PER_BATCH, ARROW_UNCHECKED_BATCH_BYTES


@pytest.mark.integration
def test_arrow_batches_are_not_measured_row_by_row(spark: Any) -> None:
    # Spark skips its per-row size check only at exactly INT_MAX
    assert ARROW_UNCHECKED_BATCH_BYTES == 2147483647
    assert spark.conf.get(ARROW_MAX_BYTES_PER_BATCH) == "2147483647"


@pytest.mark.integration
def test_the_driver_jvm_runs_the_parallel_collector(spark: Any) -> None:
    jvm = spark.sparkContext._jvm
    beans = jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    names = sorted(str(bean.getName()) for bean in beans)
    assert names == ["PS MarkSweep", "PS Scavenge"]
