"""``fanout recover --config`` on a database whose fanout tables are behind the migrations
the PostgreSQL sink reads: upsert's ``holds_batch`` reads ``upsert_routes.partitions``
(migration ``0005``). Recover opens the sink read-only (no migration), and the read failed:
it answered only "cannot tell ... (the warning logged says why)". It now says the database
needs ``fanout migrate``, naming the command, and still migrates nothing."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from fanout_postgres.migrate import upgrade
from pgcheck import execute, query

from fanout.app.cli import main
from fanout.errors import ConfigurationError
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry, now_utc


def test_recover_on_tables_before_0005_names_fanout_migrate_and_migrates_nothing(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = f"old{uuid.uuid4().hex[:8]}"
    upgrade(pg_url, schema=schema, revision="0004_upsert_routes")
    # the sink's table as the pipeline's runs left it (a missing table holds nothing,
    # whatever fanout's tables say: the lost-target answer, not this one)
    execute(pg_url, f'CREATE TABLE "events_{schema}" (id BIGINT PRIMARY KEY, v TEXT)')
    ledger = tmp_path / "ledger"
    marks = DeltaLedger(str(ledger))
    marks.open()
    marks.mark_committed(
        LedgerEntry("orders", "events", 0, "committed", query_id="q1", rows=3,
                    finished_at=now_utc())
    )  # fmt: skip
    file = tmp_path / "pipeline.toml"
    file.write_text(
        f'[pipeline]\nname = "orders"\nledger = "{ledger}"\n'
        f'checkpoint = "{tmp_path / "checkpoint"}"\n[source]\nformat = "rate"\n'
        f'[[sinks]]\ntype = "postgres"\nname = "events"\nurl = "{pg_url}"\n'
        f'table = "events_{schema}"\nmode = "upsert"\nkeys = ["id"]\ncreate_table = true\n'
        f'state_schema = "{schema}"\n'
    )
    capsys.readouterr()
    assert main(["recover", "--config", str(file), "--no-record"]) == 0
    out = capsys.readouterr().out
    asked = out.split("(written, but never marked):\n")[1]
    line = asked.splitlines()[0]
    assert line.startswith(
        "  events: cannot tell whether it holds batch 1: ConfigurationError: postgres sink "
        f"'events' (table events_{schema}): cannot read its records of batch 1 of "
        f"epoch 0: fanout's tables in schema '{schema}' are at revision 0004_upsert_routes, "
        f"not 0008_upsert_routes_target (missing: column {schema}.progress.target_oid, "
        f"column {schema}.upsert_routes.partitions, column {schema}.upsert_routes.target_oid, "
        f"column {schema}.upsert_routes.refused, column {schema}.upsert_routes.kept_in, "
        f"column {schema}.upsert_routes.target); the database needs `fanout migrate --url "
    ), line
    assert line.endswith(f" --schema {schema}` first (a read-only check migrates nothing)"), line
    assert query(pg_url, f'SELECT version_num FROM "{schema}".alembic_version') == [
        ("0004_upsert_routes",)
    ]


def test_target_replaced_on_tables_before_0006_names_fanout_migrate(pg_url: str) -> None:
    """The read of the table OIDs the records name (``target_oid``, migration ``0006``)
    fails on older tables the way :meth:`holds_batch`'s does, and says so the same way."""
    from fanout_postgres.sink import PostgresSink

    from fanout import SinkContext

    schema = f"old{uuid.uuid4().hex[:8]}"
    upgrade(pg_url, schema=schema, revision="0005_upsert_routes_partitions")
    execute(pg_url, f'CREATE TABLE "events_{schema}" (id BIGINT PRIMARY KEY, v TEXT)')
    sink = PostgresSink("events", url=pg_url, table=f"events_{schema}", mode="append",
                        state_schema=schema)  # fmt: skip
    sink.open(SinkContext("orders", None, checking=True))  # read-only: migrates nothing
    try:
        with pytest.raises(ConfigurationError) as behind:
            sink.target_replaced("orders", 0, 1)
    finally:
        sink.close()
    said = str(behind.value)
    assert said.startswith(
        f"postgres sink 'events' (table events_{schema}): cannot read the table OIDs its "
        "records of batch 1 of epoch 0 name: fanout's tables in schema "
        f"'{schema}' are at revision 0005_upsert_routes_partitions, not "
        f"0008_upsert_routes_target (missing: column {schema}.progress.target_oid, column "
        f"{schema}.upsert_routes.target_oid, column {schema}.upsert_routes.refused, column "
        f"{schema}.upsert_routes.kept_in, column {schema}.upsert_routes.target); the database "
        "needs `fanout migrate --url "
    ), said
    assert said.endswith(f" --schema {schema}` first (a read-only check migrates nothing)")
    assert behind.value.__cause__ is not None


def test_an_upsert_holds_batch_on_tables_at_0006_names_fanout_migrate(pg_url: str) -> None:
    """Upsert's ``holds_batch`` reads the refused rows' count (``upsert_routes.refused``,
    migration ``0007``) with the partition counts: on tables at 0006 it says so, as for
    ``0005``'s column, and migrates nothing."""
    from fanout_postgres.sink import PostgresSink

    from fanout import SinkContext

    schema = f"old{uuid.uuid4().hex[:8]}"
    upgrade(pg_url, schema=schema, revision="0006_target_oid")
    execute(pg_url, f'CREATE TABLE "events_{schema}" (id BIGINT PRIMARY KEY, v TEXT)')
    sink = PostgresSink("events", url=pg_url, table=f"events_{schema}", mode="upsert",
                        keys=["id"], state_schema=schema)  # fmt: skip
    sink.open(SinkContext("orders", None, checking=True))
    try:
        with pytest.raises(ConfigurationError) as behind:
            sink.holds_batch("orders", 0, 1)
    finally:
        sink.close()
    said = str(behind.value)
    assert said.startswith(
        f"postgres sink 'events' (table events_{schema}): cannot read its records of batch 1 "
        f"of epoch 0: fanout's tables in schema '{schema}' are at revision 0006_target_oid, "
        f"not 0008_upsert_routes_target (missing: column {schema}.upsert_routes.refused, "
        f"column {schema}.upsert_routes.kept_in, column {schema}.upsert_routes.target); the "
        "database needs `fanout migrate --url "
    ), said
    assert query(pg_url, f'SELECT version_num FROM "{schema}".alembic_version') == [
        ("0006_target_oid",)
    ]
