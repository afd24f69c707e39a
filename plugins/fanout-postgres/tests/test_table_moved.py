"""A PostgreSQL sink whose ``table`` or ``mode`` changed between a crash and its replay
(docs/architecture.md §8.2, "A table moved mid-batch", "A mode switched mid-batch").

An append sink's progress marks are keyed by pipeline, sink, batch and partition, not by
table: killed after its partitions committed batch N into ``t1`` and before its ledger
mark, then restarted with ``table = "t2"``, the replay found the marks, skipped those
partitions, and ``t2`` never got their rows. Switched from upsert to append instead, the
replay found no progress mark (the upsert recorded ``upsert_routes``) and appended the
batch again: every row a unique violation, in the dead letters beside the upsert's. Both
are now refused before any partition writes, naming what to do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pgcheck import execute, query

from fanout import BatchFailedError, BatchInfo, FanOut, TargetLostError
from fanout.testing.faults import MarkLost


def _sink(url: str, **options: Any) -> dict[str, Any]:
    return {"type": "postgres", "name": "pg", "url": url, "table": "t1", "mode": "append",
            "partitions": 2, **options}  # fmt: skip


def _fan(url: str, ledger: Any, **options: Any) -> FanOut:
    return FanOut("pgmove", ledger, [_sink(url, **options)], retries=0)


def _ids(url: str, table: str) -> list[int]:
    return [row[0] for row in query(url, f"SELECT id FROM {table} ORDER BY id")]


def _crash(spark: Any, url: str, ledger: str, ids: range, batch: int, **options: Any) -> None:
    """Batch ``batch`` (``ids``) committed by sink ``pg``, the driver "dying" before its
    ledger mark (:class:`MarkLost`)."""
    crashed = _fan(url, MarkLost(ledger, "pg"), **options)
    try:
        with pytest.raises(BatchFailedError):
            crashed.process(spark.range(ids.start, ids.stop), BatchInfo("pgmove", batch, "q"))
    finally:
        crashed.close()


def _refusal(fan: FanOut, rows: Any, batch: int) -> str:
    """Why ``fan`` refused batch ``batch`` of ``rows`` for sink ``pg`` (``fan`` stays open)."""
    with pytest.raises(BatchFailedError) as refused:
        fan.process(rows, BatchInfo("pgmove", batch, "q"))
    return str(refused.value.failures["pg"])


def test_an_append_table_moved_between_a_crash_and_its_replay_is_refused(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """Batch 1 committed into ``t1``, its mark lost; restarted on ``t2`` (which holds a row
    of its own): before, the replay skipped both partitions, ``t2`` ended ``[100]``. Its
    answer to the start questions (``holds_batch``) is "cannot tell", not "held": the
    marks are of ``t1``. Back on ``t1`` the batch completes, and moving after the mark
    writes the next batch into ``t2``."""
    execute(pg_url, "CREATE TABLE t1 (id bigint)", "CREATE TABLE t2 (id bigint)",
            "INSERT INTO t2 VALUES (100)")  # fmt: skip
    ledger = str(tmp_path / "ledger")
    _crash(spark, pg_url, ledger, range(4, 8), 1)  # the driver "dies" before the mark
    assert _ids(pg_url, "t1") == [4, 5, 6, 7]

    moved = _fan(pg_url, ledger, table="t2")
    try:
        # what a checkpoint reset's start would ask: before, True (t1's marks), so the
        # start was refused and its lost mark recorded for a batch t2 never got
        assert moved.sinks["pg"].holds_batch("pgmove", 0, 1) is None
        with pytest.raises(BatchFailedError) as refused:
            moved.process(spark.range(4, 8), BatchInfo("pgmove", 1, "q"))
    finally:
        moved.close()
    text = str(refused.value.failures["pg"])
    assert "partition(s) [0, 1] of batch 1 of this sink as committed to table t1 (OID " in text
    assert "its table is t2 now (OID " in text
    assert "Set table back to t1 and restart" in text
    assert text.endswith(
        "delete its marks first: DELETE FROM fanout.progress WHERE pipeline = 'pgmove' AND "
        "sink = 'pg' AND batch_id = 1"
    )
    assert _ids(pg_url, "t2") == [100]  # nothing written (before: [100] too, and accepted)
    assert _ids(pg_url, "t1") == [4, 5, 6, 7]

    back = _fan(pg_url, ledger)  # the way out it names
    assert back.process(spark.range(4, 8), BatchInfo("pgmove", 1, "q"))["pg"].already_written
    back.close()
    after = _fan(pg_url, ledger, table="t2")
    after.process(spark.range(8, 10), BatchInfo("pgmove", 2, "q"))
    after.close()
    assert _ids(pg_url, "t1") == [4, 5, 6, 7]
    assert _ids(pg_url, "t2") == [8, 9, 100]

    # the reverse, t2 back to t1 with batch 3 committed into t2 and its mark lost; then
    # the other way it names: the marks deleted, t1 gets all of batch 3 (t2 keeps its copy)
    _crash(spark, pg_url, ledger, range(10, 12), 3, table="t2")
    reverse = _fan(pg_url, ledger)
    text = _refusal(reverse, spark.range(10, 12), 3)
    assert "committed to table t2 (OID " in text and "its table is t1 now" in text
    assert _ids(pg_url, "t1") == [4, 5, 6, 7]  # before: batch 3 skipped, t1 never got it
    execute(pg_url, text[text.index("DELETE FROM") :])
    reverse.process(spark.range(10, 12), BatchInfo("pgmove", 3, "q"))
    reverse.close()
    assert _ids(pg_url, "t1") == [4, 5, 6, 7, 10, 11]
    assert _ids(pg_url, "t2") == [8, 9, 10, 11, 100]

    # moved between runs to an empty table: the lost-target check refuses it, as before,
    # but says it moved (before: only that t3 had another OID than the batch's table)
    execute(pg_url, "CREATE TABLE t3 (id bigint)")
    with pytest.raises(TargetLostError) as lost:
        _fan(pg_url, ledger, table="t3").process(spark.range(12, 14), BatchInfo("pgmove", 4, "q"))
    assert (
        "of batch 3 were written to table t1 (OID " in str(lost.value)
        and "names t3 now (OID " in str(lost.value)
        and "the table was moved, not created again" in str(lost.value)
    )
    assert _ids(pg_url, "t3") == []


def test_upsert_switched_to_append_between_a_crash_and_its_replay_is_refused(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """Upsert with a ``postgres:`` dead-letter table committed batch 1 (ids 4, 5 in the
    table, 6 and 7 refused by the CHECK into the letters), its mark lost; restarted in
    append mode: before, the replay appended 4-7 again, each refused (a unique violation,
    a CHECK), and the letters held 4, 5 and 6, 7 twice. Refused now; switched back, the
    upsert replay completes the batch."""
    execute(pg_url, "CREATE TABLE t1 (id bigint PRIMARY KEY CHECK (id < 6))")
    ledger = str(tmp_path / "ledger")
    upsert = {"mode": "upsert", "keys": ["id"], "dead_letter": "postgres:dead"}
    _crash(spark, pg_url, ledger, range(4, 8), 1, **upsert)
    letters = "SELECT sink, (row->>'id')::int FROM dead ORDER BY 2, 1"
    assert _ids(pg_url, "t1") == [4, 5]
    assert query(pg_url, letters) == [("pg", 6), ("pg", 7)]

    switched = _fan(pg_url, ledger, keys=["id"], dead_letter="postgres:dead")
    with pytest.raises(BatchFailedError) as refused:
        switched.process(spark.range(4, 8), BatchInfo("pgmove", 1, "q"))
    with pytest.raises(BatchFailedError):  # the same FanOut again: refused again
        switched.process(spark.range(4, 8), BatchInfo("pgmove", 1, "q"))
    switched.close()
    text = str(refused.value.failures["pg"])
    assert "upsert_routes records partition(s) [0, 1] of batch 1 of this sink as " \
           "committed to table t1 in upsert mode" in text  # fmt: skip
    assert "Set mode back to 'upsert' and restart" in text
    assert _ids(pg_url, "t1") == [4, 5]
    # before: the batch "written", 4 rows refused: 4 and 5 as duplicate keys beside the
    # table's, 6 and 7 again (their partitions' letters replaced)
    assert query(pg_url, letters) == [("pg", 6), ("pg", 7)]

    back = _fan(pg_url, ledger, **upsert)
    back.process(spark.range(4, 8), BatchInfo("pgmove", 1, "q"))
    back.close()
    assert _ids(pg_url, "t1") == [4, 5]
    assert query(pg_url, letters) == [("pg", 6), ("pg", 7)]


def _crash_move_and_reset(spark: Any, pg_url: str, ledger: str, **options: Any) -> None:
    """Batch 0 marked; batch 1 committed into ``t1`` and its mark lost (the driver "dies");
    ``table`` moved to ``t2`` (holding 100) and the query started on a new checkpoint (a
    new epoch) with ``on_checkpoint_reset="new_epoch"``: the new epoch's first batch (batch
    1's offsets again) must land in ``t2`` once, ``t1`` keeping its copy, and the ledger
    record no lost mark."""
    from fanout.ledger.delta import DeltaLedger

    def info(batch: int, query_id: str, end: int) -> BatchInfo:
        return BatchInfo("pgmove", batch, query_id, [{"orders": {"0": end}}])

    _fan(pg_url, ledger, **options).process(spark.range(0, 4), info(0, "q", 4))
    with pytest.raises(BatchFailedError):  # the driver "dies" before the mark
        _fan(pg_url, MarkLost(ledger, "pg"), **options).process(spark.range(4, 8), info(1, "q", 8))
    sink = _sink(pg_url, table="t2", **options)
    reset = FanOut("pgmove", ledger, [sink], retries=0, on_checkpoint_reset="new_epoch")
    assert reset.process(spark.range(4, 8), info(0, "q2", 8))["pg"].rows == 4
    reset.close()
    assert _ids(pg_url, "t1") == [0, 1, 2, 3, 4, 5, 6, 7]
    assert _ids(pg_url, "t2") == [4, 5, 6, 7, 100]
    marks = sorted(
        (e.epoch, e.sink, e.batch_id, e.lost)
        for e in DeltaLedger(ledger).committed_entries("pgmove")
    )
    assert marks == [(0, "pg", 0, False), (1, "pg", 0, False)]


def test_a_checkpoint_reset_after_the_table_moved_writes_the_unmarked_batch_once(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """Batch 1 committed into ``t1``, its mark lost; ``table`` moved to ``t2`` (a row of its
    own) and the query started on a new checkpoint (a new epoch). Its start asks
    ``holds_batch`` about batch 1: t1's marks say nothing of t2 ("cannot tell"), so the
    start is not refused and records no lost mark, and the new epoch's first batch (batch
    1's offsets again) lands in t2 once; t1 keeps its copy. Before (6d2ea65): the marks
    answered True, the start was refused and batch 1's lost mark recorded, a batch t2
    never got."""
    execute(pg_url, "CREATE TABLE t1 (id bigint)", "CREATE TABLE t2 (id bigint)",
            "INSERT INTO t2 VALUES (100)")  # fmt: skip
    _crash_move_and_reset(spark, pg_url, str(tmp_path / "ledger"))


def test_an_append_sink_on_an_earlier_upsert_runs_records_is_told_of_the_restart(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """The mode-switch check finds the sink's ``upsert_routes`` of a *later* batch than the
    one Spark hands: no switch mid-batch (the ledger marks each batch before the next) but
    the pipeline started again, new ledger and checkpoint, under the same name, now in
    append mode. Refused (the upsert's own refusal of that restart is alike), saying so and
    printing the ``DELETE`` of the earlier run's records, which, run, lets it write."""
    execute(pg_url, "CREATE TABLE t1 (id bigint PRIMARY KEY)")
    upsert = {"mode": "upsert", "keys": ["id"]}
    first = _fan(pg_url, str(tmp_path / "ledger"), **upsert)
    first.process(spark.range(0, 2), BatchInfo("pgmove", 0, "q"))
    first.process(spark.range(2, 4), BatchInfo("pgmove", 1, "q"))
    first.close()
    again = _fan(pg_url, str(tmp_path / "ledger2"))  # a new ledger, append
    with pytest.raises(BatchFailedError) as refused:
        again.process(spark.range(10, 12), BatchInfo("pgmove", 0, "q2"))
    text = str(refused.value.failures["pg"])
    assert "upsert_routes records batch 1 of this sink committed to table t1" in text
    assert "checkpoint and ledger were replaced" in text and "Set mode back" not in text
    assert _ids(pg_url, "t1") == [0, 1, 2, 3]
    execute(pg_url, text[text.index("DELETE FROM") :])
    assert again.process(spark.range(10, 12), BatchInfo("pgmove", 0, "q2"))["pg"].rows == 2
    again.close()
    assert _ids(pg_url, "t1") == [0, 1, 2, 3, 10, 11]


def _oid(url: str, table: str) -> int:
    return int(query(url, f"SELECT '{table}'::regclass::oid::bigint")[0][0])


def _restore(url: str, keep: str) -> None:
    """``t1`` replaced by a copy of its rows ``keep`` selects (a dump restored: the same
    name, another OID, holding rows)."""
    execute(url, f"CREATE TABLE t1_dump AS SELECT * FROM t1 WHERE {keep}", "DROP TABLE t1",
            "ALTER TABLE t1_dump RENAME TO t1")  # fmt: skip


def test_the_same_name_on_another_table_between_a_crash_and_its_replay(
    spark: Any, pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Batch 1 committed into ``t1``, its mark lost; ``t1`` renamed away and another created
    under its name. The run's start refuses it (batch 0 lost, in the same words as the
    replay's refusal); accepted (``accept_lost_targets``), the replay writes all of batch 1
    into the new ``t1`` once. Before (bb398bc), the accepted replay skipped both marked
    partitions and reported the batch written: ``t1`` stayed empty. Then ``t1`` restored
    from a dump (another OID, holding rows) between a crash and the replay, which no start
    check refuses: taken before the crash, the replay is refused, and accepted writes the
    batch whole (before: skipped, ``t1`` without 8, 9); taken after it, the refusal's
    ``UPDATE`` lets the replay skip what the dump holds (each row once)."""
    execute(pg_url, "CREATE TABLE t1 (id bigint)")
    ledger = str(tmp_path / "ledger")
    _fan(pg_url, ledger).process(spark.range(0, 4), BatchInfo("pgmove", 0, "q"))
    _crash(spark, pg_url, ledger, range(4, 8), 1)  # the driver "dies" before the mark
    old = _oid(pg_url, "t1")
    execute(pg_url, "ALTER TABLE t1 RENAME TO t1_old", "CREATE TABLE t1 (id bigint)")
    new = _oid(pg_url, "t1")

    with pytest.raises(TargetLostError) as lost:
        _fan(pg_url, ledger).process(spark.range(4, 8), BatchInfo("pgmove", 1, "q"))
    text = str(lost.value)
    assert f"table t1 has OID {new} now, not {old}, which partition(s) 0, 1 of batch 0 " in text
    assert "renamed away, or dropped, and another created under its name" in text
    assert _ids(pg_url, "t1") == []

    accepted = FanOut("pgmove", ledger, [_sink(pg_url)], retries=0, accept_lost_targets=["pg"])
    result = accepted.process(spark.range(4, 8), BatchInfo("pgmove", 1, "q"))["pg"]
    assert (result.already_written, result.rows) == (False, 4)  # before: True, 0
    assert _ids(pg_url, "t1") == [4, 5, 6, 7]  # before: []
    assert _ids(pg_url, "t1_old") == [0, 1, 2, 3, 4, 5, 6, 7]

    # a dump taken before the crash of batch 2: no start check refuses it (t1 holds rows)
    _crash(spark, pg_url, ledger, range(8, 10), 2)
    accepted.close()
    crashed = _oid(pg_url, "t1")
    _restore(pg_url, "id < 8")
    plain = _fan(pg_url, ledger)
    text = _refusal(plain, spark.range(8, 10), 2)
    plain.close()
    now = _oid(pg_url, "t1")
    assert (
        f"partition(s) [0, 1] of batch 2 of this sink as committed to table t1 (OID "
        f"{crashed}: no table of this database has that OID now), but table t1 has OID "
        f"{now} now" in text
    )
    assert "A dump taken after the crash may already hold them" in text
    # the dump replaced a dropped table: no "bring it back" (before: printed all the same)
    assert (
        f"No table of this database has OID {crashed} now (dropped, or the database "
        "restored from a dump), so none can take the batch back. Accept the loss for this "
        "run" in text
    ), text
    assert "Bring the table" not in text
    assert _ids(pg_url, "t1") == [4, 5, 6, 7]  # before: the batch "written", without 8, 9
    again = FanOut("pgmove", ledger, [_sink(pg_url)], retries=0, accept_lost_targets=["pg"])
    caplog.clear()
    assert again.process(spark.range(8, 10), BatchInfo("pgmove", 2, "q"))["pg"].rows == 2
    again.close()
    # the start finds batch 1 held, yet the flag is what writes batch 2: not "drop the flag"
    assert (
        "holds batch 1 of epoch 0, which the ledger marks written there: there is no loss to "
        "accept at the start: drop the flag, unless the sink's refusal of a replayed batch "
        "named it (left on, it accepts this target's next loss unseen)" in caplog.text
    ), caplog.text
    assert _ids(pg_url, "t1") == [4, 5, 6, 7, 8, 9]

    # a dump taken after the crash of batch 3: it holds 10, 11; the UPDATE printed
    _crash(spark, pg_url, ledger, range(10, 12), 3)
    _restore(pg_url, "true")
    plain = _fan(pg_url, ledger)
    text = _refusal(plain, spark.range(10, 12), 3)
    execute(pg_url, text[text.index("UPDATE ") :])
    assert plain.process(spark.range(10, 12), BatchInfo("pgmove", 3, "q"))["pg"].already_written
    plain.close()
    assert _ids(pg_url, "t1") == [4, 5, 6, 7, 8, 9, 10, 11]


def test_a_mode_switched_between_runs_writes_on(
    spark: Any, pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Upsert wrote and marked batch 0; the next run in append mode: the table holds batch 0
    (by its ``upsert_routes`` rows), so the start check passes, saying the mode switched and
    what that means, and the run appends batch 1; switched back to upsert, batch 1 (by its
    progress marks) is held too, and batch 2 upserts (key 5 updated, not added). Before
    (bb398bc), each switch was refused: ``holds_batch`` read only the current mode's
    records, and the message said the table was "created again empty"."""
    execute(pg_url, "CREATE TABLE t1 (id bigint PRIMARY KEY, v text)")
    ledger = str(tmp_path / "ledger")

    def rows(start: int, end: int, v: str) -> Any:
        return spark.range(start, end).selectExpr("id", f"'{v}' AS v")

    _fan(pg_url, ledger, mode="upsert", keys=["id"]).process(
        rows(0, 2, "a"), BatchInfo("pgmove", 0, "q")
    )
    appended = _fan(pg_url, ledger)
    assert appended.process(rows(4, 6, "b"), BatchInfo("pgmove", 1, "q"))["pg"].rows == 2
    appended.close()
    assert (
        "batch 0 (pgmove) was written in upsert mode, and the sink is in append mode now: "
        "option 'mode' switched since; the table holds the batch by its upsert records, and "
        "the sink appends each row of its later batches: a key the table holds already is a "
        "second row, or under a unique index a refused row (kept in the dead-letter target; "
        "without one its batch fails, naming the row)" in caplog.text
    )
    upserted = _fan(pg_url, ledger, mode="upsert", keys=["id"])
    assert upserted.process(rows(5, 7, "c"), BatchInfo("pgmove", 2, "q"))["pg"].rows == 2
    upserted.close()
    assert "batch 1 (pgmove) was written in append mode" in caplog.text
    assert query(pg_url, "SELECT id, v FROM t1 ORDER BY id") == [
        (0, "a"), (1, "a"), (4, "b"), (5, "c"), (6, "c")
    ]  # fmt: skip


def test_a_checkpoint_reset_after_an_upsert_table_moved_writes_the_unmarked_batch_once(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """The upsert case of the test above, with a ``postgres:`` dead-letter target (without
    one the rewrite is harmless and not asked): batch 1 committed into ``t1``, its mark
    lost, ``table`` moved to ``t2`` and the query started on a new checkpoint. Its
    ``upsert_routes`` rows now name ``t1`` (migration ``0008_upsert_routes_target``), so
    the start cannot tell (not refused, no lost mark), and the new epoch writes batch 1
    into ``t2`` once. Before (bb398bc): the rows, with only an OID, counted as holding the
    batch and the start was refused."""
    execute(pg_url, "CREATE TABLE t1 (id bigint PRIMARY KEY)",
            "CREATE TABLE t2 (id bigint PRIMARY KEY)", "INSERT INTO t2 VALUES (100)")  # fmt: skip
    upsert = {"mode": "upsert", "keys": ["id"], "dead_letter": "postgres:dead"}
    _crash_move_and_reset(spark, pg_url, str(tmp_path / "ledger"), **upsert)


def test_an_accepted_replay_that_fails_between_its_partitions_completes_once(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """The accepted replay (``accept_lost_targets``) of a batch whose marks name a table
    replaced under ``t1``'s name fails after partition 0 committed into the new ``t1`` and
    before partition 1 (vetoed: the kill point between partitions, in-process). The next
    replay, without the flag (batch 1) or with it again (batch 2), writes only what is
    missing: each row once in the new ``t1``."""
    from fanout.testing.faults import VetoOnce

    execute(pg_url, "CREATE TABLE t1 (id bigint)")
    ledger = str(tmp_path / "ledger")
    _fan(pg_url, ledger).process(spark.range(0, 4), BatchInfo("pgmove", 0, "q"))
    for batch, accepted_again in ((1, False), (2, True)):
        rows = spark.range(10 * batch, 10 * batch + 6)
        with pytest.raises(BatchFailedError):  # the driver "dies" before the mark
            _fan(pg_url, MarkLost(ledger, "pg")).process(rows, BatchInfo("pgmove", batch, "q"))
        execute(pg_url, f"ALTER TABLE t1 RENAME TO t1_{batch}", "CREATE TABLE t1 (id bigint)")
        veto = VetoOnce(batch=batch, partition=1, state=str(tmp_path / f"veto{batch}"), sink="pg")
        accepted = FanOut("pgmove", ledger, [_sink(pg_url)], retries=0,
                          accept_lost_targets=["pg"], plugins=[veto])  # fmt: skip
        with pytest.raises(BatchFailedError):
            accepted.process(rows, BatchInfo("pgmove", batch, "q"))
        accepted.close()
        partial = _ids(pg_url, "t1")
        assert 0 < len(partial) < 6 and set(partial) < set(range(10 * batch, 10 * batch + 6))
        options: dict[str, Any] = {"accept_lost_targets": ["pg"]} if accepted_again else {}
        again = FanOut("pgmove", ledger, [_sink(pg_url)], retries=0, **options)
        result = again.process(rows, BatchInfo("pgmove", batch, "q"))["pg"]
        again.close()
        assert _ids(pg_url, "t1") == list(range(10 * batch, 10 * batch + 6))
        assert (result.already_written, result.rows) == (False, 6)  # the marked one counted
        assert result.details["written"] == 6 - len(partial)
        assert result.details["skipped_partitions"] == [0]


def test_an_accepted_replay_whose_marks_name_two_replaced_tables_writes_the_batch_whole(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """Batch 1's partition 0 committed into ``t1`` (OID A), then ``t1`` replaced (OID B)
    and partition 1 committed there, the mark lost; replaced again (OID C) before the
    replay. Not accepted, the refusal names both replaced tables at once (before: OID A
    only, and the next run, after A was dealt with, named B) and says no one of them can
    take the batch back. Accepted, the replay writes all of batch 1 into ``t1`` (C): the
    marks of both replaced tables are forgotten, not only those of the first OID read."""
    execute(pg_url, "CREATE TABLE t1 (id bigint)")
    ledger = str(tmp_path / "ledger")
    _crash(spark, pg_url, ledger, range(4, 8), 1)  # the driver "dies" before the mark
    first = _oid(pg_url, "t1")
    execute(pg_url, "ALTER TABLE t1 RENAME TO t1_a", "CREATE TABLE t1 (id bigint)")
    mid = _oid(pg_url, "t1")  # partition 1 committed here, mid-batch
    execute(
        pg_url,
        f"UPDATE fanout.progress SET target_oid = {mid} WHERE pipeline = 'pgmove' AND "
        "sink = 'pg' AND batch_id = 1 AND partition = 1",
        "ALTER TABLE t1 RENAME TO t1_b",
        "CREATE TABLE t1 (id bigint)",
    )
    plain = _fan(pg_url, ledger)
    text = _refusal(plain, spark.range(4, 8), 1)
    plain.close()
    now = _oid(pg_url, "t1")
    assert (
        f"fanout.progress marks partition(s) [0] of batch 1 of this sink as committed to "
        f"table t1 (OID {first}, now public.t1_a), and partition(s) [1] to table t1 (OID "
        f"{mid}, now public.t1_b), but table t1 has OID {now} now" in text
    ), text
    assert (
        f"The batch's committed partitions are in 2 tables (OIDs {first}, {mid}), so "
        "bringing one back under the name t1 cannot complete it. Accept the loss for this "
        "run (`fanout run PIPELINE.toml --accept-lost-target pg`" in text
    ), text
    assert f"AND target_oid IN ({first}, {mid})" in text
    assert _ids(pg_url, "t1") == []
    accepted = FanOut("pgmove", ledger, [_sink(pg_url)], retries=0, accept_lost_targets=["pg"])
    result = accepted.process(spark.range(4, 8), BatchInfo("pgmove", 1, "q"))["pg"]
    accepted.close()
    assert (result.already_written, result.rows) == (False, 4)
    assert _ids(pg_url, "t1") == [4, 5, 6, 7]


def test_the_printed_update_runs_as_printed_on_a_quoted_state_schema_and_a_qualified_table(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """The refusal's ``UPDATE`` (a dump taken after the crash), run exactly as printed, with
    ``state_schema`` needing quotes and ``table`` schema-qualified: the replay then skips
    the committed partitions, each row once."""
    execute(pg_url, "CREATE TABLE t1 (id bigint)")
    ledger = str(tmp_path / "ledger")
    options = {"state_schema": "Fan State", "table": "public.t1"}
    _crash(spark, pg_url, ledger, range(0, 4), 0, **options)  # the driver "dies" before the mark
    crashed = _oid(pg_url, "t1")
    _restore(pg_url, "true")
    plain = _fan(pg_url, ledger, **options)
    text = _refusal(plain, spark.range(0, 4), 0)
    assert (
        f"Fan State.progress marks partition(s) [0, 1] of batch 0 of this sink as committed "
        f"to table public.t1 (OID {crashed}: no table of this database has that OID now), "
        f"but table public.t1 has OID "
        f"{_oid(pg_url, 't1')} now" in text
    ), text
    execute(pg_url, text[text.index("UPDATE ") :])
    assert plain.process(spark.range(0, 4), BatchInfo("pgmove", 0, "q"))["pg"].already_written
    plain.close()
    assert _ids(pg_url, "t1") == [0, 1, 2, 3]


def test_the_printed_update_over_two_replaced_tables_runs_as_printed(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """Marks of batch 0 name two tables replaced under ``t1`` (partition 0 in A, partition 1
    in B), and ``t1`` is now a dump holding the whole batch: the refusal's ``UPDATE``, run
    as printed, makes both marks name it, and the replay skips both partitions (each row
    once)."""
    execute(pg_url, "CREATE TABLE t1 (id bigint)")
    ledger = str(tmp_path / "ledger")
    _crash(spark, pg_url, ledger, range(0, 4), 0)  # the driver "dies" before the mark
    execute(
        pg_url,
        "UPDATE fanout.progress SET target_oid = 1 WHERE partition = 1",  # B: gone since
    )
    _restore(pg_url, "true")
    plain = _fan(pg_url, ledger)
    text = _refusal(plain, spark.range(0, 4), 0)
    assert "AND target_oid IN (" in text, text
    execute(pg_url, text[text.index("UPDATE ") :])
    assert plain.process(spark.range(0, 4), BatchInfo("pgmove", 0, "q"))["pg"].already_written
    plain.close()
    assert _ids(pg_url, "t1") == [0, 1, 2, 3]


def test_a_search_path_switched_between_a_crash_and_its_replay(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """Batch 1 committed into ``app.t1`` through the URL's ``search_path=app``, its mark
    lost; the replay's URL has no search path, so ``t1`` is ``public.t1``. Refused, the
    message says where the marked table is now and that the search path may have changed
    (before: "bring the table of OID ... back under the name t1, once the table named t1
    now is renamed away or dropped", of a table never renamed); its way on, option
    ``table`` set to ``app.t1`` as printed, completes the batch: each id once in
    ``app.t1``, none in ``public.t1``."""
    execute(pg_url, "CREATE SCHEMA app", "CREATE TABLE app.t1 (id bigint)",
            "CREATE TABLE public.t1 (id bigint)")  # fmt: skip
    ledger = str(tmp_path / "ledger")
    url = pg_url + ("&" if "?" in pg_url else "?") + "options=-csearch_path%3Dapp"
    _crash(spark, url, ledger, range(4, 8), 1)  # the driver "dies" before the mark
    plain = _fan(pg_url, ledger)
    text = _refusal(plain, spark.range(4, 8), 1)
    plain.close()
    app = _oid(pg_url, "app.t1")
    assert (
        f"committed to table t1 (OID {app}, now app.t1), but table t1 has OID "
        f"{_oid(pg_url, 'public.t1')} now" in text
    ), text
    assert (
        f"Bring the table of OID {app} (app.t1 now) back under the name t1 (ALTER TABLE ... "
        "RENAME TO, or SET SCHEMA), once the table named t1 now is renamed away or dropped, "
        "or set option table to app.t1, and restart: the replay completes batch 1 there. "
        "If app.t1 never moved, the name t1 resolves to another table than at the crash: "
        "the search path changed" in text
    ), text
    assert (_ids(pg_url, "app.t1"), _ids(pg_url, "public.t1")) == ([4, 5, 6, 7], [])
    printed = text[text.index("set option table to ") + len("set option table to ") :]
    named = _fan(pg_url, ledger, table=printed[: printed.index(",")])
    result = named.process(spark.range(4, 8), BatchInfo("pgmove", 1, "q"))["pg"]
    named.close()
    assert result.already_written
    assert (_ids(pg_url, "app.t1"), _ids(pg_url, "public.t1")) == ([4, 5, 6, 7], [])


def test_a_table_moved_to_another_schema_with_the_option_completes_its_batch(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """Batch 1 committed into ``t1``, its mark lost; ``ALTER TABLE t1 SET SCHEMA app`` and
    option ``table`` set to ``app.t1``: the same OID under another name is the same table,
    so the replay is not refused and skips both marked partitions, each id once."""
    execute(pg_url, "CREATE SCHEMA app", "CREATE TABLE t1 (id bigint)")
    ledger = str(tmp_path / "ledger")
    _crash(spark, pg_url, ledger, range(4, 8), 1)  # the driver "dies" before the mark
    execute(pg_url, "ALTER TABLE t1 SET SCHEMA app")
    moved = _fan(pg_url, ledger, table="app.t1")
    result = moved.process(spark.range(4, 8), BatchInfo("pgmove", 1, "q"))["pg"]
    moved.close()
    assert (result.already_written, result.details["skipped_partitions"]) == (True, [0, 1])
    assert _ids(pg_url, "app.t1") == [4, 5, 6, 7]
