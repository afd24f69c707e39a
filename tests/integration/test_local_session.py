"""What ``fanout.spark.local_session`` sets for speed on a small machine: Arrow batches to
Python bounded by rows only, the parallel garbage collector in the JVM, and checkpoint
files renamed through Hadoop's FileSystem API (no ``readlink`` processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fanout.spark import (
    ARROW_MAX_BYTES_PER_BATCH,
    ARROW_UNCHECKED_BATCH_BYTES,
    CHECKPOINT_FILE_MANAGER,
    FILE_SYSTEM_CHECKPOINTS,
)


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


def _stream(spark: Any, source: Path, checkpoint: Path) -> list[int]:
    """Run an availableNow query over ``source`` (one file a batch); the ids it saw."""
    seen: list[int] = []
    query = (
        spark.readStream.schema("id INT").option("maxFilesPerTrigger", 1).json(str(source))
        .writeStream.foreachBatch(lambda df, _: seen.extend(r.id for r in df.collect()))
        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination()
    assert query.exception() is None
    return sorted(seen)


@pytest.mark.integration
def test_checkpoints_are_written_and_resumed_through_the_file_system_manager(
    spark: Any, tmp_path: Path
) -> None:
    assert spark.conf.get(CHECKPOINT_FILE_MANAGER) == FILE_SYSTEM_CHECKPOINTS
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    source.mkdir()
    for i in range(2):
        (source / f"{i}.json").write_text(f'{{"id": {i}}}\n')
    assert _stream(spark, source, checkpoint) == [0, 1]
    (source / "2.json").write_text('{"id": 2}\n')
    assert _stream(spark, source, checkpoint) == [2]  # resumed from the checkpoint
    for log in ("offsets", "commits"):
        names = sorted(p.name for p in (checkpoint / log).iterdir() if not p.name.startswith("."))
        assert names == ["0", "1", "2"]
        leftovers = [p.name for p in (checkpoint / log).iterdir() if p.name.endswith(".tmp")]
        assert leftovers == []  # every file renamed into place
