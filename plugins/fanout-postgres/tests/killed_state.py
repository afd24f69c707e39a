"""One killed driver's state, restored for each restart that starts from it.

The parametrized cases of a crash test often kill the driver at the same point, with the
same sink, and differ only in how they restart (the sink's new ``dead_letter``, a dropped
constraint): one kill per distinct killed state, not per case. :class:`KilledState` keeps
a copy of what the kill left (the PostgreSQL database, as a template database; the
work directory: input, checkpoint, ledger, Delta dead-letter tables) and puts it back
*in place* before each case: the same database name and the same paths, so what the
killed attempt recorded (checkpoint offsets naming the input files, the ledger's
dead-letter target, the progress marks) names the restored copies, and each case
restarts exactly what its own kill would have left.

A module-scoped fixture builds it: the root conftest keeps a test file's tests in one
pytest-xdist worker (``--dist loadgroup``, one group per file), the one that made it."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import psycopg2
from fanout_postgres import EmbeddedPostgres
from fanout_postgres.connections import CONNECTIONS
from pgcheck import dsn, query


class KilledState:
    """The database ``name`` on ``server`` and the directory ``workdir``, as a kill left
    them: :meth:`keep` copies them, :meth:`restore` puts the copy back."""

    def __init__(self, server: EmbeddedPostgres, name: str, workdir: Path) -> None:
        self.server, self.name, self.workdir = server, name, workdir
        self.url = server.create_database(name)
        self._template = f"{name}_killed"
        self._kept = workdir.with_name(workdir.name + "_killed")

    def keep(self) -> None:
        """Copy the killed state (once the driver's process is dead)."""
        self._disconnect(self.name)
        execute_admin(self.server, f'CREATE DATABASE "{self._template}" TEMPLATE "{self.name}"')
        shutil.copytree(self.workdir, self._kept)

    def restore(self) -> None:
        """Put back the database and the directory :meth:`keep` copied, in place."""
        CONNECTIONS.close_all()  # a write connection kept to the database of a case before
        execute_admin(self.server, f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        execute_admin(self.server, f'CREATE DATABASE "{self.name}" TEMPLATE "{self._template}"')
        shutil.rmtree(self.workdir)
        shutil.copytree(self._kept, self.workdir)

    def drop(self) -> None:
        """Drop both databases (the directories go with pytest's temporary ones)."""
        CONNECTIONS.close_all()
        for name in (self.name, self._template):
            execute_admin(self.server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _disconnect(self, name: str) -> None:
        """End the sessions the killed driver left on ``name`` (its server processes end
        when they see the closed socket; a template must have none): what they had begun
        is rolled back either way."""
        admin = self.server.url_for("postgres")
        sessions = "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
        query(admin, f"SELECT pg_terminate_backend(pid) FROM ({sessions}) AS s", (name,))
        deadline = time.monotonic() + 30
        while query(admin, sessions, (name,)):
            assert time.monotonic() < deadline, f"sessions left on database {name!r}"
            time.sleep(0.05)


def execute_admin(server: EmbeddedPostgres, sql: str) -> None:
    """Run ``sql`` outside a transaction (``CREATE``/``DROP DATABASE``) on ``postgres``."""
    conn = psycopg2.connect(dsn(server.url_for("postgres")))
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(sql)
    finally:
        conn.close()
