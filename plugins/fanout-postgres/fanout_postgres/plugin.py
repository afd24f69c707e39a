"""The pluggy plugin module registered under the ``fanout`` entry-point group.

It provides the ``postgres`` sink type, the ``fanout migrate`` command and the embedded
PostgreSQL server of ``fanout demo`` and ``fanout dev``. Heavy modules are imported only
when a hook asks for what they hold, so ``fanout --help`` stays quick.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path

from fanout.contract.sink import Sink
from fanout.hooks.commands import CliCommand
from fanout.hooks.services import EmbeddedService
from fanout.hooks.specs import hookimpl


@hookimpl
def fanout_sink_types() -> dict[str, type[Sink]]:
    """Provide the ``postgres`` sink type (:class:`fanout_postgres.PostgresSink`)."""
    from fanout_postgres.sink import PostgresSink

    return {"postgres": PostgresSink}


@hookimpl
def fanout_cli_commands() -> list[CliCommand]:
    """Provide ``fanout migrate`` (:mod:`fanout_postgres.cli`)."""
    from fanout_postgres.cli import MIGRATE

    return [MIGRATE]


@hookimpl
def fanout_embedded_services() -> list[EmbeddedService]:
    """Provide the embedded PostgreSQL server (``pip install 'fanout-postgres[embedded]'``)."""
    return [EmbeddedService("postgres", "PostgreSQL", "FANOUT_PG_URL", start=embedded_server)]


def embedded_server(root: Path) -> AbstractContextManager[str]:
    """A throw-away server with its data under ``root/postgres`` (removed when it stops);
    entering it yields the URL of its ``demo`` database."""
    from fanout_postgres.embedded import EmbeddedPostgres

    return EmbeddedPostgres(root / "postgres", database="demo", delete=True)
