"""Rows failing a PostgreSQL sink's route (a malformed CAST) go to its own dead-letter
kinds, a PostgreSQL table or a Delta table, before any partition writes; a replay after
the driver died before the ledger mark duplicates neither rows nor dead letters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pgcheck import execute, query

from fanout import BatchFailedError, BatchInfo, FanOut, RouteError
from fanout.routes.route import Route
from fanout.routes.settings import session_settings
from fanout.testing.faults import MarkLost
from tests.integration.streams import delta_rows

SCHEMA = "id LONG, amount STRING"
BAD = {4: "abc", 17: "9z"}
ROWS = [{"id": i, "amount": BAD.get(i, str(i * 10))} for i in range(20)]
GOOD = [(i, i * 10) for i in range(20) if i not in BAD]
SELECT = ["id", "CAST(amount AS INT) AS amount"]
REASON = (
    "route select 'CAST(amount AS INT) AS amount' failed: [CAST_INVALID_INPUT] The value "
    '\'{}\' of the type "STRING" cannot be cast to "INT"'
)


def _fan(url: str, ledger: Any, dead_letter: str) -> FanOut:
    sink = {"type": "postgres", "name": "pg", "url": url, "table": "amounts", "mode": "append",
            "partitions": 2, "dead_letter": dead_letter, "select": SELECT}  # fmt: skip
    return FanOut("pgroute", ledger, [sink], retries=0)


@pytest.mark.parametrize("kind", ["postgres", "delta"])
def test_rows_failing_the_route_go_to_the_dead_letter_target_once(
    spark: Any, pg_url: str, tmp_path: Path, kind: str
) -> None:
    execute(pg_url, "CREATE TABLE amounts (id bigint, amount integer)")
    dead = "postgres:ops.route_rejects" if kind == "postgres" else str(tmp_path / "rejects")
    if kind == "postgres":
        execute(pg_url, "CREATE SCHEMA ops")
    batch, info = spark.createDataFrame(ROWS, SCHEMA), BatchInfo("pgroute", 6, "q")
    ledger = str(tmp_path / "ledger")

    with pytest.raises(BatchFailedError):  # the driver "dies" before the mark
        _fan(pg_url, MarkLost(ledger, "pg"), dead).process(batch, info)
    result = _fan(pg_url, ledger, dead).process(batch, info)["pg"]  # the replay

    assert result.details["skipped_partitions"] == [0, 1]  # append: nothing written twice
    assert (result.rows, result.dead_lettered) == (len(GOOD), 2)
    assert query(pg_url, "SELECT id, amount FROM amounts ORDER BY id") == GOOD
    if kind == "postgres":
        letters = query(
            pg_url,
            "SELECT pipeline, sink, batch_id, partition, target, column_name, value, row, "
            "reason FROM ops.route_rejects",
        )
    else:
        letters = [
            (d["pipeline"], d["sink"], d["batch_id"], d["partition"], d["details"],
             d["column"], json.loads(d["value"]), json.loads(d["row"]), d["reason"])
            for d in delta_rows(tmp_path / "rejects")
        ]  # fmt: skip
        assert {d["source"] for d in delta_rows(tmp_path / "rejects")} == {"route"}
    letters.sort(key=lambda letter: letter[7]["id"])
    # a PostgreSQL table records the partition (-1: the route) and the sink's table; fanout's
    # Delta layout has no partition for a route's rows and no sink facts for them
    partition, target = (-1, "amounts") if kind == "postgres" else (None, None)
    assert [letter[:8] for letter in letters] == [
        ("pgroute", "pg", 6, partition, target, "amount", "abc", {"id": 4, "amount": "abc"}),
        ("pgroute", "pg", 6, partition, target, "amount", "9z", {"id": 17, "amount": "9z"}),
    ]
    assert letters[0][8].startswith(REASON.format("abc"))
    assert letters[1][8].startswith(REASON.format("9z"))
    marks = [r for r in delta_rows(tmp_path / "ledger") if r["status"] == "committed"]
    assert [(r["sink"], r["rows"], r["dead_lettered"]) for r in marks] == [("pg", len(GOOD), 2)]


def test_without_a_dead_letter_target_the_batch_fails_naming_the_expression(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    execute(pg_url, "CREATE TABLE amounts (id bigint, amount integer)")
    sink = {"type": "postgres", "name": "pg", "url": pg_url, "table": "amounts",
            "mode": "append", "partitions": 2, "select": SELECT}  # fmt: skip
    fan = FanOut("pgroute", str(tmp_path / "ledger"), [sink], retries=0)
    with pytest.raises(BatchFailedError) as caught:
        fan.process(spark.createDataFrame(ROWS, SCHEMA), BatchInfo("pgroute", 6, "q"))
    text = str(caught.value.failures["pg"])
    assert text.startswith("sink 'pg', batch 6: route select 'CAST(amount AS INT) AS amount' ")
    assert "[CAST_INVALID_INPUT]" in text and "no dead-letter target" in text


def test_route_letters_holding_nan_and_nul_are_recorded(pg_url: str) -> None:
    """A route's letters reach the PostgreSQL table as the partitions' own do: NaN and the
    infinities as strings in ``row``, NUL as the text ``\\u0000`` (jsonb and text refuse
    both, which failed the batch although a dead-letter target was set)."""
    from types import SimpleNamespace

    import sqlalchemy as sa
    from fanout_postgres.deadletter import PostgresDeadLetters, ensure_table
    from fanout_postgres.identifiers import TableName

    from fanout.contract.dead_letters import DeadLetter

    table = TableName(schema="public", name="route_nan")
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        ensure_table(conn, table)
    engine.dispose()
    batch = SimpleNamespace(pipeline="p", info=SimpleNamespace(epoch=0), sink_name="pg", batch_id=3)
    letters = [
        DeadLetter(row={"id": 1, "x": float("nan")}, reason="bad", column="x", value=float("nan")),
        DeadLetter(row={"id": 2, "x": float("-inf")}, reason="bad", column="x", value="-inf"),
        DeadLetter(row={"id": 3, "s": "a\x00b"}, reason="bad", column="s", value="a\x00b"),
    ]
    target = PostgresDeadLetters(pg_url, "pg", table, "amounts")
    assert target.write(batch, letters, source="route") == 3  # type: ignore[arg-type]
    assert query(pg_url, "SELECT partition, value, row FROM route_nan ORDER BY row->>'id'") == [
        (-1, "NaN", {"id": 1, "x": "NaN"}),
        (-1, "-inf", {"id": 2, "x": "-Infinity"}),
        (-1, "a\\u0000b", {"id": 3, "s": "a\\u0000b"}),
    ]


def test_a_route_letter_s_row_is_the_core_s_letter_json_fit_for_jsonb(pg_url: str) -> None:
    """A route's row reaches a PostgreSQL dead-letter table as the core's ``letter_json``
    (instants in UTC, binary as base64, maps as objects), a NUL as the text ``\\u0000``."""
    import datetime as dt
    from types import SimpleNamespace
    from zoneinfo import ZoneInfo

    import sqlalchemy as sa
    from fanout_postgres.deadletter import PostgresDeadLetters, ensure_table
    from fanout_postgres.identifiers import TableName

    from fanout.contract.dead_letters import DeadLetter, MapPairs

    table = TableName(schema="public", name="route_rows")
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        ensure_table(conn, table)
    engine.dispose()
    # a route's refused row as letter_rows gives it: instants in the session's zone
    at = dt.datetime(2024, 1, 2, 8, 34, 5, 123456, tzinfo=ZoneInfo("Asia/Kolkata"))
    row = {
        "at": at,
        "s": {"at": at, "day": dt.date(999, 1, 2)},
        "a": [at.replace(tzinfo=None)],
        "b": b"\xff\x00",
        "m": MapPairs([(b"\xfe", 1)]),
        "e": MapPairs(),
        "t": "a\x00b",
    }
    batch = SimpleNamespace(pipeline="p", info=SimpleNamespace(epoch=0), sink_name="pg", batch_id=3)
    target = PostgresDeadLetters(pg_url, "pg", table, "amounts")
    target.write(batch, [DeadLetter(row=row, reason="bad")], source="route")  # type: ignore[arg-type]
    assert query(pg_url, "SELECT row FROM route_rows") == [
        (
            {
                "at": "2024-01-02T03:04:05.123456+00:00",
                "s": {"at": "2024-01-02T03:04:05.123456+00:00", "day": "0999-01-02"},
                "a": ["2024-01-02T08:34:05.123456"],
                "b": "/wA=",
                "m": {"/g==": 1},
                "e": {},
                "t": "a\\u0000b",
            },
        )
    ]


def test_a_replay_under_a_changed_route_is_refused_before_the_letters_are_replaced(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """The driver died after the partitions and the route letters committed, before the
    ledger mark; the restart runs a fixed route (``try_cast``: no row refused). Replacing
    the letters by none would leave rows 4 and 17 nowhere once the partitions skip:
    refused, letters untouched; the old route restored completes the batch."""
    execute(pg_url, "CREATE TABLE amounts (id bigint, amount integer)")
    batch, info = spark.createDataFrame(ROWS, SCHEMA), BatchInfo("pgroute", 6, "q")
    ledger, dead = str(tmp_path / "ledger"), "postgres:route_rejects"
    with pytest.raises(BatchFailedError):
        _fan(pg_url, MarkLost(ledger, "pg"), dead).process(batch, info)
    fixed = ["id", "TRY_CAST(amount AS INT) AS amount"]
    sink = {"type": "postgres", "name": "pg", "url": pg_url, "table": "amounts", "mode": "append",
            "partitions": 2, "dead_letter": dead, "select": fixed}  # fmt: skip

    with pytest.raises(BatchFailedError) as failed:
        FanOut("pgroute", ledger, [sink], retries=0).process(batch, info)
    error = failed.value.failures["pg"]
    assert isinstance(error, RouteError) and (error.sink, error.batch_id) == ("pg", 6)
    settings = session_settings(batch)
    old, new = (Route(select=tuple(s)).stamp(settings) for s in (SELECT, fixed))
    assert old.text.startswith(f"select {SELECT!r} under spark.sql.ansi.enabled=true, ")
    assert (
        f"the PostgreSQL table route_rejects holds this batch's route dead letters "
        f"chosen by {old.text} (fingerprint {old.fingerprint}), but the sink's route is "
        f"now {new.text} (fingerprint {new.fingerprint})"
    ) in str(error)
    stamped = f"{old.fingerprint} {old.text}"
    letters = "SELECT row->>'id', route FROM route_rejects ORDER BY (row->>'id')::int"
    assert query(pg_url, letters) == [("4", stamped), ("17", stamped)]

    result = _fan(pg_url, ledger, dead).process(batch, info)["pg"]
    assert (result.rows, result.dead_lettered) == (len(GOOD), 2)
    assert query(pg_url, "SELECT id, amount FROM amounts ORDER BY id") == GOOD
    assert query(pg_url, letters) == [("4", stamped), ("17", stamped)]


def test_route_records_of_an_older_table_are_of_an_unknown_route_and_replaced(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A dead-letter table of an older fanout gets the ``route`` column when the sink
    opens; its records without one are of an unknown route: not refused, replaced."""
    from types import SimpleNamespace

    import sqlalchemy as sa
    from fanout_postgres.deadletter import PostgresDeadLetters, ensure_table
    from fanout_postgres.identifiers import TableName

    from fanout.contract.dead_letters import DeadLetter

    execute(
        pg_url,
        "CREATE TABLE old_rejects (pipeline text NOT NULL, sink text NOT NULL, batch_id bigint "
        "NOT NULL, partition integer NOT NULL, target text NOT NULL, reason text NOT NULL, "
        "column_name text, value text, row jsonb NOT NULL, rejected_at timestamptz DEFAULT now())",
    )
    execute(
        pg_url,
        "INSERT INTO old_rejects (pipeline, sink, batch_id, partition, target, reason, row) "
        """VALUES ('p', 'pg', 3, -1, 'amounts', 'old', '{"id": 1}')""",
    )
    table = TableName(schema="public", name="old_rejects")
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        assert ensure_table(conn, table) is False
    engine.dispose()
    batch = SimpleNamespace(pipeline="p", info=SimpleNamespace(epoch=0), sink_name="pg", batch_id=3)
    target = PostgresDeadLetters(pg_url, "pg", table, "amounts")
    route = Route(where="id > 1").stamp()
    with caplog.at_level("WARNING", logger="fanout"):
        target.write(batch, [DeadLetter(row={"id": 2}, reason="new")], source="route", route=route)  # type: ignore[arg-type]
    assert any("without the route that chose them" in r.getMessage() for r in caplog.records)
    stamped = f"{route.fingerprint} where 'id > 1'"
    assert query(pg_url, "SELECT reason, row, route FROM old_rejects") == [
        ("new", {"id": 2}, stamped)
    ]
    # and now that the records know their route, another one is refused, nothing replaced
    other = Route(where="id > 2").stamp()
    with pytest.raises(RouteError, match="the route changed mid-batch"):
        target.write(batch, [], source="route", route=other)  # type: ignore[arg-type]
    assert query(pg_url, "SELECT reason, row, route FROM old_rejects") == [
        ("new", {"id": 2}, stamped)
    ]


def test_a_replay_whose_route_refuses_rows_committed_partitions_hold_is_refused(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """The first attempt's route refuses no row (no letters, so no route recorded with
    them) and both partitions commit; the driver dies before the ledger mark. The restart
    runs a route refusing rows 4 and 17, which the skipped partitions already wrote: its
    letters would put them in two places. The progress marks recorded the route: refused,
    naming both, before any letter is written; the old route completes the batch."""
    execute(pg_url, "CREATE TABLE amounts (id bigint, amount integer)")
    batch, info = spark.createDataFrame(ROWS, SCHEMA), BatchInfo("pgroute", 6, "q")
    ledger, dead = str(tmp_path / "ledger"), "postgres:route_rejects"
    lenient = ["id", "TRY_CAST(amount AS INT) AS amount"]

    def sink(select: list[str]) -> dict[str, Any]:
        return {"type": "postgres", "name": "pg", "url": pg_url, "table": "amounts",
                "mode": "append", "partitions": 2, "dead_letter": dead,
                "select": select}  # fmt: skip

    with pytest.raises(BatchFailedError):
        FanOut("pgroute", MarkLost(ledger, "pg"), [sink(lenient)], retries=0).process(batch, info)
    written = [(i, None if i in BAD else i * 10) for i in range(20)]
    rows = "SELECT id, amount FROM amounts ORDER BY id"
    assert query(pg_url, rows) == written

    with pytest.raises(BatchFailedError) as failed:
        FanOut("pgroute", ledger, [sink(SELECT)], retries=0).process(batch, info)
    error = failed.value.failures["pg"]
    assert isinstance(error, RouteError) and (error.sink, error.batch_id) == ("pg", 6)
    settings = session_settings(batch)
    old, new = (Route(select=tuple(s)).stamp(settings) for s in (lenient, SELECT))
    assert str(error) == (
        f"sink 'pg', batch 6: the route changed mid-batch: partition(s) [0, 1] committed "
        f"this batch under {old.text} (fingerprint {old.fingerprint}), but the sink's route "
        f"is now {new.text} (fingerprint {new.fingerprint}). A replay skips the committed "
        "partitions, so a row only the new route refuses would be both in a committed "
        "partition and in the dead letters, and one only the old route refuses in neither. "
        "Nothing was written. Restore the old route (its expressions and the Spark settings "
        "it names) until this batch completes, then change it (a change between batches is "
        "safe)"
    )
    assert query(pg_url, "SELECT count(*) FROM route_rejects") == [(0,)]
    assert query(pg_url, rows) == written

    result = FanOut("pgroute", ledger, [sink(lenient)], retries=0).process(batch, info)["pg"]
    assert result.details["skipped_partitions"] == [0, 1]
    assert (result.rows, result.dead_lettered) == (20, 0)
    assert query(pg_url, rows) == written
    assert query(pg_url, "SELECT count(*) FROM route_rejects") == [(0,)]


def test_a_replay_under_another_route_without_letters_is_refused_by_the_kits_check(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """Append mode, no dead-letter target: a replay writes no route letter, so fanout does
    not call ``check_replay``; the kit's check where the write reads the progress marks
    (the route each returns in ``CommittedPartition.route``) refuses a route other than the
    one the committed partitions recorded (here none: the identity's), in the kit's words,
    before any partition writes. The old route completes the batch, skipping both."""
    execute(pg_url, "CREATE TABLE texts (id bigint, amount text)")
    batch, info = spark.createDataFrame(ROWS, SCHEMA), BatchInfo("pgroute", 6, "q")
    ledger = str(tmp_path / "ledger")

    def sink(**route: Any) -> dict[str, Any]:
        return {"type": "postgres", "name": "pg", "url": pg_url, "table": "texts",
                "mode": "append", "partitions": 2, **route}  # fmt: skip

    with pytest.raises(BatchFailedError):
        FanOut("pgroute", MarkLost(ledger, "pg"), [sink()], retries=0).process(batch, info)
    written = [(r["id"], r["amount"]) for r in ROWS]
    rows = "SELECT id, amount FROM texts ORDER BY id"
    assert query(pg_url, rows) == written

    with pytest.raises(BatchFailedError) as failed:
        FanOut("pgroute", ledger, [sink(where="id < 10")], retries=0).process(batch, info)
    error = failed.value.failures["pg"]
    assert isinstance(error, RouteError) and (error.sink, error.batch_id) == ("pg", 6)
    old, new = Route().stamp(), Route(where="id < 10").stamp(session_settings(batch))
    assert str(error) == (
        f"sink 'pg', batch 6: the route changed mid-batch: partition(s) [0, 1] committed "
        f"this batch under no route (fingerprint {old.fingerprint}), but the sink's route "
        f"is now {new.text} (fingerprint {new.fingerprint}). A replay skips the committed "
        "partitions, so a row only the new route refuses would be both in a committed "
        "partition and in the dead letters, and one only the old route refuses in neither. "
        "Nothing was written. Restore the old route (its expressions and the Spark settings "
        "it names) until this batch completes, then change it (a change between batches is "
        "safe)"
    )
    assert query(pg_url, rows) == written

    result = FanOut("pgroute", ledger, [sink()], retries=0).process(batch, info)["pg"]
    assert result.details["skipped_partitions"] == [0, 1]
    assert result.rows == 20 and query(pg_url, rows) == written
