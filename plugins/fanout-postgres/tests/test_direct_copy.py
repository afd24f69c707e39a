"""Upsert partitions whose keys are all new go straight into the table by COPY; any other
partition is staged and merged as before, and the driver stops trying for a while after
a refusal (fanout_postgres.direct).

A trigger on the target logs, for every row it inserts, the statement that inserted it
(``COPY`` or ``MERGE``/``INSERT``), so each test sees which path wrote what; a row
inserted by a direct copy that was then undone is not logged (the savepoint undid the
log too)."""

from __future__ import annotations

from typing import Any

import pytest
from fanout_postgres import PostgresSink
from fanout_postgres.direct import MAX_SKIP, DirectCopyPolicy
from pg_data import SCHEMA
from pgcheck import execute, query

from fanout.contract.batch import Batch, BatchInfo
from fanout.partitioned.outcome import PartitionOutcome
from fanout.testing import open_sink

TABLE_DDL = (
    "CREATE TABLE orders (id bigint PRIMARY KEY, customer text NOT NULL, "
    "amount double precision CHECK (amount >= 0), version bigint NOT NULL)"
)
LOG_DDL = (
    "CREATE TABLE inserted_by (id bigint, statement text)",
    "CREATE FUNCTION log_insert() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "INSERT INTO inserted_by VALUES (NEW.id, split_part(ltrim(current_query()), ' ', 1)); "
    "RETURN NEW; END $$",
    "CREATE TRIGGER log_insert AFTER INSERT ON orders FOR EACH ROW EXECUTE FUNCTION log_insert()",
)


def _write(spark: Any, sink: PostgresSink, batch_id: int, rows: list[tuple[Any, ...]]) -> Any:
    df = spark.createDataFrame(rows, SCHEMA)
    return sink.write(Batch(df, BatchInfo("direct", batch_id, "q"), "pg", "fanout/direct/pg"))


def _inserted_by(url: str) -> dict[int, str]:
    return dict(query(url, "SELECT id, statement FROM inserted_by ORDER BY id"))


def _rows(url: str) -> list[tuple[Any, ...]]:
    return query(url, "SELECT id, customer, amount, version FROM orders ORDER BY id")


def _sink(url: str, **options: Any) -> PostgresSink:
    if options.get("mode") != "append":
        options["order_by"] = "version"
    sink = PostgresSink("pg", url=url, table="orders", **options)
    return open_sink(sink, "direct")  # resolves a dead-letter target as FanOut does


def test_new_keys_are_copied_in_and_a_batch_updating_keys_is_merged(
    spark: Any, pg_url: str
) -> None:
    execute(pg_url, TABLE_DDL, *LOG_DDL)
    sink = _sink(pg_url, partitions=2)

    first = _write(spark, sink, 0, [(i, f"c{i}", float(i), 1) for i in range(20)])
    assert first.details["direct_copies"] == 2
    assert first.details["changed"] == 20
    assert _inserted_by(pg_url) == {i: "COPY" for i in range(20)}

    # keys 10..19 exist: both partitions' direct copies are refused, then merged
    second = _write(spark, sink, 1, [(i, f"c{i}-v2", float(i) + 0.5, 2) for i in range(10, 30)])
    assert second.details["direct_copies"] == 0
    assert second.details["changed"] == 20
    assert _inserted_by(pg_url) == {
        **{i: "COPY" for i in range(20)},
        **{i: "MERGE" for i in range(20, 30)},
    }
    assert _rows(pg_url) == [
        *[(i, f"c{i}", float(i), 1) for i in range(10)],
        *[(i, f"c{i}-v2", float(i) + 0.5, 2) for i in range(10, 30)],
    ]

    # after a refusal the next batch is staged without trying, the one after tries again
    third = _write(spark, sink, 2, [(i, f"c{i}", float(i), 1) for i in range(100, 110)])
    fourth = _write(spark, sink, 3, [(i, f"c{i}", float(i), 1) for i in range(200, 210)])
    assert (third.details["direct_copies"], fourth.details["direct_copies"]) == (0, 2)
    logged = _inserted_by(pg_url)
    assert {logged[i] for i in range(100, 110)} == {"MERGE"}
    assert {logged[i] for i in range(200, 210)} == {"COPY"}
    assert len(_rows(pg_url)) == 50


def test_a_new_key_twice_in_a_batch_is_refused_by_the_copy_and_deduplicated(
    spark: Any, pg_url: str
) -> None:
    execute(pg_url, TABLE_DDL, *LOG_DDL)
    sink = _sink(pg_url, partitions=1)

    rows = [(1, "a-v1", 1.0, 1), (2, "b", 2.0, 1), (1, "a-v3", 3.0, 3), (1, "a-v2", 2.0, 2)]
    result = _write(spark, sink, 0, rows)

    assert result.details["direct_copies"] == 0
    assert _rows(pg_url) == [(1, "a-v3", 3.0, 3), (2, "b", 2.0, 1)]
    assert _inserted_by(pg_url) == {1: "INSERT", 2: "INSERT"}  # DISTINCT ON .. ON CONFLICT


def test_a_row_the_table_refuses_is_dead_lettered_once_through_the_staged_path(
    spark: Any, pg_url: str
) -> None:
    execute(pg_url, TABLE_DDL, *LOG_DDL)
    sink = _sink(pg_url, partitions=1, dead_letter="postgres:rejects")

    rows = [(1, "a", 1.0, 1), (2, "b", -5.0, 1), (3, "c", 3.0, 1)]  # -5 breaks the CHECK
    result = _write(spark, sink, 0, rows)

    assert result.details["direct_copies"] == 0
    assert result.details["rejected"] == 1
    assert _rows(pg_url) == [(1, "a", 1.0, 1), (3, "c", 3.0, 1)]
    assert _inserted_by(pg_url) == {1: "INSERT", 3: "INSERT"}  # bisected, in savepoints
    assert query(pg_url, "SELECT batch_id, row->>'id', reason FROM rejects") == [
        (0, "2", 'new row for relation "orders" violates check constraint "orders_amount_check"')
    ]


def _outcomes(**counters: int) -> list[PartitionOutcome]:
    return [PartitionOutcome(0, "committed", counters=counters)]


def test_the_policy_backs_off_doubling_and_resets_after_a_batch_that_held() -> None:
    policy = DirectCopyPolicy()
    tried: list[bool] = []

    def batch(refused: bool) -> None:
        wanted = policy.wanted()
        tried.append(wanted)
        if wanted:
            policy.record(_outcomes(**{"direct_copies_refused" if refused else "direct_copies": 1}))

    for _ in range(8):  # refused whenever tried
        batch(refused=True)
    assert tried == [True, False, True, False, False, True, False, False]
    assert (policy.skip, policy.backoff) == (2, 4)

    policy = DirectCopyPolicy()
    for _ in range(12):
        policy.record(_outcomes(direct_copies_refused=1))
    assert policy.backoff == MAX_SKIP  # capped

    policy.skip = 0
    policy.record(_outcomes(direct_copies=1))  # a batch whose copies all held
    assert policy.backoff == 0
    policy.record(_outcomes(direct_copies_refused=1))
    assert (policy.skip, policy.backoff) == (1, 1)

    policy.record(_outcomes())  # no partition tried (staged batch, or all empty): no change
    assert (policy.skip, policy.backoff) == (1, 1)


@pytest.mark.parametrize("mode", ["upsert", "append"])
def test_a_table_with_row_level_security_is_written_through_the_staged_path(
    spark: Any, pg_url: str, mode: str
) -> None:
    """PostgreSQL takes no COPY FROM into a table with row-level security (for a role the
    policies apply to): the copy into the table is refused as a whole, and the rows are
    staged and inserted (upsert: merged) instead."""
    from fanout_postgres.migrate import upgrade

    upgrade(pg_url, schema="fanout")  # fanout's tables, created by their owner
    execute(
        pg_url,
        TABLE_DDL,
        *LOG_DDL,
        "ALTER TABLE orders ENABLE ROW LEVEL SECURITY",
        "CREATE POLICY everyone ON orders USING (true) WITH CHECK (true)",
        "DO $$ BEGIN CREATE ROLE fanout_writer LOGIN; EXCEPTION WHEN duplicate_object "
        "THEN NULL; END $$",
        "GRANT SELECT, INSERT, UPDATE ON orders TO fanout_writer",
        "GRANT INSERT ON inserted_by TO fanout_writer",
        "GRANT USAGE ON SCHEMA fanout TO fanout_writer",
        "GRANT ALL ON ALL TABLES IN SCHEMA fanout TO fanout_writer",
    )
    writer_url = pg_url.replace("://postgres@", "://fanout_writer@", 1)
    assert writer_url != pg_url
    sink = _sink(writer_url, partitions=2, migrate=False, mode=mode)

    result = _write(spark, sink, 0, [(i, f"c{i}", float(i), 1) for i in range(10)])

    assert result.details["direct_copies"] == 0
    assert _rows(pg_url) == [(i, f"c{i}", float(i), 1) for i in range(10)]
    statement = "MERGE" if mode == "upsert" else "INSERT"
    assert _inserted_by(pg_url) == {i: statement for i in range(10)}


def _seq_scans(url: str, table: str, *, since: int | None = None) -> int:
    """``seq_scan`` of ``table``; with ``since``, waits for the writer's sessions to report
    (a backend flushes its counts as it exits, just after the sink's write returned);
    without, waits for the count to hold still for half a second (the sessions before it,
    the earlier writes' included, still reporting)."""
    import time

    sql = "SELECT seq_scan FROM pg_stat_user_tables WHERE relname = %s"
    deadline = time.monotonic() + 10
    count = int(query(url, sql, (table,))[0][0])
    while since is None and time.monotonic() < deadline:
        time.sleep(0.5)
        count, last = int(query(url, sql, (table,))[0][0]), count
        if count == last:
            return count
    while since is not None and count == since and time.monotonic() < deadline:
        time.sleep(0.1)
        count = int(query(url, sql, (table,))[0][0])
    if since is not None:
        time.sleep(0.5)  # any late report
        count = int(query(url, sql, (table,))[0][0])
    return count


def test_a_merge_into_a_table_whose_statistics_say_empty_scans_it_once(
    spark: Any, pg_url: str
) -> None:
    """A range filter on the staged rows made the planner guess a few of them and, with the
    target's statistics saying "empty", join by a nested loop scanning the target once per
    staged row while the MERGE filled it: quadratic (minutes for 500k rows)."""
    execute(pg_url, TABLE_DDL, *LOG_DDL)
    sink = _sink(pg_url, partitions=1)
    _write(spark, sink, 0, [(1, "a", 1.0, 1), (1, "b", 2.0, 2)])  # refused: next is staged
    execute(pg_url, "TRUNCATE orders", "TRUNCATE inserted_by", "ANALYZE orders")
    before = _seq_scans(pg_url, "orders")

    result = _write(spark, sink, 1, [(i, f"c{i}", float(i), 1) for i in range(2000)])

    assert result.details["direct_copies"] == 0
    assert _inserted_by(pg_url) == {i: "MERGE" for i in range(2000)}
    assert _seq_scans(pg_url, "orders", since=before) - before == 1
