"""Step 4, before persisting: partition the batch once for the sinks that would each
partition it the same way.

Two sinks writing from the executors and hashing the batch by the same columns into the
same number of partitions (a Kafka topic and a PostgreSQL table keyed by ``order_id``, 4
partitions each) would each shuffle the whole batch. When the batch is persisted already
partitioned that way, Spark finds each sink's ``repartition`` satisfied by the cache and
plans no shuffle for it: the batch is shuffled once, before the cache is built. Where the
rows land is unchanged, since it is the same hash either way, and a sink that reported its
partitioning wrongly is only shuffled again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fanout.contract.partitions import BatchPartitioning
from fanout.partitioned.membership import quoted
from fanout.sink_spec import SinkSpec
from fanout.steps.state import BatchState

log = logging.getLogger("fanout")


def partition_if_shared(state: BatchState, specs: Mapping[str, SinkSpec]) -> None:
    """Replace ``state.df`` by ``state.df.repartition(n, *columns)`` when two or more
    pending sinks report that partitioning (:meth:`fanout.Sink.batch_partitioning`);
    records it in ``state.partitioning``. Call it before the batch is persisted."""
    candidates = [s for s in state.pending if _keeps_columns(specs[s])]
    if len(candidates) < 2 or not hasattr(state.df, "repartition"):
        return
    schema = state.df.schema
    found = {name: _partitioning_of(specs[name], schema) for name in candidates}
    shared = most_shared(found)
    if shared is None:
        return
    state.df = state.df.repartition(shared.partitions, *[quoted(c) for c in shared.columns])
    state.partitioning = shared
    sharing = [name for name, p in found.items() if p == shared]
    log.debug(
        "batch %d: partitioned once into %s for %s",
        state.batch_id, shared.describe(), ", ".join(sharing),
    )  # fmt: skip


def most_shared(found: Mapping[str, BatchPartitioning | None]) -> BatchPartitioning | None:
    """The partitioning reported by the most sinks, if at least two report it (the first
    reported wins a tie)."""
    counts: dict[BatchPartitioning, int] = {}
    for partitioning in found.values():
        if partitioning is not None and partitioning.partitions > 0 and partitioning.columns:
            counts[partitioning] = counts.get(partitioning, 0) + 1
    best = max(counts.items(), key=lambda item: item[1], default=None)
    return best[0] if best is not None and best[1] >= 2 else None


def _keeps_columns(spec: SinkSpec) -> bool:
    # A sink reading the DataFrame through a route without a select sees the batch's own
    # columns (a filter keeps the partitioning); Arrow readers are not partitioned.
    return spec.sink.reads == "dataframe" and spec.route.select is None


def _partitioning_of(spec: SinkSpec, schema: Any) -> BatchPartitioning | None:
    try:
        return spec.sink.batch_partitioning(schema)
    except Exception as exc:  # an optimisation only: the sink partitions its own input
        log.warning(
            "sink %r: batch_partitioning failed (%s); its batch is partitioned by its write",
            spec.name, exc,
        )  # fmt: skip
        return None
