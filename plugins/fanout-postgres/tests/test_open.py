"""Validation at open(): every problem found before the stream starts, naming the sink,
the table and the column."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from fanout_postgres import PostgresSink
from pgcheck import execute, query
from pyspark.sql import types as T

from fanout.contract.batch import Batch, BatchInfo
from fanout.contract.sink import SinkContext
from fanout.errors import ConfigurationError

DDL = (
    "CREATE TABLE orders (id bigint PRIMARY KEY, code text NOT NULL, amount double precision, "
    "flag boolean, created timestamptz DEFAULT now())"
)
BATCH = T.StructType(
    [
        T.StructField("id", T.LongType()),
        T.StructField("code", T.StringType()),
        T.StructField("amount", T.DoubleType()),
    ]
)


def _open(url: str, **options: Any) -> PostgresSink:
    sink = PostgresSink("pg", url=url, **options)
    sink.open(SinkContext("open"))
    return sink


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"table": "missing"},
            "postgres sink 'pg' (table missing): the table does not exist; "
            "create it, or set create_table: true",
        ),
        (
            {"table": "orders", "keys": ["code"]},
            "keys code of table orders are not "
            "unique-constrained: INSERT ... ON CONFLICT "
            "(code) needs a primary key",
        ),
        (
            {"table": "orders", "keys": ["nope"]},
            "option 'keys' names nope, not columns of table orders",
        ),
        ({"table": "orders", "order_by": "nope"}, "option 'order_by' names 'nope', not a column"),
        ({"table": "orders", "columns": {"a": "b"}}, "option 'columns' names ['b'], not columns"),
        ({"table": "nokey"}, "table nokey has no primary key; set option 'keys'"),
        ({"table": "orders", "mode": "merge"}, "unknown mode 'merge'; valid modes: upsert, append"),
        ({"table": "orders", "partitions": 0}, "option 'partitions' must be an integer"),
        (
            {
                "table": "orders",
                "batch_schema": T.StructType([*BATCH.fields, T.StructField("flag", T.LongType())]),
            },
            "batch column 'flag' (bigint) cannot be written to column flag of table orders "
            "(BOOLEAN)",
        ),
        (
            {"table": "orders", "batch_schema": T.StructType(BATCH.fields[:1])},
            "table orders requires code (NOT NULL, no default) but the batch does not provide",
        ),
        (
            {
                "table": "orders",
                "batch_schema": T.StructType(
                    [*BATCH.fields, T.StructField("extra", T.StringType())]
                ),
            },
            "batch column 'extra' has no column extra in table orders",
        ),
    ],
)
def test_problems_are_configuration_errors_naming_sink_table_and_column(
    pg_url: str, options: dict[str, Any], message: str
) -> None:
    execute(pg_url, DDL, "CREATE TABLE nokey (id bigint)")
    with pytest.raises(ConfigurationError) as caught:
        _open(pg_url, **options)
    assert message in str(caught.value)
    assert str(caught.value).startswith("postgres sink 'pg'")


def test_a_unique_index_is_a_valid_conflict_target(pg_url: str) -> None:
    execute(
        pg_url,
        DDL,
        "CREATE UNIQUE INDEX orders_code ON orders (code)",
        "CREATE UNIQUE INDEX orders_partial ON orders (amount) WHERE flag",
    )
    _open(pg_url, table="orders", keys="code", batch_schema=BATCH)
    with pytest.raises(ConfigurationError, match="not unique-constrained"):
        _open(pg_url, table="orders", keys="amount")  # a partial index cannot arbitrate


def test_create_table_checks_the_batch_schema_at_open_and_creates_at_the_first_write(
    spark: Any, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``open()`` runs before the run's lost-target check, so it creates no table (a refused
    run would leave one for its retry to find): the first write does, as declared."""
    caplog.set_level(logging.DEBUG, logger="fanout_postgres")
    sink = _open(pg_url, table="made", keys=["id"], create_table=True, batch_schema=BATCH)
    assert query(pg_url, "SELECT to_regclass('made') IS NULL") == [(True,)]
    df = spark.createDataFrame([(1, "a", 1.5)], BATCH)
    assert sink.write(Batch(df, BatchInfo("open", 0, "q"), "pg", "fanout/open/pg")).rows == 1
    columns = query(
        pg_url,
        "SELECT column_name, data_type, is_nullable FROM "
        "information_schema.columns WHERE table_name = 'made' "
        "ORDER BY ordinal_position",
    )
    assert columns == [
        ("id", "bigint", "NO"),
        ("code", "text", "YES"),
        ("amount", "double precision", "YES"),
    ]
    pk = query(
        pg_url,
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON "
        "a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = 'made'::regclass AND i.indisprimary",
    )
    assert pk == [("id",)]
    assert query(pg_url, "SELECT id, code, amount FROM made") == [(1, "a", 1.5)]
    created = [  # routine news, logged at info
        (r.levelname, r.getMessage()) for r in caplog.records if "created table" in r.getMessage()
    ]
    assert created == [("INFO", "sink 'pg': created table made")]
    with pytest.raises(ConfigurationError, match="create_table needs option 'keys'"):
        _open(pg_url, table="other", create_table=True)


def test_a_setting_the_server_refuses_fails_open_naming_it(pg_url: str) -> None:
    execute(pg_url, "CREATE TABLE IF NOT EXISTS settings_probe (id bigint PRIMARY KEY)")
    with pytest.raises(ConfigurationError) as refused:
        _open(pg_url, table="settings_probe", settings={"work_mem": "8MB", "work_memm": "64MB"})
    assert str(refused.value).startswith(
        "postgres sink 'pg' (table settings_probe): option 'settings': the server "
        "refuses work_memm='64MB': "
    )
    assert str(refused.value).endswith(
        'UndefinedObject: unrecognized configuration parameter "work_memm"'
    )
    sink = _open(pg_url, table="settings_probe", settings={"work_mem": "8MB"})
    assert sink.settings == {"temp_buffers": "128MB", "work_mem": "8MB"}  # over the defaults


def test_synchronous_commit_off_is_refused_at_open(pg_url: str) -> None:
    execute(pg_url, "CREATE TABLE IF NOT EXISTS settings_probe (id bigint PRIMARY KEY)")
    with pytest.raises(ConfigurationError) as refused:
        _open(pg_url, table="settings_probe", settings={"synchronous_commit": "OFF"})
    assert str(refused.value) == (
        "postgres sink 'pg' (table settings_probe): option 'settings': "
        "synchronous_commit='OFF' lets a commit return before it is durable, so a server "
        "crash could lose rows the ledger records as written; leave it at the server's "
        "default (on)"
    )
    kept = _open(pg_url, table="settings_probe", settings={"synchronous_commit": "local"})
    assert kept.settings == {"temp_buffers": "128MB", "work_mem": "64MB",
                             "synchronous_commit": "local"}  # fmt: skip


def test_synchronous_commit_off_for_the_database_is_refused_at_open(pg_url: str) -> None:
    database = pg_url.rsplit("/", 1)[1].split("?")[0]
    execute(
        pg_url,
        "CREATE TABLE IF NOT EXISTS settings_probe (id bigint PRIMARY KEY)",
        f'ALTER DATABASE "{database}" SET synchronous_commit = off',
    )
    with pytest.raises(ConfigurationError) as refused:
        _open(pg_url, table="settings_probe")
    assert str(refused.value) == (
        "postgres sink 'pg' (table settings_probe): synchronous_commit is 'off' for the "
        "sink's connections (set for the server, the database or the role), which lets a "
        "commit return before it is durable, so a server crash could lose rows the ledger "
        "records as written; set it to on for the sink's database or role (ALTER "
        "DATABASE/ROLE ... SET synchronous_commit = on), or in option 'settings'"
    )
    kept = _open(pg_url, table="settings_probe", settings={"synchronous_commit": "on"})
    assert kept.settings == {"temp_buffers": "128MB", "work_mem": "64MB",
                             "synchronous_commit": "on"}  # fmt: skip


def test_a_write_connection_with_synchronous_commit_off_is_refused(pg_url: str) -> None:
    from fanout_postgres.connections import WorkerConnections

    execute(pg_url, "CREATE TABLE IF NOT EXISTS settings_probe (id bigint PRIMARY KEY)")
    sink = _open(pg_url, table="settings_probe")  # durable when it opened
    database = pg_url.rsplit("/", 1)[1].split("?")[0]
    execute(pg_url, f'ALTER DATABASE "{database}" SET synchronous_commit = off')
    with pytest.raises(Exception, match="^synchronous_commit is 'off' for the sink's"):
        WorkerConnections().take(sink.connection_url(), (), "probe", 0)
    settings = (("synchronous_commit", "on"),)
    WorkerConnections().take(sink.connection_url(), settings, "probe", 0).close()


def test_a_table_with_insert_or_update_rules_is_refused_at_open(pg_url: str) -> None:
    execute(
        pg_url,
        "CREATE TABLE audit (id bigint)",
        "CREATE TABLE ev (id bigint PRIMARY KEY, qty bigint)",
        "CREATE RULE ev_audit AS ON INSERT TO ev DO ALSO INSERT INTO audit VALUES (NEW.id)",
        'CREATE RULE "Ev keep" AS ON UPDATE TO ev DO ALSO NOTHING',
        "CREATE RULE ev_gone AS ON DELETE TO ev DO ALSO NOTHING",
    )
    for mode in ("upsert", "append"):
        with pytest.raises(ConfigurationError) as refused:
            _open(pg_url, table="ev", mode=mode)
        assert str(refused.value) == (
            "postgres sink 'pg' (table ev): the table has rule(s) \"Ev keep\" (ON UPDATE), "
            "ev_audit (ON INSERT): the sink writes with COPY, which fires no rule, and falls "
            "back to INSERT, which does, so whether a rule ran would depend on the rows; "
            "replace the rule(s) with a trigger, which COPY fires too"
        )
    execute(pg_url, "DROP RULE ev_audit ON ev", 'DROP RULE "Ev keep" ON ev')
    _open(pg_url, table="ev")  # an ON DELETE rule: the sink deletes nothing


def test_a_database_or_role_that_does_not_exist_is_a_configuration_error_not_unreachable(
    pg_server: Any, tmp_path: Any
) -> None:
    """The server refusing the url's database or role was taken for a server out of reach
    (transient): a lag sink started behind and retried for ever instead of failing at
    FanOut(...), and nothing said to check the url."""
    from sqlalchemy.engine import make_url

    from fanout import FanOut
    from fanout.errors import SinkUnreachableError
    from fanout.ledger.memory import MemoryLedger

    no_db = pg_server.url_for("no_such_db")
    no_role = make_url(pg_server.url_for("postgres")).set(username="no_such_role")
    hint = (
        "; the server refused the connection: check the user, password and database in "
        "option 'url' (a password from ${VAR} is read from the environment), and the "
        "server's pg_hba.conf"
    )
    for url, refusal in [
        (no_db, 'FATAL:  database "no_such_db" does not exist'),
        (
            no_role.render_as_string(hide_password=False),
            'FATAL:  role "no_such_role" does not exist',
        ),
    ]:
        with pytest.raises(ConfigurationError) as caught:
            _open(url, table="orders")
        assert not isinstance(caught.value, SinkUnreachableError)
        message = str(caught.value)
        assert message.startswith(
            "postgres sink 'pg' (table orders): cannot open: OperationalError: "
            "(psycopg2.OperationalError) connection to server on socket "
        )
        assert message.endswith(f"failed: {refusal}{hint}")
    lagging = {"type": "postgres", "name": "pg", "url": no_db, "table": "orders",
               "on_failure": "lag"}  # fmt: skip
    with pytest.raises(ConfigurationError) as built:
        FanOut("p", MemoryLedger(), [lagging], spool=str(tmp_path / "spool"))
    assert not isinstance(built.value, SinkUnreachableError)
    assert str(built.value).endswith(f'failed: FATAL:  database "no_such_db" does not exist{hint}')


def test_a_server_out_of_reach_is_named_on_one_line_with_what_to_check() -> None:
    from fanout.errors import SinkUnreachableError

    with pytest.raises(SinkUnreachableError) as caught:
        _open("postgresql+psycopg2://app:s3cret-pw@127.0.0.1:1/shop", table="orders")
    assert str(caught.value) == (
        "sink 'pg': cannot open: OperationalError: (psycopg2.OperationalError) connection to "
        'server at "127.0.0.1", port 1 failed: Connection refused Is the server running on '
        "that host and accepting TCP/IP connections?; check the host and port in option "
        "'url', and that the server runs and accepts connections from this machine"
    )


def test_settings_written_as_numbers_and_booleans_are_taken(pg_url: str, tmp_path: Any) -> None:
    """A pipeline file's ``settings = { statement_timeout = 5000, jit = false }`` (TOML
    numbers and booleans, as in postgresql.conf): the sink gives every value to
    ``set_config`` as text, so they worked; the option type check must not refuse them."""
    from fanout.app.runner import _installed_sinks, load_pipeline

    execute(pg_url, "CREATE TABLE IF NOT EXISTS settings_probe (id bigint PRIMARY KEY)")
    file = tmp_path / "p.toml"
    file.write_text(
        f'[pipeline]\nname = "p"\nledger = "{tmp_path}/l"\ncheckpoint = "{tmp_path}/c"\n'
        '[source]\nformat = "rate"\n[[sinks]]\ntype = "postgres"\nname = "pg"\n'
        f'url = "{pg_url}"\ntable = "settings_probe"\n'
        "settings = { statement_timeout = 5000, jit = false }\n"
    )
    config = load_pipeline(str(file))
    assert config.sinks[0]["settings"] == {"statement_timeout": 5000, "jit": False}
    registry = _installed_sinks()
    sink = registry.build_sink(config.sinks[0], registry.sink_types())
    assert isinstance(sink, PostgresSink)
    sink.open(SinkContext("open"))
    assert sink.settings == {
        "temp_buffers": "128MB", "work_mem": "64MB", "statement_timeout": 5000, "jit": False,
    }  # fmt: skip


def test_a_sqlalchemy_url_object_is_taken_in_a_fanout_dict(pg_url: str) -> None:
    """``resolve_url`` takes a SQLAlchemy ``URL``, but the option type check refused one
    in a FanOut dict (``url`` was annotated ``str | None``). ``URL`` is imported for type
    checkers only: the check cannot resolve it and leaves ``url`` unchecked, the other
    options still checked."""
    from sqlalchemy.engine import make_url

    from fanout import FanOut
    from fanout.contract.options import option_types
    from fanout.ledger.memory import MemoryLedger

    execute(pg_url, "CREATE TABLE IF NOT EXISTS url_probe (id bigint PRIMARY KEY)")
    url = make_url(pg_url)
    fan = FanOut("p", MemoryLedger(), [{"type": "postgres", "name": "pg", "url": url,
                                         "table": "url_probe"}])  # fmt: skip
    sink = fan.specs["pg"].sink
    assert isinstance(sink, PostgresSink)
    assert sink.url is url
    assert sink.connection_url().render_as_string(hide_password=False) == url.set(
        drivername="postgresql+psycopg2"
    ).render_as_string(hide_password=False)
    types = option_types(PostgresSink)
    assert (types["url"], types["table"]) == (Any, str | Sequence[str] | None)
    with pytest.raises(ConfigurationError) as refused:
        FanOut("p", MemoryLedger(), [{"type": "postgres", "name": "pg", "url": url,
                                      "table": 5}])  # fmt: skip
    assert "option 'table': expected str or a list of str or none, got 5 (int)" in str(
        refused.value
    )


def test_create_table_refused_at_open_when_the_table_could_not_be_created(pg_url: str) -> None:
    """``open()`` creates no table (the first write does), but still fails when it could
    not: a role without CREATE on the schema, a schema that does not exist."""
    _open(pg_url, table="made", keys=["id"], create_table=True)  # migrates fanout's schema
    role = f"nocreate_{uuid.uuid4().hex[:6]}"
    execute(pg_url, f"CREATE ROLE {role} LOGIN", f"GRANT USAGE ON SCHEMA fanout TO {role}",
            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA fanout "
            f"TO {role}")  # fmt: skip
    as_role = pg_url.replace("://postgres@", f"://{role}@", 1)
    with pytest.raises(ConfigurationError) as refused:
        _open(as_role, table="made", keys=["id"], create_table=True, migrate=False,
              batch_schema=BATCH)  # fmt: skip
    assert str(refused.value) == (
        f"postgres sink 'pg' (table made): create_table: role {role!r} may not create tables "
        f"in schema 'public', so table made cannot be created at the first batch; grant it "
        f"(GRANT CREATE ON SCHEMA public TO {role}), or create the table"
    )
    with pytest.raises(ConfigurationError) as missing:
        _open(pg_url, table="nosuch.made", keys=["id"], create_table=True, batch_schema=BATCH)
    assert str(missing.value) == (
        "postgres sink 'pg' (table nosuch.made): create_table: schema 'nosuch' does not "
        "exist, so table nosuch.made cannot be created at the first batch; create the "
        "schema, or the table"
    )
    assert query(pg_url, "SELECT to_regclass('made') IS NULL") == [(True,)]
