"""A statement cancelled by ``statement_timeout`` (SQLSTATE 57014) is transient: the
batch is retried and ends with exact contents (issue 13, item 8).

The slowness is deterministic: a row trigger sleeps past the database's
``statement_timeout`` the first time it fires only. The counter is a sequence, which a
rollback does not undo, so the cancelled attempt leaves the retry fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pg_data import latest, run_stream, write_files
from pgcheck import execute, query

from fanout import FanOut
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import entries_from_arrow
from tests.integration.streams import committed_marks

SLOW_FIRST_WRITE = [
    "CREATE TABLE orders (id bigint PRIMARY KEY, customer text NOT NULL, "
    "amount double precision, version bigint NOT NULL)",
    "CREATE SEQUENCE slow_once",
    """CREATE FUNCTION slow_once() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN
         IF nextval('slow_once') = 1 THEN PERFORM pg_sleep(5); END IF;
         RETURN NEW;
       END $$""",
    "CREATE TRIGGER slow_once BEFORE INSERT OR UPDATE ON orders "
    "FOR EACH ROW EXECUTE FUNCTION slow_once()",
]


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_statement_timeout_is_retried_and_the_batch_lands_once(
    spark: Any, pg_url: str, tmp_path: Path, mode: str
) -> None:
    execute(pg_url, *SLOW_FIRST_WRITE)
    database = query(pg_url, "SELECT current_database()")[0][0]
    execute(pg_url, f"ALTER DATABASE {database} SET statement_timeout = '1s'")
    files = write_files(tmp_path / "input", files=1, rows=30, step=30)
    fan = FanOut(
        "pg-timeout",
        str(tmp_path / "ledger"),
        [
            {
                "type": "postgres",
                "name": "pg",
                "url": pg_url,
                "table": "orders",
                "mode": mode,
                "partitions": 1,
                "retries": 2,
                "backoff_s": 0.2,
            }
        ],
    )

    run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")

    final = latest(files)
    assert query(pg_url, "SELECT id, customer, amount, version FROM orders ORDER BY id") == [
        (i, r["customer"], r["amount"], r["version"]) for i, r in sorted(final.items())
    ]
    assert query(pg_url, "SELECT last_value FROM slow_once")[0][0] == 31  # 1 cancelled + 30
    assert committed_marks(tmp_path / "ledger", "pg-timeout") == {("pg", 0): 1}
    failures = [
        e for e in entries_from_arrow(DeltaLedger(str(tmp_path / "ledger")).read())
        if e.status == "failed"
    ]  # fmt: skip
    assert [(f.sink, f.batch_id, f.attempt) for f in failures] == [("pg", 0, 1)]
    assert "statement timeout" in (failures[0].error or "")
    assert "57014" in (failures[0].error or "")
