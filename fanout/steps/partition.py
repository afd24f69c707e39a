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
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from fanout.contract.partitions import BatchPartitioning
from fanout.partitioned.membership import quoted
from fanout.sink_spec import SinkSpec
from fanout.steps.state import BatchState

log = logging.getLogger("fanout")

T = TypeVar("T")


def partition_if_shared(state: BatchState, specs: Mapping[str, SinkSpec]) -> None:
    """Replace ``state.df`` by ``state.df.repartition(n, *columns)`` when two or more
    pending sinks report that partitioning (:meth:`fanout.Sink.batch_partitioning`);
    records it in ``state.partitioning``. Call it before the batch is persisted."""
    candidates = [s for s in state.pending if _keeps_columns(specs[s])]
    if len(candidates) < 2 or not hasattr(state.df, "repartition"):
        return
    schema = state.df.schema
    found = {name: reported_partitioning(specs[name], schema) for name in candidates}
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
    return most_common([p for p in found.values() if p is not None and usable(p)])


def most_common(values: Sequence[T]) -> T | None:
    """The value found most often, if at least twice (the first found wins a tie)."""
    best = Counter(values).most_common(1)
    return best[0][0] if best and best[0][1] >= 2 else None


def usable(partitioning: BatchPartitioning) -> bool:
    """Whether a reported partitioning can be shared: some partitions, some columns."""
    return partitioning.partitions > 0 and bool(partitioning.columns)


def _keeps_columns(spec: SinkSpec) -> bool:
    # A sink reading the DataFrame through a route without a select sees the batch's own
    # columns (a filter keeps the partitioning); Arrow readers are not partitioned.
    return spec.sink.reads == "dataframe" and spec.route.select is None


def reported_partitioning(spec: SinkSpec, schema: Any) -> BatchPartitioning | None:
    """What ``spec``'s sink reports it will partition a batch of ``schema`` by
    (:meth:`fanout.Sink.batch_partitioning`); ``None`` when it cannot tell, or raises
    (logged: sharing is an optimisation only, the sink partitions its own input)."""
    try:
        return spec.sink.batch_partitioning(schema)
    except Exception as exc:
        log.warning(
            "sink %r: batch_partitioning failed (%s); its write partitions the batch itself",
            spec.name, exc,
        )  # fmt: skip
        return None
