"""The pluggy plugin module registered under the ``fanout`` entry-point group.

It provides the ``postgres`` sink type and dead-letter kind, the ``fanout migrate`` command
and the embedded PostgreSQL server of ``fanout demo`` and ``fanout dev``.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path

from fanout.contract.sink import Sink
from fanout.deadletters.target import DeadLetterKind
from fanout.errors import ConfigurationError
from fanout.hooks.commands import CliCommand
from fanout.hooks.services import EmbeddedService
from fanout.hooks.specs import hookimpl
from fanout_postgres.deadletter import POSTGRES, PostgresDeadLetters
from fanout_postgres.identifiers import parse_table


@hookimpl
def fanout_sink_types() -> dict[str, type[Sink] | str]:
    """Provide the ``postgres`` sink type (:class:`fanout_postgres.PostgresSink`), as a lazy
    reference: its module (pandas; SQLAlchemy) is imported only when a sink of the type is
    used."""
    return {"postgres": "fanout_postgres.sink:PostgresSink"}


@hookimpl
def fanout_dead_letter_kinds() -> Mapping[str, DeadLetterKind]:
    """Provide the ``postgres`` dead-letter kind: a table in a PostgreSQL sink's database."""
    return {POSTGRES: postgres_target}


def postgres_target(location: str, sink: Sink) -> PostgresDeadLetters:
    """The ``postgres`` kind's factory: a table in ``sink``'s database; only a PostgreSQL
    sink has one."""
    from fanout_postgres.sink import PostgresSink

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


@hookimpl
def fanout_cli_commands() -> list[CliCommand]:
    """Provide ``fanout migrate`` (:mod:`fanout_postgres.cli`)."""
    from fanout_postgres.cli import MIGRATE

    return [MIGRATE]


@hookimpl
def fanout_embedded_services() -> list[EmbeddedService]:
    """Provide the embedded PostgreSQL server (``pip install 'fanout-postgres[embedded]'``)."""
    return [
        EmbeddedService(
            "postgres", "PostgreSQL", "FANOUT_PG_URL", start=embedded_server, answers=answers
        )
    ]


def answers(url: str, timeout_s: int = 5) -> str | None:
    """``None`` when the server at ``url`` accepts a connection and a query within
    ``timeout_s`` seconds, else the error's first line."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    engine = create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": timeout_s})
    try:
        with engine.connect() as connection:
            connection.execute(text("select 1"))
    except Exception as exc:
        said = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        return f"{type(exc).__name__}: {said[0] if said else ''}"
    finally:
        engine.dispose()
    return None


def embedded_server(root: Path) -> AbstractContextManager[str]:
    """A throw-away server with its data under ``root/postgres`` (removed when it stops);
    entering it yields the URL of its ``demo`` database."""
    from fanout_postgres.embedded import EmbeddedPostgres

    return EmbeddedPostgres(root / "postgres", database="demo", delete=True)
