"""The PostgreSQL sink's own records gone (``fanout.progress`` rows deleted) while its table
still holds the rows: the run is refused with a ``SinkRecordsGoneError`` naming the sink,
the batch and what is gone, not a ``TargetLostError`` "created again empty", and never
appends a batch a second time; with the records put back, every batch is held once.

(i) a clean run, its records deleted between runs; (ii) the driver killed (a real
subprocess) after the sink committed batch 2 and before its ledger mark, the records
deleted before the restart: without them the replay of batch 2 would append it again."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from pg_data import latest, write_files
from pg_driver import PIPELINE, drive, restart
from pgcheck import execute, id_counts, query

from fanout.testing.faults import KILL_EXIT_CODE
from tests.integration.streams import committed_marks

ROWS = 20
SAVE = "CREATE TABLE public.saved_progress AS SELECT * FROM fanout.progress"
DELETE = "DELETE FROM fanout.progress"
PUT_BACK = "INSERT INTO fanout.progress SELECT * FROM public.saved_progress"


def _ids(files: list[list[dict[str, Any]]]) -> Counter[int]:
    return Counter(r["id"] for chunk in files for r in chunk)


def _refusal_names_records_gone(text: str, batch: int) -> None:
    """The refusal's key parts: the error, the sink, the batch, what is gone, the ways on."""
    assert "SinkRecordsGoneError" in text, text[-3000:]
    assert (
        f"pipeline {PIPELINE!r}, sink 'events': its own records of batch {batch} of epoch 0, "
        "which the ledger marks written to table 'events'"
    ) in text
    assert (
        f"fanout.progress holds no progress mark of batch {batch} of sink 'events' under "
        f"pipeline scope {PIPELINE!r} and fanout.upsert_routes no row of it, nor any record "
        "of the sink under that pipeline scope, while table events is not empty"
    ) in text
    assert "created again empty" not in text
    assert "Ways on: restore the sink's records" in text
    assert "--accept-lost-target events" in text or "accept_lost_targets=['events']" in text


def test_records_deleted_between_runs_refuse_the_run_until_put_back(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    files = write_files(tmp_path / "input", files=2, rows=ROWS, step=ROWS)  # unique ids
    assert restart(spark, tmp_path, pg_url) == ""
    assert id_counts(pg_url) == _ids(files)
    execute(pg_url, SAVE, DELETE)

    files += write_files(tmp_path / "more", files=4, rows=ROWS, step=ROWS)[2:]
    for f in (tmp_path / "more").iterdir():
        if f.name >= "part-0002":
            f.rename(tmp_path / "input" / f.name)
    # a password in the URL (the server trusts local connections: it is not checked)
    with_password = pg_url.replace("postgres@", "postgres:pw-s3cr3t-x@", 1)
    refused = restart(spark, tmp_path, with_password)
    _refusal_names_records_gone(refused, 1)
    assert "s3cr3t" not in refused
    assert id_counts(pg_url) == _ids(files[:2])  # nothing written
    assert committed_marks(tmp_path / "ledger", PIPELINE) == {("events", b): 1 for b in (0, 1)}

    execute(pg_url, PUT_BACK)
    assert restart(spark, tmp_path, pg_url) == ""
    assert id_counts(pg_url) == _ids(files)  # each id once
    assert committed_marks(tmp_path / "ledger", PIPELINE) == {("events", b): 1 for b in range(4)}


def test_a_batch_written_unmarked_is_not_appended_again_once_the_records_are_gone(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    files = write_files(tmp_path / "input", files=4, rows=ROWS, step=ROWS)
    killed = drive(tmp_path, pg_url, "--kill-after-write", "2")
    assert killed.returncode == KILL_EXIT_CODE, killed.stderr[-3000:]
    assert id_counts(pg_url) == _ids(files[:3])  # batch 2 committed, unmarked
    assert committed_marks(tmp_path / "ledger", PIPELINE) == {("events", b): 1 for b in (0, 1)}
    execute(pg_url, SAVE, DELETE)

    refused = restart(spark, tmp_path, pg_url)
    _refusal_names_records_gone(refused, 1)
    assert "a batch written after batch 1 and never marked" in refused
    assert id_counts(pg_url) == _ids(files[:3])  # batch 2 not appended a second time

    execute(pg_url, PUT_BACK)
    assert restart(spark, tmp_path, pg_url) == ""
    assert id_counts(pg_url) == _ids(files)  # batch 2 skipped by its marks, each id once
    assert committed_marks(tmp_path / "ledger", PIPELINE) == {("events", b): 1 for b in range(4)}


def _hook_sink(spark: Any, pg_url: str, mode: str = "append", **options: Any) -> Any:
    """A sink of table ``t`` (one partition) opened as ``FanOut`` opens it, for its hook."""
    from fanout_postgres import PostgresSink

    from fanout.testing import open_sink

    execute(pg_url, "CREATE TABLE t (id bigint PRIMARY KEY, name text NOT NULL)")
    keys = {"keys": ["id"]} if mode == "upsert" else {}
    return open_sink(
        PostgresSink("pg", url=pg_url, table="t", mode=mode, partitions=1, **keys, **options),
        "hook",
    )


def _write(spark: Any, sink: Any, batch_id: int, rows: list[tuple[int, str | None]]) -> int:
    from fanout.contract.batch import Batch, BatchInfo

    frame = spark.createDataFrame(rows, "id LONG, name STRING")
    info = BatchInfo("hook", batch_id, "q0")
    return int(sink.write(Batch(frame, info, "pg", "fanout/hook/pg")).rows)


def test_records_pruned_by_the_sink_itself_are_not_records_gone(spark: Any, pg_url: str) -> None:
    """The sink prunes its own marks older than KEEP_MARKS (100) batches: batch 0 wrote
    rows, batch 101's only row went to the dead letters (a mark of 0 rows, so the ledger's
    last mark that wrote rows is still batch 0) and its mark pruned batch 0's. Not "records
    gone": a new epoch's start asks about batch 0 (the ledger's last mark that wrote rows),
    and a reason there refused a healthy pipeline at every checkpoint reset."""
    sink = _hook_sink(spark, pg_url, dead_letter="postgres:rejects")
    assert _write(spark, sink, 0, [(1, "a"), (2, "b")]) == 2
    assert _write(spark, sink, 101, [(3, None)]) == 0  # NOT NULL: refused, dead-lettered
    assert query(pg_url, "SELECT batch_id, rows FROM fanout.progress ORDER BY 1") == [(101, 0)]
    assert sink.holds_batch("hook", 0, 101) is True
    assert sink.records_gone("hook", 0, 0) is None
    execute(pg_url, DELETE)  # all of them deleted: that is records gone
    gone = sink.records_gone("hook", 0, 0)
    assert gone is not None and gone.startswith(
        "fanout.progress holds no progress mark of batch 0 of sink 'pg' under pipeline scope "
        "'hook' and fanout.upsert_routes no row of it, nor any record of the sink"
    ), gone


def test_a_table_emptied_by_delete_is_a_lost_target_not_records_gone(
    spark: Any, pg_url: str
) -> None:
    """``DELETE FROM t`` without a vacuum leaves its heap's pages: its size is not 0, but it
    holds no row. With its records gone too, that is a lost target (``None``), not "the
    target still holds rows"."""
    sink = _hook_sink(spark, pg_url)
    assert _write(spark, sink, 0, [(1, "a"), (2, "b")]) == 2
    execute(pg_url, DELETE)
    assert sink.records_gone("hook", 0, 0) is not None  # the rows are there
    execute(pg_url, "DELETE FROM t")
    assert query(pg_url, "SELECT pg_relation_size('t') > 0") == [(True,)]
    assert sink.records_gone("hook", 0, 0) is None


def test_upsert_records_gone_pass_as_its_rewrite_is_harmless(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """Upsert by key without a dead-letter target (``harmless_rewrite``): its
    ``upsert_routes`` rows deleted after batch 2 was written and never marked (a real
    subprocess killed), the restart neither refuses (no loss, no duplicate to prevent) nor
    keeps a key twice: batch 2 upserted again, each id once, holding its last file's row."""
    files = write_files(tmp_path / "input", files=4, rows=ROWS, step=ROWS // 2)  # overlapping
    killed = drive(tmp_path, pg_url, "--kill-after-write", "2", "--mode", "upsert")
    assert killed.returncode == KILL_EXIT_CODE, killed.stderr[-3000:]
    assert committed_marks(tmp_path / "ledger", PIPELINE) == {("events", b): 1 for b in (0, 1)}
    assert query(pg_url, "SELECT count(*) FROM fanout.upsert_routes") != [(0,)]
    execute(pg_url, "DELETE FROM fanout.upsert_routes")

    assert restart(spark, tmp_path, pg_url, mode="upsert") == ""
    assert id_counts(pg_url) == Counter(latest(files).keys())  # each id once
    rows = query(pg_url, "SELECT id, customer, amount, version FROM events ORDER BY id")
    assert rows == [tuple(r.values()) for _, r in sorted(latest(files).items())]
    assert committed_marks(tmp_path / "ledger", PIPELINE) == {("events", b): 1 for b in range(4)}
