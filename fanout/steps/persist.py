"""Step 4 of a batch: persist the DataFrame when more than one reader will scan it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fanout.contract.sessions import ADAPTIVE, session_settings
from fanout.sink_spec import SinkSpec
from fanout.steps.partition import partition_if_shared
from fanout.steps.share import group_shared_tasks
from fanout.steps.state import BatchState

CACHE_COMPRESSED = "spark.sql.inMemoryColumnarStorage.compressed"


def prepare_reads(
    state: BatchState, specs: Mapping[str, SinkSpec], *, share_tasks: bool = True,
    parallelism: int | None = None,
) -> None:  # fmt: skip
    """Step 4: group the sinks that share their tasks (:mod:`fanout.steps.share`), then,
    when the batch will be read more than once, partition it once for the sinks hashing
    it alike (:mod:`fanout.steps.partition`) and persist it. A batch read once (one shared
    job for every pending sink) is left as it is: each reader partitions its own."""
    if share_tasks:
        group_shared_tasks(state, specs, parallelism)
    if batch_readers(state, specs) > 1:
        partition_if_shared(state, specs)
    persist_if_shared(state, specs)


def persist_if_shared(state: BatchState, specs: Mapping[str, SinkSpec]) -> bool:
    """Persist ``state.df`` when the pending sinks read it more than once; records it in
    ``state.persisted`` (step 7 unpersists) and returns it.

    Sinks reading Arrow share one conversion per route, so together they read the
    DataFrame once per distinct route; each sink reading the DataFrame reads it once, and
    sinks sharing their tasks (:mod:`fanout.steps.share`) once together; the spool reads
    it once when a sink is behind (step 6b).
    """
    state.persisted = batch_readers(state, specs) > 1 and hasattr(state.df, "persist")
    if state.persisted:
        persist_uncompressed(state.df, keep_partitioning=state.partitioning is not None)
    return state.persisted


def batch_readers(state: BatchState, specs: Mapping[str, SinkSpec]) -> int:
    """How many times this batch's DataFrame will be read: by the pending sinks (each
    group sharing its tasks once), and by the spool when a sink is behind."""
    grouped = {name for group in state.share_groups for name in group}
    alone = [name for name in state.pending if name not in grouped]
    readers = readers_of(alone, specs) + len(state.share_groups)  # one shared job each
    return readers + (1 if state.lagging or state.lagged else 0)


def readers_of(pending: Sequence[str], specs: Mapping[str, SinkSpec]) -> int:
    """How many times the pending sinks will read the batch DataFrame."""
    readers = sum(specs[s].sink.reads == "dataframe" for s in pending)
    readers += len({specs[s].route for s in pending if specs[s].sink.reads == "arrow"})
    return readers


def persist_uncompressed(df: Any, *, keep_partitioning: bool = False) -> None:
    """``df.persist()``, caching the batch's columns uncompressed unless the session sets
    ``spark.sql.inMemoryColumnarStorage.compressed`` itself; with ``keep_partitioning``,
    the cache is planned without adaptive execution, so that its hash partitioning (step
    4 repartitioned the batch for sinks hashing alike) is known to the plans that read it.

    The cache lives for one batch and is read once per reader, so compressing it costs
    CPU and buys nothing but memory: in bench/bench_three_sinks.py (1M rows, 10 batches,
    3 sinks) building the compressed cache took ~1.4 of the ~8 task CPU seconds, and the
    Spark JVM used ~2.5 CPU s (~15%) more. The price is memory: an uncompressed cache is
    larger (MEMORY_AND_DISK spills what does not fit); a session that sets the option
    explicitly keeps its choice.

    An adaptive plan does not tell its output partitioning until it ran, so a sink's
    ``repartition`` over a cache planned adaptively shuffles the batch again, each sink
    once more; planned plainly, Spark sees the cache partitioned already and plans no
    shuffle. Adaptive execution has nothing to adapt in the cache's plan (a scan and a
    repartition to a fixed count, which it never coalesces); the kit's partition jobs are
    planned without it too, other sinks' plans keep it. Spark reads both options when
    ``persist()`` plans the cache, so they are set for that call only and restored right
    after, by :func:`~fanout.contract.sessions.session_settings` (another query of the
    same session planned in that instant would see them too: harmless).
    """
    conf = getattr(getattr(df, "sparkSession", None), "conf", None)
    if conf is None:
        df.persist()
        return
    settings = {} if conf.get(CACHE_COMPRESSED, None) is not None else {CACHE_COMPRESSED: "false"}
    if keep_partitioning:
        settings[ADAPTIVE] = "false"
    with session_settings(conf, settings):
        df.persist()
