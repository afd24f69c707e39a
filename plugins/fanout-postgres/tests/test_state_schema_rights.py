"""A role that may not keep fanout's state tables (option ``state_schema``) is refused at
``open()``, by ``fanout validate`` too, naming the role, the schema and the GRANT that lets
it; running that GRANT as printed is enough for the sink to open. Before, ``fanout
validate`` called such a sink valid and ``fanout run`` failed with PostgreSQL's
"permission denied for schema fanout" alone."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from fanout_postgres import PostgresSink
from pgcheck import execute
from sqlalchemy.engine import make_url

from fanout.contract.sink import SinkContext
from fanout.errors import ConfigurationError, SinkUnreachableError


def _role(pg_url: str) -> tuple[str, str]:
    """A new login role with no rights but the default ones, and the url logging in as it."""
    role = f"app_{uuid.uuid4().hex[:8]}"
    execute(pg_url, f"CREATE ROLE {role} LOGIN", "CREATE TABLE orders (id bigint PRIMARY KEY)")
    execute(pg_url, f"GRANT SELECT, INSERT, UPDATE, DELETE ON orders TO {role}")
    url = make_url(pg_url).set(username=role).render_as_string(hide_password=False)
    return role, url


def _open(url: str, *, checking: bool) -> None:
    sink = PostgresSink("pg", url=url, table="orders")
    try:
        sink.open(SinkContext("p", checking=checking))
    finally:
        sink.close()


def _refusal(url: str, *, checking: bool) -> str:
    with pytest.raises(ConfigurationError) as caught:
        _open(url, checking=checking)
    assert not isinstance(caught.value, SinkUnreachableError)
    return str(caught.value)


def _printed_statements(message: str) -> list[str]:
    """The statements in the message's "grant it (...)" or "create the schema for it (...)",
    run as printed."""
    found = re.search(r"\((GRANT [^)]*|CREATE SCHEMA [^)]*)\)", message)
    assert found is not None, message
    return [s.strip() for s in found.group(1).split(";")]


@pytest.mark.parametrize("checking", [True, False])
def test_a_state_schema_the_role_may_not_use_is_refused_with_the_grant(
    pg_url: str, checking: bool
) -> None:
    role, url = _role(pg_url)
    _open(pg_url, checking=False)  # the owner migrates: schema fanout, not granted
    message = _refusal(url, checking=checking)
    assert message == (
        f"postgres sink 'pg' (table orders): role '{role}' may not use schema 'fanout', "
        "which holds fanout's state tables (option state_schema); grant it (GRANT USAGE ON "
        f"SCHEMA fanout TO {role}; GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN "
        f"SCHEMA fanout TO {role}), or name a schema it owns in option state_schema"
    )
    execute(pg_url, *_printed_statements(message))
    _open(url, checking=checking)


@pytest.mark.parametrize("checking", [True, False])
def test_a_state_schema_the_role_may_not_create_is_refused_with_the_grant(
    pg_url: str, checking: bool
) -> None:
    role, url = _role(pg_url)
    database = make_url(pg_url).database
    message = _refusal(url, checking=checking)
    assert message == (
        f"postgres sink 'pg' (table orders): role '{role}' may not create schema 'fanout' for "
        f"fanout's state tables (option state_schema) in database '{database}'; grant it "
        f"(GRANT CREATE ON DATABASE {database} TO {role}), or create the schema for it "
        f"(CREATE SCHEMA fanout AUTHORIZATION {role})"
    )
    execute(pg_url, *_printed_statements(message))  # the GRANT, the first way printed
    _open(url, checking=checking)
    execute(
        pg_url,
        "DROP SCHEMA IF EXISTS fanout CASCADE",
        f"REVOKE CREATE ON DATABASE {database} FROM {role}",
    )
    execute(pg_url, _printed_statements(message.split("or create the schema")[1])[0])
    _open(url, checking=checking)  # the second way: the schema created for it


def test_fanout_migrate_says_which_grant_or_url_part_to_fix_and_exits_by_cause(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fanout migrate`` ended with a bare driver error on several lines, SQLAlchemy's
    "Background on this error" link included, and exit 1 for every cause: a refused login
    or a missing GRANT is a configuration error (exit 2) saying what to fix; a server out of
    reach stays exit 1, saying to check the host and port and run it again."""
    from fanout.app.cli import main

    role, url = _role(pg_url)
    _open(pg_url, checking=False)  # schema fanout, the owner's
    assert main(["migrate", "--url", url]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"fanout: configuration error: role '{role}' may not use schema 'fanout', which holds "
        "fanout's state tables (--schema); grant it (GRANT USAGE ON SCHEMA fanout TO "
        f"{role}; GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA fanout TO "
        f"{role}), or name a schema it owns in --schema\n"
    )
    execute(pg_url, *_printed_statements(err))
    assert main(["migrate", "--url", url]) == 0
    assert "already at" in capsys.readouterr().out

    stranger = make_url(url).set(username="no_such_role", password="s3cret-pw")
    assert main(["migrate", "--url", stranger.render_as_string(hide_password=False)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "fanout: configuration error: migrating postgresql+psycopg2://no_such_role:***@"
    )
    assert err.endswith(
        'FATAL:  role "no_such_role" does not exist; the server refused the connection: check '
        "the user, password and database in --url, and the server's pg_hba.conf\n"
    )
    assert "s3cret-pw" not in err and "Background on this error" not in err

    assert main(["migrate", "--url", "postgresql://app:s3cret-pw@127.0.0.1:1/shop"]) == 1
    assert capsys.readouterr().err == (
        "fanout: FanoutError: migrating postgresql+psycopg2://app:***@127.0.0.1:1/shop failed: "
        'OperationalError: (psycopg2.OperationalError) connection to server at "127.0.0.1", '
        "port 1 failed: Connection refused Is the server running on that host and accepting "
        "TCP/IP connections?; check the host and port in --url, and that the server runs and "
        "accepts connections from this machine, then run the command again\n"
    )


def _open_as(url: str, *, checking: bool, migrate: bool) -> None:
    sink = PostgresSink("pg", url=url, table="orders", migrate=migrate)
    try:
        sink.open(SinkContext("p", checking=checking))
    finally:
        sink.close()


@pytest.mark.parametrize("migrate", [True, False])
@pytest.mark.parametrize("checking", [True, False])
def test_state_tables_the_role_may_not_read_or_write_are_refused_with_the_grant(
    pg_url: str, checking: bool, migrate: bool
) -> None:
    """USAGE on the schema alone (the first half of the GRANT) let open() pass the check and
    fail on PostgreSQL's bare "permission denied for table alembic_version"; the tables
    without the rights are named, with the GRANT that lets the role use them."""
    role, url = _role(pg_url)
    _open(pg_url, checking=False)  # the owner migrates: schema fanout, not granted
    execute(pg_url, f"GRANT USAGE ON SCHEMA fanout TO {role}")
    with pytest.raises(ConfigurationError) as caught:
        _open_as(url, checking=checking, migrate=migrate)
    message = str(caught.value)
    assert message == (
        f"postgres sink 'pg' (table orders): role '{role}' may not read and write fanout's "
        "state tables fanout.alembic_version, fanout.progress, fanout.upsert_routes (option "
        f"state_schema); grant it (GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN "
        f"SCHEMA fanout TO {role}), or name a schema it owns in option state_schema"
    )
    execute(pg_url, *_printed_statements(message))
    _open_as(url, checking=checking, migrate=migrate)


def test_the_grants_the_readme_lists_for_migrate_false_are_enough(pg_url: str) -> None:
    """The README granted USAGE and the rights on fanout.progress and fanout.upsert_routes
    only: open() then failed reading fanout.alembic_version. Without SELECT there the table
    is named; with it (as the README now says) the sink opens; a role holding the rights
    through a group role it inherits from is not refused."""
    role, url = _role(pg_url)
    _open(pg_url, checking=False)
    execute(
        pg_url,
        f"GRANT USAGE ON SCHEMA fanout TO {role}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON fanout.progress, fanout.upsert_routes TO {role}",
    )
    with pytest.raises(ConfigurationError, match=r"state tables fanout\.alembic_version \("):
        _open_as(url, checking=False, migrate=False)
    execute(pg_url, f"GRANT SELECT ON fanout.alembic_version TO {role}")
    _open_as(url, checking=False, migrate=False)

    member = f"member_{uuid.uuid4().hex[:8]}"
    execute(pg_url, f"CREATE ROLE {member} LOGIN IN ROLE {role}")
    member_url = make_url(pg_url).set(username=member).render_as_string(hide_password=False)
    _open_as(member_url, checking=True, migrate=False)
    stranger = f"noinherit_{uuid.uuid4().hex[:8]}"  # a member that must SET ROLE first
    execute(pg_url, f"CREATE ROLE {stranger} LOGIN NOINHERIT IN ROLE {role}")
    stranger_url = make_url(pg_url).set(username=stranger).render_as_string(hide_password=False)
    with pytest.raises(ConfigurationError, match=f"role '{stranger}' may not use schema 'fanout'"):
        _open_as(stranger_url, checking=True, migrate=False)


@pytest.mark.parametrize("checking", [True, False])
def test_an_empty_state_schema_the_role_may_not_create_tables_in_is_refused_with_the_grant(
    pg_url: str, checking: bool
) -> None:
    """A schema made for the role by an administrator with USAGE only (or after the
    USAGE grant printed for a schema with no tables yet): open() passed the check, and the
    migration failed with PostgreSQL's bare "permission denied for schema fanout"."""
    role, url = _role(pg_url)
    execute(pg_url, "CREATE SCHEMA fanout", f"GRANT USAGE ON SCHEMA fanout TO {role}")
    message = _refusal(url, checking=checking)
    assert message == (
        f"postgres sink 'pg' (table orders): role '{role}' may not create fanout's state "
        "tables in schema 'fanout' (option state_schema), which holds none yet; grant it "
        f"(GRANT CREATE ON SCHEMA fanout TO {role}), or name a schema the role owns in "
        "option state_schema"
    )
    execute(pg_url, *_printed_statements(message))
    _open(url, checking=checking)


def test_quoted_role_and_schema_names_get_grants_that_run_as_printed(pg_url: str) -> None:
    """A role and a state schema whose names need quotes: each printed statement runs."""
    role = f"App Role-{uuid.uuid4().hex[:4]}"
    execute(pg_url, f'CREATE ROLE "{role}" LOGIN', "CREATE TABLE orders (id bigint PRIMARY KEY)")
    execute(pg_url, f'GRANT SELECT, INSERT, UPDATE, DELETE ON orders TO "{role}"')
    url = make_url(pg_url).set(username=role).render_as_string(hide_password=False)

    def attempt(as_url: str) -> None:
        sink = PostgresSink("pg", url=as_url, table="orders", state_schema="Fan Out")
        try:
            sink.open(SinkContext("p"))
        finally:
            sink.close()

    with pytest.raises(ConfigurationError) as caught:
        attempt(url)
    assert f'(CREATE SCHEMA "Fan Out" AUTHORIZATION "{role}")' in str(caught.value)
    attempt(pg_url)  # the owner makes "Fan Out" and its tables
    with pytest.raises(ConfigurationError) as caught:
        attempt(url)
    assert f'GRANT USAGE ON SCHEMA "Fan Out" TO "{role}";' in str(caught.value)
    execute(pg_url, *_printed_statements(str(caught.value)))
    attempt(url)


@pytest.mark.parametrize(
    ("checking", "migrate", "checked"),
    [(False, True, [True]), (True, True, [True]), (False, False, [False])],
)
def test_open_checks_the_state_schema_rights_once(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, checking: bool, migrate: bool, checked: list[bool]
) -> None:
    """With ``migrate`` on, open() ran the rights check (one query) and then upgrade() ran it
    again; open() now leaves it to upgrade(), which runs it in the transaction it migrates
    in. ``checked``: the ``creates`` of each check run, exactly."""
    import fanout_postgres.migrate as migrate_module
    import fanout_postgres.sink as sink_module

    real = migrate_module.state_schema_problem
    calls: list[bool] = []

    def counted(*args: Any, **kwargs: Any) -> str | None:
        calls.append(kwargs["creates"])
        return real(*args, **kwargs)

    monkeypatch.setattr(migrate_module, "state_schema_problem", counted)
    monkeypatch.setattr(sink_module, "state_schema_problem", counted)
    execute(pg_url, "CREATE TABLE orders (id bigint PRIMARY KEY)")
    if not migrate:
        _open(pg_url, checking=False)  # the tables at head, which migrate: false needs
        calls.clear()
    _open_as(pg_url, checking=checking, migrate=migrate)
    assert calls == checked


def test_fanout_migrate_asks_whether_the_login_was_refused_once(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fanout migrate`` decided twice whether the server refused the login (once for the
    exit code, once for the hint); once now, and both still follow from it."""
    from fanout_postgres import cli

    from fanout.app.cli import main

    real = cli._refused
    asked: list[Exception] = []

    def counted(exc: Exception) -> bool:
        asked.append(exc)
        return real(exc)

    monkeypatch.setattr(cli, "_refused", counted)
    stranger = make_url(pg_url).set(username="no_such_role", password="s3cret-pw")
    assert main(["migrate", "--url", stranger.render_as_string(hide_password=False)]) == 2
    assert capsys.readouterr().err.endswith(
        "the server refused the connection: check the user, password and database in --url, "
        "and the server's pg_hba.conf\n"
    )
    assert len(asked) == 1
