"""A checkpoint reset while a PostgreSQL upsert sink lags with spooled batches of the old
epoch: its first batch of the new epoch closes the old epoch's scope in
``fanout.upsert_routes`` (the fence against the replaced query's stragglers,
docs/architecture.md §8.2, "A straggler of an earlier batch"), so that row must come after
the catch-up wrote the old epoch's spooled batches, or it refuses them for good and the
sink never gets their rows. The sink gets its batches in ``(epoch, batch id)`` order: the
new epoch's values of keys the old epoch's spooled batches wrote are the ones left. A
second run of the new epoch (a new process: the fence written again) writes as usual.
Real Spark, a real Delta lake, ledger and spool, the embedded PostgreSQL."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fanout import FanOut
from tests.in_process_cli import Cli
from tests.integration.lagging_reset import FENCE, fan, lag_in_epoch_zero, pg_query
from tests.integration.streams import EPOCH, order, run_stream

PIPELINE = "fence"


def _sink(url: str) -> dict[str, Any]:
    return {"type": "postgres", "name": "pg", "url": url, "table": "orders", "mode": "upsert",
            "keys": ["order_id"], "on_failure": "lag", "retries": 0}  # fmt: skip


def _fan(tmp_path: Path, url: str, **kw: Any) -> FanOut:
    return fan(tmp_path, PIPELINE, _sink(url), **kw)


def _write_changed(directory: Path, n: int, ids: range) -> list[dict[str, Any]]:
    """Input file ``n`` (micro-batch n of its checkpoint) with the orders ``ids``, their
    status changed to ``epoch 1``: keys an earlier batch wrote, with other values."""
    rows = [{**order(i), "status": "epoch 1"} for i in ids]
    path = directory / f"orders-{n:04d}.json"
    directory.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    os.utime(path, (EPOCH + n, EPOCH + n))
    return rows


def test_a_lagging_upsert_sink_gets_the_old_epochs_spooled_batches_before_the_fence(
    spark: Any, tmp_path: Path, server: tuple[Any, str], fanout_cli: Cli
) -> None:
    pg, url = server
    create = (
        "CREATE TABLE orders (order_id bigint PRIMARY KEY, customer text, "
        "amount double precision, status text)"
    )
    lag_in_epoch_zero(spark, tmp_path, server, fanout_cli, PIPELINE, _sink(url), create)

    # the reset: a new checkpoint reads the files after batch 2; its batch 0 changes
    # orders 3-5, which the old epoch's spooled batch 1 wrote
    after = tmp_path / "input-new"
    _write_changed(after, 3, range(3, 6))
    pg.start()
    third = _fan(tmp_path, url, on_checkpoint_reset="new_epoch")
    try:
        run_stream(spark, after, third, tmp_path / "checkpoint-new")
        lags = third.catch_up(timeout_s=120)
        assert lags["pg"].state == "live"
        assert third.spool is not None and third.spool.size()[0] == 0
    finally:
        third.close()

    _write_changed(after, 4, range(6, 8))  # epoch 1's batch 1, in a run of its own
    fourth = _fan(tmp_path, url, on_checkpoint_reset="new_epoch")
    try:
        run_stream(spark, after, fourth, tmp_path / "checkpoint-new")
    finally:
        fourth.close()

    table = pg_query(url, "SELECT order_id, status FROM orders ORDER BY order_id")
    old = {i: order(i)["status"] for i in range(9)}
    assert table == [(i, "epoch 1" if 3 <= i < 8 else old[i]) for i in range(9)]
    fences = pg_query(
        url, "SELECT pipeline, sink, partition FROM fanout.upsert_routes WHERE batch_id = "
             f"{FENCE} ORDER BY pipeline",
    )  # fmt: skip
    assert fences == [(PIPELINE, "pg", -1)]
    # the old epoch's spooled batches and the new epoch's are the sink's, marked once each
    from tests.integration.streams import delta_rows

    marks = sorted(
        (r["epoch"], r["batch_id"]) for r in delta_rows(tmp_path / "ledger")
        if r["sink"] == "pg" and r["status"] == "committed"
    )  # fmt: skip
    assert marks == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
