"""Append mode: the marks the driver reads to check that a replay rebuilds the partitions
that already committed the batch (the check is the kit's: :mod:`fanout.partitioned.sink`).

Each partition's progress mark records, in the transaction that writes its rows, the
partition count (``partitions``), the partitioning fingerprint (``fingerprint``) and the
digest of its input rows (``input_rows``, ``input_checksum``; migration
``0002_progress_plan``), and the route its rows went through (``route``, migration
``0003_progress_route``). Before any partition writes, the kit's check reads the marks of
the batch in one query; only when some exist does it re-plan the batch in one Spark job
and compare. A mark of another route refuses the replay: the mark's route is returned in
:attr:`CommittedPartition.route` and the kit compares it
(:func:`fanout.partitioned.replay_route.check_routes`).

Upsert mode skips nothing on a replay but deletes nothing either: each committed partition
records its route in ``upsert_routes`` (migration ``0004_upsert_routes``, in the partition's
transaction), which a replay's route must match (:func:`upsert_routes`, compared by the same
``check_routes`` with :data:`REWRITES`). The same row counts the rows the partition
refused (migration ``0007_upsert_routes_refused``, :func:`upsert_records`): its replay
refuses them again, so ``holds_batch`` needs only their number to tell a batch whose
refused rows are not in its dead-letter target yet.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from fanout.contract.batch import Batch, pipeline_scope
from fanout.partitioned.membership import (
    WHOLE_ROW,
    CommittedPartition,
    PartitionDigest,
)
from fanout_postgres.deadletter import KEPT_IN
from fanout_postgres.identifiers import TableName
from fanout_postgres.statements import progress_table, upsert_routes_table


@dataclass(frozen=True)
class SinkRecords:
    """Whose records in ``state_schema`` a driver-side check of the sink reads, and the table
    they are compared with: the sink's name, its mode now (progress marks: append;
    ``upsert_routes`` rows: upsert) and its table as :meth:`PostgresSink.open` resolved it
    (``None`` before)."""

    sink: str
    mode: str
    state_schema: str
    table: TableName | None


def batch_scope(batch: Batch) -> str:
    """The pipeline scope of ``batch``'s epoch, which keys every record of it."""
    return pipeline_scope(batch.pipeline, batch.info.epoch)


def committed_partitions(conn: Any, state_schema: str, scope: str, sink: str, batch_id: int
                         ) -> list[CommittedPartition]:  # fmt: skip
    """The progress marks of one batch of one sink, each with the route it recorded
    (``<fingerprint> <route>``; ``None`` in a mark of an older fanout)."""
    return [mark for mark, _ in committed_marks(conn, state_schema, scope, sink, batch_id)]


def committed_marks(conn: Any, state_schema: str, scope: str, sink: str, batch_id: int
                    ) -> list[tuple[CommittedPartition, str | None]]:  # fmt: skip
    """:func:`committed_partitions`, each with the id of the query that committed it
    (``None``: not recorded), read in the same query."""
    import sqlalchemy as sa

    p = progress_table(state_schema)
    query = sa.select(
        p.c.partition, p.c.partitions, p.c.fingerprint, p.c.input_rows, p.c.input_checksum,
        p.c.route, p.c.query_id,
    ).where(p.c.pipeline == scope, p.c.sink == sink, p.c.batch_id == batch_id)  # fmt: skip
    marks: list[tuple[CommittedPartition, str | None]] = []
    for partition, partitions, fingerprint, rows, checksum, route, query_id in conn.execute(query):
        digest = None if rows is None else PartitionDigest(int(rows), int(checksum or 0))
        mark = CommittedPartition(int(partition), int(partitions), fingerprint, digest,
                                  route=route)  # fmt: skip
        marks.append((mark, query_id))
    return marks


def letters_waiting(conn: Any, state_schema: str, scope: str, sink: str, batch_id: int
                    ) -> dict[int, int]:  # fmt: skip
    """Append mode: partition -> how many refused rows its progress mark of the batch keeps
    that no PostgreSQL dead-letter table holds (no :data:`~fanout_postgres.deadletter.
    KEPT_IN`): the partition committed, and the attempt ended before the driver handed them
    to the sink's dead-letter target. Partitions with none are left out."""
    import sqlalchemy as sa

    p = progress_table(state_schema)
    query = sa.select(p.c.partition, p.c.rejects).where(
        p.c.pipeline == scope, p.c.sink == sink, p.c.batch_id == batch_id,
        p.c.rejects.isnot(None),
    )  # fmt: skip
    waiting: dict[int, int] = {}
    for partition, rejects in conn.execute(query):
        count = sum(1 for d in rejects or [] if not d.get(KEPT_IN))
        if count:
            waiting[int(partition)] = count
    return waiting


def upsert_routes(conn: Any, state_schema: str, scope: str, sink: str, batch_id: int
                  ) -> tuple[dict[int, str | None], int | None]:  # fmt: skip
    """Upsert mode: the route each committed partition of one batch of one sink recorded
    (``upsert_routes``, migration ``0004_upsert_routes``), by partition; and the latest
    batch after it the sink committed in the scope (``None``: none, as always but after a
    ledger replaced: the sink writes its batches in order;
    :data:`~fanout_postgres.statements.EPOCH_FENCE` once a later epoch began writing the
    sink). One query, reading the rows of the batch and of any later one: in the common
    case only the batch's."""
    import sqlalchemy as sa

    r = upsert_routes_table(state_schema)
    query = sa.select(r.c.batch_id, r.c.partition, r.c.route).where(
        r.c.pipeline == scope, r.c.sink == sink, r.c.batch_id >= batch_id
    )
    routes: dict[int, str | None] = {}
    later: int | None = None
    for batch, partition, route in conn.execute(query):
        if batch == batch_id:
            routes[int(partition)] = route
        else:
            later = max(int(batch), later or 0)
    return routes, later


@dataclass(frozen=True)
class UpsertRecord:
    """What one committed upsert partition's ``upsert_routes`` row records of its batch
    besides its route."""

    partitions: int | None
    """The partition count the batch was written in (migration
    ``0005_upsert_routes_partitions``; ``None`` in a row of an older fanout)."""
    refused: int | None
    """How many rows the partition refused (migration ``0007_upsert_routes_refused``;
    ``None`` in a row of an older fanout: unknown)."""
    kept_in: str | None
    """The PostgreSQL dead-letter table that took them in the partition's transaction;
    ``None``: left to the driver, which writes them to the sink's target after every
    partition committed (or none refused)."""

    @property
    def waiting(self) -> int:
        """Refused rows the driver was to write to the dead-letter target (0 when
        unknown: see :attr:`refused`)."""
        return 0 if self.kept_in is not None else self.refused or 0


def upsert_records(conn: Any, state_schema: str, scope: str, sink: str, batch_id: int
                   ) -> dict[int, UpsertRecord]:  # fmt: skip
    """Upsert mode: what each committed partition of one batch of one sink recorded in
    ``upsert_routes`` (its partition count, refused rows and where they are kept), by
    partition, in one query: the count the batch was written in, whatever the sink's
    ``partitions`` option says now."""
    import sqlalchemy as sa

    r = upsert_routes_table(state_schema)
    query = sa.select(r.c.partition, r.c.partitions, r.c.refused, r.c.kept_in).where(
        r.c.pipeline == scope, r.c.sink == sink, r.c.batch_id == batch_id
    )
    return {
        int(partition): UpsertRecord(
            None if count is None else int(count),
            None if refused is None else int(refused),
            kept_in,
        )
        for partition, count, refused, kept_in in conn.execute(query)
    }


def target_oids(conn: Any, state_schema: str, mode: str, scope: str, sink: str, batch_id: int
                ) -> dict[int, int | None]:  # fmt: skip
    """The OID of the table each committed partition of one batch of one sink wrote into,
    as its progress mark (append) or ``upsert_routes`` row (upsert) recorded it (migration
    ``0006_target_oid``; ``None`` in one of an older fanout), by partition."""
    import sqlalchemy as sa

    t = progress_table(state_schema) if mode == "append" else upsert_routes_table(state_schema)
    query = sa.select(t.c.partition, t.c.target_oid).where(
        t.c.pipeline == scope, t.c.sink == sink, t.c.batch_id == batch_id
    )
    return {
        int(partition): None if oid is None else int(oid) for partition, oid in conn.execute(query)
    }


def vanished_sink_marks(
    conn: Any, state_schema: str, scope: str, sink: str, sinks: Collection[str], batch_id: int,
    table: str, mode: str = "append",
) -> tuple[str, int, list[int]] | None:  # fmt: skip
    """The progress marks (``mode`` append; upsert: the ``upsert_routes`` rows), in table
    ``table`` (SQL, as the statements name it) as it is now (its OID, migration
    ``0006_target_oid``), of the first batch at or past ``batch_id`` of a sink of pipeline
    scope ``scope`` that is not among ``sinks`` (the sinks the pipeline configures): that
    sink's name, the batch and its committed partitions; ``None`` when there are none, or
    when ``sink`` itself has records in the scope (it is no new name). A sink renamed after
    it committed a batch and before its ledger mark: under the new name the replay would
    write the batch again (docs/architecture.md §8.2, "A sink renamed mid-batch"). Two
    queries, asked once per :meth:`~fanout_postgres.PostgresSink.open` (the first batch
    with no records of its own): the first by the table's primary key, the second only for
    a name without records in the scope."""
    import sqlalchemy as sa

    p = progress_table(state_schema) if mode == "append" else upsert_routes_table(state_schema)
    own = sa.select(p.c.batch_id).where(p.c.pipeline == scope, p.c.sink == sink).limit(1)
    if conn.execute(own).first() is not None:
        return None
    oid = current_oid(conn, table)
    if oid is None:
        return None
    others = (
        p.c.pipeline == scope, p.c.sink != sink, p.c.sink.notin_(sorted(sinks)),
        p.c.batch_id >= batch_id, p.c.target_oid == oid,
    )  # fmt: skip
    return _first_batch(conn, p, others)


def upsert_routes_of(
    conn: Any, state_schema: str, scope: str, sink: str, batch_id: int, table: str
) -> tuple[int, list[int]] | None:
    """Append mode: the first batch at or past ``batch_id`` that sink ``sink`` committed in
    scope ``scope`` into table ``table`` as it is now (its OID) in *upsert* mode (its
    ``upsert_routes`` rows), with those partitions; ``None``: none. The sink's ``mode``
    switched from upsert to append after it committed the batch and before its ledger
    mark: the append replay finds no progress mark and appends the batch again
    (docs/architecture.md §8.2, "A mode switched mid-batch"). One query, asked once per
    :meth:`~fanout_postgres.PostgresSink.open` (the first batch with no marks of its own)."""
    r = upsert_routes_table(state_schema)
    oid = _current_oid_query(table)
    found = _first_batch(conn, r, (
        r.c.pipeline == scope, r.c.sink == sink, r.c.batch_id >= batch_id,
        r.c.target_oid == oid,
    ))  # fmt: skip
    return None if found is None else found[1:]


def _first_batch(conn: Any, t: Any, where: Sequence[Any]) -> tuple[str, int, list[int]] | None:
    """The sink, batch and partitions of the first batch (then sink) of state table ``t``'s
    records matching ``where``; ``None``: none."""
    import sqlalchemy as sa

    query = (
        sa.select(t.c.sink, t.c.batch_id, t.c.partition)
        .where(*where)
        .order_by(t.c.batch_id, t.c.sink, t.c.partition)
    )
    found: tuple[str, int, list[int]] | None = None
    for other, batch, partition in conn.execute(query):
        if found is None:
            found = (str(other), int(batch), [])
        if (other, batch) != found[:2]:
            break
        found[2].append(int(partition))
    return found


@dataclass(frozen=True)
class MovedMarks:
    """Append: progress marks of one batch that recorded another table than the sink's now
    (:func:`moved_marks`)."""

    partitions: list[int]
    """The partitions whose marks name that table."""
    table: str
    """The table they were committed to, as the sink's option named it then (SQL)."""
    oid: int
    """That table's OID as the marks recorded it."""
    now: int | None
    """The OID of the sink's table now."""


def moved_marks(
    conn: Any, state_schema: str, scope: str, sink: str, batch_id: int, table: str,
    mode: str = "append",
) -> MovedMarks | None:  # fmt: skip
    """The progress marks (upsert: the ``upsert_routes`` rows, which record the table's
    name from migration ``0008_upsert_routes_target``; one of an older fanout, no name,
    is never moved) of one batch of one sink that record another table than
    ``table`` (SQL, as the statements name it): another OID (migration ``0006_target_oid``)
    *and* another name (``target``, the sink's option as the partition wrote it). The
    sink's ``table`` moved since they committed: they say nothing of the table it names
    now, and a replay skipping their partitions would leave it without their rows
    (docs/architecture.md §8.2, "A table moved mid-batch"). Another OID under the same name
    is a table replaced (:func:`other_table_marks`; at a start
    :meth:`~fanout_postgres.PostgresSink.target_replaced` tells those), not a move; the
    same OID under another name (``orders`` and ``public.orders``, a table renamed with
    the option) is the same table. ``None``: none. One query, asked by ``holds_batch`` and
    ``target_replaced`` (a start)."""
    return other_table_marks(conn, state_schema, scope, sink, batch_id, table, same_name=False,
                             mode=mode)[0]  # fmt: skip


def other_table_marks(
    conn: Any, state_schema: str, scope: str, sink: str, batch_id: int, table: str,
    same_name: bool = True, mode: str = "append",
) -> tuple[MovedMarks | None, list[MovedMarks]]:  # fmt: skip
    """Append: the progress marks of one batch of one sink that record another OID than
    ``table``'s now (``None`` when it is missing), split by the name they record: those of
    another name (the table moved: :func:`moved_marks`; the first such table, ``None``
    when there are none), then, with ``same_name``, those of ``table``'s own name, one
    :class:`MovedMarks` per OID they record, in partition order: the table renamed away,
    or dropped, and another created or restored from a dump under its name since they
    committed, once or more than once mid-batch (docs/architecture.md §8.2, "A table
    replaced mid-batch"). One query, asked on a replay only (the batch has marks)."""
    import sqlalchemy as sa

    p = progress_table(state_schema) if mode == "append" else upsert_routes_table(state_schema)
    now = _current_oid_query(table)
    where = [
        p.c.pipeline == scope, p.c.sink == sink, p.c.batch_id == batch_id,
        p.c.target_oid.isnot(None), p.c.target_oid != sa.func.coalesce(now, -1),
    ]  # fmt: skip
    if not same_name:  # an upsert row of an older fanout (no name): none
        where.append(p.c.target != table)
    query = sa.select(p.c.partition, p.c.target, p.c.target_oid, now).where(*where)
    rows = conn.execute(query.order_by(p.c.partition)).all()
    same = [r for r in rows if r[1] == table]
    replaced: list[MovedMarks] = []
    for oid in dict.fromkeys(r[2] for r in same):  # each OID once, in partition order
        found = _marks_of([r for r in same if r[2] == oid])
        assert found is not None  # the OID is one of theirs
        replaced.append(found)
    return _marks_of([r for r in rows if r[1] != table]), replaced


def _marks_of(rows: Sequence[Any]) -> MovedMarks | None:
    """The first table (name and OID) ``rows`` (partition, target, OID, OID now) name,
    with its partitions; ``None`` for no rows."""
    if not rows:
        return None
    _, target, oid, current = rows[0]
    parts = [int(row[0]) for row in rows if (row[1], row[2]) == (target, oid)]
    return MovedMarks(parts, str(target), int(oid), None if current is None else int(current))


def repoint_marks_sql(
    state_schema: str, scope: str, sink: str, batch_id: int, oids: Sequence[int], now: int
) -> str:
    """The ``UPDATE`` that makes the progress marks of one batch recorded in table OID(s)
    ``oids`` name table OID ``now`` (a table restored from a dump that holds their rows:
    the replay then skips their partitions)."""
    from fanout.contract.sql import sql_literal
    from fanout_postgres.identifiers import quote

    return (
        f"UPDATE {quote(state_schema)}.progress SET target_oid = {now} WHERE pipeline = "
        f"{sql_literal(scope)} AND sink = {sql_literal(sink)} AND batch_id = {batch_id} "
        + (f"AND target_oid = {oids[0]}" if len(oids) == 1
           else f"AND target_oid IN ({', '.join(str(oid) for oid in oids)})")
    )  # fmt: skip


def forget_replaced_marks(
    conn: Any, state_schema: str, scope: str, sink: str, batch_id: int, oid: int
) -> int:
    """Delete the progress marks of one batch recorded in table OID ``oid`` (a table
    replaced under its name: the run accepts the loss, and the replay writes the whole
    batch into the table as it is); how many were deleted."""
    import sqlalchemy as sa

    p = progress_table(state_schema)
    deleted = conn.execute(
        sa.delete(p).where(
            p.c.pipeline == scope, p.c.sink == sink, p.c.batch_id == batch_id,
            p.c.target_oid == oid,
        )
    )  # fmt: skip
    return int(deleted.rowcount or 0)


REPLACED_UNDER_ITS_NAME = (
    "the table was renamed away, or dropped, and another created under its name"
)
"""What another OID under the sink's table name means: in the run start's lost-target
reason (:func:`fanout_postgres.holds.replaced`) and the replay's refusal
(:func:`fanout_postgres.replay_refusals.refuse_moved`)."""


def tables_now(conn: Any, oids: Collection[int]) -> dict[int, str]:
    """The schema-qualified name (SQL) each of ``oids`` that is still a table has now: one
    the records name, renamed away or moved to another schema since, or still where it
    was while the sink's name resolves to another table (the search path changed). One
    query, on a refusal's path only."""
    import sqlalchemy as sa

    from fanout_postgres.identifiers import TableName

    if not oids:
        return {}
    query = sa.text(
        "SELECT c.oid::bigint, n.nspname, c.relname FROM pg_class c JOIN pg_namespace n "
        "ON n.oid = c.relnamespace WHERE c.oid::bigint = ANY(:oids) AND c.relkind IN ('r', 'p')"
    )
    return {
        int(oid): TableName(str(name), str(schema)).quoted()
        for oid, schema, name in conn.execute(query, {"oids": sorted(oids)})
    }


def _current_oid_query(table: str) -> Any:
    """The OID of ``table`` (SQL) now, as a scalar SQL expression (``NULL``: none)."""
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql as pg

    regclass = sa.func.to_regclass(sa.literal(table, sa.Text))
    return sa.cast(sa.cast(regclass, pg.OID), sa.BigInteger)


def current_oid(conn: Any, table: str) -> int | None:
    """The OID of the table ``table`` (SQL, as the statements name it) names now."""
    import sqlalchemy as sa

    oid = conn.execute(
        sa.text("SELECT to_regclass(:table)::oid::bigint"), {"table": table}
    ).scalar()
    return None if oid is None else int(oid)


def relation_bytes(conn: Any, table: str) -> int:
    """The bytes of the table ``table`` (SQL) names in its heap, its partitions' too (0: a
    table created and never written, or emptied by ``TRUNCATE``). Read from the catalog
    and the files' sizes: no ``SELECT`` on the table needed."""
    import sqlalchemy as sa

    size = conn.execute(
        sa.text(  # pg_inherits, not pg_partition_tree: that one is PostgreSQL 12+ and
            # lists nothing for a table not partitioned
            "WITH RECURSIVE tree(relid) AS (SELECT to_regclass(:table)::oid UNION ALL "
            "SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.relid) "
            "SELECT coalesce(sum(pg_relation_size(relid)), 0) FROM tree"
        ),
        {"table": table},
    ).scalar()
    return int(size or 0)


REWRITES = (
    "An upsert rewrites the rows the route keeps but deletes none, so a row those "
    "partitions hold that the new route refuses would be both in the table and in the "
    "dead letters, and one it leaves out would stay in the table."
)
"""Why upsert mode refuses a replay under another route
(:func:`fanout.partitioned.replay_route.check_routes`' ``why``; append mode's is the kit's
:data:`~fanout.partitioned.replay_route.SKIPS`)."""


def partition_columns(
    mode: str, keys: Sequence[str], columns: Sequence[str] | Mapping[str, str] | None
) -> Sequence[str] | Literal["*"] | None:
    """What an append sink hashes, in batch column names: its keys, the columns it writes
    when it selects some, else the whole row; ``None`` in upsert mode (a key written twice
    is idempotent whichever partition writes it)."""
    if mode != "append":
        return None
    if not keys:
        if columns is None:
            return WHOLE_ROW
        keys = list(columns.values()) if isinstance(columns, Mapping) else list(columns)
    return batch_names(keys, columns)


VOLATILE_KEYS = (
    "a replay or retry would compute other keys (or keep other rows), and the upsert would "
    "insert them beside the rows an earlier attempt wrote (every row written twice)"
)
"""Why an upsert sink needs deterministic keys (:meth:`PostgresSink.deterministic_columns`)."""


def batch_names(names: Sequence[str], columns: Sequence[str] | Mapping[str, str] | None
                ) -> list[str]:  # fmt: skip
    """Table columns ``names`` under their batch names (option ``columns`` may rename)."""
    renamed = {t: s for s, t in columns.items()} if isinstance(columns, Mapping) else {}
    return [renamed.get(k, k) for k in names]
