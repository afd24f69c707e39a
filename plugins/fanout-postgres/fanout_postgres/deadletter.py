"""The ``postgres`` dead-letter kind: a table in the PostgreSQL sink's own database.

``dead_letter = "postgres:<table>"`` (``"errors"``, ``"ops.pg_rejects"``) on a PostgreSQL
sink. The rows its target table refuses are written by each partition in the same
transaction as its rows, so a record exists exactly when the rows around it committed (a
replay replaces the partition's records, never duplicates them). The table is created when
missing. Rows failing the sink's *route* are written by fanout through
:meth:`PostgresDeadLetters.write`, in one transaction replacing the batch's route records
(partition :data:`ROUTE_PARTITION`), each with its route (column ``route``:
``<fingerprint> <route>``); a replay finding the batch's route records there under another
route is refused in that transaction, before anything is replaced
(:mod:`fanout.deadletters.route_letters`). Any other kind (a Delta table) gets the refused rows
from the driver after the partitions, as :class:`fanout.contract.dead_letters.DeadLetter`s.

Each record: pipeline, sink, batch_id, partition, target (table), reason (the server's
message), column_name, value (as text: :func:`fanout_postgres.encode.value_text`), row (the
batch row as every dead-letter target holds it,
:func:`fanout.deadletters.layout.letter_json`, a NUL as the text ``\\u0000``), rejected_at.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from fanout_postgres.identifiers import TableName
from fanout_postgres.statements import ROUTE_COLUMN

if TYPE_CHECKING:
    from fanout.contract.batch import Batch
    from fanout.contract.dead_letters import DeadLetter, RouteStamp, Source
    from fanout.contract.earlier_letters import HeldLetters

POSTGRES = "postgres"
ROUTE_PARTITION = -1
"""The ``partition`` of a record of a row that failed the sink's route (it never reached
a partition)."""
KEPT_IN = "kept_in"
"""The key, in each refused row an append partition's progress mark keeps (``rejects``),
naming the PostgreSQL dead-letter table the partition's transaction (or a replay's skip of
it) wrote it into. A row without it waits for the driver: its target's ``write`` after
every partition (a Delta table, a Kafka topic), or a replay's skip of the partition
writing it into the table the sink's ``dead_letter`` names then."""


def letters_lock(pipeline: str, sink: str, batch_id: int, partition: int) -> int:
    """The key of the ``pg_advisory_xact_lock`` a partition takes before it replaces its
    records of a batch: two attempts of one partition (a speculative or zombie task) may
    run at once and take no row lock in common (every row refused, or every row unchanged:
    MERGE locks none), and would then both commit their records. A hash stable across
    processes (not Python's ``hash()``), as one signed 64-bit key."""
    text = json.dumps(["dead-letters", pipeline, sink, batch_id, partition])
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def drop_stale(conn: Any, table: TableName, pipeline: str, sink: str, batch_id: int,
               kept: Sequence[int]) -> None:  # fmt: skip
    """Delete the batch's records of refused rows (not the route's) of every partition but
    ``kept``: those an earlier attempt wrote from a partition that is now empty, or beyond
    a partition count since lowered (upsert mode does not refuse a new count)."""
    import sqlalchemy as sa

    from fanout_postgres.statements import dead_letter_table

    d = dead_letter_table(table)
    conn.execute(
        sa.delete(d).where(
            d.c.pipeline == pipeline, d.c.sink == sink, d.c.batch_id == batch_id,
            d.c.partition >= 0, d.c.partition.not_in(list(kept)),
        )
    )  # fmt: skip


def refused_held(conn: Any, table: TableName, pipeline: str, sink: str, batch_id: int) -> int:
    """How many records of refused rows (not the route's) of the batch ``table`` holds; 0
    when it does not exist (created at the sink's ``open()``, so only when dropped)."""
    import sqlalchemy as sa

    from fanout_postgres.statements import dead_letter_table

    if conn.execute(sa.select(sa.func.to_regclass(table.quoted()))).scalar() is None:
        return 0
    d = dead_letter_table(table)
    held = conn.execute(
        sa.select(sa.func.count()).select_from(d).where(
            d.c.pipeline == pipeline, d.c.sink == sink, d.c.batch_id == batch_id,
            d.c.partition >= 0,
        )
    ).scalar()  # fmt: skip
    return int(held or 0)


def ensure_table(conn: Any, table: TableName, *, create: bool = True) -> bool:
    """Create the dead-letter table when missing (not when ``create`` is off: ``fanout
    validate``), else check it has the expected columns. Returns whether it was missing."""
    import sqlalchemy as sa
    from sqlalchemy.schema import CreateTable

    from fanout_postgres.statements import DEAD_LETTER_COLUMNS, ROUTE_COLUMN, dead_letter_table

    inspector = sa.inspect(conn)
    if not inspector.has_table(table.name, schema=table.schema):
        if create:
            conn.execute(CreateTable(dead_letter_table(table), if_not_exists=True))
        return True
    present = {c["name"] for c in inspector.get_columns(table.name, schema=table.schema)}
    missing = [c for c in DEAD_LETTER_COLUMNS if c not in present]
    if missing:
        raise ValueError(
            f"dead-letter table {table} exists without column(s) {', '.join(missing)}; "
            "drop it or name another table (the sink creates it with the right layout)"
        )
    if ROUTE_COLUMN not in present and create:  # a table of an older fanout
        conn.execute(
            sa.text(f"ALTER TABLE {table.quoted()} ADD COLUMN IF NOT EXISTS {ROUTE_COLUMN} text")
        )
    return False


class PostgresDeadLetters:
    """A dead-letter table in a PostgreSQL sink's database (configuration only).

    :param url: the sink's ``url`` option as given (environment references expanded when
        the target connects), so no resolved password is pickled or logged.
    :param sink: the sink's name (for errors).
    :param table: the dead-letter table.
    :param target: the sink's own table, recorded in every record.
    """

    kind = POSTGRES

    def __init__(self, url: Any, sink: str, table: TableName, target: str) -> None:
        self.url = url
        self.sink = sink
        self.table = table
        self.target = target

    def describe(self) -> str:
        """``PostgreSQL table <table>``."""
        return f"PostgreSQL table {self.table}"

    def write(
        self,
        batch: Batch,
        letters: Sequence[DeadLetter],
        *,
        source: Source,
        partition: int | None = None,
        route: RouteStamp | None = None,
    ) -> int:
        """One transaction replacing the batch's records of this partition (a route's
        letters: partition :data:`ROUTE_PARTITION`, each with ``route``; refused when the
        records there are of another route) with ``letters``: ``row`` as the
        partitions' own letters (:func:`fanout.deadletters.layout.letter_json`, then
        :func:`fanout_postgres.encode.jsonb_safe`), ``value`` and ``reason`` fit for
        ``text`` (:func:`fanout_postgres.encode.letter_safe`: NaN and the infinities as
        strings, NUL as text)."""
        from fanout.deadletters.layout import letter_json
        from fanout_postgres.encode import jsonb_safe, letter_safe

        records = [
            {
                "reason": letter_safe(letter.reason),
                "column_name": letter.column,
                "value": None if letter.value is None else str(letter_safe(letter.value)),
                "row": None
                if letter.row is None
                else json.loads(jsonb_safe(letter_json(dict(letter.row)))),
            }
            for letter in letters
        ]
        where = ROUTE_PARTITION if source == "route" or partition is None else partition
        self._replace(batch, where, records, route)
        return len(letters)

    def letters_held(self, batch: Batch) -> HeldLetters:
        """What this table holds of ``batch``'s letters (asked when the sink's
        ``dead_letter`` moved since an attempt of the batch: :mod:`fanout.deadletters.moved`):
        its route records (partition :data:`ROUTE_PARTITION`, with their route) and the
        partitions of its refused rows' records; one query. Nothing when the table does
        not exist."""
        import sqlalchemy as sa

        from fanout.contract.batch import pipeline_scope
        from fanout.contract.earlier_letters import HeldLetters
        from fanout_postgres.statements import dead_letter_table

        table = dead_letter_table(self.table)
        with self._engine() as engine, engine.connect() as conn:
            if conn.execute(sa.select(sa.func.to_regclass(self.table.quoted()))).scalar() is None:
                return HeldLetters(self.describe())
            found = conn.execute(
                sa.select(table.c.partition, sa.func.min(table.c[ROUTE_COLUMN]))
                .where(
                    table.c.pipeline == pipeline_scope(batch.pipeline, batch.info.epoch),
                    table.c.sink == batch.sink_name,
                    table.c.batch_id == batch.batch_id,
                )
                .group_by(table.c.partition)
            ).all()
        routes = [stamp for partition, stamp in found if partition == ROUTE_PARTITION]
        fingerprint, _, text = (routes[0] or "").partition(" ") if routes else ("", "", "")
        refused = frozenset(int(p) for p, _ in found if p != ROUTE_PARTITION)
        return HeldLetters(
            self.describe(), bool(routes), fingerprint or None, text or None, refused
        )

    @contextmanager
    def _engine(self) -> Iterator[Any]:
        """A one-connection engine on the sink's database, disposed of on leaving."""
        import sqlalchemy as sa

        from fanout.errors import ConfigurationError
        from fanout_postgres import url as pgurl
        from fanout_postgres.connections import CLIENT_ENCODING

        try:
            url = pgurl.resolve_url(self.url, sink=self.sink)
            pgurl.refuse_at_in_host(url)  # not "unreachable": an '@' to escape
        except ValueError as exc:
            raise ConfigurationError(
                f"postgres sink {self.sink!r}: dead letters ({self.describe()}): {exc}"
            ) from None
        engine = sa.create_engine(
            url,
            poolclass=sa.NullPool,
            client_encoding=CLIENT_ENCODING,
        )
        try:
            yield engine
        finally:
            engine.dispose()

    def _replace(
        self,
        batch: Batch,
        partition: int,
        records: Sequence[Mapping[str, Any]],
        route: RouteStamp | None,
    ) -> None:
        import sqlalchemy as sa

        from fanout.contract.batch import pipeline_scope
        from fanout_postgres.statements import dead_letter_table

        table = dead_letter_table(self.table)
        key = {
            # the scope of the partitions' own records: a new epoch starts afresh
            "pipeline": pipeline_scope(batch.pipeline, batch.info.epoch),
            "sink": batch.sink_name,
            "batch_id": batch.batch_id,
            "partition": partition,
        }
        with self._engine() as engine, engine.begin() as conn:
            same = [table.c[k] == v for k, v in key.items()]
            if route is not None:
                self._check_route(conn, table, same, batch, route)
            conn.execute(sa.delete(table).where(*same))
            if records:
                stamp = None if route is None else f"{route.fingerprint} {route.text}"
                rows = [{**key, "target": self.target, **r, ROUTE_COLUMN: stamp} for r in records]
                conn.execute(sa.insert(table), rows)

    def _check_route(
        self, conn: Any, table: Any, same: list[Any], batch: Batch, route: RouteStamp
    ) -> None:
        """Refuse when the batch's route records (locked, in the replacing transaction)
        were kept under another route; a record without one is of an unknown route."""
        import sqlalchemy as sa

        from fanout.deadletters.route_letters import check_unchanged

        found = conn.execute(
            sa.select(table.c[ROUTE_COLUMN]).where(*same).limit(1).with_for_update()
        ).first()
        if found is None:
            return  # no records of this batch's route: nothing to compare
        fingerprint, _, text = (found[0] or "").partition(" ")
        check_unchanged(
            batch,
            route,
            fingerprint=fingerprint or None,
            recorded=text or None,
            target=self.describe(),
        )

    def __repr__(self) -> str:
        return f"<PostgresDeadLetters {self.table}>"


def as_letter(reject: Mapping[str, Any], target: str) -> DeadLetter:
    """A partition's refused row (as its outcome carries it) as a core dead letter: its
    ``row`` and ``value`` the JSON values of :func:`fanout_postgres.encode.row_json` and
    :func:`~fanout_postgres.encode.cell_json`, so the core writes the same JSON again."""
    from fanout.contract.dead_letters import DeadLetter

    row = reject.get("row")
    # a progress mark written before value_json existed holds only the value's text
    value = reject.get("value")
    if "value_json" in reject:
        value = None if reject["value_json"] is None else json.loads(reject["value_json"])
    return DeadLetter(
        row=json.loads(row) if isinstance(row, str) else row,
        reason=reject["reason"],
        column=reject.get("column"),
        value=value,
        partition=reject.get("partition"),
        details={"target": target},
    )
