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

from pathlib import Path
from typing import Any

import pytest

from fanout import FanOut
from tests.in_process_cli import Cli
from tests.integration.lagging_reset import FENCE, fan, lag_in_epoch_zero, pg_query
from tests.integration.streams import delta_rows, run_stream, write_input

PIPELINE = "afence"


def _sink(url: str) -> dict[str, Any]:
    return {"type": "postgres", "name": "pg", "url": url, "table": "orders", "mode": "append",
            "on_failure": "lag", "retries": 0}  # fmt: skip


def _fan(tmp_path: Path, url: str, **kw: Any) -> FanOut:
    return fan(tmp_path, PIPELINE, _sink(url), **kw)


@pytest.mark.parametrize("catch_up", ["same process", "next process"])
def test_a_lagging_append_sink_gets_the_old_epochs_spooled_batches_after_a_reset(
    spark: Any,
    tmp_path: Path,
    server: tuple[Any, str],
    fanout_cli: Cli,
    catch_up: str,
) -> None:
    pg, url = server
    create = (
        "CREATE TABLE orders (order_id bigint, customer text, amount double precision, status text)"
    )
    lag_in_epoch_zero(spark, tmp_path, server, fanout_cli, PIPELINE, _sink(url), create)

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

    table = pg_query(url, "SELECT order_id FROM orders ORDER BY order_id")
    assert table == [(i,) for i in range(15)]
    fences = pg_query(
        url, "SELECT pipeline, sink, partition FROM fanout.progress WHERE batch_id = "
             f"{FENCE} ORDER BY pipeline",
    )  # fmt: skip
    assert fences == [(PIPELINE, "pg", -1)]
    marks = sorted(
        (r["epoch"], r["batch_id"]) for r in delta_rows(tmp_path / "ledger")
        if r["sink"] == "pg" and r["status"] == "committed"
    )  # fmt: skip
    assert marks == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
