"""Stable partition membership for sinks that commit one transaction per Spark partition.

The Kafka sink and the PostgreSQL sink in append mode hash-partition each batch into a
fixed number of partitions and commit each partition on its own; a replay (after a crash,
or a retry inside the same batch) skips the partitions that already committed. That is
only sound when every attempt puts every row in the same partition. Two things here make
sure of it:

1. **Determinism** (:mod:`fanout.partitioned.determinism`): the columns a sink
   partitions by (:meth:`fanout.Sink.partitioned_by`: its key columns, or the whole row)
   must not come from a non-deterministic expression (``uuid()``, ``rand()``,
   ``current_timestamp()`` in a route...), and no non-deterministic filter may decide
   which rows exist. Checked on Spark's plans: the route's expressions at ``FanOut(...)``,
   the routed batch and the streaming query's own plan at each batch (cached per query).
2. **Detection** (:class:`PartitionPlan`, :func:`check_committed`): each partition commits,
   atomically with its rows, the partition count, a fingerprint of the partitioning (columns,
   types, hash scheme) and a digest of its rows (count and an order-independent checksum of
   the partitioning columns). When some partitions already hold the batch, the driver
   re-plans the batch in one Spark job (:func:`summarize`) and refuses any difference
   before a partition writes. Batches no partition committed yet pay no extra job.

The core imports no plugin; the sinks call these functions.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from fanout.contract.nested_types import holds_spark_type
from fanout.errors import PartitioningError, SchemaMismatchError
from fanout.partitioned.frame_steps import frame_steps

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("fanout")

WHOLE_ROW: Literal["*"] = "*"
"""What :meth:`fanout.Sink.partitioned_by` returns for a sink hashing the whole row."""

HASH_SCHEME = "spark-hashpartitioning-murmur3/v1"
"""How rows are assigned to partitions: Spark's ``repartition(n, *columns)``."""

MEMBER_COLUMN = "__fanout_member"
"""The column a sink adds after the repartition: the low 32 bits of ``xxhash64`` of the
partitioning columns, summed per partition into the checksum, stripped before writing."""

_LOW32 = 0xFFFFFFFF


# -- what a partition commits, and what a replay must match ---------------------------------


@dataclass(frozen=True)
class PartitionDigest:
    """The rows of one partition: how many, and the sum of their :data:`MEMBER_COLUMN`."""

    rows: int
    checksum: int

    def short(self) -> int:
        """A 32-bit digest of both (for stores that keep a single small number)."""
        data = f"{self.rows}:{self.checksum}".encode()
        return int.from_bytes(hashlib.sha256(data).digest()[:4], "big")


@dataclass(frozen=True)
class PartitionPlan:
    """How a sink partitions one batch: the count and the columns with their types."""

    partitions: int
    columns: tuple[tuple[str, str], ...]

    @property
    def fingerprint(self) -> str:
        """8 hex digits identifying the columns, their types and :data:`HASH_SCHEME`
        (not the count, which is recorded and compared on its own)."""
        text = HASH_SCHEME + "|" + "|".join(f"{n}:{t}" for n, t in self.columns)
        return hashlib.sha256(text.encode()).hexdigest()[:8]

    def describe(self) -> str:
        """``4 partitions by order_id bigint`` (for messages)."""
        shown = ", ".join(f"{n} {t}" for n, t in self.columns)
        return f"{self.partitions} partitions by {shown} (fingerprint {self.fingerprint})"


@dataclass(frozen=True)
class CommittedPartition:
    """What a partition that already committed the batch recorded; ``None``: not recorded
    (a mark written by an older fanout). ``digest`` is exact; ``short`` is
    :meth:`PartitionDigest.short` where only that could be stored. ``route`` is the route
    its rows went through, as :func:`fanout.partitioned.replay_route.route_mark` gave it
    (``<fingerprint> <route>``): the kit refuses a replay under another
    (:func:`~fanout.partitioned.replay_route.check_routes`)."""

    partition: int
    partitions: int | None = None
    fingerprint: str | None = None
    digest: PartitionDigest | None = None
    short: int | None = None
    route: str | None = None


def plan_of(df: Any, by: Sequence[str], partitions: int) -> PartitionPlan:
    """The plan of ``df.repartition(partitions, *by)``."""
    types = dict(df.dtypes)
    return PartitionPlan(partitions, tuple((c, types[c]) for c in by))


def unhashable(schema: Any, by: Sequence[str]) -> list[tuple[str, str]]:
    """``(column, type)`` of the columns of ``by`` in ``schema`` (a Spark ``StructType``)
    holding a map or a variant at any depth: Spark refuses to hash them
    (``DATATYPE_MISMATCH.HASH_MAP_TYPE``, ``HASH_VARIANT_TYPE``), so
    :data:`MEMBER_COLUMN` cannot be computed and every batch would fail."""
    fields = {f.name: f.dataType for f in schema.fields}
    return [(c, fields[c].simpleString()) for c in by if c in fields and _holds_map(fields[c])]


def hash_refusal(schema: Any, by: Sequence[str], *, keyed: bool) -> tuple[str, list[str]] | None:
    """``None`` when Spark can hash the partitioning columns ``by`` of ``schema``; else the
    refusal's text (each column Spark cannot hash, :func:`unhashable`, and what to do: a
    keyless sink partitions by every column it writes, so one map among them stalls it at
    every batch) and those columns."""
    found = unhashable(schema, by)
    if not found:
        return None
    named = ", ".join(f"{c!r} ({t})" for c, t in found)
    first = found[0][0]
    if keyed:
        advice = (
            f"This sink partitions by its key column(s) {', '.join(by)}: choose keys without "
            f"maps or variants, or convert the column in the query or the sink's select "
            f"(e.g. to_json({first}))"
        )
    else:
        advice = (
            "This sink has no key, so it partitions by every column it writes: give it key "
            "columns (Kafka 'key', PostgreSQL 'keys'), or drop the column or convert it in "
            f"the query or the sink's select (e.g. to_json({first}))"
        )
    message = (
        f"column(s) {named} cannot assign rows to partitions: Spark cannot hash a map or a "
        f"variant (DATATYPE_MISMATCH.HASH_MAP_TYPE or HASH_VARIANT_TYPE). {advice}"
    )
    return message, [c for c, _ in found]


def check_hashable(
    schema: Any, by: Sequence[str], *, keyed: bool, sink: str, batch_id: int | None
) -> None:
    """Raise :class:`SchemaMismatchError` naming the sink, the batch (``None`` before the
    stream starts: ``fanout validate``) and the :func:`hash_refusal` of ``by``."""
    refused = hash_refusal(schema, by, keyed=keyed)
    if refused is not None:
        message, columns = refused
        raise SchemaMismatchError(message, sink=sink, batch_id=batch_id, columns=columns)


def _holds_map(data_type: Any) -> bool:
    from pyspark.sql import types as T

    return holds_spark_type(data_type, lambda t: isinstance(t, T.MapType | T.VariantType))


def with_member_column(parted: Any, by: Sequence[str]) -> Any:
    """``parted`` plus :data:`MEMBER_COLUMN` (a narrow projection: the partitions stay)."""
    from pyspark.sql import functions as F

    return parted.withColumn(MEMBER_COLUMN, F.expr(_member_hash(by)))


def member_column_sql(by: Sequence[str]) -> str:
    """:data:`MEMBER_COLUMN` as a SQL select expression, for a projection that also picks
    the job's other columns: one plan step fewer than :func:`with_member_column` after it.
    A row's value depends on its own ``by`` values only, so selecting it before or after a
    ``repartition`` gives the same values in the same partitions."""
    return f"{_member_hash(by)} AS {quoted(MEMBER_COLUMN)}"


def select_columns(df: Any, expressions: Sequence[str]) -> Any:
    """``df`` projected to ``expressions`` (quoted column names, SQL expressions), as one
    ``selectExpr`` whose list of strings is kept in the JVM (:mod:`frame_steps`)."""
    return frame_steps(df, select=expressions)


def partitioned_frame(
    df: Any,
    partitions: int,
    by: Sequence[str],
    *,
    columns: Sequence[str] | None = None,
    member: bool = False,
    sort: Sequence[str] = (),
) -> Any:
    """What a partitioned job reads, alone or shared: ``df``'s ``columns`` (all when
    ``None``) plus, with ``member``, :data:`MEMBER_COLUMN` hashed from ``by``; hashed by
    ``by`` into ``partitions``; sorted within each by ``sort``. The member column joins a
    projection of ``columns`` (one step), else follows the repartition: either way a row's
    value and partition are the same."""
    keyed = [quoted(c) for c in by]
    ordered = [quoted(c) for c in sort]  # names, as ``by``: a dot is part of the name
    if columns is None and member:  # a sink's own job: the member column after the shuffle
        parted = with_member_column(frame_steps(df, partitions=partitions, by=keyed), by)
        return frame_steps(parted, sort=ordered)
    picked = None
    if columns is not None:
        picked = [quoted(c) for c in columns] + ([member_column_sql(by)] if member else [])
    return frame_steps(df, select=picked, partitions=partitions, by=keyed, sort=ordered)


def _member_hash(by: Sequence[str]) -> str:
    # SQL text: one py4j call instead of one per column and operator, ~3 ms instead of ~8
    # on the driver before the job (the same expression and values)
    return f"xxhash64({', '.join(quoted(c) for c in by)}) & {_LOW32}"


class MemberDigest:
    """On the executor: strips :data:`MEMBER_COLUMN` from a partition's Arrow batches and
    sums it; :attr:`digest` is final once the batches are consumed."""

    def __init__(self) -> None:
        self.rows = 0
        self.checksum = 0

    def strip(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The batches without the member column, counting as they pass."""
        import pyarrow.compute as pc

        for batch in batches:
            index = batch.schema.get_field_index(MEMBER_COLUMN)
            if index < 0:
                yield batch
                continue
            # Arrow's sum: to_numpy() imports pandas, ~0.3 CPU s in every Python worker
            total = pc.sum(batch.column(index).cast("int64")).as_py()
            self.rows += batch.num_rows
            self.checksum += int(total or 0)
            yield batch.remove_column(index)

    @property
    def digest(self) -> PartitionDigest:
        """The partition's digest so far."""
        return PartitionDigest(self.rows, self.checksum)


def summarize(parted: Any, by: Sequence[str]) -> dict[int, PartitionDigest]:
    """On the driver, one Spark job: each partition's digest, as the executors will see it."""
    from pyspark.sql import functions as F

    member = with_member_column(parted, by)
    rows = (
        member.select(F.spark_partition_id().alias("p"), F.col(MEMBER_COLUMN).alias("h"))
        .groupBy("p")
        .agg(F.count(F.lit(1)).alias("n"), F.sum("h").alias("s"))
        .collect()
    )
    return {int(r["p"]): PartitionDigest(int(r["n"]), int(r["s"] or 0)) for r in rows}


def check_committed(
    committed: Sequence[CommittedPartition],
    plan: PartitionPlan,
    summary: Callable[[], Mapping[int, PartitionDigest]],
    *,
    sink: str,
    batch_id: int,
) -> None:
    """Refuse a replay whose partitions differ from those that already committed the batch.

    :param committed: the partitions holding the batch (empty: nothing to check, no job).
    :param summary: computes the re-planned digests; called only when needed.
    :raises PartitioningError: naming the sink, the batch and what changed.
    """
    if not committed:
        return
    done = sorted(c.partition for c in committed)
    advice = (
        f"Partitions {done} already hold batch {batch_id}; a replay skips them, so the "
        "batch must be partitioned exactly as when they committed. "
    )
    for mark in committed:
        if mark.partitions is not None and mark.partitions != plan.partitions:
            raise PartitioningError(
                f"option 'partitions' changed mid-batch: partition {mark.partition} committed "
                f"with partitions {mark.partitions}, now {plan.partitions}. {advice}Restore "
                f"partitions={mark.partitions} until this batch completes, then change it",
                sink=sink, batch_id=batch_id,
            )  # fmt: skip
        if mark.fingerprint is not None and mark.fingerprint != plan.fingerprint:
            raise PartitioningError(
                f"the partitioning columns changed mid-batch: partition {mark.partition} "
                f"committed with fingerprint {mark.fingerprint}, now {plan.describe()}. "
                f"{advice}Restore the key columns, route and schema of the sink until this "
                "batch completes",
                sink=sink, batch_id=batch_id,
            )  # fmt: skip
    digests = summary()
    for mark in committed:
        now = digests.get(mark.partition, PartitionDigest(0, 0))
        moved = (mark.digest is not None and mark.digest != now) or (
            mark.digest is None and mark.short is not None and mark.short != now.short()
        )
        if moved:
            then = f"{mark.digest.rows} rows" if mark.digest is not None else "other rows"
            raise PartitioningError(
                f"rows moved between partitions: partition {mark.partition} committed "
                f"{then}, and re-planned it now holds {now.rows} rows"
                f"{'' if mark.digest is None else ' with other partitioning values'}. "
                f"{advice}The batch's rows or their partitioning values differ from the "
                "first attempt (a non-deterministic source, a changed input or static "
                "table): writing would lose or duplicate rows. Restore the input of this "
                "batch, or accept the loss explicitly by removing this sink's marks",
                sink=sink, batch_id=batch_id,
            )  # fmt: skip


def quoted(column: str) -> str:
    """A column name as a Spark SQL identifier."""
    return "`" + column.replace("`", "``") + "`"
