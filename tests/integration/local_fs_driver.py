"""A driver run as a subprocess by test_local_session, on a PATH whose first ``chmod`` logs
every call to WORKDIR/chmod.log (the test puts it there: the suite's own JVM was started
without it).

usage: python local_fs_driver.py WORKDIR

Prints one JSON line: the class serving ``file:`` paths in fanout's local session; the
``chmod`` calls one file created through Hadoop's stock LocalFileSystem made (the proof that
the logging ``chmod`` is the one Hadoop runs); the ids a three-batch stream with its
checkpoint under WORKDIR saw, and the ``chmod`` calls that stream made.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def calls(log: Path) -> int:
    """How many ``chmod`` calls the logging ``chmod`` has recorded."""
    return len(log.read_text().splitlines()) if log.exists() else 0


def main(work: Path) -> None:
    """Run the checks described in the module docstring; print their results."""
    from fanout.spark import local_session

    spark = local_session("local-fs-driver", master="local[1]")
    jvm = spark.sparkContext._jvm
    hadoop_conf = spark.sparkContext._jsc.hadoopConfiguration()
    log = work / "chmod.log"
    local = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), hadoop_conf)
    stock = jvm.org.apache.hadoop.fs.LocalFileSystem()
    stock.initialize(jvm.java.net.URI("file:///"), hadoop_conf)
    stock.create(jvm.org.apache.hadoop.fs.Path(f"file://{work}/stock.txt"), True).close()
    stock_calls = calls(log)

    source = work / "input"
    source.mkdir()
    for i in range(3):
        (source / f"{i}.json").write_text(f'{{"id": {i}}}\n')
    seen: list[int] = []

    def collect(batch: Any, _batch_id: int) -> None:
        seen.extend(row.id for row in batch.collect())

    query = (
        spark.readStream.schema("id INT").option("maxFilesPerTrigger", 1).json(str(source))
        .writeStream.foreachBatch(collect).option("checkpointLocation", str(work / "ckpt"))
        .trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination()
    result = {
        "file_system": str(local.getClass().getName()),
        "stock_chmods": stock_calls,
        "ids": sorted(seen),
        "stream_chmods": calls(log) - stock_calls,
    }
    print(json.dumps(result), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
