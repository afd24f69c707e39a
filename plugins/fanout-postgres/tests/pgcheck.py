"""Independent reads of PostgreSQL for the assertions: plain psycopg2, no fanout code."""

from __future__ import annotations

from collections import Counter
from typing import Any

import psycopg2


def dsn(url: str) -> str:
    """A libpq URI from the SQLAlchemy URL the tests hand to the sink."""
    return url.replace("postgresql+psycopg2://", "postgresql://", 1)


def query(url: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Run one statement in its own connection; return its rows (or [] for none)."""
    conn = psycopg2.connect(dsn(url))
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql, params)
            return list(cur.fetchall()) if cur.description else []
    finally:
        conn.close()


def id_counts(url: str, table: str = "events") -> Counter[int]:
    """The ids ``table`` holds, each with how many of its rows hold it."""
    return Counter(i for (i,) in query(url, f"SELECT id FROM {table}"))


def execute(url: str, *statements: str) -> None:
    """Run statements in one transaction (DDL and fixtures of a test)."""
    conn = psycopg2.connect(dsn(url))
    try:
        with conn, conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql)
    finally:
        conn.close()


def waiting_on_a_lock(url: str, wait_event: str | None = None) -> bool:
    """Whether a session waits on a lock: one of the sink's (application name
    ``fanout ...``), or, given ``wait_event`` (``"advisory"``: the epoch fence, a
    partition's fence lock), any session waiting on a lock of that kind."""
    where, params = (
        ("application_name LIKE 'fanout %%'", None)
        if wait_event is None
        else ("wait_event = %(event)s", {"event": wait_event})
    )
    sql = f"SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND {where}"
    found = query(url, sql, params)
    return bool(found and found[0][0])
