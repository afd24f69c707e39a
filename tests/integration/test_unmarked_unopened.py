"""A lagging sink that wrote a batch and lost its mark, and cannot be reached when the new
epoch starts (ARCHITECTURE §5, "A batch written but never marked").

The start asks each *open* sink whether it holds the batch after its mark. A sink with
``on_failure="lag"`` whose ``open()`` failed was not asked: the epoch started, the new
query re-read the batch's input (``fanout recover`` resumes after the other sink's mark),
and once PostgreSQL was back the catch-up appended those rows a second time. Now the start
is refused until the sink can be asked. Real Spark, Delta ledger, lake and spool, the
embedded PostgreSQL.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from fanout import BatchInfo, FanOut, hookimpl
from fanout.errors import UnmarkedBatchError
from tests.integration import two_sink_resets as resets
from tests.integration.streams import delta_rows
from tests.integration.two_sink_resets import NEW, OLD, ROWS

PIPELINE = "unopened"


class DriverKilled(BaseException):
    """The driver's death, between the PostgreSQL sink's commit and its mark."""


class KillAfterPostgresWrote:
    """Kills the driver right after ``pg`` wrote batch 1, before its mark (and before the
    lake's write of it)."""

    @hookimpl
    def fanout_sink_done(self, info: BatchInfo, sink: str, result: Any, duration_s: float) -> None:
        if info.batch_id == 1 and sink == "pg":
            raise DriverKilled("killed between the write and the mark")

    @hookimpl
    def fanout_sink_start(self, info: BatchInfo, sink: str, attempt: int) -> None:
        if info.batch_id == 1 and sink == "lake":
            raise DriverKilled("killed before the lake's write")


def _fan(tmp_path: Path, url: str, *plugins: object, on_reset: str = "refuse") -> FanOut:
    return FanOut(
        PIPELINE, str(tmp_path / "ledger"),
        [{"type": "postgres", "name": "pg", "url": url, "table": "orders", "mode": "append",
          "create_table": True, "on_failure": "lag", "retries": 0},
         {"type": "delta", "name": "lake", "path": str(tmp_path / "lake")}],
        plugins=plugins, parallelism=1, retries=0, backoff_s=0, spool=str(tmp_path / "spool"),
        probe_interval_s=3600, on_checkpoint_reset=on_reset,  # type: ignore[arg-type]
    )  # fmt: skip


def _pg_ids(url: str) -> Counter[int]:
    import psycopg2

    from tests.chaos.checker import libpq_url

    with psycopg2.connect(libpq_url(url)) as conn, conn.cursor() as cur:
        cur.execute("SELECT id FROM orders")
        return Counter(int(r[0]) for r in cur.fetchall())


def _refused_start(
    spark: Any, tmp_path: Path, pg: Any, url: str
) -> tuple[FanOut, pytest.ExceptionInfo[UnmarkedBatchError]]:
    """PostgreSQL wrote batch 1 and lost its mark, then is down when the new checkpoint
    starts after batch 0: the new FanOut (to close) and its refused start."""
    pg.start()
    old = _fan(tmp_path, url, KillAfterPostgresWrote())
    try:
        resets.run(old, spark, OLD, 0, 0)
        with pytest.raises(DriverKilled):
            resets.run(old, spark, OLD, 1, ROWS)
    finally:
        old.close()
    assert _pg_ids(url) == Counter(range(2 * ROWS))  # batch 1 in PostgreSQL, unmarked
    pg.stop()
    new = _fan(tmp_path, url, on_reset="new_epoch")
    try:
        assert new.unopened == ("pg",)
        with pytest.raises(UnmarkedBatchError) as refused:
            resets.run(new, spark, NEW, 0, ROWS)  # batch 1's rows again
    except BaseException:
        new.close()
        raise
    return new, refused


def test_the_refusals_other_way_on_starts_the_epoch_without_the_sink(
    spark: Any, tmp_path: Path, server: tuple[Any, str]
) -> None:
    """ "Or start it without the sink", as printed: the pipeline without ``pg`` starts epoch
    1 (the lake gets batch 1's rows once), and ``pg`` gets nothing of it."""
    pg, url = server
    new, refused = _refused_start(spark, tmp_path, pg, url)
    new.close()
    assert str(refused.value).endswith(
        "Or start it without the sink (it then gets nothing of epoch 1)."
    )
    lake = FanOut(
        PIPELINE, str(tmp_path / "ledger"),
        [{"type": "delta", "name": "lake", "path": str(tmp_path / "lake")}],
        parallelism=1, retries=0, backoff_s=0, spool=str(tmp_path / "spool"),
        on_checkpoint_reset="new_epoch",
    )  # fmt: skip
    try:
        resets.run(lake, spark, NEW, 0, ROWS)
    finally:
        lake.close()
    assert sorted(r["id"] for r in delta_rows(tmp_path / "lake")) == list(range(2 * ROWS))
    assert resets.marks(tmp_path) == [(0, "lake", 0), (0, "pg", 0), (1, "lake", 0)]
    pg.start()
    assert _pg_ids(url) == Counter(range(2 * ROWS))


def test_a_lagging_sink_that_cannot_be_opened_is_asked_before_the_new_epoch_starts(
    spark: Any, tmp_path: Path, server: tuple[Any, str]
) -> None:
    pg, url = server
    new, refused = _refused_start(spark, tmp_path, pg, url)
    try:
        pg.start()
        new.final_catch_up()
    finally:
        new.close()
    assert str(refused.value).startswith(
        f"pipeline '{PIPELINE}': query {NEW} cannot start epoch 1: sink pg could not be "
        "opened, so it was not asked whether it holds batch 1 of epoch 0 (the batch after "
        "its mark 0) by its own records: the driver may have died between its write of that "
        "batch and its mark, and epoch 1 would write the batch's rows to it again. Nothing "
        "was written under epoch 1.\nStart the query again once sink pg can be opened (its "
        "error: "
    )
    assert str(refused.value).endswith(
        "): it is then asked. Or start it without the sink (it then gets nothing of epoch 1)."
    )
    assert _pg_ids(url) == Counter(range(2 * ROWS))  # each row once
    assert sorted(r["id"] for r in delta_rows(tmp_path / "lake")) == list(range(ROWS))
    assert resets.marks(tmp_path) == [(0, "lake", 0), (0, "pg", 0)]

    again = _fan(tmp_path, url, on_reset="new_epoch")  # PostgreSQL is up: asked, it holds it
    try:
        with pytest.raises(UnmarkedBatchError, match="sink pg holds batch 1 of epoch 0"):
            resets.run(again, spark, NEW, 0, ROWS)
    finally:
        again.close()
    assert _pg_ids(url) == Counter(range(2 * ROWS))
