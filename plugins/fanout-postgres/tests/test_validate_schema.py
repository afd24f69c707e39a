"""``fanout validate`` on a pipeline file whose source declares its schema: a PostgreSQL
table that would round a column of it fails the check, naming the sink, the column and the
cast, with exit code 2, before any stream; a table ``create_table`` would make is checked
and not created."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pgcheck import execute, query

PIPELINE = """
[pipeline]
name = "checks"
ledger = "{data}/ledger"
checkpoint = "{data}/checkpoint"

[spark]
master = "local[2]"

[source]
format = "json"
path = "{data}/input"
schema = "id LONG, price DOUBLE"

[[sinks]]
type = "postgres"
name = "prices"
url = "{url}"
table = "prices"

[[sinks]]
type = "postgres"
name = "fresh"
url = "{url}"
table = "fresh"
create_table = true
keys = ["id"]
"""


def test_validate_fails_a_table_that_would_round_a_declared_column(
    spark: Any, pg_url: str, tmp_path: Path, capsys: Any
) -> None:
    from fanout.app.cli import main

    execute(pg_url, "CREATE TABLE prices (id bigint PRIMARY KEY, price numeric(10,2))")
    (tmp_path / "input").mkdir()
    config = tmp_path / "pipeline.toml"
    config.write_text(PIPELINE.format(data=tmp_path, url=pg_url))
    assert main(["validate", str(config)]) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.out.splitlines() if line.startswith("  ")]
    assert lines == [
        "  OK    source: builds with its schema and transform",
        f"  OK    ledger {tmp_path}/ledger: opens",
        "  OK    sink prices: options",
        "  OK    sink prices: opens its target",
        "  FAIL  sink prices: target takes the routed schema: sink 'prices': batch column "
        "'price' (double) cannot be written to column price of table prices (NUMERIC(10, 2)) "
        "without loss: PostgreSQL would round its values to 2 decimal places; cast it in the "
        'query so the rounding is yours: F.col("price").cast("decimal(10,2)") (in a sink\'s '
        "select: CAST(price AS decimal(10,2)) AS price), or change the column's type",
        "  OK    sink fresh: options",
        "  OK    sink fresh: opens its target",
        "  OK    sink fresh: target takes the routed schema",
    ]
    assert "configuration error: 1 of 8 checks failed:" in captured.err
    assert query(pg_url, "SELECT to_regclass('public.fresh')") == [(None,)]
    assert query(pg_url, "SELECT count(*) FROM prices") == [(0,)]
    assert not (tmp_path / "checkpoint").exists()
