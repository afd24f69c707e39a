"""The pluggy plugin module registered under the ``fanout`` entry-point group."""

from __future__ import annotations

from collections.abc import Mapping

from fanout.contract.sink import Sink
from fanout.deadletters.target import DeadLetterKind
from fanout.errors import ConfigurationError
from fanout.hooks.specs import hookimpl
from fanout_postgres.deadletter import POSTGRES, PostgresDeadLetters
from fanout_postgres.names import parse_table
from fanout_postgres.sink import PostgresSink


@hookimpl
def fanout_sink_types() -> dict[str, type[Sink]]:
    """Provide the ``postgres`` sink type (:class:`fanout_postgres.PostgresSink`)."""
    return {"postgres": PostgresSink}


@hookimpl
def fanout_dead_letter_kinds() -> Mapping[str, DeadLetterKind]:
    """Provide the ``postgres`` dead-letter kind: a table in a PostgreSQL sink's database."""
    return {POSTGRES: postgres_target}


def postgres_target(location: str, sink: Sink) -> PostgresDeadLetters:
    """The ``postgres`` kind's factory: a table in ``sink``'s database; only a PostgreSQL
    sink has one."""
    if not isinstance(sink, PostgresSink):
        raise ConfigurationError(
            f"sink {sink.name!r}: dead_letter 'postgres:{location}' is a table in a PostgreSQL "
            "sink's database; this sink has none (a Delta table path works for every sink)"
        )
    try:
        table = parse_table(location)
    except ValueError as exc:
        raise ConfigurationError(f"sink {sink.name!r}: option 'dead_letter': {exc}") from None
    return PostgresDeadLetters(sink.url, sink.name, table, str(sink.table))
