"""On the executors: the write connections a Spark Python worker keeps between partitions.

A partition's transaction used a connection of its own, opened and closed around it: for
each partition of each batch the server started a backend (fork, authentication, catalog
caches; ~2 ms of server CPU on a local socket, and a TLS handshake and a SCRAM exchange on
most real servers) and the client waited for it. Spark reuses its Python workers from task
to task, so a worker can hand the next partition the connection the last one committed on.

What is kept is only a connection at rest: its transaction committed or rolled back, its
session settings those of the sink's ``settings`` (applied once, when it was opened, and
committed). A connection whose partition failed in any other way is closed, never kept.
Before a kept connection is handed out it is checked with one statement (which also names
the new partition in ``application_name``), so one the server closed meanwhile (a restart,
an idle timeout, ``pg_terminate_backend``) is replaced before the partition reads any row.
At most :data:`MAX_IDLE` connections per worker wait, each at most the sink's
``connection_idle_s``; a thread of the worker closes them when that time has passed.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MAX_IDLE = 2
"""Connections one worker keeps at rest at most (a shared task may write two PostgreSQL
sinks at once); the oldest is closed first."""
SETTINGS_SQL = "SELECT set_config(%(name)s, %(value)s, false)"
CLIENT_ENCODING = "UTF8"
"""Every connection's ``client_encoding``: the sink sends UTF-8 (Arrow's strings), and the
server converts it to the database's encoding, refusing a character it cannot hold
(SQLSTATE 22P05) rather than storing the bytes as if they were that encoding's."""
NOT_DURABLE = frozenset({"off", "false", "no", "0"})
"""``synchronous_commit`` values under which a server crash may lose a commit."""


class NotDurable(Exception):
    """A write connection's ``synchronous_commit`` is off (set for its server, database or
    role since the sink opened)."""


def not_durable(value: str) -> str:
    """Why a connection whose ``synchronous_commit`` is ``value`` (off) is refused."""
    return (
        f"synchronous_commit is {value!r} for the sink's connections (set for the server, "
        "the database or the role), which lets a commit return before it is durable, so a "
        "server crash could lose rows the ledger records as written; set it to on for the "
        "sink's database or role (ALTER DATABASE/ROLE ... SET synchronous_commit = on), or "
        "in option 'settings'"
    )


def connect(url: Any, application_name: str) -> Any:
    """A psycopg2 connection from a SQLAlchemy URL (no engine, no pool)."""
    import psycopg2
    from sqlalchemy.dialects.postgresql.psycopg2 import PGDialect_psycopg2

    cargs, cparams = PGDialect_psycopg2().create_connect_args(url)
    cparams.setdefault("application_name", application_name[:63])
    cparams["client_encoding"] = CLIENT_ENCODING  # the rows are UTF-8, whatever the URL says
    return psycopg2.connect(*cargs, **cparams)


@dataclass
class _AtRest:
    connection: Any
    key: str
    since: float
    idle_s: float  # its sink's connection_idle_s

    def expired(self, now: float) -> bool:
        return now - self.since > self.idle_s


class WorkerConnections:
    """The connections at rest in this process, by server, credentials and settings."""

    def __init__(self, max_idle: int = MAX_IDLE) -> None:
        self.max_idle = max_idle
        self._lock = threading.Lock()
        self._at_rest: list[_AtRest] = []
        self._closer: threading.Thread | None = None

    def take(
        self,
        url: Any,
        settings: Sequence[tuple[str, str]],
        application_name: str,
        idle_s: float,
    ) -> Any:
        """A connection to ``url`` with ``settings`` applied: one kept at rest and still
        open, else a new one. Raises what connecting or applying a setting raised.

        ``idle_s`` is the taker's ``connection_idle_s``: 0 takes no kept connection. How
        long a kept one may have waited is the setting of the sink that left it (as the
        closing thread reads it), so the two never disagree on a connection."""
        key = _key(url, settings)
        while idle_s > 0:
            kept = self._pop(key)
            if kept is None:
                break
            if not kept.expired(time.monotonic()) and _answers(kept.connection, application_name):
                return kept.connection
            close_quietly(kept.connection)
        connection = connect(url, application_name)
        try:
            with connection.cursor() as cur:
                for name, value in settings:
                    cur.execute(SETTINGS_SQL, {"name": name, "value": value})
                cur.execute("SHOW synchronous_commit")
                (durable,) = cur.fetchone()
            if str(durable).lower() in NOT_DURABLE:
                raise NotDurable(not_durable(durable))
            connection.commit()  # a partition that rolls back keeps the settings
        except BaseException:
            close_quietly(connection)
            raise
        return connection

    def give_back(
        self, connection: Any, url: Any, settings: Sequence[tuple[str, str]], idle_s: float
    ) -> None:
        """Keep ``connection`` for the next partition when it is at rest and ``idle_s`` is
        positive; close it otherwise."""
        if idle_s <= 0 or not _at_rest(connection):
            close_quietly(connection)
            return
        key = _key(url, settings)
        closing = []
        with self._lock:
            self._at_rest.append(_AtRest(connection, key, time.monotonic(), idle_s))
            while len(self._at_rest) > self.max_idle:
                closing.append(self._at_rest.pop(0).connection)
            if self._closer is None:
                self._closer = threading.Thread(
                    target=self._close_expired, name="fanout-postgres-idle", daemon=True
                )
                self._closer.start()
        for old in closing:
            close_quietly(old)

    def close_all(self) -> None:
        """Close every connection at rest."""
        with self._lock:
            closing, self._at_rest = self._at_rest, []
        for kept in closing:
            close_quietly(kept.connection)

    def at_rest(self) -> int:
        """How many connections wait at rest now."""
        with self._lock:
            return len(self._at_rest)

    def _pop(self, key: str) -> _AtRest | None:
        with self._lock:
            for index in range(len(self._at_rest) - 1, -1, -1):  # the most recent first
                if self._at_rest[index].key == key:
                    return self._at_rest.pop(index)
        return None

    def _close_expired(self) -> None:
        """The closing thread: runs while connections wait, closes each once its sink's
        ``connection_idle_s`` has passed."""
        while True:
            with self._lock:
                now = time.monotonic()
                expired: list[_AtRest] = []
                waiting: list[_AtRest] = []
                for kept in self._at_rest:
                    (expired if kept.expired(now) else waiting).append(kept)
                self._at_rest = waiting
                if not self._at_rest and not expired:
                    self._closer = None
                    return
                wait = min((k.idle_s - (now - k.since) for k in self._at_rest), default=0.0)
            for kept in expired:
                close_quietly(kept.connection)
            time.sleep(min(max(wait, 0.05), 5.0))


CONNECTIONS = WorkerConnections()
"""This process's connections at rest (a Spark Python worker's, or the driver's for a
batch written without Spark)."""


def _key(url: Any, settings: Sequence[tuple[str, str]]) -> str:
    """Which connections are interchangeable: the same rendered URL (password included:
    other credentials, another connection) and settings; hashed, so no password is kept
    in the key."""
    render = getattr(url, "render_as_string", None)
    rendered = render(hide_password=False) if render is not None else str(url)
    return hashlib.sha256(repr((rendered, tuple(settings))).encode()).hexdigest()


def _answers(connection: Any, application_name: str) -> bool:
    """Whether a kept connection still answers; the answer names the new partition."""
    if connection.closed:
        return False
    try:
        with connection.cursor() as cur:
            cur.execute(SETTINGS_SQL, {"name": "application_name", "value": application_name[:63]})
        return True
    except Exception:  # closed by the server, or broken: the caller opens a new one
        return False


def _at_rest(connection: Any) -> bool:
    """Open, with no transaction in progress."""
    import psycopg2.extensions as ext

    try:
        return not connection.closed and (
            connection.get_transaction_status() == ext.TRANSACTION_STATUS_IDLE
        )
    except Exception:
        return False


def close_quietly(connection: Any) -> None:
    """Close ``connection``, ignoring that it is already closed or broken."""
    try:
        connection.close()
    except Exception:  # already closed or broken: nothing to release
        pass
