"""On the driver: reflect the target table, check it against the options and the batch
schema, and build the :class:`WritePlan` the executors run."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fanout.partitioned.membership import hash_refusal
from fanout_postgres import types as pgtypes
from fanout_postgres.binary import wire_kind
from fanout_postgres.encode import Check
from fanout_postgres.identifiers import TableName, quote
from fanout_postgres.keyhash import HASHED, KeyHash, KeyRefused, key_fold
from fanout_postgres.statements import ROW, Statements, build_statements


class PlanError(ValueError):
    """A mismatch between options, batch and table; ``columns`` names the culprits."""

    def __init__(self, message: str, columns: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.columns = list(columns)


@dataclass(frozen=True)
class TargetColumn:
    """A reflected column of the target table."""

    name: str
    sa_type: Any
    nullable: bool
    has_default: bool
    generated: bool
    identity_always: bool = False
    """``GENERATED ALWAYS AS IDENTITY``: ``COPY`` writes a value into it, ``INSERT`` refuses
    one (SQLSTATE 428C9)."""

    @property
    def pg_type(self) -> str:
        """The type as PostgreSQL spells it (for messages)."""
        from sqlalchemy.dialects import postgresql

        try:
            return str(self.sa_type.compile(dialect=postgresql.dialect()))
        except Exception:
            return str(self.sa_type)


IndexCollations = tuple[tuple[frozenset[str], tuple[tuple[str, str], ...]], ...]
"""(a unique index's columns, ((column, the index's collation) ...)) per index comparing a
column by a nondeterministic collation other than the column's own."""


@dataclass(frozen=True)
class TargetInfo:
    """What reflection tells about the target table."""

    table: TableName
    columns: dict[str, TargetColumn]
    primary_key: tuple[str, ...]
    unique_sets: tuple[frozenset[str], ...] = field(default_factory=tuple)
    deferrable_sets: tuple[frozenset[str], ...] = field(default_factory=tuple)
    """Column sets of ``DEFERRABLE`` unique constraints (``ON CONFLICT`` refuses them as
    arbiters): not in :attr:`unique_sets`."""
    loose_collations: Mapping[str, str] = field(default_factory=dict)
    """Column -> the nondeterministic collation (ICU, ``deterministic = false``) comparing
    it, as the column's own or in a unique index on it: its ``=`` may call different
    strings equal (``'Bob'`` and ``'bob'``), like ``citext``'s, by rules no fold follows."""
    index_collations: IndexCollations = ()
    """Unique indexes comparing a column by a nondeterministic collation other than the
    column's own: (the index's columns, (column, the index's collation) ...)."""


@dataclass(frozen=True)
class WritePlan:
    """Everything a partition task needs besides the connection (picklable)."""

    sink: str
    table: str
    mode: str
    columns: tuple[tuple[str, str], ...]  # (batch column, target column)
    keys: tuple[str, ...]
    hash_columns: tuple[str, ...]
    partitions: int
    checks: tuple[Check, ...]
    statements: Statements
    dead_letter: str | None  # "postgres" (in the partition's transaction), "driver" or None
    state_schema: str
    settings: tuple[tuple[str, str], ...] = ()
    wire_kinds: tuple[str | None, ...] = ()
    """Binary COPY format of each written column (``None``: text only)."""
    target: str = ""
    """The table as the statements name it (schema-qualified when it was resolved)."""
    column_types: tuple[str, ...] = ()
    """Each written column's type when the plan was made (``format_type``): a partition
    whose table has other types now rolls back (``transaction.PartitionTransaction``)."""
    key_hashes: tuple[KeyHash, ...] = ()
    """Upsert keys hashed on a fold of their values (:mod:`fanout_postgres.keyhash`)."""

    @property
    def sources(self) -> dict[str, str]:
        """Target column -> batch column."""
        return {target: source for source, target in self.columns}


def reflect(conn: Any, table: TableName) -> TargetInfo | None:
    """The target's columns and unique column sets, or ``None`` when it does not exist."""
    import sqlalchemy as sa

    inspector = sa.inspect(conn)
    if not inspector.has_table(table.name, schema=table.schema):
        return None
    with warnings.catch_warnings():
        # A type SQLAlchemy does not know (geometric, PostGIS, xml...) reflects as NullType,
        # which fanout compares and orders by its text: the warning would tell a user of
        # such a table, at every open, about a case that is handled.
        warnings.filterwarnings("ignore", "Did not recognize type", sa.exc.SAWarning)
        reflected = inspector.get_columns(table.name, schema=table.schema)
    columns = {
        c["name"]: TargetColumn(
            name=c["name"],
            sa_type=c["type"],
            nullable=bool(c.get("nullable", True)),
            has_default=c.get("default") is not None or bool(c.get("identity")),
            generated=bool(c.get("computed")),
            identity_always=bool((c.get("identity") or {}).get("always")),
        )
        for c in reflected
    }
    pk = tuple(inspector.get_pk_constraint(table.name, schema=table.schema)["constrained_columns"])
    unique: list[frozenset[str]] = [frozenset(pk)] if pk else []
    for uc in inspector.get_unique_constraints(table.name, schema=table.schema):
        unique.append(frozenset(uc["column_names"]))
    for index in inspector.get_indexes(table.name, schema=table.schema):
        names = index.get("column_names") or []
        partial = (index.get("dialect_options") or {}).get("postgresql_where")
        if index.get("unique") and names and None not in names and not partial:
            unique.append(frozenset(names))
    deferrable = _deferrable_sets(conn, table)
    usable = [u for u in unique if u not in deferrable]
    loose, index_collations = _loose_collations(conn, table)
    return TargetInfo(table, columns, pk, tuple(usable), tuple(deferrable), loose, index_collations)


COLUMN_COLLATIONS_SQL = (
    "SELECT a.attname, c.collname FROM pg_attribute a JOIN pg_collation c "
    "ON c.oid = a.attcollation WHERE a.attrelid = to_regclass(:table) AND a.attnum > 0 "
    "AND NOT a.attisdropped AND NOT c.collisdeterministic"
)
"""The columns whose own collation is nondeterministic."""
INDEX_COLLATIONS_SQL = (
    "SELECT i.indexrelid, a.attname, COALESCE(c.collname, ''), "
    "COALESCE(NOT c.collisdeterministic AND k.coll <> a.attcollation, false) FROM pg_index i "
    "CROSS JOIN LATERAL unnest(i.indkey::int2[], i.indcollation::oid[]) AS k(attnum, coll) "
    "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
    # a column of a type without collation (bigint...) has none: still one of the index's
    "LEFT JOIN pg_collation c ON c.oid = k.coll "
    "WHERE i.indrelid = to_regclass(:table) AND i.indisunique AND i.indpred IS NULL "
    "AND i.indexprs IS NULL"
)
"""Each unique index's columns, with whether the index compares one by a nondeterministic
collation other than the column's own (``ON CONFLICT`` and the unique check decide by the
index's)."""


def _loose_collations(conn: Any, table: TableName) -> tuple[dict[str, str], IndexCollations]:
    """:attr:`TargetInfo.loose_collations` and :attr:`TargetInfo.index_collations` (read
    by :data:`COLUMN_COLLATIONS_SQL` and :data:`INDEX_COLLATIONS_SQL`, decided by
    :func:`collations_found`); none before PostgreSQL 12, which has no nondeterministic
    collation."""
    import sqlalchemy as sa

    version = getattr(conn.dialect, "server_version_info", None) or (0,)
    if version < (12,):
        return {}, ()
    params = {"table": table.quoted()}
    columns = conn.execute(sa.text(COLUMN_COLLATIONS_SQL), params).all()
    indexes = conn.execute(sa.text(INDEX_COLLATIONS_SQL), params).all()
    return collations_found(columns, indexes)


def collations_found(
    column_rows: Sequence[Sequence[Any]], index_rows: Sequence[Sequence[Any]]
) -> tuple[dict[str, str], IndexCollations]:
    """:attr:`TargetInfo.loose_collations` and :attr:`TargetInfo.index_collations` from the
    rows of :data:`COLUMN_COLLATIONS_SQL` (column, collation) and
    :data:`INDEX_COLLATIONS_SQL` (index, column, collation, whether the index's collation
    is nondeterministic and not the column's own). A column compared by such an index's
    collation is loose too, under that collation when its own is deterministic."""
    loose = dict(sorted((str(name), str(collation)) for name, collation in column_rows))
    indexes: dict[Any, list[tuple[str, str, bool]]] = {}
    for index, name, collation, other in index_rows:
        indexes.setdefault(index, []).append((str(name), str(collation), bool(other)))
    found = []
    for columns in indexes.values():
        others = tuple((name, collation) for name, collation, other in columns if other)
        if others:
            found.append((frozenset(name for name, _, _ in columns), others))
            for name, collation in others:
                loose.setdefault(name, collation)
    return loose, tuple(found)


def _deferrable_sets(conn: Any, table: TableName) -> set[frozenset[str]]:
    """The column sets of the table's ``DEFERRABLE`` unique constraints (``indimmediate``
    false): ``ON CONFLICT`` infers every unique index on its columns as arbiter and refuses
    a deferrable one, even beside an immediate index on the same columns."""
    import sqlalchemy as sa

    rows = conn.execute(
        sa.text(
            "SELECT i.indimmediate, array_agg(a.attname) FROM pg_index i "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey) "
            "WHERE i.indrelid = to_regclass(:table) AND i.indisunique "
            "GROUP BY i.indexrelid, i.indimmediate"
        ),
        {"table": table.quoted()},
    ).all()
    return {frozenset(names) for now, names in rows if not now}


def resolve_keys(info: TargetInfo, keys: Sequence[str] | None, mode: str) -> tuple[str, ...]:
    """The key columns: the option, else the primary key. Upsert keys must be exactly the
    columns of a primary key, unique constraint or non-partial unique index."""
    table = info.table
    chosen = tuple(keys) if keys else info.primary_key
    missing = [k for k in chosen if k not in info.columns]
    if missing:
        raise PlanError(
            f"option 'keys' names {_names(missing)}, not columns of table {table} "
            f"(columns: {_names(info.columns)})",
            missing,
        )
    if mode != "upsert":
        return chosen
    if not chosen:
        raise PlanError(
            f"table {table} has no primary key; set option 'keys' to columns with a "
            "unique constraint (upsert needs one for ON CONFLICT)"
        )
    if frozenset(chosen) in info.deferrable_sets:
        raise PlanError(
            f"keys {_names(chosen)} of table {table} have a DEFERRABLE unique constraint, "
            "which INSERT ... ON CONFLICT cannot use as its arbiter; drop it and add it "
            "again NOT DEFERRABLE",
            chosen,
        )
    if frozenset(chosen) not in info.unique_sets:
        raise PlanError(
            f"keys {_names(chosen)} of table {table} are not unique-constrained: "
            f"INSERT ... ON CONFLICT ({', '.join(quote(k) for k in chosen)}) needs a primary "
            "key, unique constraint or non-partial unique index on exactly these columns "
            f"(e.g. ALTER TABLE {table} ADD UNIQUE ({', '.join(quote(k) for k in chosen)}))",
            chosen,
        )
    return chosen


def check_target(
    info: TargetInfo | None,
    keys: Sequence[str] | None,
    order_by: Sequence[str],
    columns: Sequence[str] | Mapping[str, str] | None,
    mode: str,
    *,
    create_table: bool,
) -> tuple[str, ...] | None:
    """At ``open()``: the keys of an existing table (``None`` for a table to create), or
    :class:`PlanError` saying which option does not fit the table."""
    if info is None:
        if not create_table:
            raise PlanError(
                "the table does not exist; create it, or set "
                "create_table: true to create it from the batch schema"
            )
        if mode == "upsert" and not keys:
            raise PlanError("create_table needs option 'keys' (the new table's primary key)")
        return None
    resolved = resolve_keys(info, keys, mode)
    for column in order_by:
        if column not in info.columns:
            raise PlanError(f"option 'order_by' names {column!r}, not a column of the table")
    if columns is not None:
        targets = columns.values() if isinstance(columns, Mapping) else columns
        missing = [c for c in targets if c not in info.columns]
        if missing:
            raise PlanError(f"option 'columns' names {missing}, not columns of the table")
    return resolved


def map_columns(
    batch_columns: Sequence[str], option: Sequence[str] | Mapping[str, str] | None
) -> list[tuple[str, str]]:
    """``(batch column, target column)`` pairs: every batch column under its own name, or
    the ones option ``columns`` selects (list) or renames (``{batch: target}``)."""
    if option is None:
        return [(c, c) for c in batch_columns]
    pairs = list(option.items()) if isinstance(option, Mapping) else [(c, c) for c in option]
    missing = [s for s, _ in pairs if s not in batch_columns]
    if missing:
        raise PlanError(
            f"option 'columns' names {_names(missing)}, not in the batch "
            f"(batch columns: {_names(batch_columns)})",
            missing,
        )
    return pairs


def check_batch(
    info: TargetInfo, pairs: Sequence[tuple[str, str]], spark_types: Mapping[str, Any]
) -> None:
    """Every batch column has a target column of a compatible type, into which PostgreSQL
    would not round its values silently (:func:`fanout_postgres.types.loss`); the table's
    required columns are all written."""
    table = info.table
    for source, target in pairs:
        column = info.columns.get(target)
        if column is None:
            raise PlanError(
                f"batch column {source!r} has no column {quote(target)} in table {table} "
                f"(columns: {_names(info.columns)}); add the column to the table, or choose "
                "and rename columns with option 'columns'",
                [source],
            )
        if column.generated:
            raise PlanError(
                f"batch column {source!r} maps to the generated column {quote(target)} of "
                f"table {table}, which cannot be written",
                [source],
            )
        if column.identity_always:
            # COPY would take the values and the INSERT a partition falls back to refuse
            # them: the batch would fail once a key was updated or a row refused
            raise PlanError(
                f"batch column {source!r} maps to the identity column {quote(target)} of "
                f"table {table}, GENERATED ALWAYS, which takes no value; leave it out of the "
                "batch (option 'columns'), or make it GENERATED BY DEFAULT (ALTER TABLE "
                f"{table} ALTER COLUMN {quote(target)} SET GENERATED BY DEFAULT)",
                [source],
            )
        check_stored_form(source, spark_types[source])
        spark_kind = pgtypes.spark_kind(spark_types[source])
        kind = pgtypes.target_kind(column.sa_type)
        if spark_kind != "null" and spark_kind not in pgtypes.COMPATIBLE[kind]:
            raise PlanError(
                f"batch column {source!r} ({spark_types[source].simpleString()}) cannot be "
                f"written to column {quote(target)} of table {table} ({column.pg_type}); "
                "cast it in the query, or write it as a string for PostgreSQL to parse",
                [source],
            )
        lost = pgtypes.loss(spark_types[source], column.sa_type)
        if lost is not None:
            raise PlanError(
                f"batch column {source!r} ({spark_types[source].simpleString()}) cannot be "
                f"written to column {quote(target)} of table {table} ({column.pg_type}) "
                f"without loss: {lost.what}; {lost.remedy(source)}, or change the column's "
                "type",
                [source],
            )
    written = {t for _, t in pairs}
    required = [
        c.name
        for c in info.columns.values()
        if not c.nullable and not c.has_default and not c.generated and c.name not in written
    ]
    if required:
        raise PlanError(
            f"table {table} requires {_names(required)} (NOT NULL, no default) but the batch "
            "does not provide them",
            required,
        )


@dataclass(frozen=True)
class PlanOptions:
    """The sink options a plan depends on."""

    sink: str
    table: TableName
    mode: str
    keys: Sequence[str] | None
    order_by: Sequence[str]
    columns: Sequence[str] | Mapping[str, str] | None
    partitions: int
    state_schema: str
    dead_letter_table: TableName | None
    dead_letter_kind: str | None
    settings: tuple[tuple[str, str], ...] = ()
    schema: str | None = None
    """The schema ``table`` resolved to, when it names none: the statements qualify it."""
    dead_letter_schema: str | None = None
    """The schema ``dead_letter_table`` resolved to on the driver, when it names none: the
    partitions' statements qualify it (their ``settings`` may set another search_path),
    while the records (``kept_in``) keep the name as the option spells it."""


def build_plan(info: TargetInfo, options: PlanOptions, spark_schema: Any) -> WritePlan:
    """The plan for batches of ``spark_schema`` (a Spark ``StructType``)."""
    spark_types = {f.name: f.dataType for f in spark_schema.fields}
    pairs = map_columns(list(spark_types), options.columns)
    targets = [t for _, t in pairs]
    check_targets(targets)
    check_batch(info, pairs, spark_types)
    keys = resolve_keys(info, options.keys, options.mode)
    for option, names in (("keys", keys), ("order_by", options.order_by)):
        unwritten = [k for k in names if k not in targets]
        if unwritten and (option == "order_by" or options.mode == "upsert"):
            raise PlanError(
                f"option {option!r} names {_names(unwritten)}, which the batch does not write "
                f"to table {info.table} (written: {_names(targets)})",
                unwritten,
            )
    checks = tuple(
        Check(
            column=t,
            # an upsert key must not be NULL (ON CONFLICT matches no NULL: a replay would
            # insert the row again); append keys only choose the partitions
            not_null=not info.columns[t].nullable or (t in keys and options.mode == "upsert"),
            max_length=pgtypes.max_length(info.columns[t].sa_type),
            pg_type=info.columns[t].pg_type,
        )
        for t in targets
    )
    target = options.table
    if target.schema is None and options.schema is not None:
        target = TableName(target.name, options.schema)
    statements = build_statements(
        target=target,
        columns=[(t, info.columns[t].sa_type) for t in targets],
        keys=keys,
        order_by=options.order_by,
        upsert=options.mode == "upsert",
        text_compared=[
            t
            for t in targets
            if pgtypes.changes_compare_as_text(info.columns[t].sa_type)
            or t in info.loose_collations
        ],
        loose=[t for t in targets if t in info.loose_collations],
        state_schema=options.state_schema,
        dead_letter=options.dead_letter_table,
        dead_letter_schema=options.dead_letter_schema,
    )
    hash_columns = tuple(keys if (keys and all(k in targets for k in keys)) else targets)
    if options.mode == "append":  # its partition membership digest hashes them
        sources = {t: s for s, t in pairs}
        refused = hash_refusal(
            spark_schema, [sources[c] for c in hash_columns], keyed=hash_columns == tuple(keys)
        )
        if refused is not None:
            raise PlanError(*refused)
    key_hashes: tuple[KeyHash, ...] = ()
    if options.mode == "upsert":
        check_zone_less_keys(info, pairs, keys, spark_types)
        check_key_collations(info, pairs, keys)
    if options.mode == "upsert" and options.partitions > 1:
        key_hashes = fold_keys(info, pairs, keys, spark_types)
    if options.mode == "upsert":  # after fold_keys, which refuses these keys first
        check_string_time_keys(info, pairs, keys, spark_types, options.settings)
    return WritePlan(
        sink=options.sink,
        table=options.table.quoted(),
        mode=options.mode,
        columns=tuple(pairs),
        keys=tuple(keys),
        hash_columns=hash_columns,
        partitions=options.partitions,
        checks=checks,
        statements=statements,
        dead_letter=options.dead_letter_kind,
        state_schema=options.state_schema,
        settings=options.settings,
        wire_kinds=tuple(wire_kind(info.columns[t].sa_type) for t in targets),
        target=target.quoted(),
        key_hashes=key_hashes,
    )


def fold_keys(
    info: TargetInfo, pairs: Sequence[tuple[str, str]], keys: Sequence[str],
    spark_types: Mapping[str, Any],
) -> tuple[KeyHash, ...]:  # fmt: skip
    """The upsert keys to hash on a fold of their values, so that keys PostgreSQL calls
    equal share a partition (:mod:`fanout_postgres.keyhash`); :class:`PlanError` for a key
    no fold covers."""
    sources = {target: source for source, target in pairs}
    folded = []
    for key in keys:
        source, column = sources[key], info.columns[key]
        try:
            collation = info.loose_collations.get(key)
            if collation is not None:  # 'Bob' = 'bob', or more: no fold can know
                raise KeyRefused(
                    f"the values its nondeterministic collation {quote(collation)} calls "
                    "equal (differing in case or accents, as the collation says)",
                    None,
                )
            fold = key_fold(spark_types[source], column.sa_type)
        except KeyRefused as refused:
            raise PlanError(_unfoldable(info.table, source, key, column, spark_types[source],
                                        refused), [source]) from None  # fmt: skip
        if fold is not None:
            folded.append(KeyHash(key, fold))
    return tuple(folded)


def check_key_collations(
    info: TargetInfo, pairs: Sequence[tuple[str, str]], keys: Sequence[str]
) -> None:
    """:class:`PlanError` when the unique index on the upsert keys compares one by a
    nondeterministic collation other than the column's own: ``ON CONFLICT`` then calls two
    rows one key that the batch's choice of a winner (``DISTINCT ON``, by the column's
    collation) keeps apart, and every attempt fails on a key "held twice"."""
    for columns, collations in info.index_collations:
        if columns != frozenset(keys):
            continue
        column, collation = collations[0]
        raise PlanError(
            f"the unique index on the keys ({', '.join(quote(k) for k in keys)}) of table "
            f"{info.table} compares column {quote(column)} by the nondeterministic "
            f"collation {quote(collation)}, not by the column's own collation: the sink "
            "chooses each key's row by the column's, and the index would call two of them "
            "one key; give the column that collation (ALTER TABLE ... ALTER COLUMN "
            f"{quote(column)} TYPE ... COLLATE {quote(collation)})",
            [source for source, target in pairs if target == column],
        )


def check_zone_less_keys(
    info: TargetInfo, pairs: Sequence[tuple[str, str]], keys: Sequence[str],
    spark_types: Mapping[str, Any],
) -> None:  # fmt: skip
    """:class:`PlanError` for an upsert key of Spark ``timestamp_ntz`` or ``date`` written
    to a ``timestamptz`` column. PostgreSQL reads a zone-less time (a date: its midnight) in
    the connection's ``TimeZone``, which neither Spark nor the ledger sees: a change of it
    moves every key (the next write, or a replay, puts keys beside the old ones), and in a
    daylight-saving gap two times become one key, whichever commits last winning over
    ``order_by``. Cast to Spark's ``timestamp``, a key is an instant read in the Spark
    session's zone, which a route's fingerprint records."""
    from pyspark.sql import types as T

    sources = {target: source for source, target in pairs}
    for key in keys:
        source, column = sources[key], info.columns[key]
        zoned = bool(getattr(pgtypes.without_domain(column.sa_type), "timezone", False))
        spark_type = spark_types[source]
        if not (isinstance(spark_type, (T.TimestampNTZType, T.DateType)) and zoned):
            continue
        is_date = isinstance(spark_type, T.DateType)
        raise PlanError(
            f"key column {source!r} ({spark_type.simpleString()}) is written to column "
            f"{quote(key)} of table {info.table} ({column.pg_type}): PostgreSQL reads "
            + ("a date as its midnight" if is_date else "a zone-less time")
            + " in the connection's TimeZone, which fanout does not record, so a "
            "TimeZone change moves every key (the next write, or a replay, puts keys "
            "beside the old ones)"
            + (
                ""
                if is_date
                else " and in a daylight-saving gap two times become one key (whichever "
                "commits last wins, whatever order_by says)"
            )
            + "; cast it in the query to an instant read in the Spark session's time zone: "
            f"{pgtypes.cast_in_query(source, 'timestamp')}, or make the column "
            + ("date" if is_date else "timestamp (without time zone)"),
            [source],
        )


STRING_KEY_SETTINGS = {
    "TimeZone": "a time without an offset in its TimeZone",
    "DateStyle": "a date such as 01/02/2024 in its DateStyle's order of fields (January 2 "
    "under MDY, February 1 under DMY)",
}
"""The session settings PostgreSQL reads date and time text by, and how."""
PIN_EXAMPLE = {"TimeZone": "UTC", "DateStyle": "ISO, MDY"}


def string_key_settings(sa_type: Any) -> tuple[tuple[str, ...], str | None]:
    """The session settings PostgreSQL reads a string into a column of ``sa_type`` by (none
    for a type that is not a date or time), with the Spark type to cast such a key to in
    the query instead (``None``: Spark has none)."""
    import sqlalchemy as sa

    base = pgtypes.without_domain(sa_type)
    zoned = bool(getattr(base, "timezone", False))
    if isinstance(base, sa.DateTime):
        return (("TimeZone", "DateStyle") if zoned else ("DateStyle",)), (
            "timestamp" if zoned else "timestamp_ntz"
        )
    if isinstance(base, sa.Date):
        return ("DateStyle",), "date"
    if isinstance(base, sa.Time) and zoned:
        return ("TimeZone",), None
    return (), None


def check_string_time_keys(
    info: TargetInfo, pairs: Sequence[tuple[str, str]], keys: Sequence[str],
    spark_types: Mapping[str, Any], settings: Sequence[tuple[str, str]],
) -> None:  # fmt: skip
    """:class:`PlanError` for a string upsert key written to a date or time column
    (``timestamptz``, ``timestamp``, ``date``, ``timetz``) unless option ``settings`` pins
    the session settings PostgreSQL reads it by (:func:`string_key_settings`): the server's,
    database's or role's ``TimeZone`` and ``DateStyle`` are not fanout's to record, and a
    change of one moves every key, so the next write or a replay puts keys beside the old
    ones. With ``partitions`` above 1, :func:`fold_keys` refuses such keys first."""
    from pyspark.sql import types as T

    pinned = {name.lower() for name, _ in settings}
    sources = {target: source for source, target in pairs}
    for key in keys:
        source, column = sources[key], info.columns[key]
        if not isinstance(spark_types[source], T.StringType):
            continue
        needed, cast = string_key_settings(column.sa_type)
        missing = [n for n in needed if n.lower() not in pinned]
        if not missing:
            continue
        how = " and ".join(STRING_KEY_SETTINGS[n] for n in missing)
        pins = ", ".join(f"{n}: {PIN_EXAMPLE[n]!r}" for n in missing)
        remedy = f"pin {' and '.join(missing)} in option 'settings' (e.g. settings: {{{pins}}})"
        if cast is not None:
            remedy = (
                "cast it in the query, to a value Spark reads in its session (whose time zone "
                f"fanout records): {pgtypes.cast_in_query(source, cast)}, or {remedy}"
            )
        raise PlanError(
            f"key column {source!r} (string) is written to column {quote(key)} of table "
            f"{info.table} ({column.pg_type}): PostgreSQL reads {how}, settings of the "
            "connection that fanout does not record, so a change (of the server's, the "
            "database's or the role's) moves every key and the next write, or a replay, "
            f"puts keys beside the old ones; {remedy}",
            [source],
        )


def _unfoldable(
    table: TableName, source: str, key: str, column: TargetColumn, spark_type: Any,
    refused: KeyRefused,
) -> str:  # fmt: skip
    said = (
        f"key column {source!r} ({spark_type.simpleString()}) is written to column "
        f"{quote(key)} of table {table} ({column.pg_type}), which reads {refused.examples} "
        "as one key; Spark would hash them to different partitions, whose transactions "
        "commit in any order, so the last would win whatever order_by says"
    )
    if refused.cast is None:
        return f"{said}; write it as one partition (option partitions: 1)"
    return (
        f"{said}; cast it in the query so that Spark sees the key PostgreSQL sees: "
        f"{pgtypes.cast_in_query(source, refused.cast)}, or write it as one partition "
        "(option partitions: 1)"
    )


MAX_NAME_BYTES = 63
"""PostgreSQL's identifier length (``NAMEDATALEN - 1``): longer names are cut, with a
notice only."""


def check_targets(targets: Sequence[str]) -> None:
    """The target columns the batch columns map to: none reserved, none twice."""
    if ROW in targets:
        raise PlanError(f"column name {ROW!r} is reserved by the postgres sink", [ROW])
    hashes = [t for t in targets if t.startswith(HASHED)]
    if hashes:
        raise PlanError(f"column names starting {HASHED!r} are reserved by the postgres "
                        f"sink ({_names(hashes)})", hashes)  # fmt: skip
    if len(set(targets)) != len(targets):
        raise PlanError(f"two batch columns map to one target column ({_names(targets)})")


def check_stored_form(source: str, spark_type: Any) -> None:
    """:class:`PlanError` when batch column ``source`` holds a struct with two fields of
    one name (:func:`fanout_postgres.types.duplicate_field`), or a value PostgreSQL would
    get in its stored form (:func:`fanout_postgres.types.stored_form`)."""
    twice = pgtypes.duplicate_field(spark_type, source)
    if twice is not None:
        path, name = twice
        at = "" if path == source else f" at {path}"
        raise PlanError(
            f"batch column {source!r} ({spark_type.simpleString()}) holds a struct{at} with "
            f"two fields named {name!r}, which Spark cannot hand to the sink (Arrow refuses "
            "a struct's duplicate field names) and a JSON object could not hold; rename one "
            f"of the {name!r} fields in the query (named_struct or struct(... AS "
            "<other name>)), or leave the column out (option 'columns')",
            [source],
        )
    why = pgtypes.stored_form(spark_type, source)
    if why is not None:
        raise PlanError(
            f"batch column {source!r} ({spark_type.simpleString()}) cannot be written: {why}",
            [source],
        )


def table_to_create(
    table: TableName, spark_schema: Any, pairs: Sequence[tuple[str, str]], keys: Sequence[str]
) -> Any:
    """The ``sqlalchemy.Table`` option ``create_table`` creates for batches of
    ``spark_schema``: a column of :func:`fanout_postgres.types.type_for_create` per
    ``(batch column, target column)`` pair, ``keys`` as primary key. Nothing is executed;
    :class:`PlanError` names what no table can be created with (a reserved or repeated
    column, a name PostgreSQL would cut, a key the batch does not write)."""
    import sqlalchemy as sa

    targets = [t for _, t in pairs]
    check_targets(targets)
    too_long = [t for t in targets if len(t.encode()) > MAX_NAME_BYTES]
    if too_long:
        raise PlanError(
            f"column name(s) {_names(too_long)} are longer than the {MAX_NAME_BYTES} bytes "
            f"PostgreSQL keeps of a name: create_table would make table {table} with the "
            "names cut, and the batch's columns would not be found in it; rename them in "
            "the query, the sink's select or option 'columns'",
            too_long,
        )
    unwritten = [k for k in keys if k not in targets]
    if unwritten:
        raise PlanError(
            f"option 'keys' names {_names(unwritten)}, which the batch does not write "
            f"to table {table} (written: {_names(targets)}); create_table needs the keys "
            "as columns of the new table (its primary key)",
            unwritten,
        )
    types = {f.name: f.dataType for f in spark_schema.fields}
    for source, _ in pairs:
        check_stored_form(source, types[source])
    columns = [
        sa.Column(target, pgtypes.type_for_create(types[source]), nullable=target not in keys)
        for source, target in pairs
    ]
    created = sa.Table(table.name, sa.MetaData(), *columns, schema=table.schema)
    if keys:
        created.append_constraint(sa.PrimaryKeyConstraint(*keys))
    return created


def create_table(
    conn: Any, table: TableName, spark_schema: Any, pairs: Sequence[tuple[str, str]],
    keys: Sequence[str],
) -> None:  # fmt: skip
    """``CREATE TABLE IF NOT EXISTS`` of :func:`table_to_create`."""
    from sqlalchemy.schema import CreateTable

    conn.execute(CreateTable(table_to_create(table, spark_schema, pairs, keys), if_not_exists=True))


def created_target(table: TableName, created: Any) -> TargetInfo:
    """What :func:`reflect` would tell of the table :func:`table_to_create` made, without
    creating it: ``fanout validate`` checks a batch schema against a table that
    ``create_table`` would create at the first batch."""
    columns = {
        c.name: TargetColumn(c.name, c.type, bool(c.nullable), has_default=False, generated=False)
        for c in created.columns
    }
    pk = tuple(c.name for c in created.primary_key.columns)
    return TargetInfo(table, columns, pk, (frozenset(pk),) if pk else ())


def _names(names: Any) -> str:
    return ", ".join(quote(str(n)) for n in names) or "none"
