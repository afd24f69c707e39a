"""The lost-target check (docs/architecture.md §5, "A target lost behind fanout's back") and
sinks with ``on_failure="lag"``.

A lagging sink that could not be opened at the run's start was never asked: once its
server was back, its catch-up re-created the dropped table (``create_table``) and wrote
into it, and the loss went silent. And a lag sink whose target was lost refused the whole
run, although one sink's trouble must not stop the others: it now lags with
:class:`fanout.TargetLostError` (spooled, never written), the other sinks go on, and the
next run given ``accept_lost_targets`` catches it up. Real Spark, Delta ledger, lake and
spool, the embedded PostgreSQL server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fanout import FanOut, LagLimitError, SinksBehindError
from fanout.app.status import report
from fanout.ledger.delta import DeltaLedger
from tests.integration import two_sink_resets as resets
from tests.integration.streams import delta_rows
from tests.integration.two_sink_resets import ROWS

PIPELINE = "lostlag"
QUERY = "query-1"


def _fan(tmp_path: Path, url: str, accept: bool = False, **lag: Any) -> FanOut:
    return FanOut(
        PIPELINE, str(tmp_path / "ledger"),
        [{"type": "postgres", "name": "pg", "url": url, "table": "orders", "mode": "append",
          "create_table": True, "on_failure": "lag", "retries": 0, **lag},
         {"type": "delta", "name": "lake", "path": str(tmp_path / "lake")}],
        parallelism=1, retries=0, backoff_s=0, spool=str(tmp_path / "spool"),
        probe_interval_s=3600, accept_lost_targets=["pg"] if accept else (),
    )  # fmt: skip


def _run(fan: FanOut, spark: Any, batch_id: int) -> None:
    resets.run(fan, spark, QUERY, batch_id, batch_id * ROWS)


def _rows(*batches: int) -> list[int]:
    return sorted(n for b in batches for n in range(b * ROWS, (b + 1) * ROWS))


def _sql(url: str, statement: str) -> list[tuple[Any, ...]]:
    import psycopg2

    from tests.chaos.checker import libpq_url

    with psycopg2.connect(libpq_url(url)) as conn, conn.cursor() as cur:
        cur.execute(statement)
        return cur.fetchall() if cur.description else []


def _pg_ids(url: str) -> list[int] | None:
    """The ids in PostgreSQL's ``orders``, sorted; ``None`` when the table is missing."""
    if not _sql(url, "SELECT to_regclass('public.orders') IS NOT NULL")[0][0]:
        return None
    return sorted(int(r[0]) for r in _sql(url, "SELECT id FROM orders"))


def _write_two_batches_and_drop(tmp_path: Path, url: str, spark: Any) -> None:
    first = _fan(tmp_path, url)
    try:
        _run(first, spark, 0)
        _run(first, spark, 1)
    finally:
        first.close()
    assert _pg_ids(url) == _rows(0, 1)
    _sql(url, "DROP TABLE orders")  # behind fanout's back


def _pg_failures(tmp_path: Path) -> list[tuple[int, str]]:
    rows = delta_rows(tmp_path / "ledger")
    return sorted(
        (r["batch_id"], r["error"].split(":")[0])
        for r in rows
        if r["sink"] == "pg" and r["status"] == "failed"
    )


def _pg_status(tmp_path: Path) -> dict[str, Any]:
    text = report(
        DeltaLedger(str(tmp_path / "ledger")), PIPELINE, as_json=True, spool=str(tmp_path / "spool")
    )
    return next(s for s in json.loads(text) if s["sink"] == "pg")


def test_a_lagging_sink_opened_late_is_asked_before_its_catch_up_writes(
    spark: Any, tmp_path: Path, server: tuple[Any, str]
) -> None:
    pg, url = server
    pg.start()
    _write_two_batches_and_drop(tmp_path, url, spark)
    pg.stop()  # down when the next run starts: pg is not opened, so not asked then

    fan = _fan(tmp_path, url)
    try:
        assert fan.unopened == ("pg",)
        _run(fan, spark, 2)  # pg still down: batch 2 spooled for it
        pg.start()
        with pytest.raises(SinksBehindError) as behind:
            fan.final_catch_up()  # reopens pg: asked, refused before any write
    finally:
        fan.close()

    assert _pg_ids(url) is None  # nothing written, the table not created again
    assert "TargetLostError: sink 'pg', batch 1: pipeline 'lostlag': table 'orders' no " \
        "longer holds batch 1 of epoch 0" in str(behind.value)  # fmt: skip
    assert "--accept-lost-target pg" in str(behind.value)
    assert sorted(r["id"] for r in delta_rows(tmp_path / "lake")) == _rows(0, 1, 2)
    assert resets.marks(tmp_path) == [(0, "lake", 0), (0, "lake", 1), (0, "lake", 2),
                                      (0, "pg", 0), (0, "pg", 1)]  # fmt: skip
    assert _pg_failures(tmp_path) == [(2, "SinkUnreachableError"), (2, "TargetLostError")]
    status = _pg_status(tmp_path)
    assert (status["state"], status["lag_batches"]) == ("lagging", 1)
    assert status["last_error"].startswith("TargetLostError: sink 'pg', batch 1: ")
    assert "`--accept-lost-target pg`" not in status["last_error"]  # FanOut: no file
    assert "FanOut(accept_lost_targets=['pg'])" in status["last_error"]

    accepted = _fan(tmp_path, url, accept=True)  # a run with no new batch: its final catch-up
    try:
        accepted.final_catch_up()
    finally:
        accepted.close()
    assert _pg_ids(url) == _rows(2)  # exactly the spooled batch, into the new table

    after = _fan(tmp_path, url)  # holds its mark 2: passes without the flag
    try:
        _run(after, spark, 3)
    finally:
        after.close()
    assert _pg_ids(url) == _rows(2, 3)
    assert sorted(r["id"] for r in delta_rows(tmp_path / "lake")) == _rows(0, 1, 2, 3)


def test_a_lag_sink_whose_target_was_lost_lags_and_the_others_go_on(
    spark: Any, tmp_path: Path, server: tuple[Any, str]
) -> None:
    pg, url = server
    pg.start()
    _write_two_batches_and_drop(tmp_path, url, spark)

    fan = _fan(tmp_path, url)
    try:
        _run(fan, spark, 2)  # pg is refused, and lags; the lake writes on
        _run(fan, spark, 3)
        with pytest.raises(SinksBehindError) as behind:
            fan.final_catch_up()
    finally:
        fan.close()

    assert _pg_ids(url) is None  # nothing written into the target, not even created
    assert sorted(r["id"] for r in delta_rows(tmp_path / "lake")) == _rows(0, 1, 2, 3)
    assert resets.marks(tmp_path) == [(0, "lake", 0), (0, "lake", 1), (0, "lake", 2),
                                      (0, "lake", 3), (0, "pg", 0), (0, "pg", 1)]  # fmt: skip
    assert _pg_failures(tmp_path) == [  # the live batches', then the final catch-up's
        (2, "TargetLostError"), (2, "TargetLostError"), (3, "TargetLostError")
    ]  # fmt: skip
    assert "Not written by the next run until you act: pg" in str(behind.value)
    status = _pg_status(tmp_path)
    assert (status["state"], status["lag_batches"], status["lag_rows"]) == (
        "lagging", 2, 2 * ROWS
    )  # fmt: skip
    assert status["last_error"].startswith(
        "TargetLostError: sink 'pg', batch 1: pipeline 'lostlag': table 'orders' no longer "
        "holds batch 1 of epoch 0, which the ledger marks written there"
    )
    assert (
        "Nothing is written to it by this run: with on_failure='lag' it lags"
        in (status["last_error"])
    )

    again = _fan(tmp_path, url)  # without the flag: still lost, still lagging
    try:
        with pytest.raises(SinksBehindError):
            again.final_catch_up()
    finally:
        again.close()
    assert _pg_ids(url) is None

    accepted = _fan(tmp_path, url, accept=True)
    try:
        accepted.final_catch_up()
    finally:
        accepted.close()
    assert _pg_ids(url) == _rows(2, 3)  # exactly the spooled batches

    after = _fan(tmp_path, url)
    try:
        _run(after, spark, 4)
    finally:
        after.close()
    assert _pg_ids(url) == _rows(2, 3, 4)
    assert sorted(r["id"] for r in delta_rows(tmp_path / "lake")) == _rows(0, 1, 2, 3, 4)


def test_a_lost_lag_sink_past_its_max_lag_stops_the_query(
    spark: Any, tmp_path: Path, server: tuple[Any, str]
) -> None:
    """The spool is bounded by ``max_lag`` for a lost target as for any lagging sink."""
    pg, url = server
    pg.start()
    _write_two_batches_and_drop(tmp_path, url, spark)

    fan = _fan(tmp_path, url, max_lag=1)
    try:
        _run(fan, spark, 2)  # one batch behind: within max_lag
        with pytest.raises(LagLimitError) as stopped:
            _run(fan, spark, 3)
    finally:
        fan.close()
    assert "past its max_lag (1 batches; now 2 batches > 1)" in str(stopped.value), stopped.value
    assert "TargetLostError: sink 'pg', batch 1" in str(stopped.value)
    assert _pg_ids(url) is None
    assert resets.marks(tmp_path) == [(0, "lake", 0), (0, "lake", 1), (0, "lake", 2),
                                      (0, "pg", 0), (0, "pg", 1)]  # fmt: skip


def test_status_shows_the_lost_target_found_after_newer_batches_failed(
    spark: Any, tmp_path: Path, server: tuple[Any, str]
) -> None:
    """A run that finds the target lost at its catch-up records it as attempt 1 of the
    sink's oldest missed batch: ``fanout status`` must show it, not an older failure of a
    later attempt of that batch (a live write retried)."""
    pg, url = server
    pg.start()
    first = _fan(tmp_path, url, retries=1)
    try:
        _run(first, spark, 0)
        _run(first, spark, 1)
        pg.stop()  # down mid-run: pg fails batch 2 twice and lags, batch 2 spooled
        _run(first, spark, 2)
    finally:
        first.close()
    pg.start()
    _sql(url, "DROP TABLE orders")  # behind fanout's back

    fan = _fan(tmp_path, url)  # a run with no new batch: its final catch-up finds the loss
    try:
        with pytest.raises(SinksBehindError):
            fan.final_catch_up()
    finally:
        fan.close()

    assert _pg_ids(url) is None
    assert _pg_failures(tmp_path) == [
        (2, "TargetLostError"), (2, "TransientSinkError"), (2, "TransientSinkError")
    ]  # fmt: skip
    attempts = sorted(
        (r["attempt"], r["error"].split(":")[0])
        for r in delta_rows(tmp_path / "ledger")
        if r["sink"] == "pg" and r["status"] == "failed"
    )
    assert attempts == [  # the loss, found last, is attempt 1 of batch 2
        (1, "TargetLostError"), (1, "TransientSinkError"), (2, "TransientSinkError")
    ]  # fmt: skip
    status = _pg_status(tmp_path)
    assert (status["state"], status["lag_batches"]) == ("lagging", 1)
    assert status["last_error"].startswith("TargetLostError: sink 'pg', batch 1: "), status
