"""What a Delta sink refuses in a batch before either writer runs, whether or not the table
exists (docs/architecture.md, "What a batch must be"): two names differing only in case,
a column an option names missing, and for delta-rs a ``VARIANT``, a ``GEOMETRY``, a
``GEOGRAPHY``, a binary partition column, or a merge key of a Spark collation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

    from fanout.contract.batch import Batch


@dataclass(frozen=True)
class BatchChecks:
    """The batch checks of Delta sink ``sink`` writing with ``engine`` (resolved, or as
    configured before the open) in ``mode``, its options naming these columns."""

    sink: str
    engine: str
    mode: str
    keys: Sequence[str] | None
    order_by: Sequence[str] | None
    partition_by: Sequence[str] | None

    def check_batch(self, batch: Batch) -> None:
        """The checks of :meth:`~fanout_delta.DeltaSink.check_schema` that need no table,
        on the batch's schema (Spark's, read without a job; delta-spark's only needs the
        names)."""
        if self.engine == "spark" and hasattr(batch.df, "mapInArrow"):
            self.check_schema(None, list(batch.df.columns), batch.batch_id)
            return
        from fanout.delta_tables.distributed import arrow_schema_of
        from fanout_delta.schema import refuse_collated_keys

        df = batch.df
        schema = arrow_schema_of(df) if hasattr(df, "mapInArrow") else batch.arrow().schema
        self.check_schema(schema, schema.names, batch.batch_id)
        if self.mode == "merge" and hasattr(df, "mapInArrow"):
            refuse_collated_keys(df.schema, self.keys or [], sink=self.sink,
                                 batch_id=batch.batch_id)  # fmt: skip

    def check_schema(
        self, schema: pa.Schema | None, names: Sequence[str], batch_id: int | None
    ) -> None:
        """Refuse a batch holding two names that differ only in case, lacking a column an
        option names, or, for delta-rs, holding a ``VARIANT``, a ``GEOMETRY`` or a
        ``GEOGRAPHY`` (``schema``: the batch's Arrow schema, when known)."""
        from fanout_delta.schema import (
            check_option_columns,
            refuse_binary_partitions,
            refuse_case_duplicates,
            refuse_geospatial,
            refuse_variants,
        )

        options = {"keys": self.keys, "order_by": self.order_by, "partition_by": self.partition_by}
        refuse_case_duplicates(schema if schema is not None else names, sink=self.sink,
                               batch_id=batch_id)  # fmt: skip
        check_option_columns(names, options, sink=self.sink, batch_id=batch_id)
        if schema is not None and self.engine == "rs":
            refuse_variants(schema, sink=self.sink, batch_id=batch_id)
            refuse_geospatial(schema, sink=self.sink, batch_id=batch_id)
            refuse_binary_partitions(schema, self.partition_by, sink=self.sink,
                                     batch_id=batch_id)  # fmt: skip
