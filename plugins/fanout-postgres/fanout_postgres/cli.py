"""``fanout migrate``: the command this plugin adds to ``fanout`` (through
:func:`fanout.hooks.specs.fanout_cli_commands`, see :mod:`fanout_postgres.plugin`)."""

from __future__ import annotations

import argparse

from fanout.errors import ConfigurationError, FanoutError
from fanout.hooks.commands import CliCommand
from fanout.observe.logs import register_secrets
from fanout.observe.secrets import redact
from fanout_postgres import url as pgurl
from fanout_postgres.migrate import DEFAULT_SCHEMA, INSTALL_HINT, upgrade


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--url`` (required) and ``--schema``."""
    parser.add_argument(
        "--url",
        required=True,
        help="SQLAlchemy URL of the database; any part may be ${ENV_VAR}, or the whole URL",
    )
    parser.add_argument(
        "--schema",
        default=DEFAULT_SCHEMA,
        help=f"schema for fanout's tables (default {DEFAULT_SCHEMA})",
    )


def run(args: argparse.Namespace) -> int:
    """Apply fanout's PostgreSQL migrations (the tables fanout owns) to one database."""
    try:
        import sqlalchemy  # noqa: F401
    except ImportError as exc:
        raise ConfigurationError(INSTALL_HINT) from exc
    try:  # as the sink reads its url: ${VAR} in any part, or the whole URL
        url = pgurl.resolve_url(args.url, sink=None, named="--url")
        pgurl.refuse_at_in_host(url, "--url")
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    secrets = pgurl.secrets_of(url)
    register_secrets(secrets)  # the CLI's stderr masks them too
    shown = pgurl.display(url)
    try:
        result = upgrade(url, schema=args.schema, named="--schema")
    except FanoutError:
        raise
    except Exception as exc:
        refused = _refused(exc)
        said = f"migrating {shown} failed: {_said(exc, secrets, refused=refused)}"
        if refused:  # the url is wrong, not the server down: exit 2
            raise ConfigurationError(said) from None
        raise FanoutError(said) from None
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


def _said(exc: Exception, secrets: tuple[str, ...], *, refused: bool) -> str:
    """The driver's error on one line, without SQLAlchemy's "Background on this error"
    link, and what to check when the server could not be reached or (``refused``, see
    :func:`_refused`) refused the login."""
    from fanout_postgres.sqlstate import classify

    text = f"{type(exc).__name__}: {exc}".split("\n(Background on this error")[0]
    said = redact(" ".join(line.strip() for line in text.splitlines() if line.strip()), secrets)
    cause = getattr(exc, "orig", None) or exc
    if refused:
        return (
            f"{said}; the server refused the connection: check the user, password and "
            "database in --url, and the server's pg_hba.conf"
        )
    if classify(cause) == "transient":
        return (
            f"{said}; check the host and port in --url, and that the server runs and "
            "accepts connections from this machine, then run the command again"
        )
    return said


def _refused(exc: Exception) -> bool:
    """The server answered and refused the login (a role, a database, a password)."""
    from fanout_postgres.sqlstate import refused_login

    cause = getattr(exc, "orig", None) or exc
    return refused_login(cause) and getattr(cause, "pgcode", None) is None
