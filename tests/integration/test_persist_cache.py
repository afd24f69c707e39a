"""With real Spark: the batch fanout persists for several sinks is cached uncompressed,
unless the session chose otherwise (see ``fanout.steps.persist.persist_uncompressed``)."""

from __future__ import annotations

import threading
from typing import Any

from fanout import BatchInfo, FanOut
from fanout.contract.batch import Batch
from fanout.ledger.memory import MemoryLedger
from fanout.steps.persist import CACHE_COMPRESSED
from tests.unit.fakes import ScriptedSink

ROWS = 200_000


def cached_bytes_seen_by_sinks(spark: Any) -> int:
    """Fan a batch of very compressible rows out to two DataFrame sinks; return the cache's
    size in memory as the sinks saw it (after each counted the batch)."""
    from pyspark.sql import functions as F

    df = spark.range(ROWS).select(F.col("id"), F.lit("the same string in every row").alias("s"))
    sizes: list[int] = []
    lock = threading.Lock()

    def measure(batch: Batch) -> None:
        batch.df.count()  # materialises the cache
        size = sum(i.memSize() for i in spark.sparkContext._jsc.sc().getRDDStorageInfo())
        with lock:
            sizes.append(size)

    sinks = [ScriptedSink(n, on_write=measure) for n in ("a", "b")]
    FanOut("persist", MemoryLedger(), sinks, backoff_s=0, spark=spark).process(
        df, BatchInfo("persist", 0, "q-1")
    )
    assert all(s.calls == [(0, 1)] for s in sinks)
    return max(sizes)


def test_the_shared_batch_is_cached_uncompressed(spark: Any) -> None:
    assert spark.conf.get(CACHE_COMPRESSED, None) is None
    uncompressed = cached_bytes_seen_by_sinks(spark)
    assert spark.conf.get(CACHE_COMPRESSED, None) is None  # the session is left as it was
    spark.conf.set(CACHE_COMPRESSED, "true")  # the session's explicit choice wins
    try:
        compressed = cached_bytes_seen_by_sinks(spark)
    finally:
        spark.conf.unset(CACHE_COMPRESSED)
    # 200k longs and a 28-byte string each: ~7 MB as they are, far less compressed
    assert uncompressed > 5_000_000
    assert compressed * 5 < uncompressed
