"""The PostgreSQL sink's own records of a batch gone while its table still holds rows.

A batch's progress marks (append) and ``upsert_routes`` rows (upsert) live in
``state_schema``, apart from the table: an operator cleaning fanout's "internal" tables,
a database restored from a dump taken without that schema, or option ``state_schema``
changed since, leaves the table with its rows and the sink without the records telling
which batches it holds. :meth:`~fanout_postgres.PostgresSink.holds_batch` then says
``False``, which the core would read as a table created again empty, and, for a batch
written after the last mark and never marked, its replay would append it a second time.
Asked only at a run's lost-target check and at a new epoch's start, after ``holds_batch``
said ``False``, about a batch the ledger marks written there with rows
(:meth:`fanout.Sink.records_gone`).
"""

from __future__ import annotations

from typing import Any

from fanout_postgres.identifiers import quote
from fanout_postgres.membership import relation_bytes


def records_gone(
    conn: Any, state_schema: str, scope: str, sink: str, batch_id: int, table: str, shown: str
) -> str | None:
    """Why sink ``sink``'s records of batch ``batch_id`` of pipeline scope ``scope`` are
    gone while its table ``table`` (SQL; ``shown``: as the options name it) is not empty: a
    sentence naming the state tables, what is left in them of the scope and the ways to get
    them back; ``None`` when a progress mark or ``upsert_routes`` row of the batch, or of a
    later batch, is there (another answer decides: the sink itself prunes the marks of a
    partition older than ``KEEP_MARKS`` batches, so a batch whose rows went to the dead
    letters only, a mark of 0 rows, may be the last record of an older batch that wrote
    rows), or the table holds no row (its rows went too: a lost target). One query, then
    the table's size and, when it is not 0, whether it holds a row (:func:`_holds_a_row`)."""
    import sqlalchemy as sa

    schema = quote(state_schema)
    where = "pipeline = :scope AND sink = :sink"
    held, marks, routes = conn.execute(
        sa.text(
            f"SELECT (SELECT count(*) FROM {schema}.progress WHERE {where} AND batch_id >= :b)"
            f" + (SELECT count(*) FROM {schema}.upsert_routes WHERE {where} AND batch_id >= :b),"
            f" (SELECT count(DISTINCT batch_id) FROM {schema}.progress WHERE {where}),"
            f" (SELECT count(DISTINCT batch_id) FROM {schema}.upsert_routes WHERE {where})"
        ),
        {"scope": scope, "sink": sink, "b": batch_id},
    ).one()
    if held or not _holds_a_row(conn, table):
        return None
    left = (
        "nor any record of the sink under that pipeline scope"
        if not marks and not routes
        else f"though they keep records of {int(marks) + int(routes)} other batch(es) of it"
    )
    return (
        f"{state_schema}.progress holds no progress mark of batch {batch_id} of sink "
        f"{sink!r} under pipeline scope {scope!r} and {state_schema}.upsert_routes no row of "
        f"it, {left}, while table {shown} is not empty: those records were deleted (fanout's "
        f"state tables cleaned by hand, the database restored from a dump taken without "
        f"schema {state_schema!r}) or option 'state_schema' names another schema since. Put "
        f"back the rows of {state_schema}.progress and {state_schema}.upsert_routes whose "
        f"pipeline is {scope!r} (from the dump or backup that held them: `pg_dump "
        f"--schema={state_schema}`), or set state_schema back"
    )


def _holds_a_row(conn: Any, table: str) -> bool:
    """Whether table ``table`` (SQL) holds a row: its size first (0: created and never
    written, or emptied by ``TRUNCATE``; read from the catalog, no ``SELECT`` right needed),
    then, when the role may read it, one row of it: a table emptied by ``DELETE`` keeps its
    pages until a vacuum, so its size alone would call it holding rows (records gone) when
    it lost them (a lost target). Without the ``SELECT`` right (an append sink needs only
    ``INSERT``), its size decides. Asked only on the run-start path, never per batch."""
    import sqlalchemy as sa

    if relation_bytes(conn, table) == 0:
        return False
    readable = conn.execute(
        sa.text("SELECT has_table_privilege(to_regclass(:table), 'SELECT')"), {"table": table}
    ).scalar()
    if not readable:
        return True
    return bool(conn.execute(sa.text(f"SELECT EXISTS (SELECT 1 FROM {table})")).scalar())
