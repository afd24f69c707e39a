"""The postgres sink without a server: options, URLs and secrets, names, registration."""

from __future__ import annotations

import pickle

import pytest

from fanout.testing import RecordingSink

pytest.importorskip("fanout_postgres")

from fanout_postgres import PostgresSink
from fanout_postgres.identifiers import TableName, parse_table
from fanout_postgres.sqlstate import classify
from fanout_postgres.url import resolve_url, secrets_of

from fanout.contract.sink import SinkContext
from fanout.errors import ConfigurationError, TransientSinkError
from fanout.hooks.registry import load_registry

URL = "postgresql://app:${PG_PW}@db.example:5433/orders?sslmode=require"


def test_the_entry_point_provides_the_postgres_type() -> None:
    types = load_registry().sink_types()
    assert types["postgres"].sink_class is PostgresSink
    assert types["postgres"].plugin.distribution == "fanout-postgres"
    assert PostgresSink.guarantees == ("idempotent", "transactional")
    assert PostgresSink("a", mode="append").guarantee == "transactional"
    assert PostgresSink("a").guarantee == "idempotent"


def test_url_parts_are_expanded_after_parsing_so_the_password_needs_no_escaping() -> None:
    url = resolve_url(URL, sink="pg", environ={"PG_PW": "p@ss/w:rd %1"})
    assert (url.drivername, url.username, url.password) == (
        "postgresql+psycopg2",
        "app",
        "p@ss/w:rd %1",
    )
    assert (url.host, url.port, url.database, dict(url.query)) == (
        "db.example",
        5433,
        "orders",
        {"sslmode": "require"},
    )
    assert secrets_of(url) == ("p@ss/w:rd %1", "p%40ss%2Fw%3Ard%20%251", "p%40ss%2Fw%3Ard+%251")


def test_a_missing_variable_names_the_variable_not_a_value() -> None:
    with pytest.raises(ConfigurationError) as caught:
        resolve_url(URL, sink="pg", environ={})
    assert "'PG_PW'" in str(caught.value) and "sink 'pg' option 'url' (password)" in str(
        caught.value
    )


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://u@h/d", "uses driver 'mysql'"),
        ("postgresql+asyncpg://u@h/d", "COPY through psycopg2"),
        ("::nonsense", "not a SQLAlchemy URL"),
        (None, "option 'url' is required"),
    ],
)
def test_bad_urls_are_configuration_errors(url: str | None, message: str) -> None:
    with pytest.raises(ConfigurationError, match="postgres sink 'pg'") as caught:
        PostgresSink("pg", url=url, table="t").open(SinkContext("p"))
    assert message in str(caught.value)


def test_an_at_sign_not_escaped_in_the_password_is_named_not_unreachable() -> None:
    """``app:Sec@ret99@db`` (a newcomer's password with an '@') was cut by SQLAlchemy at
    the first '@' and ``ret99@db`` taken as the host: the sink then reported the target
    unreachable (exit 1, "check the host and port ..., run again once the server
    answers"), never saying to escape the '@'."""
    sink = PostgresSink("pg", url="postgresql://app:Sec@ret99@127.0.0.1:5499/d", table="t")
    with pytest.raises(ConfigurationError) as caught:
        sink.open(SinkContext("p"))
    assert type(caught.value) is ConfigurationError
    assert str(caught.value) == (
        "postgres sink 'pg': option 'url' holds an '@' not escaped before its host (in the "
        "password?): write '@' in the password as %40, or take the password from the "
        "environment (postgresql://user:${PGPASSWORD}@host/db: a password from ${VAR} needs "
        "no escaping)"
    )
    assert "ret99" not in repr(sink)


def test_an_at_sign_not_escaped_is_named_by_migrate_and_by_the_dead_letters(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The check above covered the sink's own ``url`` only: ``fanout migrate --url`` with
    such a password, and the sink's ``postgres:`` dead letters, tried the rest of the
    password as a host (``could not translate host name``: exit 1, as unreachable)."""
    from fanout_postgres.deadletter import PostgresDeadLetters

    from fanout.app.cli import main as cli_main

    url = "postgresql://app:Sec@ret99@127.0.0.1:5499/d"
    assert cli_main(["migrate", "--url", url]) == 2
    err = capsys.readouterr().err
    assert (
        "--url holds an '@' not escaped before its host (in the password?): write '@' in the "
        "password as %40, or take the password from the environment "
        "(postgresql://user:${PGPASSWORD}@host/db: a password from ${VAR} needs no escaping)"
    ) in err
    assert "ret99" not in err
    letters = PostgresDeadLetters(url, "pg", parse_table("errors"), "t")
    with pytest.raises(ConfigurationError) as caught:
        with letters._engine():
            pass
    assert str(caught.value) == (
        "postgres sink 'pg': dead letters (PostgreSQL table errors): option 'url' holds an "
        "'@' not escaped before its host (in the password?): write '@' in the password as "
        "%40, or take the password from the environment (postgresql://user:${PGPASSWORD}@"
        "host/db: a password from ${VAR} needs no escaping)"
    )
    from fanout_postgres.migrate import upgrade

    with pytest.raises(ConfigurationError, match=r"^the URL holds an '@' not escaped"):
        upgrade(url)


def test_repr_and_pickle_never_show_the_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PG_PW", "hunter2-secret")
    sink = PostgresSink("pg", url=URL, table="t")
    with pytest.raises(ConfigurationError) as caught:  # no server: fails after parsing
        sink.open(SinkContext("p"))
    assert "hunter2-secret" not in str(caught.value)
    assert "hunter2-secret" not in repr(sink)
    assert "***" in repr(sink)
    assert sink.secret_values()[0] == "hunter2-secret"
    clone = pickle.loads(pickle.dumps(sink))  # what the executors receive
    assert clone.connection_url().password == "hunter2-secret"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"table": None}, "option 'table' is required"),
        ({"table": "a.b.c"}, "more than two parts"),
        ({"table": "x" * 64}, "longer than 63 bytes"),
        ({"table": "t", "mode": "merge"}, "unknown mode 'merge'"),
        ({"table": "t", "mode": "append", "order_by": "v"}, "'order_by' only applies"),
        ({"table": "t", "partitions": True}, "'partitions' must be an integer"),
        ({"table": "t", "create_table": "yes"}, "'create_table' must be true or false"),
        ({"table": "t", "dead_letter": 5}, "option 'dead_letter' must be"),
        ({"table": "t", "keys": ["a\x00"]}, "contains a NUL character"),
        (
            {"table": "t", "state_schema": "fan.out"},
            "option 'state_schema' 'fan.out' contains a '.': Alembic and SQLAlchemy, which "
            "create and name fanout's tables, read it as <database>.<schema> (PostgreSQL "
            "then refuses a cross-database reference); choose a schema name without one",
        ),
        ({"table": "t", "connection_idle_s": -1}, "'connection_idle_s' must be a number"),
        ({"table": "t", "connection_idle_s": "60"}, "'connection_idle_s' must be a number"),
        ({"table": "t", "connection_idle_s": True}, "'connection_idle_s' must be a number"),
    ],
)
def test_option_errors_name_the_sink_and_the_option(options: dict, message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        PostgresSink("pg", url="postgresql://u@h/d", **options).open(SinkContext("p"))
    assert str(caught.value).startswith("postgres sink 'pg'")
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("orders", TableName("orders")),
        ("Orders", TableName("Orders")),
        ("sales.orders", TableName("orders", "sales")),
        ('"my.schema"."a""b"', TableName('a"b', "my.schema")),
        ('Orders "2026"; drop table x', TableName('Orders "2026"; drop table x')),
        (["s p", "t.x"], TableName("t.x", "s p")),
    ],
)
def test_table_names_are_taken_literally(text: str, expected: TableName) -> None:
    assert parse_table(text) == expected


def test_dead_letter_targets() -> None:
    from fanout_postgres.deadletter import PostgresDeadLetters
    from fanout_postgres.plugin import postgres_target

    sink = PostgresSink("pg", url="postgresql://u@h/d", table="t")
    target = postgres_target("ops.rejects", sink)
    assert isinstance(target, PostgresDeadLetters)
    assert (target.kind, target.table, target.target) == (
        "postgres",
        TableName("rejects", "ops"),
        "t",
    )
    assert postgres_target("rejects", sink).table == TableName("rejects")
    with pytest.raises(ConfigurationError, match="this sink has none"):
        postgres_target("rejects", RecordingSink("other"))


class _PgError(Exception):
    def __init__(self, code: str | None) -> None:
        self.pgcode = code


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("40001", "transient"),
        ("40P01", "transient"),
        ("08006", "transient"),
        ("57P01", "transient"),
        ("57014", "transient"),  # statement_timeout
        ("55P03", "transient"),  # lock_timeout
        ("22001", "data"),
        ("23505", "data"),
        ("42P01", "fatal"),
    ],
)
def test_error_classification(code: str, kind: str) -> None:
    assert classify(_PgError(code)) == kind
    assert PostgresSink("pg").is_transient(_PgError(code)) is (kind == "transient")


def test_connection_losses_retry_but_bad_passwords_do_not() -> None:
    import psycopg2

    sink = PostgresSink("pg")
    assert sink.is_transient(psycopg2.OperationalError("server closed the connection"))
    assert not sink.is_transient(psycopg2.OperationalError("password authentication failed"))
    assert sink.is_transient(TransientSinkError("x", sink="pg"))


def test_settings_given_as_a_string_are_named() -> None:
    """dict() raised a bare ValueError, naming neither the sink nor the option."""
    with pytest.raises(ConfigurationError) as caught:
        PostgresSink("pg", url="postgresql://h/db", table="t", settings="statement_timeout=5min")  # type: ignore[arg-type]
    assert str(caught.value) == (
        "postgres sink 'pg': option 'settings' must be a mapping of PostgreSQL settings "
        "({'statement_timeout': '5min'}), got str"
    )
