"""Input whose batches update earlier batches' keys, so an upsert table shows whether the
batches reached it in order (the lag tests), and independent reads of every sink."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from tests.integration.streams import EPOCH

STEP = 10  # file f holds order ids f*STEP .. f*STEP + 2*STEP - 1: half are updates
LAG_SCHEMA = "order_id LONG, customer STRING, amount DOUBLE, status STRING"


def lag_row(order_id: int, version: int) -> dict[str, Any]:
    """Order ``order_id`` as file ``version`` writes it."""
    return {
        "order_id": order_id,
        "customer": f"c{order_id % 7}",
        "amount": float(version),
        "status": f"v{version}",
    }


def write_lag_input(
    directory: Path, files: int, start_file: int = 0, step: int = STEP
) -> list[dict[str, Any]]:
    """Files ``orders-<n>.json`` (one per micro-batch) of ``2 * step`` orders each, the
    first half updating the previous file's second half; returns every row written."""
    directory.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for f in range(start_file, start_file + files):
        chunk = [lag_row(i, f) for i in range(f * step, f * step + 2 * step)]
        path = directory / f"orders-{f:04d}.json"
        path.write_text("\n".join(json.dumps(r) for r in chunk) + "\n")
        os.utime(path, (EPOCH + f, EPOCH + f))
        rows.extend(chunk)
    return rows


def final_state(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """What an upsert table holds after every row in order: the last row of each id."""
    state: dict[int, dict[str, Any]] = {}
    for row in rows:
        state[row["order_id"]] = row
    return state


def versions(rows: list[dict[str, Any]]) -> Counter[tuple[int, str]]:
    """How often each (order id, version) occurs: every appended row exactly once."""
    return Counter((int(r["order_id"]), str(r["status"])) for r in rows)


def postgres_rows(url: str, table: str) -> dict[int, dict[str, Any]]:
    """The PostgreSQL table by order id, read with psycopg2."""
    import psycopg2
    import psycopg2.extras

    from tests.chaos.checker import libpq_url

    with (
        psycopg2.connect(libpq_url(url)) as conn,
        conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur,
    ):
        cur.execute(f'SELECT order_id, customer, amount, status FROM "{table}"')
        return {int(r["order_id"]): dict(r) for r in cur.fetchall()}


def kafka_rows(bootstrap: str, topic: str, expected: int) -> tuple[list[dict[str, Any]], bool]:
    """Every committed record value, and whether the broker's last stable offset stuck.
    On a broker showing aborted transactions (Tansu) the values are read from the log's
    transaction markers (``kafka_log``), where no offset can stick; else a read_committed
    consumer (another process) reads them, and read_uncommitted once its last stable
    offset stuck."""
    from kafka_log import committed_values
    from kafkatools import _consume, broker_hides_aborted

    if not broker_hides_aborted(bootstrap):  # Tansu: the committed records, by the log's markers
        return [json.loads(value) for value in committed_values(bootstrap, topic)], False
    result = _consume(bootstrap, topic, expected, 60.0, 1.0)
    stuck = bool(result["timed_out"]) and len(result["records"]) < expected
    if stuck:
        result = _consume(bootstrap, topic, expected, 60.0, 1.0, "--uncommitted")
    return [json.loads(r["value"]) for r in result["records"]], stuck
