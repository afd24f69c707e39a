"""The PostgreSQL sink's options checked at ``open()``, before any connection: each problem
a ``ValueError`` naming the option (the sink turns it into a configuration error)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from fanout.errors import ConfigurationError
from fanout_postgres.identifiers import TableName, check_identifier, parse_table

MODES: tuple[str, ...] = ("upsert", "append")


class Configured(Protocol):
    """The options of a configured PostgreSQL sink, as :func:`check_options` reads them."""

    table: Any
    dead_letter: Any
    state_schema: str
    keys: Sequence[str] | None
    order_by: Sequence[str]
    columns: Sequence[str] | Mapping[str, str] | None
    mode: Any
    partitions: Any
    create_table: Any
    migrate: Any
    connection_idle_s: Any


def check_options(sink: Configured) -> TableName:
    """Raise ``ValueError`` naming the first option that is wrong; return the table."""
    if sink.table is None:
        raise ValueError("option 'table' is required: the target table")
    table = parse_table(sink.table)
    if sink.dead_letter is not None and not isinstance(sink.dead_letter, str):
        raise ValueError(
            "option 'dead_letter' must be a string: 'postgres:<table>' or a Delta path"
        )
    check_identifier(sink.state_schema, "option 'state_schema'")
    if "." in sink.state_schema:
        raise ValueError(dotted_schema(sink.state_schema, "option 'state_schema'"))
    for option in ("keys", "order_by"):
        for column in getattr(sink, option) or []:
            check_identifier(column, f"option {option!r} column")
    if sink.columns is not None:
        columns = sink.columns
        targets = columns.values() if isinstance(columns, Mapping) else columns
        for column in targets:
            check_identifier(column, "option 'columns' column")
    if sink.mode not in MODES:
        raise ValueError(f"unknown mode {sink.mode!r}; valid modes: {', '.join(MODES)}")
    if sink.mode == "append" and sink.order_by:
        raise ValueError("option 'order_by' only applies to mode 'upsert'")
    partitions = sink.partitions
    if (
        isinstance(partitions, bool)
        or not isinstance(partitions, int)
        or not 1 <= partitions <= 10_000
    ):
        raise ValueError(
            f"option 'partitions' must be an integer from 1 to 10000, got {partitions!r}"
        )
    for flag in ("create_table", "migrate"):
        if not isinstance(getattr(sink, flag), bool):
            raise ValueError(f"option {flag!r} must be true or false")
    idle = sink.connection_idle_s
    if isinstance(idle, bool) or not isinstance(idle, (int, float)) or not 0 <= idle <= 86_400:
        raise ValueError(
            "option 'connection_idle_s' must be a number of seconds from 0 (a connection "
            f"per partition) to 86400, got {idle!r}"
        )
    return table


def schema_of(value: Any, spark: Any) -> Any:
    """Option ``batch_schema``: a ``StructType`` as given, or one parsed from a DDL string."""
    if isinstance(value, str):
        if spark is None:
            raise ConfigurationError("option 'batch_schema' as a DDL string needs a SparkSession")
        return spark.createDataFrame([], value).schema
    return value


def as_list(value: Any) -> Any:
    """A column option as a list (one name, or a list or tuple of them)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return list(value)
    return value


def dotted_schema(schema: str, what: str) -> str:
    """Why a schema name for fanout's tables may not hold a dot."""
    return (
        f"{what} {schema!r} contains a '.': Alembic and SQLAlchemy, which create and name "
        "fanout's tables, read it as <database>.<schema> (PostgreSQL then refuses a "
        "cross-database reference); choose a schema name without one"
    )
