"""fanout's own PostgreSQL tables: Alembic migrations, idempotent and race-free."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fanout_postgres import PostgresSink
from fanout_postgres.migrate import head_revision, head_table, lock_key, upgrade
from pgcheck import dsn, execute, query
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from fanout.app.cli import main as cli_main
from fanout.contract.sink import SinkContext
from fanout.errors import ConfigurationError

PROGRESS_COLUMNS = [
    ("pipeline", "text", "NO"),
    ("sink", "text", "NO"),
    ("batch_id", "bigint", "NO"),
    ("partition", "integer", "NO"),
    ("partitions", "integer", "NO"),
    ("query_id", "text", "YES"),
    ("target", "text", "NO"),
    ("rows", "bigint", "NO"),
    ("rejects", "jsonb", "YES"),
    ("committed_at", "timestamp with time zone", "NO"),
    ("fingerprint", "text", "YES"),
    ("input_rows", "bigint", "YES"),
    ("input_checksum", "bigint", "YES"),
    ("route", "text", "YES"),
    ("target_oid", "bigint", "YES"),
]


def _state(url: str, schema: str = "fanout") -> dict[str, Any]:
    return {
        "tables": query(
            url,
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s ORDER BY 1",
            (schema,),
        ),
        "versions": query(url, f'SELECT version_num FROM "{schema}".alembic_version'),
        "columns": query(
            url,
            "SELECT column_name, data_type, is_nullable FROM "
            "information_schema.columns WHERE table_schema = %s AND "
            "table_name = 'progress' ORDER BY ordinal_position",
            (schema,),
        ),
        "public": query(
            url, "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        ),
    }


def test_upgrade_of_a_fresh_database_then_again_is_a_no_op(pg_url: str) -> None:
    assert query(pg_url, "SELECT nspname FROM pg_namespace WHERE nspname = 'fanout'") == []
    first = upgrade(pg_url)
    assert (first.before, first.after, first.changed) == (None, head_revision(), True)
    state = _state(pg_url)
    assert state == {
        "tables": [("alembic_version",), ("progress",), ("upsert_routes",)],
        "versions": [(head_revision(),)],
        "columns": PROGRESS_COLUMNS,
        "public": [],  # nothing of fanout's outside its schema
    }
    oid = query(pg_url, "SELECT 'fanout.progress'::regclass::oid")
    second = upgrade(pg_url)
    assert (second.before, second.after, second.changed) == (head_revision(),) * 2 + (False,)
    assert _state(pg_url) == state
    assert query(pg_url, "SELECT 'fanout.progress'::regclass::oid") == oid  # not recreated


def test_a_schema_name_with_a_dot_is_refused_before_anything_runs(pg_url: str) -> None:
    """Alembic read ``fan.out`` as database ``fan``, schema ``out``: PostgreSQL refused the
    migration with "cross-database references are not implemented"."""
    with pytest.raises(ConfigurationError) as caught:
        upgrade(pg_url, schema="fan.out")

    assert str(caught.value) == (
        "the schema for fanout's tables 'fan.out' contains a '.': Alembic and SQLAlchemy, "
        "which create and name fanout's tables, read it as <database>.<schema> (PostgreSQL "
        "then refuses a cross-database reference); choose a schema name without one"
    )
    assert query(pg_url, "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'fan%'") == [(0,)]


def test_the_cli_migrates_and_says_so(pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["migrate", "--url", pg_url, "--schema", "ops"]) == 0
    assert cli_main(["migrate", "--url", pg_url, "--schema", "ops"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith(f"schema 'ops' upgraded (empty) -> {head_revision()}")
    assert out[1].endswith(f"schema 'ops' already at {head_revision()} (nothing to do)")
    assert _state(pg_url, "ops")["versions"] == [(head_revision(),)]
    assert cli_main(["migrate", "--url", "not a url"]) == 2


def test_the_cli_reads_its_url_as_the_sink_does(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fanout_postgres.url import display
    from sqlalchemy.engine import make_url

    url = make_url(pg_url)
    monkeypatch.setenv("MIG_USER", str(url.username))
    monkeypatch.setenv("MIG_DB", str(url.database))
    parts = pg_url.replace(f"//{url.username}@", "//${MIG_USER}@", 1).replace(
        f"/{url.database}", "/${MIG_DB}", 1
    )
    assert "${MIG_USER}@" in parts and "/${MIG_DB}" in parts
    assert cli_main(["migrate", "--url", parts, "--schema", "by_parts"]) == 0
    monkeypatch.setenv("MIG_URL", pg_url)
    assert cli_main(["migrate", "--url", "${MIG_URL}", "--schema", "by_whole"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"{display(url)}: schema 'by_parts' upgraded (empty) -> {head_revision()}",
        f"{display(url)}: schema 'by_whole' upgraded (empty) -> {head_revision()}",
    ]
    assert _state(pg_url, "by_parts")["versions"] == [(head_revision(),)]
    assert _state(pg_url, "by_whole")["versions"] == [(head_revision(),)]


def test_two_processes_upgrading_at_once_do_not_race(pg_url: str) -> None:
    import psycopg2

    holder = psycopg2.connect(dsn(pg_url))  # hold the migration lock: both must queue on it
    holder.autocommit = True
    with holder.cursor() as cur:
        cur.execute("SELECT pg_advisory_lock(%s, %s)", lock_key("fanout"))
    code = "import sys; from fanout_postgres.migrate import upgrade; print(upgrade(sys.argv[1]))"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, pg_url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    classid, objid = lock_key("fanout")
    deadline = time.monotonic() + 60
    waiting: list[Any] = []
    while time.monotonic() < deadline:
        waiting = query(
            pg_url,
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND "
            "NOT granted AND classid = %s AND objid = %s",
            (classid, objid & 0xFFFFFFFF),
        )
        if len(waiting) == 2:
            break
        time.sleep(0.1)
    assert len(waiting) == 2, "both upgrades should be waiting on the migration lock"
    with holder.cursor() as cur:
        cur.execute("SELECT pg_advisory_unlock(%s, %s)", lock_key("fanout"))
    holder.close()
    results = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    outputs = sorted(out.strip() for out, _ in results)
    head = head_revision()
    assert outputs == [
        f"MigrationResult(schema='fanout', before='{head}', after='{head}')",
        f"MigrationResult(schema='fanout', before=None, after='{head}')",
    ]
    assert _state(pg_url)["versions"] == [(head,)]


def test_two_threads_upgrading_and_replaying_at_once_do_not_race(pg_url: str) -> None:
    """Two PostgreSQL sinks of one pipeline open (``upgrade``) and plan their first batch
    (``head_table``) in parallel threads; Alembic's ``op`` is one proxy per process (found
    by the executor-kill chaos test: ``'NoneType' object has no attribute 'get_context'``)."""
    import threading

    from fanout_postgres import migrate

    errors: list[str] = []

    def replay(n: int) -> None:
        try:
            for i in range(10):
                tables = migrate._head_tables.__wrapped__(f"s{n}_{i}")  # type: ignore[attr-defined]
                assert "progress" in tables
        except Exception as exc:
            errors.append(f"replay: {type(exc).__name__}: {exc}")

    def migrate_to(schema: str) -> None:
        try:
            upgrade(pg_url, schema=schema)
        except Exception as exc:
            errors.append(f"upgrade: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=replay, args=(n,)) for n in range(3)]
    threads += [threading.Thread(target=migrate_to, args=(s,)) for s in ("t1", "t2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert _state(pg_url, "t1")["versions"] == [(head_revision(),)]


def test_the_sink_migrates_at_open_unless_told_not_to(pg_url: str) -> None:
    engine = create_engine(pg_url, poolclass=NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE events (id bigint)")
    engine.dispose()
    unmigrated = PostgresSink("pg", url=pg_url, table="events", mode="append", migrate=False)
    with pytest.raises(ConfigurationError, match="run `fanout migrate --url"):
        unmigrated.open(SinkContext("m"))
    assert query(pg_url, "SELECT nspname FROM pg_namespace WHERE nspname = 'fanout'") == []
    PostgresSink("pg", url=pg_url, table="events", mode="append").open(SinkContext("m"))
    assert _state(pg_url)["versions"] == [(head_revision(),)]
    unmigrated.open(SinkContext("m"))  # now at head: fine


def test_the_tables_the_sink_uses_are_the_migrations_at_head(pg_url: str) -> None:
    """One definition of the progress table: the sink's statements use the table the
    revisions build (replayed offline), which is what they create in a real database."""
    from sqlalchemy.dialects import postgresql

    upgrade(pg_url, schema="ops")
    table = head_table("progress", "ops")
    assert table.schema == "ops"
    dialect = postgresql.dialect()
    replayed = [
        (c.name, c.type.compile(dialect=dialect).lower(), "YES" if c.nullable else "NO")
        for c in table.columns
    ]
    assert replayed == _state(pg_url, "ops")["columns"] == PROGRESS_COLUMNS
    assert [c.name for c in table.primary_key] == ["pipeline", "sink", "batch_id", "partition"]


def test_marks_of_an_older_progress_table_are_kept_without_a_route(pg_url: str) -> None:
    """Upgrading a progress table of revision 0002 in place adds ``route``; the marks it
    held are kept, of an unknown route, which a replay under any route does not refuse."""
    from types import SimpleNamespace

    from fanout_postgres.membership import committed_partitions, target_oids

    from fanout.partitioned.replay_route import check_routes, recorded_routes
    from fanout.routes.route import Route

    upgrade(pg_url, schema="old", revision="0002_progress_plan")
    engine = create_engine(pg_url, poolclass=NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO old.progress (pipeline, sink, batch_id, partition, partitions, target, "
            "rows) VALUES ('p', 'pg', 7, 1, 2, 'events', 5)"
        )
    upgrade(pg_url, schema="old")
    with engine.connect() as conn:
        marks = committed_partitions(conn, "old", "p", "pg", 7)
        oids = target_oids(conn, "old", "append", "p", "pg", 7)
    engine.dispose()
    assert oids == {1: None}  # of an unknown table too: not compared
    assert _state(pg_url, "old")["columns"] == PROGRESS_COLUMNS
    assert [(m.partition, m.partitions, m.route) for m in marks] == [(1, 2, None)]
    batch = SimpleNamespace(route=Route(where="id > 1").stamp(), sink_name="pg", batch_id=7)
    check_routes(recorded_routes(marks), batch, sink="pg")  # type: ignore[arg-type]


def _columns(url: str, schema: str, table: str) -> list[str]:
    return [
        name
        for (name,) in query(
            url,
            "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
            "AND table_name = %s ORDER BY ordinal_position",
            (schema, table),
        )
    ]


def test_target_oid_downgrades_keeping_the_marks_and_upgrades_again(pg_url: str) -> None:
    """Revision 0006 down to 0005 drops ``target_oid`` from both tables and keeps their
    rows; upgrading again adds it back, empty (those marks are then not compared)."""
    from alembic import command
    from fanout_postgres.migrate import ALEMBIC_LOCK, _alembic_config

    upgrade(pg_url, schema="dn")
    engine = create_engine(pg_url, poolclass=NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO dn.progress (pipeline, sink, batch_id, partition, partitions, target, "
            "rows, target_oid) VALUES ('p', 'pg', 7, 1, 2, 'events', 5, 16384)"
        )
        conn.exec_driver_sql(
            "INSERT INTO dn.upsert_routes (pipeline, sink, batch_id, partition, route, "
            "partitions, target_oid) VALUES ('p', 'up', 3, 0, NULL, 1, 16385)"
        )
    with engine.connect() as conn, conn.begin(), ALEMBIC_LOCK:
        command.downgrade(_alembic_config("dn", conn), "0005_upsert_routes_partitions")
    engine.dispose()
    assert query(pg_url, "SELECT version_num FROM dn.alembic_version") == [
        ("0005_upsert_routes_partitions",)
    ]
    assert "target_oid" not in _columns(pg_url, "dn", "progress")
    assert "target_oid" not in _columns(pg_url, "dn", "upsert_routes")
    kept = "SELECT pipeline, sink, batch_id, partition, partitions, target, rows FROM dn.progress"
    assert query(pg_url, kept) == [("p", "pg", 7, 1, 2, "events", 5)]
    assert query(
        pg_url, "SELECT pipeline, sink, batch_id, partition, partitions FROM dn.upsert_routes"
    ) == [("p", "up", 3, 0, 1)]

    again = upgrade(pg_url, schema="dn")
    assert (again.before, again.after) == ("0005_upsert_routes_partitions", head_revision())
    assert _state(pg_url, "dn")["columns"] == PROGRESS_COLUMNS
    assert query(pg_url, "SELECT batch_id, target_oid FROM dn.progress") == [(7, None)]
    assert query(pg_url, "SELECT batch_id, target_oid FROM dn.upsert_routes") == [(3, None)]


UPSERT_ROUTES_COLUMNS = [
    "pipeline", "sink", "batch_id", "partition", "route", "committed_at", "partitions",
    "target_oid", "refused", "kept_in", "target",
]  # fmt: skip


def test_upsert_routes_of_0006_keep_their_rows_uncounted_and_read_cautiously(
    pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Upgrading ``upsert_routes`` of revision 0006 in place adds ``refused`` and
    ``kept_in`` (0007); the rows it held are kept, their refused rows uncounted. A batch
    they say every partition committed is then held whole without a dead-letter target,
    or when the target holds refused rows of the batch; with a target holding none,
    ``holds_batch`` cannot tell (``None``, logged): no lost mark, no refusal of a reset."""
    from fanout_postgres.membership import UpsertRecord, upsert_records

    from fanout.contract.dead_letters import DeadLetter
    from fanout.deadletters.delta import DeltaDeadLetters
    from fanout.testing import make_batch, open_sink

    upgrade(pg_url, schema="up6", revision="0006_target_oid")
    engine = create_engine(pg_url, poolclass=NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE up6_events (id bigint PRIMARY KEY, v text)")
        for batch_id, partition in ((3, 0), (3, 1), (4, 0), (4, 1)):
            conn.exec_driver_sql(
                "INSERT INTO up6.upsert_routes (pipeline, sink, batch_id, partition, route, "
                f"partitions) VALUES ('p', 'up', {batch_id}, {partition}, 'r', 2)"
            )
    migrated = upgrade(pg_url, schema="up6")
    assert (migrated.before, migrated.after) == ("0006_target_oid", head_revision())
    assert _columns(pg_url, "up6", "upsert_routes") == UPSERT_ROUTES_COLUMNS
    with engine.connect() as conn:
        records = upsert_records(conn, "up6", "p", "up", 3)
    engine.dispose()
    assert records == {0: UpsertRecord(2, None, None), 1: UpsertRecord(2, None, None)}
    assert query(pg_url, "SELECT batch_id, partition, route FROM up6.upsert_routes ORDER BY 1, 2"
                 ) == [(3, 0, "r"), (3, 1, "r"), (4, 0, "r"), (4, 1, "r")]  # fmt: skip

    def sink(**dead: str) -> PostgresSink:
        made = PostgresSink("up", url=pg_url, table="up6_events", mode="upsert", keys=["id"],
                            partitions=2, state_schema="up6", **dead)  # fmt: skip
        return open_sink(made, "p")

    bare = sink()
    try:
        assert bare.holds_batch("p", 0, 3) is True  # no target: nothing waits for one
    finally:
        bare.close()
    dead = tmp_path / "dead"
    DeltaDeadLetters(str(dead)).write(
        make_batch([{"id": 1}], batch_id=4, pipeline="p", sink_name="up"),
        [DeadLetter({"id": 1}, "refused")],
        source="refused",
    )
    delta = sink(dead_letter=str(dead))
    try:
        with caplog.at_level("WARNING", logger="fanout_postgres"):
            assert delta.holds_batch("p", 0, 3) is None
            assert delta.holds_batch("p", 0, 4) is True  # its letters are there
    finally:
        delta.close()
    in_table = sink(dead_letter="postgres:up6_rejects")  # created by open()
    execute(
        pg_url,
        "INSERT INTO up6_rejects (pipeline, sink, batch_id, partition, target, reason, row) "
        """VALUES ('p', 'up', 4, 1, 'up6_events', 'refused', '{"id": 1}')""",
    )
    try:
        with caplog.at_level("WARNING", logger="fanout_postgres"):
            assert in_table.holds_batch("p", 0, 3) is None
            assert in_table.holds_batch("p", 0, 4) is True  # written in its transactions
    finally:
        in_table.close()
    said = [r.getMessage() for r in caplog.records if "older fanout" in r.getMessage()]
    assert said == [
        "sink 'up', batch 3: its upsert_routes rows of epoch 0 were written by an older "
        f"fanout, which counted no refused row, and {where} holds none of the batch: "
        "cannot tell whether it refused none or the driver never wrote them there"
        for where in (f"Delta table {dead}", "PostgreSQL table up6_rejects")
    ]


def test_upsert_routes_refused_downgrades_keeping_the_rows_and_upgrades_again(
    pg_url: str,
) -> None:
    """Revision 0007 down to 0006 drops ``refused`` and ``kept_in`` (and 0008's ``target``)
    and keeps the rows; upgrading again adds them back, empty (those rows then read as an
    older fanout's)."""
    from alembic import command
    from fanout_postgres.migrate import ALEMBIC_LOCK, _alembic_config

    upgrade(pg_url, schema="dn7")
    engine = create_engine(pg_url, poolclass=NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO dn7.upsert_routes (pipeline, sink, batch_id, partition, route, "
            "partitions, refused, kept_in) VALUES ('p', 'up', 3, 0, 'r', 2, 4, 'rejects'), "
            "('p', 'up', 3, 1, 'r', 2, 0, NULL)"
        )
    with engine.connect() as conn, conn.begin(), ALEMBIC_LOCK:
        command.downgrade(_alembic_config("dn7", conn), "0006_target_oid")
    engine.dispose()
    assert query(pg_url, "SELECT version_num FROM dn7.alembic_version") == [("0006_target_oid",)]
    assert _columns(pg_url, "dn7", "upsert_routes") == UPSERT_ROUTES_COLUMNS[:-3]
    rows = "SELECT batch_id, partition, route, partitions FROM dn7.upsert_routes ORDER BY 2"
    assert query(pg_url, rows) == [(3, 0, "r", 2), (3, 1, "r", 2)]

    again = upgrade(pg_url, schema="dn7")
    assert (again.before, again.after) == ("0006_target_oid", head_revision())
    assert _columns(pg_url, "dn7", "upsert_routes") == UPSERT_ROUTES_COLUMNS
    assert query(
        pg_url, "SELECT partition, refused, kept_in FROM dn7.upsert_routes ORDER BY 1"
    ) == [(0, None, None), (1, None, None)]


def test_tables_a_newer_fanout_migrated_say_to_upgrade_the_plugin(pg_url: str) -> None:
    """A database migrated by a newer fanout-postgres (a revision this one does not ship):
    ``migrate: true`` failed with Alembic's "Can't locate revision", and ``migrate: false``
    said to run `fanout migrate`, which cannot help. Both now say to upgrade the plugin."""
    upgrade(pg_url)
    execute(pg_url, "UPDATE fanout.alembic_version SET version_num = '0099_from_the_future'")
    said = (
        "fanout's tables in schema 'fanout' are at revision 0099_from_the_future, which this "
        f"fanout-postgres does not know (its newest is {head_revision()}): a newer fanout "
        "migrated them. Upgrade fanout-postgres to the version that did (`pip install -U "
        "fanout-postgres`); migrating again cannot help, and fanout never migrates down"
    )
    with pytest.raises(ConfigurationError) as migrating:
        upgrade(pg_url)
    assert str(migrating.value) == said
    unmigrated = PostgresSink("pg", url=pg_url, table="events", mode="append", migrate=False)
    execute(pg_url, "CREATE TABLE events (id bigint)")
    with pytest.raises(ConfigurationError) as opening:
        unmigrated.open(SinkContext("m"))
    assert str(opening.value).endswith(said)
    assert query(pg_url, "SELECT version_num FROM fanout.alembic_version") == [
        ("0099_from_the_future",)
    ]


def test_the_printed_migrate_runs_as_printed_for_a_url_with_two_parameters(pg_url: str) -> None:
    """A URL with two query parameters (``...?host=...&application_name=...``): the
    ``fanout migrate`` a sink told not to migrate prints, pasted into a shell (``sh -c``, a
    real subprocess), migrates exactly the sink's schema. Unquoted, the shell cut the URL at
    the ``&``: it ran ``fanout migrate --url <the URL up to it>`` in the background, without
    ``--schema`` (the default schema ``fanout``) and without the rest of the URL (here the
    server's socket: it reached for another server), and ``<the rest> --schema mig`` as a
    command that does not exist (exit 127)."""
    url = f"{pg_url}{'&' if '?' in pg_url else '?'}application_name=fanout_test"
    execute(pg_url, "CREATE TABLE events (id bigint)")
    sink = PostgresSink(
        "pg", url=url, table="events", mode="append", migrate=False, state_schema="mig"
    )
    with pytest.raises(ConfigurationError) as refused:
        sink.open(SinkContext("m"))
    command = str(refused.value).split("`")[1]
    assert command.startswith("fanout migrate --url '") and command.endswith("' --schema mig")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["sh", "-c", command], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    schemas = "SELECT nspname FROM pg_namespace WHERE nspname IN ('fanout', 'mig') ORDER BY 1"
    assert query(pg_url, schemas) == [("mig",)]
    assert query(pg_url, "SELECT version_num FROM mig.alembic_version") == [(head_revision(),)]
    sink.open(SinkContext("m"))  # at head now: opens
    sink.close()


def test_migrate_killed_mid_way_leaves_nothing_and_runs_again_to_head(pg_url: str) -> None:
    """``fanout migrate`` killed (SIGKILL) after its fourth revision, inside the one
    transaction the whole upgrade runs in: PostgreSQL rolls it back when the connection
    drops (no schema, no table, no version row, the advisory lock released), and the same
    command run again migrates to head."""
    from tests.cli_process import fanout_process
    from tests.kill_at import KILLED, fanout_killed_at

    migrate = ["migrate", "--url", pg_url, "--schema", "cut"]
    cut = fanout_killed_at(
        "alembic.runtime.migration:HeadMaintainer.update_to_step", "after", 4, *migrate
    )
    assert cut.returncode == KILLED, cut.stderr
    deadline = time.monotonic() + 30  # the server ends the dead client's backend
    while query(pg_url, "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                "current_database() AND pid <> pg_backend_pid()") != [(0,)]:  # fmt: skip
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert query(pg_url, "SELECT count(*) FROM pg_namespace WHERE nspname = 'cut'") == [(0,)]

    done = fanout_process(*migrate)
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith(f"schema 'cut' upgraded (empty) -> {head_revision()}\n")
    assert _state(pg_url, "cut")["versions"] == [(head_revision(),)]
