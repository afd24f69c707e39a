"""A transactional sink of your own, written from the driver: each batch into a SQLite table
in one transaction with a progress row keyed by the batch's idempotency key, appended or
upserted by ``keys``; rows SQLite refuses (a NOT NULL or CHECK constraint) are dead letters.

The pattern fits any database with transactions: the rows and "(app id, batch id) done" in
one commit, so a replay finds the progress row and writes nothing again. The refused rows are
recorded in that commit too and handed to the dead-letter target only after it (from what
it recorded): a replay that finds the batch committed hands over the same letters, which the
target keeps once. ``holds_batch`` answers from the same progress rows.
``tests/integration/test_sqlite_example.py`` runs the conformance suite
on it without installing it (``SinkUnderTest(plugins=["sqlite_sink"])``).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from fanout import (
    Batch,
    ConfigurationError,
    Reads,
    SchemaMismatchError,
    Sink,
    SinkContext,
    SinkOption,
    SinkResult,
    SinkWriteError,
    hookimpl,
    txn_app_id,
)

# The dead-letter parts a sink of its own uses (README, "Dead letters"):
from fanout.contract.dead_letters import DeadLetter, DeadLetterTarget, letter_rows
from fanout.deadletters.moved import write_letters

PROGRESS = "_fanout_progress"  # one row per (app id, batch id) committed, with its letters


class SqliteSink(Sink):
    """Each batch into one SQLite table, exactly once (transactional)."""

    guarantees = ("transactional",)
    options = (
        SinkOption("database", "required", "the SQLite database file (its directory must exist)"),
        SinkOption(
            "table", "the sink's name", "the table; created from the first batch if missing"
        ),
        SinkOption(
            "keys", "none", "upsert on these columns (a unique key of the table); none: append"
        ),
        SinkOption("dead_letter", "none", "where rows SQLite refuses (NOT NULL, CHECK...) go"),
    )
    read_only_check = True

    def __init__(
        self,
        name: str,
        *,
        database: str | None = None,
        table: str | None = None,
        keys: Sequence[str] = (),
        dead_letter: str | None = None,
    ) -> None:
        super().__init__(name)
        self.database, self.table = database, table or name
        self.keys = [keys] if isinstance(keys, str) else list(keys)
        self.dead_letter = dead_letter  # fanout resolves it into context.dead_letters
        self._letters: DeadLetterTarget | None = None

    @property
    def reads(self) -> Reads:
        return "arrow"

    def open(self, context: SinkContext) -> None:
        if not self.database:
            raise ConfigurationError(f"sink {self.name!r}: option 'database' is required")
        if not Path(self.database).parent.is_dir():
            raise ConfigurationError(
                f"sink {self.name!r}: option 'database': directory "
                f"{Path(self.database).parent} does not exist; create it"
            )
        self._letters = context.dead_letters
        if context.checking and not Path(self.database).exists():  # fanout validate
            context.would(f"create SQLite database {self.database} at the first batch")
        # Nothing is created here (the database, its tables): the first write does, in its
        # transaction, so a run refused before its first batch leaves no trace.

    def _connect(self) -> sqlite3.Connection:
        # One connection per write: sqlite3 connections belong to their thread, and fanout
        # may call write() from another thread each batch.
        return sqlite3.connect(str(self.database), timeout=30, isolation_level=None)

    def is_transient(self, error: BaseException) -> bool:
        locked = isinstance(error, sqlite3.OperationalError) and "locked" in str(error)
        return locked or super().is_transient(error)

    def write(self, batch: Batch) -> SinkResult:
        key = batch.idempotency_key  # not batch_id alone: a new epoch gets a new key
        table = batch.arrow()
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")  # the write lock, before reading the progress row
            db.execute(
                f"CREATE TABLE IF NOT EXISTS {PROGRESS} (app_id TEXT NOT NULL, batch_id INTEGER"
                " NOT NULL, rows INTEGER NOT NULL, letters TEXT NOT NULL,"
                " PRIMARY KEY (app_id, batch_id))"
            )
            done = db.execute(
                f"SELECT rows, letters FROM {PROGRESS} WHERE app_id = ? AND batch_id = ?",
                (key.app_id, key.version),
            ).fetchone()
            if done is not None:  # committed by an attempt whose ledger mark was lost
                db.execute("ROLLBACK")
                letters = _letters(done[1])
                self._hand_over(batch, letters)  # again: the target keeps them once
                return SinkResult(done[0], dead_lettered=len(letters), already_written=True)
            columns = self._ensure_table(db, table.schema, batch)
            letters = self._insert(db, columns, letter_rows(table))
            if letters and self._letters is None:
                raise _refused(self.name, batch, letters)
            recorded = json.dumps([_letter_json(letter) for letter in letters], default=str)
            db.execute(
                f"INSERT INTO {PROGRESS} VALUES (?, ?, ?, ?)",
                (key.app_id, key.version, table.num_rows - len(letters), recorded),
            )
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        finally:
            db.close()
        # After the commit, from what it recorded: never letters of an attempt that did not
        # commit (docs/architecture.md §7, "Refused letters follow the commit").
        self._hand_over(batch, _letters(recorded))
        return SinkResult(table.num_rows - len(letters), dead_lettered=len(letters))

    def _ensure_table(self, db: sqlite3.Connection, schema: pa.Schema, batch: Batch) -> list[str]:
        existing = [row[1] for row in db.execute(f"PRAGMA table_info({_quote(self.table)})")]
        names = list(schema.names)
        missing = [k for k in self.keys if k not in names]
        missing += [n for n in names if existing and n not in existing]
        if missing:
            raise SchemaMismatchError(
                f"sink {self.name!r}, batch {batch.batch_id}: column(s) {missing} of the batch"
                f" or of option 'keys' are not in SQLite table {self.table!r}; add them to the"
                " table (ALTER TABLE ... ADD COLUMN) or leave them out with the sink's 'select'",
                sink=self.name, batch_id=batch.batch_id, columns=missing,
            )  # fmt: skip
        if not existing:
            columns = [f"{_quote(f.name)} {_sql_type(f.type)}" for f in schema]
            if self.keys:
                columns.append(f"PRIMARY KEY ({', '.join(map(_quote, self.keys))})")
            db.execute(f"CREATE TABLE {_quote(self.table)} ({', '.join(columns)})")
        return names

    def _insert(
        self, db: sqlite3.Connection, columns: list[str], rows: list[dict[str, Any]]
    ) -> list[DeadLetter]:
        sql = (
            f"INSERT INTO {_quote(self.table)} ({', '.join(map(_quote, columns))})"
            f" VALUES ({', '.join('?' for _ in columns)})"
        )
        if self.keys:
            others = [f"{_quote(c)} = excluded.{_quote(c)}" for c in columns if c not in self.keys]
            action = f"UPDATE SET {', '.join(others)}" if others else "NOTHING"
            sql += f" ON CONFLICT ({', '.join(map(_quote, self.keys))}) DO {action}"
        letters = []
        for row in rows:
            # SQLite lets NULL into most primary keys (and numbers one for an INTEGER
            # PRIMARY KEY): a row without its key is refused here, by name.
            null = next((k for k in self.keys if row[k] is None), None)
            if null is not None:
                letters.append(DeadLetter(row, f"key column {null!r} is null", null, None))
                continue
            try:
                db.execute(sql, [_value(row[c]) for c in columns])
            except sqlite3.IntegrityError as error:  # this statement alone is undone
                letters.append(DeadLetter(row, str(error), details={"table": self.table}))
        return letters

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool | None:
        """Whether the progress row of that batch (its idempotency key: app id of the
        epoch, version the batch id) is there, and the table too: fanout asks at a
        checkpoint reset (a batch written but never marked) and at each run's first batch
        (a table dropped since: ``TargetLostError``). A progress row outlives a dropped
        table, so a table that is gone holds nothing."""
        if not self.database or not Path(self.database).exists():
            return False  # opened read-only below: asking creates nothing
        # as_uri() escapes what a URI would cut or decode ('#', '?', '%' in the path)
        uri = Path(self.database).resolve().as_uri() + "?mode=ro"
        db = sqlite3.connect(uri, uri=True)
        try:
            # SQLite's names ignore ASCII case, as write() found the table: NOCASE too
            for name in (self.table, PROGRESS):
                if not db.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ? COLLATE NOCASE",
                    (name,),
                ).fetchone():
                    return False
            found = db.execute(
                f"SELECT 1 FROM {PROGRESS} WHERE app_id = ? AND batch_id = ?",
                (txn_app_id(pipeline, self.name, epoch), batch_id),
            ).fetchone()
            return found is not None
        finally:
            db.close()

    def _hand_over(self, batch: Batch, letters: list[DeadLetter]) -> None:
        if letters and self._letters is not None:
            # through write_letters: none an earlier dead-letter target of the sink holds
            # (its dead_letter moved since an attempt of this batch: docs/architecture.md §7)
            write_letters(self._letters, batch, letters, source="refused")


def _refused(sink: str, batch: Batch, letters: list[DeadLetter]) -> SinkWriteError:
    first = letters[0]
    return SinkWriteError(
        f"sink {sink!r}, batch {batch.batch_id}: SQLite refused {len(letters)} row(s), the"
        f" first {json.dumps(first.row, default=str)}: {first.reason}; fix the rows or the"
        " table's constraints, or give the sink a 'dead_letter' target",
        sink=sink, batch_id=batch.batch_id,
    )  # fmt: skip


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sql_type(arrow_type: pa.DataType) -> str:
    if pa.types.is_integer(arrow_type) or pa.types.is_boolean(arrow_type):
        return "INTEGER"
    if pa.types.is_floating(arrow_type):
        return "REAL"
    return "BLOB" if pa.types.is_binary(arrow_type) else "TEXT"


def _value(value: Any) -> Any:
    """A value of an Arrow row as sqlite3 binds it (dates, decimals, lists as text)."""
    if value is None or isinstance(value, (int, float, str, bytes)):
        return value
    return json.dumps(value, default=str) if isinstance(value, (list, dict)) else str(value)


def _letter_json(letter: DeadLetter) -> dict[str, Any]:
    return {"row": letter.row, "reason": letter.reason, "column": letter.column,
            "value": letter.value, "details": dict(letter.details)}  # fmt: skip


def _letters(recorded: str) -> list[DeadLetter]:
    return [DeadLetter(d["row"], d["reason"], d["column"], d["value"], details=d["details"])
            for d in json.loads(recorded)]  # fmt: skip


@hookimpl
def fanout_sink_types() -> Mapping[str, type[Sink]]:
    """The sink types of this plugin (registered under the `fanout` entry point)."""
    return {"sqlite": SqliteSink}
