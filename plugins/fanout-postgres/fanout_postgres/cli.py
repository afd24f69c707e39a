"""``fanout migrate``: the command this plugin adds to ``fanout`` (through
:func:`fanout.hooks.specs.fanout_cli_commands`, see :mod:`fanout_postgres.plugin`)."""

from __future__ import annotations

import argparse

from fanout.errors import ConfigurationError, FanoutError
from fanout.hooks.commands import CliCommand
from fanout.observe.secrets import expand_env, redact
from fanout_postgres.migrate import DEFAULT_SCHEMA, INSTALL_HINT, upgrade


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--url`` (required) and ``--schema``."""
    parser.add_argument(
        "--url",
        required=True,
        help="SQLAlchemy URL of the database; the password may be ${ENV_VAR}",
    )
    parser.add_argument(
        "--schema",
        default=DEFAULT_SCHEMA,
        help=f"schema for fanout's tables (default {DEFAULT_SCHEMA})",
    )


def run(args: argparse.Namespace) -> int:
    """Apply fanout's PostgreSQL migrations (the tables fanout owns) to one database."""
    try:
        from sqlalchemy.engine import make_url
    except ImportError as exc:
        raise ConfigurationError(INSTALL_HINT) from exc
    try:
        url = make_url(args.url)
    except Exception as exc:
        raise ConfigurationError(f"--url is not a SQLAlchemy URL: {type(exc).__name__}") from None
    password = expand_env(url.password or "", what="fanout migrate --url (password)")
    url = url.set(password=password or None)
    shown = url.render_as_string(hide_password=True)
    try:
        result = upgrade(url, schema=args.schema)
    except FanoutError:
        raise
    except Exception as exc:
        message = redact(f"{type(exc).__name__}: {exc}", [password])
        raise FanoutError(f"migrating {shown} failed: {message}") from None
    if result.changed:
        print(
            f"{shown}: schema {result.schema!r} upgraded {result.before or '(empty)'} -> "
            f"{result.after}"
        )
    else:
        print(f"{shown}: schema {result.schema!r} already at {result.after} (nothing to do)")
    return 0


MIGRATE = CliCommand(
    name="migrate",
    help="create or upgrade the tables fanout owns in a PostgreSQL database",
    add_arguments=add_arguments,
    run=run,
)
"""The ``fanout migrate`` command."""
