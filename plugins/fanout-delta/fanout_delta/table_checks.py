"""What a Delta sink's open refuses, or warns about, in the table it is to write: columns
its options name that the table lacks, another partitioning, CHECK constraints Spark cannot
evaluate, a binary partition column (engine ``rs``), a log long enough to slow every
commit, and a ``delta.setTransactionRetentionDuration`` shorter than the sink accepts."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from fanout.errors import ConfigurationError
from fanout_delta.option_values import config_error

# The sink's logger: its records keep the name users' logging settings give.
logger = logging.getLogger("fanout_delta.sink")


def pa_schema(table: Any) -> Any:
    """A delta-rs table's schema as a ``pyarrow.Schema``."""
    import pyarrow as pa

    return pa.schema(table.schema().to_arrow())


def check_table(
    sink: str, path: str | None, table: Any, columns: Mapping[str, Sequence[str] | None]
) -> None:
    """Refuse an existing ``table`` lacking a column an option names (``columns``:
    ``keys``, ``order_by``, ``partition_by`` by name), or partitioned otherwise than
    ``partition_by`` says."""
    names = set(pa_schema(table).names)
    for option, given in columns.items():
        missing = [c for c in given or [] if c not in names]
        if missing:
            raise config_error(
                sink,
                f"option {option!r} names column(s) {', '.join(map(repr, missing))} not "
                f"in the existing table at {path!r} "
                f"(columns: {', '.join(sorted(names))})",
            )
    existing = list(table.metadata().partition_columns)
    partition_by = columns["partition_by"]
    if partition_by is not None and partition_by != existing:
        raise config_error(
            sink,
            f"option 'partition_by' is {partition_by!r} but the existing table at "
            f"{path!r} is partitioned by {existing!r}; use the table's partitioning "
            "(or omit the option)",
        )


def check_constraints(sink: str, table: Any, engine: Literal["rs", "spark"], spark: Any) -> None:
    """Refuse a CHECK constraint of the table Spark cannot evaluate: the sink could
    not tell which rows it refuses (:mod:`fanout_delta.constraints`)."""
    from fanout_delta.constraints import TableConstraints

    constraints = TableConstraints.of(table, engine, spark=spark)
    constraints.check_expressions(spark, table, sink)


def refuse_binary_partitions(sink: str, path: str | None, table: Any) -> None:
    """Refuse (engine ``rs``) an existing table partitioned by a binary column."""
    from fanout_delta.schema import binary_columns, binary_partition_message

    binary = binary_columns(pa_schema(table), table.metadata().partition_columns)
    if binary:
        raise config_error(
            sink, f"the existing table at {path!r}: {binary_partition_message(binary)}"
        )


def check_log_length(sink: str, path: str, table: Any) -> None:
    """Warn when the table's log directory is long enough to slow every commit (a
    table on a local or mounted disk; an object store is not listed for it)."""
    from fanout.delta_tables import retention

    files = retention.log_files_on_disk(path)
    if files is not None and files >= retention.LONG_LOG_FILES:
        where = f"Delta sink {sink!r}: the table {path!r}"
        configuration = table.metadata().configuration
        logger.warning(retention.long_log_advice(where, files, configuration))


def check_txn_retention(
    sink: str,
    path: str | None,
    configuration: Mapping[str, str | None] | None,
    min_hours: float,
) -> None:
    """Refuse a ``delta.setTransactionRetentionDuration`` shorter than ``min_hours`` (the
    option ``min_txn_retention_hours``); warn about any (see
    :mod:`fanout.delta_tables.retention`)."""
    from datetime import timedelta

    from fanout.delta_tables import retention as txn_retention

    where = f"Delta sink {sink!r} (table {path!r})"
    retention = txn_retention.retention_of(configuration, where)
    if retention is None:
        return
    value = str((configuration or {})[txn_retention.PROPERTY])
    floor = timedelta(hours=min_hours)
    if retention < floor:
        raise ConfigurationError(
            txn_retention.short_retention_error(
                where,
                value,
                floor,
                "a batch written but not yet marked in the ledger when the pipeline stops "
                "would be written again by a restart later than that",
                "lower the sink's option 'min_txn_retention_hours' to the longest outage "
                "after a crash you accept",
            )
        )
    logger.warning(
        "%s: table property %s = %r: a restart more than %s after a crash may write "
        "the batch that was in flight a second time", where, txn_retention.PROPERTY,
        value, retention,
    )  # fmt: skip
