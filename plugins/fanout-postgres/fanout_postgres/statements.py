"""The SQL of the write path, built with SQLAlchemy on the driver and shipped as text.

Every identifier is quoted by SQLAlchemy's PostgreSQL dialect. Statements run with
parameters are compiled for psycopg2 (``%(name)s`` placeholders, literal ``%`` doubled) and
always executed with a parameter dict; the two COPY statements, which SQLAlchemy has no
construct for, are assembled from :func:`fanout_postgres.identifiers.quote` and run without
parameters.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from fanout.contract.sql import sql_literal
from fanout_postgres.identifiers import TableName, quote

STAGE = "fanout_stage"
"""The temporary staging table (``ON COMMIT DROP``), one per partition transaction."""
WINNERS = "fanout_winners"
"""Temporary table of the rows left after deduplication, built only to isolate bad rows."""
ROW = "__fanout_row"
"""Staging column holding each row's position in its partition (tie-break and bisection)."""

_AsText = Literal["only", "also"] | None
"""How the no-op check compares a column: as text only, as itself and as text, or as
itself (``None``)."""


@dataclass(frozen=True)
class Statements:
    """Every statement one partition task may run (plain strings, picklable)."""

    create_stage: str
    copy_stage: str
    copy_target: str
    copy_stage_binary: str
    copy_target_binary: str
    write_from_stage: str
    write_unique: str
    write_merge: str
    create_winners: str
    write_from_winners: str
    drop_refused: str
    """Upsert (else empty): :func:`_drop_refused` with ``order_by``, else
    :func:`_drop_held`."""
    duplicate_probe: str
    mark_insert: str
    mark_select: str
    mark_update: str
    mark_prune: str
    dead_delete: str
    dead_insert: str
    route_record: str = ""
    """Upsert (else empty): record the partition's route in ``upsert_routes`` and prune the
    partition's records of old batches (:func:`_route_statements`); run with the
    transaction's first statement, so it costs no round trip of its own."""
    mark_rejects: str = ""
    """Append: set a progress mark's kept refused rows (``rejects``) alone, when a replay
    that skips the partition writes them into the PostgreSQL dead-letter table."""
    route_refused: str = ""
    """Upsert (else empty): set the partition's ``upsert_routes`` row's count of refused
    rows and the PostgreSQL dead-letter table holding them, if one does (``refused``,
    ``kept_in``; migration ``0007_upsert_routes_refused``), in its transaction; run only
    when it refused some (:attr:`route_record` sets 0)."""
    dead_table: str = ""
    """The PostgreSQL dead-letter table as :attr:`dead_insert` names it (empty: none)."""
    later_batch: str = ""
    """Upsert (else empty): the latest batch after ``%(batch_id)s`` any partition of the
    sink committed in the pipeline's scope (``NULL``: none), from ``upsert_routes``
    (:func:`_later_batch`); a scalar subquery, asked in the round trip that checks the
    column types after the rows are written."""
    fence_check: str = ""
    """Append (else empty): take the scope's epoch fence lock shared
    (:func:`epoch_fence_lock`, ``%(fence_lock)s``), then say whether a later epoch closed
    the scope (its :data:`EPOCH_FENCE` mark, :func:`fence_earlier_epochs`): two statements,
    sent with the transaction's first (no round trip of their own), the second read under
    a snapshot taken once the lock is held (:func:`_fence_check`)."""


def compile_sql(statement: Any, *, literal_binds: bool = False) -> str:
    """``statement`` as psycopg2 SQL text (run it with a parameter dict)."""
    from sqlalchemy.dialects.postgresql import psycopg2

    kwargs = {"literal_binds": True} if literal_binds else {}
    return str(statement.compile(dialect=psycopg2.dialect(), compile_kwargs=kwargs))


def build_statements(
    *,
    target: TableName,
    columns: Sequence[tuple[str, Any]],
    keys: Sequence[str],
    order_by: Sequence[str],
    upsert: bool,
    text_compared: Sequence[str] = (),
    loose: Sequence[str] = (),
    state_schema: str,
    dead_letter: TableName | None,
    dead_letter_schema: str | None = None,
) -> Statements:
    """The statements for one plan.

    :param columns: ``(target column, SQLAlchemy type)`` of every column written.
    :param keys: the conflict target (upsert) — a unique-constrained column set.
    :param order_by: upsert: which row of a key wins (greatest first, ties to the greatest
        values of the other columns in table order, then to the greatest text of each
        column whose type's ``=`` is coarser than its text, keys included — see
        :func:`fanout_postgres.types.equality_is_coarse`); empty: no dedupe.
    :param text_compared: columns compared as text in the no-op check
        (:func:`fanout_postgres.types.changes_compare_as_text`), byte for byte.
    :param dead_letter_schema: the schema ``dead_letter`` resolved to on the driver when it
        names none: the statements qualify it; ``dead_table`` keeps the option's spelling.
    :param loose: columns compared by a nondeterministic collation
        (:attr:`fanout_postgres.plan.TargetInfo.loose_collations`): their ``=`` is coarser
        than their text, as a ``citext``'s is.
    """
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql as pg

    names = [name for name, _ in columns]
    md = sa.MetaData()
    table = sa.Table(
        target.name,
        md,
        *[sa.Column(n, t) for n, t in columns],
        schema=target.schema,
    )
    stage = _temp_table(STAGE, columns)
    winners = _temp_table(WINNERS, columns)
    lo, hi = sa.bindparam("lo", type_=sa.Integer), sa.bindparam("hi", type_=sa.Integer)

    types = dict(columns)
    tie_breakers = [n for n in names if n not in keys and n not in order_by]
    # columns whose = leaves rows tied that differ in text (1.0 and 1.00, 'A' and 'a' in
    # citext): after every other term their text decides, keys included (which spelling of
    # a citext key is written); a tie-breaker ordered as text already is not repeated
    # the no-op check: a column whose = is coarser than its text (citext, numeric, -0.0)
    # compares as itself and as text ('bob' -> 'Bob' and 1.0 -> 1.000 are changes to
    # write; its = still decides where the text is not exact, a double under
    # extra_float_digits < 1); one without a usable = only as text
    as_text: dict[str, _AsText] = {
        n: (None if n not in text_compared else "only" if _orders_as_text(t) else "also")
        for n, t in columns
    }
    spelled = [
        n
        for n in names
        if _equality_is_coarse(types[n])
        or n in loose
        or (_unknown(types[n]) and n not in tie_breakers)
    ]

    def source(src: sa.Table, dedupe: bool) -> Any:
        cols = [src.c[n] for n in names] + [src.c[ROW]]
        query = sa.select(*cols)
        if dedupe and upsert and order_by:
            # Ties on order_by go to the greatest value of each other column, in table order,
            # then to the greatest text (byte order) of each column whose = is coarser than
            # its text, never to the arrival order (a replay may deliver the rows in another
            # order). Rows still tied have the same text in every written column: either
            # one gives the result.
            query = _distinct_on(query, [src.c[k] for k in keys]).order_by(
                *[src.c[k] for k in keys],
                *[src.c[o].desc().nulls_last() for o in order_by],
                *[_orderable(src.c[n], types[n]).desc().nulls_last() for n in tie_breakers],
                *[_as_text(src.c[n]).collate("C").desc().nulls_last() for n in spelled],
                src.c[ROW].desc(),
            )
        return query.subquery("w")

    def write(src: sa.Table, dedupe: bool) -> str:
        w = source(src, dedupe)
        selected = sa.select(*[w.c[n] for n in names]).where(w.c[ROW].between(lo, hi))
        stmt = pg.insert(table).from_select(names, selected)
        if upsert:
            update = [n for n in names if n not in keys]
            if update:
                mine = [t for n in update for t in _compared(table.c[n], as_text[n])]
                theirs = [t for n in update for t in _compared(stmt.excluded[n], as_text[n])]
                stmt = stmt.on_conflict_do_update(
                    index_elements=list(keys),
                    set_={n: stmt.excluded[n] for n in update},
                    where=sa.tuple_(*mine).is_distinct_from(sa.tuple_(*theirs)),
                )
            else:
                stmt = stmt.on_conflict_do_nothing(index_elements=list(keys))
        return compile_sql(stmt)

    create_stage = (
        f"CREATE TEMPORARY TABLE {quote(STAGE)} ON COMMIT DROP AS "
        + compile_sql(
            sa.select(
                *[_stage_column(table.c[n], t) for n, t in columns],
                sa.cast(sa.null(), sa.Integer).label(ROW),
            ).select_from(table)
        )
        + " WITH NO DATA"
    )
    w_sel = source(stage, dedupe=True)
    create_winners = (
        f"CREATE TEMPORARY TABLE {quote(WINNERS)} ON COMMIT DROP AS "
        + compile_sql(sa.select(*w_sel.c))
        + f"; CREATE INDEX ON {quote(WINNERS)} ({quote(ROW)})"
    )
    key_cols = [stage.c[k] for k in keys] or [stage.c[ROW]]
    duplicate_probe = compile_sql(
        sa.select(*key_cols, sa.func.count().label("n"))
        .group_by(*key_cols)
        .having(sa.func.count() > 1)
        .limit(1),
        literal_binds=True,
    )
    column_list = ", ".join(quote(n) for n in names)
    marks = _mark_statements(state_schema)
    qualified = dead_letter
    if dead_letter is not None and dead_letter.schema is None and dead_letter_schema:
        qualified = TableName(dead_letter.name, dead_letter_schema)
    dead = _dead_letter_statements(qualified)
    return Statements(
        create_stage=create_stage,
        copy_stage=f"COPY pg_temp.{quote(STAGE)} ({column_list}, {quote(ROW)}) "
        "FROM STDIN WITH (FORMAT csv)",
        copy_target=f"COPY {target.quoted()} ({column_list}) FROM STDIN WITH (FORMAT csv)",
        copy_stage_binary=f"COPY pg_temp.{quote(STAGE)} ({column_list}, {quote(ROW)}) "
        "FROM STDIN WITH (FORMAT binary)",
        copy_target_binary=f"COPY {target.quoted()} ({column_list}) "
        "FROM STDIN WITH (FORMAT binary)",
        write_from_stage=write(stage, dedupe=True),
        write_unique=write(stage, dedupe=False) if upsert and order_by else "",
        write_merge=_merge(
            target,
            names,
            keys,
            as_text,
            # the whole stage, unfiltered: a range filter makes the planner guess a few rows
            # and, when the target's statistics say it is empty, join by a nested loop that
            # scans the target once per staged row while the MERGE fills it (quadratic)
            compile_sql(sa.select(*[stage.c[n] for n in names])),
        )
        if upsert
        else "",
        create_winners=create_winners,
        write_from_winners=write(winners, dedupe=False),
        drop_refused=(
            _drop_refused(stage, keys, source(stage, dedupe=True))
            if order_by
            else _drop_held(stage)
        )
        if upsert
        else "",
        duplicate_probe=duplicate_probe,
        **marks,
        **dead,
        route_record=_route_statements(state_schema) if upsert else "",
        route_refused=_route_refused(state_schema) if upsert else "",
        later_batch=_later_batch(state_schema) if upsert else "",
        fence_check="" if upsert else _fence_check(state_schema),
        dead_table="" if dead_letter is None else dead_letter.quoted(),
    )


def _drop_refused(stage: Any, keys: Sequence[str], winners: Any) -> str:
    """Remove from the stage the refused rows (positions ``%(refused)s``, staged to take
    part in choosing their key's winner) and every row of a key whose winner is refused:
    that key keeps its value in the target. Returns each removed row's position and whether
    it is a refused winner (dead-lettered; a refused row that lost to another row of its key
    was superseded: it would not have been written, so it is not dead-lettered)."""
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql as pg

    refused = sa.bindparam("refused", type_=pg.ARRAY(sa.Integer))
    lost = (
        sa.select(*[winners.c[k] for k in keys], winners.c[ROW])
        .where(winners.c[ROW] == sa.any_(refused))
        .cte("lost")
    )
    # keys are compared as DISTINCT ON groups them (a NULL key is never staged)
    same_key = sa.and_(*[lost.c[k].is_not_distinct_from(stage.c[k]) for k in keys])
    return compile_sql(
        sa.delete(stage)
        .where(sa.or_(stage.c[ROW] == sa.any_(refused), sa.exists().where(same_key)))
        .returning(stage.c[ROW], sa.exists().where(lost.c[ROW] == stage.c[ROW]))
    )


def _drop_held(stage: Any) -> str:
    """Upsert without ``order_by``: remove the refused rows (positions ``%(refused)s``) from
    the stage, each returned as its key's winner (no row of a key outranks another; a key
    held twice fails the batch before this runs)."""
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql as pg

    refused = sa.bindparam("refused", type_=pg.ARRAY(sa.Integer))
    return compile_sql(
        sa.delete(stage).where(stage.c[ROW] == sa.any_(refused)).returning(stage.c[ROW], sa.true())
    )


def _merge(
    target: TableName,
    names: Sequence[str],
    keys: Sequence[str],
    as_text: dict[str, _AsText],
    source: str,
) -> str:
    """The upsert as ``MERGE`` (PostgreSQL 15+), for a staging table holding each key once.

    It ends in the same rows as the ``INSERT ... ON CONFLICT`` statement, for about 15%
    less work: new rows are plain inserts, not speculative ones. Unlike ``ON CONFLICT``
    it raises when another session inserts one of its keys meanwhile; the task then runs
    the ``ON CONFLICT`` statement instead (see ``transaction.PartitionTransaction._write``).
    """

    def q(name: str) -> str:  # run with a parameter dict: a literal % is doubled
        return quote(name).replace("%", "%%")

    def col(alias: str, name: str) -> str:
        value = f"{alias}.{q(name)}"
        text = f'CAST({value} AS TEXT) COLLATE "C"'  # byte for byte, as _compared
        how = as_text[name]
        return value if how is None else text if how == "only" else f"{value}, {text}"

    update = [n for n in names if n not in keys]
    on = " AND ".join(f"t.{q(k)} = s.{q(k)}" for k in keys)
    parts = [
        f"MERGE INTO {'.'.join(q(p) for p in (target.schema, target.name) if p)} AS t "
        f"USING ({source}) AS s ON {on}"
    ]
    if update:
        mine = ", ".join(col("t", n) for n in update)
        theirs = ", ".join(col("s", n) for n in update)
        parts.append(
            f"WHEN MATCHED AND ({mine}) IS DISTINCT FROM ({theirs}) THEN UPDATE SET "
            + ", ".join(f"{q(n)} = s.{q(n)}" for n in update)
        )
    parts.append(
        f"WHEN NOT MATCHED THEN INSERT ({', '.join(q(n) for n in names)}) "
        f"VALUES ({', '.join(f's.{q(n)}' for n in names)})"
    )
    return " ".join(parts)


def _stage_column(column: Any, sa_type: Any) -> Any:
    """A staging column: of the planned type when rows may reach it in binary COPY, which
    encodes each field for that type (the table's column may have changed type since the
    plan was made; the INSERT from the stage then casts, or fails); else of the table's
    current type, which PostgreSQL parses the CSV text into."""
    import copy

    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql

    from fanout_postgres.binary import wire_kind

    if wire_kind(sa_type) is None:
        return column
    dialect = postgresql.dialect()
    planned = copy.copy(sa_type)
    collation = getattr(planned, "collation", None)
    if collation is not None:  # a type spelled with COLLATE is not valid in a CAST
        planned.collation = None
    sql = f"CAST(NULL AS {planned.compile(dialect=dialect)})"
    if collation is not None:
        schema = getattr(planned, "collation_schema", None)
        sql += f" COLLATE {dialect.identifier_preparer.format_collation(collation, schema)}"
    return sa.literal_column(sql).label(column.name)


def _temp_table(name: str, columns: Sequence[tuple[str, Any]]) -> Any:
    import sqlalchemy as sa

    return sa.Table(
        name,
        sa.MetaData(),
        *[sa.Column(n, t) for n, t in columns],
        sa.Column(ROW, sa.Integer),
        schema="pg_temp",
    )


def _distinct_on(query: Any, columns: Sequence[Any]) -> Any:
    try:
        from sqlalchemy.dialects.postgresql import distinct_on  # SQLAlchemy >= 2.1

        return query.ext(distinct_on(*columns))
    except ImportError:  # SQLAlchemy 2.0
        return query.distinct(*columns)


def _orderable(column: Any, sa_type: Any) -> Any:
    """``column`` as a sort key: as itself, or as text for types PostgreSQL cannot order
    (``json``) or SQLAlchemy did not recognise (``xml``, geometric types, ...)."""
    return _as_text(column) if _orders_as_text(sa_type) else column


def _orders_as_text(sa_type: Any) -> bool:
    from fanout_postgres.types import orders_as_text

    return orders_as_text(sa_type)


def _equality_is_coarse(sa_type: Any) -> bool:
    from fanout_postgres.types import equality_is_coarse

    return equality_is_coarse(sa_type)


def _unknown(sa_type: Any) -> bool:
    """A type SQLAlchemy did not recognise (its ``=``, if any, is not known to be exact)."""
    import sqlalchemy as sa

    return isinstance(sa_type, sa.types.NullType)


def _as_text(column: Any) -> Any:
    import sqlalchemy as sa

    return sa.cast(column, sa.Text)


def _compared(column: Any, as_text: _AsText) -> list[Any]:
    """What the no-op check compares of ``column``: itself, its text, or both. The text
    is compared byte for byte (``COLLATE "C"``): a cast to ``text`` keeps a text column's
    collation, and a nondeterministic one calls ``'Bob'`` and ``'bob'`` equal."""
    if as_text is None:
        return [column]
    text = _as_text(column).collate("C")
    return [text] if as_text == "only" else [column, text]


def progress_table(state_schema: str) -> Any:
    """fanout's progress table, as its migrations define it (:func:`.migrate.head_table`)."""
    from fanout_postgres.migrate import head_table

    return head_table("progress", state_schema)


def target_oid() -> Any:
    """The OID of the table ``%(target_table)s`` names (``NULL`` when there is none), as
    a progress mark or ``upsert_routes`` row records it (migration ``0006_target_oid``):
    resolved in the partition's transaction, so it is the table the rows went to."""
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql as pg

    regclass = sa.func.to_regclass(sa.bindparam("target_table", type_=sa.Text))
    return sa.cast(sa.cast(regclass, pg.OID), sa.BigInteger)


PARTITION_KEY = ("pipeline", "sink", "batch_id", "partition")
"""The columns naming one partition's record of a batch in fanout's state tables (progress
marks, ``upsert_routes``) and in a dead-letter table, each set from the parameter of its
name."""


def _of_partition(table: Any) -> list[Any]:
    """The conditions selecting the partition's rows of ``table`` (:data:`PARTITION_KEY`,
    from the parameters of those names)."""
    import sqlalchemy as sa

    return [table.c[name] == sa.bindparam(name) for name in PARTITION_KEY]


def _partition_values() -> dict[str, Any]:
    """The values of a row for the partition (:data:`PARTITION_KEY`, from the parameters
    of those names), to spread into an ``INSERT``'s other values."""
    import sqlalchemy as sa

    return {name: sa.bindparam(name) for name in PARTITION_KEY}


def _prune_older(table: Any) -> Any:
    """The ``DELETE`` of the partition's rows of ``table`` for the batches before
    ``%(keep_from)s`` (the pipeline's, the sink's and the partition's, of any batch id
    below it)."""
    import sqlalchemy as sa

    return sa.delete(table).where(
        table.c.pipeline == sa.bindparam("pipeline"),
        table.c.sink == sa.bindparam("sink"),
        table.c.partition == sa.bindparam("partition"),
        table.c.batch_id < sa.bindparam("keep_from"),
    )


def _mark_statements(state_schema: str) -> dict[str, str]:
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql as pg

    p = progress_table(state_schema)
    key = sa.and_(*_of_partition(p))
    insert = (
        pg.insert(p)
        .values(
            **_partition_values(),
            partitions=sa.bindparam("partitions"),
            query_id=sa.bindparam("query_id"),
            target=sa.bindparam("target"),
            rows=0,
        )
        .on_conflict_do_nothing(index_elements=["pipeline", "sink", "batch_id", "partition"])
        .returning(p.c.batch_id)
    )
    select = sa.select(p.c.partitions, p.c.query_id, p.c.rows, p.c.rejects).where(key)
    update = (
        sa.update(p)
        .where(key)
        .values(
            rows=sa.bindparam("rows"),
            rejects=sa.cast(sa.bindparam("rejects"), pg.JSONB),
            fingerprint=sa.bindparam("fingerprint"),
            input_rows=sa.bindparam("input_rows"),
            input_checksum=sa.bindparam("input_checksum"),
            route=sa.bindparam("route"),
            target_oid=target_oid(),
        )
    )
    rejects = sa.update(p).where(key).values(rejects=sa.cast(sa.bindparam("rejects"), pg.JSONB))
    prune = _prune_older(p)
    return {
        "mark_insert": compile_sql(insert),
        "mark_select": compile_sql(select),
        "mark_update": compile_sql(update),
        "mark_prune": compile_sql(prune),
        "mark_rejects": compile_sql(rejects),
    }


def upsert_routes_table(state_schema: str) -> Any:
    """fanout's table of the routes committed upsert partitions went through, as its
    migrations define it (:func:`.migrate.head_table`)."""
    from fanout_postgres.migrate import head_table

    return head_table("upsert_routes", state_schema)


def _route_statements(state_schema: str) -> str:
    """Upsert: one text of two statements, recording the partition's route and the batch's
    partition count, with no refused row yet (:func:`_route_refused` counts them; a replay
    under the same route, or of an older fanout's record, rewrites them all) and deleting
    the partition's records of batches older than ``%(keep_from)s``."""
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql as pg

    r = upsert_routes_table(state_schema)
    insert = pg.insert(r).values(
        **_partition_values(),
        route=sa.bindparam("route"),
        partitions=sa.bindparam("partitions"),
        target_oid=target_oid(),
        target=sa.bindparam("target", type_=sa.Text),
        refused=sa.literal_column("0"),
        kept_in=sa.null(),
    )
    insert = insert.on_conflict_do_update(
        index_elements=["pipeline", "sink", "batch_id", "partition"],
        set_={
            "route": insert.excluded.route,
            "partitions": insert.excluded.partitions,
            "target_oid": insert.excluded.target_oid,
            "target": insert.excluded.target,
            "refused": insert.excluded.refused,
            "kept_in": insert.excluded.kept_in,
            "committed_at": sa.func.now(),
        },
    )
    return f"{compile_sql(insert)}; {compile_sql(_prune_older(r))}"


def _later_batch(state_schema: str) -> str:
    """Upsert: the greatest batch id above ``%(batch_id)s`` in ``upsert_routes`` for the
    pipeline's scope and the sink, any partition (the key range of the primary key)."""
    import sqlalchemy as sa

    r = upsert_routes_table(state_schema)
    later = sa.select(sa.func.max(r.c.batch_id)).where(
        r.c.pipeline == sa.bindparam("pipeline"),
        r.c.sink == sa.bindparam("sink"),
        r.c.batch_id > sa.bindparam("batch_id"),
    )
    return compile_sql(later)


EPOCH_FENCE = 2**63 - 1
"""The batch id of the record (partition ``-1``) with which a new epoch closes the scopes of
the earlier epochs to the sink's writes still in flight (:func:`fence_earlier_epochs`): an
``upsert_routes`` row (upsert) or a progress mark (append). Above every batch there, so an
earlier epoch's upsert straggler, whose check asks for a later batch of its own scope
(:func:`_later_batch`), finds it with the same index lookup; an append partition looks it
up after taking the scope's fence lock (:func:`_fence_check`)."""


def epoch_fence_lock(scope: str, sink: str) -> int:
    """The key of the advisory lock guarding the epoch fence of ``sink`` in ``scope``: every
    append partition transaction of the scope holds it shared until its commit
    (:func:`_fence_check`), the fence takes it exclusively (:func:`fence_earlier_epochs`),
    so the fence waits for every partition already writing and every partition starting
    after it waits for the fence and then sees it. A hash stable across processes, as one
    signed 64-bit key."""
    text = json.dumps(["epoch-fence", scope, sink])
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _fence_check(state_schema: str) -> str:
    """Append: the scope's fence lock taken shared, then whether the scope's
    :data:`EPOCH_FENCE` mark is there (one primary-key lookup). Two statements: in
    ``READ COMMITTED`` each takes its snapshot when it starts, so the lookup sees a fence
    committed while this transaction waited for the lock."""
    import sqlalchemy as sa

    p = progress_table(state_schema)
    fenced = sa.select(
        sa.exists().where(
            p.c.pipeline == sa.bindparam("pipeline"),
            p.c.sink == sa.bindparam("sink"),
            p.c.batch_id == sa.literal_column(str(EPOCH_FENCE)),
            p.c.partition == sa.literal_column("-1"),
        )
    )
    return f"SELECT pg_advisory_xact_lock_shared(%(fence_lock)s); {compile_sql(fenced)}"


def fence_earlier_epochs(state_schema: str, mode: str) -> Any:
    """The ``INSERT`` of an :data:`EPOCH_FENCE` record of the sink in each scope of
    ``%(scopes)s`` (the earlier epochs'), unless there is one: an ``upsert_routes`` row
    (upsert) or a progress mark (append; no rows, no partitions, ``%(target)s``). From then
    on a partition of those epochs finds it, and rolls back (docs/architecture.md §8.2, "A
    straggler of an earlier batch"). Parameters ``scopes`` (a list), ``sink`` and, append,
    ``target``. Append takes each scope's fence lock exclusively first
    (:func:`epoch_fence_locks`)."""
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql as pg

    append = mode == "append"
    r = progress_table(state_schema) if append else upsert_routes_table(state_schema)
    scopes = sa.func.unnest(sa.bindparam("scopes", type_=pg.ARRAY(sa.Text)))
    columns = [
        scopes, sa.bindparam("sink", type_=sa.Text),
        sa.literal_column(str(EPOCH_FENCE)), sa.literal_column("-1"),
    ]  # fmt: skip
    names = ["pipeline", "sink", "batch_id", "partition"]
    if append:
        columns += [
            sa.literal_column("0"), sa.bindparam("target", type_=sa.Text),
            sa.literal_column("0"),
        ]  # fmt: skip
        names += ["partitions", "target", "rows"]
    insert = pg.insert(r).from_select(names, sa.select(*columns))
    return insert.on_conflict_do_nothing(
        index_elements=["pipeline", "sink", "batch_id", "partition"]
    )


EPOCH_FENCE_LOCKS = "SELECT pg_advisory_xact_lock(k) FROM unnest(CAST(:locks AS bigint[])) AS k"
"""Append: take the fence locks ``:locks`` (:func:`epoch_fence_lock` of each earlier scope,
in the order given) exclusively, in the fence's transaction before its ``INSERT``: it waits
for every partition transaction of those scopes still open."""


EPOCH_FENCE_HOLDERS = (
    "SELECT l.classid::bigint, l.objid::bigint, l.pid, a.state, a.xact_start "
    "FROM pg_locks AS l LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid "
    "WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted "
    "AND l.pid <> pg_backend_pid() AND (l.classid::bigint, l.objid::bigint) IN "
    "(SELECT * FROM unnest(CAST(:highs AS bigint[]), CAST(:lows AS bigint[]))) "
    "ORDER BY l.pid"
)
"""Append, before the fence takes its locks: the sessions holding one of them (a
one-bigint advisory key is shown as its high half in ``classid``, its low half in
``objid``, ``objsubid`` 1; :func:`lock_halves`): each lock's halves, backend pid, state and
transaction start. A read of ``pg_locks`` only (taking nothing: taking the free locks first
would break the order in which fences take them, and two fences could deadlock)."""


def lock_halves(key: int) -> tuple[int, int]:
    """The high and low unsigned 32-bit halves of a one-bigint advisory lock key, as
    ``pg_locks`` shows them in ``classid`` and ``objid`` (:data:`EPOCH_FENCE_HOLDERS`)."""
    return (key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF


def lift_epoch_fence(state_schema: str, mode: str) -> Any:
    """The ``DELETE`` of the sink's :data:`EPOCH_FENCE` record in scope ``%(scope)s``: the
    start of the epoch after it was refused, so that scope is the pipeline's newest again
    (its old checkpoint may be started again to complete a batch). Parameters ``scope`` and
    ``sink``."""
    import sqlalchemy as sa

    r = progress_table(state_schema) if mode == "append" else upsert_routes_table(state_schema)
    return sa.delete(r).where(
        r.c.pipeline == sa.bindparam("scope"),
        r.c.sink == sa.bindparam("sink"),
        r.c.batch_id == sa.literal_column(str(EPOCH_FENCE)),
        r.c.partition == sa.literal_column("-1"),
    )


def forget_fence_sql(state_schema: str, scope: str, sink: str, mode: str) -> str:
    """The ``DELETE`` of the sink's :data:`EPOCH_FENCE` record in one scope, as an error
    names it for a person to run (its values inline, quoted)."""
    table = "progress" if mode == "append" else "upsert_routes"
    return (
        f"{_forget_sql(state_schema, table, scope, sink)} AND batch_id = {EPOCH_FENCE} "
        "AND partition = -1"
    )


def forget_routes_sql(state_schema: str, scope: str, sink: str) -> str:
    """The ``DELETE`` of a sink's ``upsert_routes`` rows of one pipeline scope, as an error
    names it for a person to run (its values inline, quoted): the records of an earlier
    run that make a pipeline started again under the same name be refused."""
    return _forget_sql(state_schema, "upsert_routes", scope, sink)


def forget_marks_sql(state_schema: str, scope: str, sink: str) -> str:
    """The ``DELETE`` of a sink's progress marks of one pipeline scope (append mode), as an
    error names it for a person to run (its values inline, quoted): the marks of an
    earlier run that make a pipeline started again under the same name be refused."""
    return _forget_sql(state_schema, "progress", scope, sink)


def restarted(*, ledger_too: bool) -> str:
    """Why a sink meets an earlier run's records of the batch Spark hands (its progress
    marks by another query, a later batch in ``upsert_routes``), as the refusals say it:
    the pipeline started again under the same name on a new checkpoint; ``ledger_too``:
    with a new ledger as well (a later batch recorded says so: the old ledger would have
    refused the earlier one), else perhaps (a mark of another query says only the
    checkpoint). The one text of the four refusals (driver and partition, append and
    upsert)."""
    ledger = "and ledger" if ledger_too else "(and ledger)"
    return (
        f"the pipeline's checkpoint {ledger} were replaced and it starts again under the same name"
    )


RESTORE_OR_RENAME = (
    "Restore the pipeline's ledger and checkpoint; or, to write the table again from this "
    "batch on, give the pipeline a new name"
)
"""The driver's ways on after :func:`restarted` (append and upsert alike)."""


def forget_marks_advice(state_schema: str, scope: str, sink: str, table: object) -> str:
    """What the refusals of an append batch another query marked (the pipeline started
    again under the same name with a new checkpoint) say of :func:`forget_marks_sql`:
    the statement, and that it duplicates what the new run reads again."""
    return (
        "Deleting the earlier run's marks lets this run write under the same name: "
        f"{forget_marks_sql(state_schema, scope, sink)}; but the rows the earlier run "
        f"appended to {table} stay there, and a batch reading the same input again appends "
        "them a second time"
    )


def _forget_sql(state_schema: str, table: str, scope: str, sink: str) -> str:
    return (
        f"DELETE FROM {quote(state_schema)}.{table} WHERE pipeline = {sql_literal(scope)} "
        f"AND sink = {sql_literal(sink)}"
    )


def _route_refused(state_schema: str) -> str:
    """Upsert: set the partition's ``upsert_routes`` row's ``refused`` and ``kept_in``."""
    import sqlalchemy as sa

    r = upsert_routes_table(state_schema)
    update = (
        sa.update(r)
        .where(*_of_partition(r))
        .values(refused=sa.bindparam("refused"), kept_in=sa.bindparam("kept_in"))
    )
    return compile_sql(update)


def dead_letter_table(name: TableName) -> Any:
    """The layout of a PostgreSQL dead-letter table (created by the sink when missing)."""
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql as pg

    return sa.Table(
        name.name,
        sa.MetaData(),
        sa.Column("pipeline", sa.Text, nullable=False),
        sa.Column("sink", sa.Text, nullable=False),
        sa.Column("batch_id", sa.BigInteger, nullable=False),
        sa.Column("partition", sa.Integer, nullable=False),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("column_name", sa.Text),
        sa.Column("value", sa.Text),
        sa.Column("row", pg.JSONB, nullable=False),
        sa.Column("rejected_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
        sa.Column(ROUTE_COLUMN, sa.Text),
        schema=name.schema,
    )


ROUTE_COLUMN = "route"
"""The column of a route letter's route: ``<fingerprint> <route>`` (null for the rows the
target refused, and in records written before it existed); added to an older table by
:func:`fanout_postgres.deadletter.ensure_table`."""


DEAD_LETTER_COLUMNS = (
    "pipeline",
    "sink",
    "batch_id",
    "partition",
    "target",
    "reason",
    "column_name",
    "value",
    "row",
    "rejected_at",
)
"""The columns a dead-letter table must have (:data:`ROUTE_COLUMN` is added when missing)."""


def _dead_letter_statements(name: TableName | None) -> dict[str, str]:
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql as pg

    if name is None:
        return {"dead_delete": "", "dead_insert": ""}
    d = dead_letter_table(name)
    delete = sa.delete(d).where(*_of_partition(d))
    insert = sa.insert(d).values(
        **_partition_values(),
        target=sa.bindparam("target"),
        reason=sa.bindparam("reason"),
        column_name=sa.bindparam("column_name"),
        value=sa.bindparam("value"),
        row=sa.cast(sa.bindparam("row"), pg.JSONB),
    )
    return {"dead_delete": compile_sql(delete), "dead_insert": compile_sql(insert)}
