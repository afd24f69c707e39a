"""A checkpoint reset while a PostgreSQL append sink lags with spooled batches of the old
epoch: the new epoch's start closes the old epoch's scope to the sink's writes still in
flight (its epoch fence mark in ``fanout.progress``, docs/architecture.md §8.2, "A straggler
of an earlier batch") only for the sinks it asks whether they hold the replaced epoch's
last batch; a sink whose spool holds that batch is not asked, and is fenced at its first
batch of the new epoch, after its catch-up wrote the old epoch's spooled batches in the old
scope. Were it fenced at the start, its catch-up would be refused for good and the sink
would never get those rows. Both when the catch-up comes in the process that started the
new epoch and when it comes in a later process of that epoch (the sink still lagging in the
old epoch at that process's start). Every order once in the table, each batch marked once.
Real Spark, a real Delta lake, ledger and spool, the embedded PostgreSQL."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from fanout import FanOut
from fanout.app.cli import main
from tests.integration.streams import delta_rows, run_stream, write_input

PIPELINE = "afence"
FENCE = 2**63 - 1


def _fan(tmp_path: Path, url: str, **kw: Any) -> FanOut:
    return FanOut(
        PIPELINE, str(tmp_path / "ledger"),
        [{"type": "delta", "name": "lake", "path": str(tmp_path / "lake")},
         {"type": "postgres", "name": "pg", "url": url, "table": "orders", "mode": "append",
          "on_failure": "lag", "retries": 0}],
        retries=0, backoff_s=0, spool=str(tmp_path / "spool"), probe_interval_s=3600, **kw,
    )  # fmt: skip


def _query(url: str, sql: str) -> list[tuple[Any, ...]]:
    import psycopg2

    from tests.chaos.checker import libpq_url

    with psycopg2.connect(libpq_url(url)) as conn, conn.cursor() as cur:
        cur.execute(sql)
        return [tuple(r) for r in cur.fetchall()] if cur.description else []


@pytest.mark.parametrize("catch_up", ["same process", "next process"])
def test_a_lagging_append_sink_gets_the_old_epochs_spooled_batches_after_a_reset(
    spark: Any,
    tmp_path: Path,
    server: tuple[Any, str],
    capsys: pytest.CaptureFixture[str],
    catch_up: str,
) -> None:
    pg, url = server
    inputs = tmp_path / "input"
    write_input(inputs, 1, 3)  # batch 0: orders 0-2
    pg.start()
    _query(url, "CREATE TABLE orders (order_id bigint, customer text, "
                "amount double precision, status text)")  # fmt: skip
    first = _fan(tmp_path, url)
    try:
        run_stream(spark, inputs, first, tmp_path / "checkpoint")  # batch 0: lake and pg
    finally:
        first.close()
    pg.stop()

    write_input(inputs, 2, 3, start_file=1)  # batches 1, 2: orders 3-8
    second = _fan(tmp_path, url)  # PostgreSQL is down: both spooled for pg
    try:
        run_stream(spark, inputs, second, tmp_path / "checkpoint")
        assert second.spool is not None
        spooled = [(b.key, sorted(b.needed_by)) for b in second.spool.batches()]
        assert spooled == [((0, 1), ["pg"]), ((0, 2), ["pg"])]
    finally:
        second.close()

    ledger, spool = str(tmp_path / "ledger"), str(tmp_path / "spool")
    assert main(["recover", "--ledger", ledger, "--pipeline", PIPELINE, "--spool", spool]) == 0
    out = capsys.readouterr().out
    resume = re.search(r"Resume after batch (\d+)", out)
    assert resume is not None and resume.group(1) == "2", out

    # the reset: a new checkpoint reads the files after batch 2 (orders 9-11 its batch 0)
    after = tmp_path / "input-new"
    write_input(after, 1, 3, start_file=3)
    if catch_up == "same process":
        pg.start()
    third = _fan(tmp_path, url, on_checkpoint_reset="new_epoch")
    try:
        run_stream(spark, after, third, tmp_path / "checkpoint-new")
        assert third.spool is not None
        if catch_up == "same process":
            assert third.catch_up(timeout_s=120)["pg"].state == "live"
            assert third.spool.size()[0] == 0
        else:  # pg still down: epoch 1's batch 0 spooled behind epoch 0's batches 1, 2
            keys = [b.key for b in third.spool.batches()]
            assert keys == [(0, 1), (0, 2), (1, 0)]
    finally:
        third.close()

    if catch_up == "next process":
        pg.start()
    write_input(after, 1, 3, start_file=4)  # epoch 1's batch 1 (orders 12-14), a new run
    fourth = _fan(tmp_path, url, on_checkpoint_reset="new_epoch")
    try:
        if catch_up == "next process":  # the restart: pg lags in epoch 0 still
            assert fourth.catch_up(timeout_s=120)["pg"].state == "live"
        run_stream(spark, after, fourth, tmp_path / "checkpoint-new")
        assert fourth.spool is not None and fourth.spool.size()[0] == 0
    finally:
        fourth.close()

    table = _query(url, "SELECT order_id FROM orders ORDER BY order_id")
    assert table == [(i,) for i in range(15)]
    fences = _query(
        url, "SELECT pipeline, sink, partition FROM fanout.progress WHERE batch_id = "
             f"{FENCE} ORDER BY pipeline",
    )  # fmt: skip
    assert fences == [(PIPELINE, "pg", -1)]
    marks = sorted(
        (r["epoch"], r["batch_id"]) for r in delta_rows(tmp_path / "ledger")
        if r["sink"] == "pg" and r["status"] == "committed"
    )  # fmt: skip
    assert marks == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
