"""``fanout validate`` on a pipeline file whose source declares its schema: a PostgreSQL
table that would round a column of it fails the check, naming the sink, the column and the
cast, with exit code 2, before any stream; a table ``create_table`` would make is checked
and not created, and neither are the state tables' migrations run nor the dead-letter table
made: each is named as what a run would do."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from fanout_postgres.migrate import head_revision
from pgcheck import execute, query

from tests.in_process_cli import Cli
from tests.integration.checklist import validate

SINKS = """[[sinks]]
type = "postgres"
name = "prices"
url = "{url}"
table = "prices"
state_schema = "{state}"

[[sinks]]
type = "postgres"
name = "fresh"
url = "{url}"
table = "fresh"
create_table = true
keys = ["id"]
state_schema = "{state}"
dead_letter = "postgres:fresh_dead"

[[sinks]]
type = "postgres"
name = "planned"
url = "{url}"
table = "planned"
create_table = true
keys = ["id"]
batch_schema = "id LONG, price DOUBLE"
mode = "upsert"
state_schema = "{state}"
"""


def test_validate_fails_a_table_that_would_round_a_declared_column(
    spark: Any, pg_url: str, tmp_path: Path, fanout_cli: Cli
) -> None:
    execute(pg_url, "CREATE TABLE prices (id bigint PRIMARY KEY, price numeric(10,2))")
    state = f"validate_{uuid.uuid4().hex[:8]}"
    sinks = SINKS.format(url=pg_url, state=state)
    validated = validate(tmp_path, "id LONG, price DOUBLE", sinks, fanout_cli)
    assert validated.code == 2
    assert validated.lines == [
        "  OK    source: builds with its schema and transform",
        f"  OK    ledger {tmp_path}/ledger: opens",
        f"  INFO  ledger {tmp_path}/ledger: would create the ledger table",
        "  OK    sink prices: options",
        "  OK    sink prices: opens its target",
        f"  INFO  sink prices: would migrate fanout's state tables in schema '{state}' from "
        f"revision (none) to {head_revision()}",
        "  FAIL  sink prices: target takes the routed schema: sink 'prices': batch column "
        "'price' (double) cannot be written to column price of table prices (NUMERIC(10, 2)) "
        "without loss: PostgreSQL would round its values to 2 decimal places; cast it in the "
        'query so the rounding is yours: F.col("price").cast("decimal(10,2)") (in a sink\'s '
        "select: CAST(price AS decimal(10,2)) AS price), or change the column's type",
        "  OK    sink fresh: options",
        "  OK    sink fresh: opens its target",
        f"  INFO  sink fresh: would migrate fanout's state tables in schema '{state}' from "
        f"revision (none) to {head_revision()}",
        "  INFO  sink fresh: would create the dead-letter table fresh_dead",
        "  INFO  sink fresh: would create table fresh (at the first batch, from its columns)",
        "  OK    sink fresh: target takes the routed schema",
        "  OK    sink planned: options",
        "  OK    sink planned: opens its target",
        f"  INFO  sink planned: would migrate fanout's state tables in schema '{state}' from "
        f"revision (none) to {head_revision()}",
        "  INFO  sink planned: would create table planned (from option batch_schema)",
        "  OK    sink planned: target takes the routed schema",
    ]
    assert "configuration error: 1 of 11 checks failed:" in validated.err
    assert query(pg_url, "SELECT to_regclass('public.fresh')") == [(None,)]
    assert query(pg_url, "SELECT to_regclass('public.fresh_dead')") == [(None,)]
    assert query(pg_url, "SELECT to_regclass('public.planned')") == [(None,)]
    assert query(pg_url, f"SELECT to_regnamespace('{state}')") == [(None,)]
    assert not (tmp_path / "ledger").exists()
    assert query(pg_url, "SELECT count(*) FROM prices") == [(0,)]
    assert not (tmp_path / "checkpoint").exists()
