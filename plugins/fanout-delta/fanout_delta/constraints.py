"""The rows a Delta table's constraints refuse, found in Spark before any write.

A Delta table holds CHECK constraints (table properties ``delta.constraints.<name>``, a
Spark SQL expression each), NOT NULL columns, top-level or a field of a struct column,
and, in older tables, column invariants (the column metadata ``delta.invariants``, an
expression a row must meet, as a CHECK). delta-rs also refuses a null element of an array
whose elements may not be null (``containsNull: false``) and a null value of a map whose
values may not be null (``valueContainsNull: false``), top-level or in a struct (not
deeper: an array's elements or a map's values it does not check).
Every Delta writer refuses a row for which a CHECK's expression is false *or null*
(delta-spark's ``DeltaInvariantCheckerExec``; delta-rs alike), and a null in a NOT NULL
column. A NOT NULL field of a struct column is refused null also under a null parent
struct: the Delta protocol would take that row, but delta-rs 1.6 refuses it (its check
reads the field's values whatever the parent's validity, and Spark's Arrow conversion
leaves a null there), so both engines refuse it alike rather than let delta-rs fail the
batch. Left to the writer, one such row fails the whole batch, and delta-rs names neither
the constraint nor the row.

So the sink reads the constraints from the snapshot it already reads for the batch
(:meth:`TableConstraints.of`) and, when the table has some, evaluates them on the batch in
Spark (one extra filter pass, only for such tables): with a dead-letter target the refused
rows become dead letters naming the constraint (:func:`split_refused_spark`), without one
the batch fails before anything is written, naming the constraint and the first refused
row's values (:func:`refuse_spark`). Constraints are deterministic (Delta refuses others),
so the same rows against the same constraints make the same letters on every replay.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from fanout.contract.dead_letters import DeadLetter, letter_rows
from fanout.deadletters.moved import refused_elsewhere, write_letters
from fanout.errors import ConfigurationError, SinkWriteError
from fanout_delta.merge import quote
from fanout_delta.schema import is_generated

if TYPE_CHECKING:
    import pyarrow as pa

    from fanout.contract.batch import Batch
    from fanout.contract.dead_letters import DeadLetterTarget

PREFIX = "delta.constraints."
"""The table properties holding CHECK constraints: ``delta.constraints.<name>``."""

logger = logging.getLogger(__name__)

_RULE = "__fanout_refused_by__"
"""The column holding, for each refused row collected, the index of the first rule it breaks."""

_SHOWN_VALUES = 500
"""The most characters of a refused row an error shows."""


@dataclass(frozen=True)
class Rule:
    """One constraint of a Delta table.

    :param kind: ``"check"`` or ``"not_null"``.
    :param name: the CHECK constraint's name, or the NOT NULL field's path (``s.a``).
    :param expression: the CHECK's expression as the table holds it (``None`` for NOT
        NULL).
    :param path: the NOT NULL field's path, one name per struct level.
    :param spark: the CHECK's expression in Spark SQL, when the table holds it in another
        dialect (delta-rs': :func:`fanout_delta.dialect.spark_expression`).
    """

    kind: Literal["check", "invariant", "not_null", "not_null_element", "not_null_value"]
    name: str
    expression: str | None = None
    path: tuple[str, ...] = ()
    spark: str | None = None
    problem: str | None = None
    """Why the sink cannot evaluate the CHECK as the table's writer does (``None``: it
    can): :meth:`refused` raises it, and the sink's ``open()`` refuses the table."""

    @property
    def expressed(self) -> bool:
        """Whether the rule is an expression (a CHECK or an invariant) rather than a
        null check."""
        return self.kind in ("check", "invariant")

    @property
    def label(self) -> str:
        """The constraint for people: ``CHECK x_pos (x > 0)`` or ``NOT NULL 's.a'``."""
        if self.kind == "check":
            return f"CHECK {self.name} ({self.expression})"
        if self.kind == "invariant":
            return f"invariant of {self.name!r} ({self.expression})"
        if self.kind == "not_null_element":
            return f"NOT NULL elements of {self.name!r}"
        if self.kind == "not_null_value":
            return f"NOT NULL values of {self.name!r}"
        return f"NOT NULL {self.name!r}"

    @property
    def column(self) -> str | None:
        """The column at fault: a NOT NULL field's path, an invariant's column; ``None``
        for a CHECK, whose expression may read several."""
        return None if self.kind == "check" else self.name

    def reason(self) -> str:
        """A dead letter's reason for a row breaking this constraint."""
        if self.kind == "check":
            return (
                f"breaks the Delta table's CHECK constraint {self.name} ({self.expression}): "
                "the expression is false or null for the row"
            )
        if self.kind == "invariant":
            return (
                f"breaks the Delta table's invariant of column {self.name!r} "
                f"({self.expression}): the expression is false or null for the row"
            )
        if self.kind == "not_null_element":
            return (
                f"null element in the Delta table's array column {self.name!r}, whose "
                "elements may not be null"
            )
        if self.kind == "not_null_value":
            return (
                f"null value in the Delta table's map column {self.name!r}, whose values "
                "may not be null"
            )
        return f"null in the Delta table's NOT NULL column {self.name!r}"

    def refused(self) -> Any:
        """The Spark condition true exactly for the rows this constraint refuses (never
        null, so its negation keeps exactly the other rows)."""
        from pyspark.sql import functions as F

        if self.problem is not None:
            from fanout_delta.dialect import Untranslatable

            raise Untranslatable(self.problem)
        if self.expressed:
            return ~F.coalesce(F.expr(self.spark or str(self.expression)), F.lit(False))
        column = F.col(quote(self.path[0]))
        for name in self.path[1:]:
            column = column.getField(name)
        if self.kind == "not_null_element":
            return F.coalesce(F.exists(column, lambda x: x.isNull()), F.lit(False))
        if self.kind == "not_null_value":
            values = F.map_values(column)
            return F.coalesce(F.exists(values, lambda x: x.isNull()), F.lit(False))
        return column.isNull()  # a null parent struct included: see the module docstring


@dataclass(frozen=True)
class TableConstraints:
    """A Delta table's CHECK constraints (sorted by name) and NOT NULL fields (in schema
    order), as one snapshot of the table holds them."""

    rules: tuple[Rule, ...] = ()
    padded: tuple[pa.Field, ...] = field(default=(), compare=False)
    """The table's nullable columns, which an append lacking them pads with nulls."""

    @classmethod
    def of(
        cls, table: Any, engine: Literal["rs", "spark"] = "rs", *, spark: Any = None
    ) -> TableConstraints:
        """The constraints of the delta-rs table ``table`` (none for ``None``: no table
        yet), read from the snapshot it is: no read of the log. With ``engine`` ``"rs"``
        a CHECK (or a column's invariant) is evaluated as delta-rs reads it, in
        DataFusion's SQL (a ``"Name"`` is a column, not a string; ``a / 2`` of whole
        numbers a whole number, typed with the session ``spark`` on the table's columns:
        :mod:`fanout_delta.dialect`), and NOT NULL elements of arrays and values of maps
        are checked, as delta-rs does; delta-spark reads Spark SQL."""
        if table is None:
            return cls()
        import pyarrow as pa

        configuration = table.metadata().configuration
        checks = [
            Rule("check", name[len(PREFIX) :], str(expression))
            for name, expression in sorted(configuration.items())
            if name.startswith(PREFIX) and expression is not None
        ]
        nested = _schema_rules(json.loads(table.schema().to_json())["fields"], (), engine)
        schema = pa.schema(table.schema().to_arrow())
        expressed = [*checks, *(r for r in nested if r.expressed)]
        if engine == "rs":
            expressed = _in_spark_sql(expressed, schema, spark)
        padded = tuple(f for f in schema if f.nullable and not is_generated(f))
        not_null = [*_not_null_rules(list(schema), ()), *(r for r in nested if not r.expressed)]
        return cls((*expressed, *not_null), padded)

    def __bool__(self) -> bool:
        return bool(self.rules)

    def describe(self) -> str:
        """Every constraint, for an error: ``CHECK x_pos (x > 0), NOT NULL 'id'``."""
        return ", ".join(rule.label for rule in self.rules) or "none"

    def on(self, spark_schema: Any) -> tuple[Rule, ...]:
        """The rules a batch of ``spark_schema`` can break: every CHECK, and the NOT NULL
        fields the batch holds that Spark's schema lets be null (a missing one is the
        schema check's to refuse). A field Spark declares non-nullable at every level of
        its path holds no null: checking it would cost every batch of a table created
        from such a schema (``spark.range``'s ``id``) a Spark job for nothing."""
        return tuple(
            r
            for r in self.rules
            if r.expressed
            or (r.kind == "not_null" and _may_be_null(spark_schema, r.path))
            or (r.kind != "not_null" and _may_hold_nulls(spark_schema, r.path))
        )

    def check_expressions(self, spark: Any, table: Any, sink: str) -> None:
        """Refuse (:class:`ConfigurationError`, naming the constraint) a CHECK expression
        Spark cannot evaluate on the table's columns (an unknown function, a column the
        table lacks): analysed on an empty DataFrame of the table's schema, no job."""
        checks = [r for r in self.rules if r.expressed]
        refuse_untranslatable(checks, sink)
        if spark is None or not checks:
            return
        import pyarrow as pa

        try:
            empty = spark.createDataFrame(pa.schema(table.schema().to_arrow()).empty_table())
        except Exception:  # a type Spark cannot take from Arrow: each batch checks instead
            logger.debug("sink %r: no empty DataFrame of the table to check its constraints "
                         "on", sink, exc_info=True)  # fmt: skip
            return
        for rule in checks:
            try:
                empty.filter(rule.refused()).schema  # noqa: B018 - analyses the plan
            except Exception as exc:
                raise ConfigurationError(
                    f"Delta sink {sink!r}: the table's {rule.label} cannot be evaluated "
                    f"by Spark on the table's columns, so the sink cannot tell which rows "
                    f"it refuses: {_first_line(exc)}. Fix or drop the constraint "
                    "(ALTER TABLE ... DROP CONSTRAINT) before starting the pipeline"
                ) from exc


def refuse_untranslatable(rules: Sequence[Rule], sink: str) -> None:
    """Refuse (:class:`ConfigurationError`, naming the constraint) a rule the sink cannot
    evaluate as delta-rs does (:attr:`Rule.problem`)."""
    for rule in rules:
        if rule.problem is not None:
            raise ConfigurationError(
                f"Delta sink {sink!r}: the table's {rule.label} cannot be evaluated by "
                f"Spark as delta-rs evaluates it, so the sink cannot tell which rows it "
                f"refuses: {rule.problem}. Rewrite the constraint so both read it alike "
                "(e.g. CAST the operands of a division to DOUBLE, or use DIV for a whole "
                "number division) before starting the pipeline"
            )


@dataclass(frozen=True)
class _Refusal:
    """The Spark conditions of a batch's refused rows: ``any`` true for a row breaking a
    rule, ``first`` the index of the first rule it breaks."""

    rules: tuple[Rule, ...]
    any: Any
    first: Any
    frame: Any
    """The batch the conditions read: with the table's columns it lacks, as nulls."""
    added: tuple[str, ...] = ()

    def kept(self) -> Any:
        """The batch without its refused rows, with its own columns only."""
        kept = self.frame.filter(~self.any)
        return kept.drop(*self.added) if self.added else kept

    def refused(self) -> Any:
        """The refused rows, with their own columns and the rule index :data:`_RULE`."""
        rows = self.frame.filter(self.any).withColumn(_RULE, self.first)
        return rows.drop(*self.added) if self.added else rows


def _refusal(
    df: Any, constraints: TableConstraints, sink: str, batch_id: int, *, pad: bool = True
) -> _Refusal | None:
    """The conditions of ``df``'s refused rows, analysed on ``df`` (a CHECK Spark cannot
    evaluate on the batch's columns fails the batch naming it); ``None`` when no
    constraint applies to the batch. With ``pad`` (an append), the table's nullable
    columns the batch lacks are read as nulls, as the append writes them."""
    from pyspark.sql import functions as F

    rules = constraints.on(df.schema)
    if not rules:
        return None
    refuse_untranslatable(rules, sink)  # typed with the batch's session: untypable
    columns = list(df.columns)
    added: tuple[str, ...] = ()
    if pad:
        df, added = _padded(df, constraints.padded)
    conditions = []
    for rule in rules:
        condition = rule.refused()
        try:
            df.filter(condition).schema  # noqa: B018 - analyses the plan
        except Exception as exc:
            raise SinkWriteError(
                f"the Delta table's {rule.label} cannot be evaluated on the batch's "
                f"columns ({', '.join(columns)}): {_first_line(exc)}. Nothing was "
                "written: give the batch the columns the constraint reads, or change the "
                "constraint",
                sink=sink,
                batch_id=batch_id,
            ) from exc
        conditions.append(condition)
    first = F.coalesce(*[F.when(c, F.lit(i)) for i, c in enumerate(conditions)])
    return _Refusal(rules, functools.reduce(lambda a, b: a | b, conditions), first, df, added)


@contextlib.contextmanager
def _evaluating(rules: Sequence[Rule], sink: str, batch_id: int) -> Iterator[None]:
    """Name the constraints when Spark fails evaluating them on a row (a data exception,
    SQLSTATE class 22: a division by zero, a cast of a malformed value in ANSI mode),
    which delta-rs' check fails on too; other errors pass as they are."""
    try:
        yield
    except Exception as exc:
        state = getattr(exc, "getSqlState", lambda: None)()
        if not (isinstance(state, str) and state.startswith("22")):
            raise
        checks = ", ".join(r.label for r in rules if r.expressed)
        raise SinkWriteError(
            f"Spark cannot evaluate the Delta table's constraints ({checks}) on a row of "
            f"the batch: {_first_line(exc)}. Nothing was written, and every replay fails "
            "alike (delta-rs' own check fails on such a row too): fix or filter those rows "
            "in the stream, or change the constraint (e.g. try_divide, try_cast)",
            sink=sink,
            batch_id=batch_id,
        ) from exc


def _padded(df: Any, columns: Sequence[pa.Field]) -> tuple[Any, tuple[str, ...]]:
    """``df`` with each of ``columns`` it lacks (names compared as Spark does, ignoring
    case) added as typed nulls, and the names added."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_type

    present = {c.lower() for c in df.columns}
    missing = [f for f in columns if f.name.lower() not in present]
    if not missing:
        return df, ()
    nulls = {f.name: F.lit(None).cast(from_arrow_type(f.type)) for f in missing}
    return df.withColumns(nulls), tuple(nulls)


def split_refused_spark(
    df: Any, constraints: TableConstraints, *, sink: str, batch_id: int, pad: bool = True
) -> tuple[Any, list[DeadLetter]]:
    """``df`` without the rows the table's constraints refuse, and a dead letter for each
    (collected to the driver as Arrow, taken as the other letters are: one Spark job, the
    extra filter pass). ``df`` as it is, and no job, when no constraint applies. ``pad``:
    see :func:`_refusal` (a merge's winners are not padded)."""
    refusal = _refusal(df, constraints, sink, batch_id, pad=pad)
    if refusal is None:
        return df, []
    with _evaluating(refusal.rules, sink, batch_id):
        letters = _letters(refusal.refused().toArrow(), refusal.rules)
    if not letters:
        return df, []
    return refusal.kept(), letters


def holds_refused_spark(
    df: Any, constraints: TableConstraints, *, sink: str, batch_id: int
) -> bool:
    """Whether a row of ``df`` breaks the constraints: one Spark job (a count: a
    ``limit(1)`` finding nothing runs a job after another over ever more partitions, ~3x
    slower on 1M rows), none when no constraint applies."""
    refusal = _refusal(df, constraints, sink, batch_id, pad=False)
    if refusal is None:
        return False
    with _evaluating(refusal.rules, sink, batch_id):
        return bool(refusal.frame.filter(refusal.any).count())


def refuse_spark(df: Any, constraints: TableConstraints, *, sink: str, batch_id: int,
                 table: str, pad: bool = True) -> None:  # fmt: skip
    """Fail the batch when one of its rows breaks a constraint of the Delta table at
    ``table``, naming the constraint and the first such row's values (one Spark job
    counting them, see :func:`holds_refused_spark`; one more taking the first when there
    is one)."""
    refusal = _refusal(df, constraints, sink, batch_id, pad=pad)
    if refusal is None:
        return
    with _evaluating(refusal.rules, sink, batch_id):
        count = int(refusal.frame.filter(refusal.any).count())
        first = refusal.refused().limit(1).toArrow() if count else None
    if first is not None:
        raise refused_error(_letters(first, refusal.rules)[0], count, sink=sink,
                            batch_id=batch_id, table=table)  # fmt: skip


def refused_error(
    letter: DeadLetter, count: int, *, sink: str, batch_id: int, table: str
) -> SinkWriteError:
    """The error of a batch ``count`` of whose rows break the table's constraints, and
    which has no dead-letter target: ``letter`` is the first."""
    return SinkWriteError(
        f"{count} row(s) break the constraints of the Delta table {table}. First refused "
        f"row {_shown(letter.row)}: {letter.reason}. Nothing was written and every replay "
        "fails alike: fix or filter those rows in the stream, or set the sink's option "
        "'dead_letter' to set such rows aside",
        sink=sink,
        batch_id=batch_id,
    )


def write_refused(
    target: DeadLetterTarget,
    batch: Batch,
    letters: Sequence[DeadLetter],
    constraints: TableConstraints,
    table: str,
) -> int:
    """Hand the batch's refused rows' letters to ``target`` (before the data is written,
    once per batch: a replay's are skipped) and return how many the batch has.

    A replay refuses the rows the first attempt refused only while the table's
    constraints are the same. One added between an attempt that kept its letters and
    died before its commit, and the replay, would refuse more rows, whose letters the
    target would skip as the batch's: in neither place. So when the table has
    constraints and the batch refuses rows, a target that can read a batch's letters
    back (a Delta table) is asked how many it keeps, and another number fails the batch
    before its data is written (a dropped constraint, which refuses fewer rows, leaves
    the earlier letters and writes those rows too: kept twice, never lost).

    Written through :func:`fanout.deadletters.moved.write_letters`: a batch whose letters
    an earlier attempt kept in the sink's earlier target (its ``dead_letter`` moved since)
    writes none again, and its count is not compared (that target is not this one)."""
    count = write_letters(target, batch, letters, source="refused")
    read_rows = getattr(target, "read_rows", None)
    elsewhere = refused_elsewhere(batch, None) is not None
    if not letters or not constraints or read_rows is None or elsewhere:
        return count
    kept = read_rows(batch.pipeline, batch.sink_name, (batch.info.epoch, batch.batch_id))
    if kept.num_rows != len(letters):
        raise SinkWriteError(
            f"this attempt refuses {len(letters)} row(s), but the {target.describe()} keeps "
            f"{kept.num_rows} dead letter(s) of the batch from an earlier attempt: the "
            f"constraints of the Delta table {table} changed in between (now: "
            f"{constraints.describe()}). Nothing of the batch was written: writing it would "
            "leave rows only one of the two refuses in neither place or in both. Restore "
            "the constraints the batch first ran under until it completes, then change them",
            sink=batch.sink_name,
            batch_id=batch.batch_id,
        )
    return count


def violations(
    df: Any, constraints: TableConstraints, *, sink: str, batch_id: int
) -> list[DeadLetter]:
    """A dead letter for each row of ``df`` the constraints refuse (one Spark job; none
    when no constraint applies): a merge decides afterwards which of them win their key
    (:class:`RefusedRows`)."""
    refusal = _refusal(df, constraints, sink, batch_id, pad=False)
    if refusal is None:
        return []
    with _evaluating(refusal.rules, sink, batch_id):
        return _letters(refusal.refused().toArrow(), refusal.rules)


@dataclass(frozen=True)
class RefusedRows:
    """The batch's refused rows (their letters, from :func:`violations`), found again
    among a merge's winners, which are chosen in Arrow: a winner is refused when it is
    one of them, compared by its keys first and then by its whole row (a constraint
    reads the row only, so an equal row is refused alike)."""

    letters: tuple[DeadLetter, ...]
    keys: tuple[str, ...]

    def any_in(self, rows: pa.Table) -> bool:
        """Whether one of ``rows`` is refused."""
        return bool(self.letters) and bool(self._indices(rows))

    def split(self, rows: pa.Table) -> tuple[pa.Table, list[DeadLetter]]:
        """``rows`` without the refused ones, and their letters (in ``rows``' order)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        found = self._indices(rows)
        if not found:
            return rows, []
        mask = pa.array([i in found for i in range(rows.num_rows)])
        return rows.filter(pc.invert(mask)), [found[i] for i in sorted(found)]

    def _indices(self, rows: pa.Table) -> dict[int, DeadLetter]:
        """The refused rows of ``rows``, by index, with their letters."""
        import pyarrow as pa

        by_key: dict[str, list[DeadLetter]] = {}
        for letter in self.letters:
            by_key.setdefault(_key_text(letter.row or {}, self.keys), []).append(letter)
        candidates = letter_rows(rows.select(list(self.keys)))
        wanted = [i for i, key in enumerate(candidates) if _key_text(key, self.keys) in by_key]
        if not wanted:
            return {}
        picked = rows.take(pa.array(wanted, pa.int64()))
        found: dict[int, DeadLetter] = {}
        for index, row in zip(wanted, letter_rows(picked), strict=True):
            for letter in by_key[_key_text(row, self.keys)]:
                if _same(letter.row, row):
                    found[index] = letter
                    break
        return found


def _same(a: Any, b: Any) -> bool:
    """Whether two row values are equal, a NaN equal to a NaN (``==`` says no: a refused
    winner holding a NaN was not found, and delta-rs failed the whole batch on it)."""
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b)


def _key_text(row: Any, keys: Sequence[str]) -> str:
    return json.dumps([row.get(k) for k in keys], default=str)


def _letters(rejected: pa.Table, rules: Sequence[Rule]) -> list[DeadLetter]:
    """A letter per row of ``rejected`` (with the rule index column :data:`_RULE`)."""
    which = rejected.column(_RULE).to_pylist()
    rows = letter_rows(rejected.drop_columns([_RULE]))
    letters = []
    for row, index in zip(rows, which, strict=True):
        rule = rules[index]
        letters.append(DeadLetter(row, rule.reason(), rule.column, None))
    return letters


def _not_null_rules(fields: list[pa.Field], parents: tuple[str, ...]) -> list[Rule]:
    """The NOT NULL fields among ``fields`` and, through struct columns, their fields."""
    import pyarrow.types as pat

    rules: list[Rule] = []
    for f in fields:
        path = (*parents, f.name)
        if not f.nullable:
            rules.append(Rule("not_null", ".".join(path), path=path))
        if pat.is_struct(f.type):
            rules += _not_null_rules(list(f.type), path)
    return rules


def _may_be_null(spark_schema: Any, path: Sequence[str]) -> bool:
    """Whether the Spark schema holds the field at ``path`` (struct levels only) and lets
    it be null: the field, or a struct above it (a null parent is refused too, see the
    module docstring), is nullable."""
    from pyspark.sql.types import StructType

    kind: Any = spark_schema
    nullable = False
    for name in path:
        if not isinstance(kind, StructType) or name not in kind.fieldNames():
            return False
        nullable = nullable or kind[name].nullable
        kind = kind[name].dataType
    return nullable


def _shown(row: Any) -> str:
    text = json.dumps(row, default=str)
    return text if len(text) <= _SHOWN_VALUES else text[:_SHOWN_VALUES] + "..."


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


INVARIANTS = "delta.invariants"
"""A column's metadata key holding its invariant (older tables, writer version 2):
``{"expression": {"expression": "<SQL>"}}``."""


def _schema_rules(
    fields: list[dict[str, Any]], parents: tuple[str, ...], engine: Literal["rs", "spark"]
) -> list[Rule]:
    """The invariants of ``fields`` (Delta schema JSON) and, through struct columns, of
    their fields; with ``engine`` ``"rs"`` also the arrays whose elements and the maps
    whose values may not be null (delta-rs refuses a null there; not one inside an
    array's element or a map's value, which it does not check)."""
    rules: list[Rule] = []
    for f in fields:
        path = (*parents, str(f["name"]))
        name = ".".join(path)
        invariant = (f.get("metadata") or {}).get(INVARIANTS)
        if invariant is not None:
            rules.append(_invariant(name, path, str(invariant)))
        kind = f["type"]
        if not isinstance(kind, dict):
            continue
        if kind.get("type") == "struct":
            rules += _schema_rules(kind["fields"], path, engine)
        elif engine == "rs" and kind.get("type") == "array" and not kind["containsNull"]:
            rules.append(Rule("not_null_element", name, path=path))
        elif engine == "rs" and kind.get("type") == "map" and not kind["valueContainsNull"]:
            rules.append(Rule("not_null_value", name, path=path))
    return rules


def _invariant(name: str, path: tuple[str, ...], metadata: str) -> Rule:
    """The invariant of the column ``name`` from its ``delta.invariants`` ``metadata``."""
    try:
        expression = json.loads(metadata)["expression"]["expression"]
    except (ValueError, KeyError, TypeError):
        problem = f"its metadata {INVARIANTS!r} is no invariant: {metadata}"
        return Rule("invariant", name, metadata, path=path, problem=problem)
    return Rule("invariant", name, str(expression), path=path)


def _in_spark_sql(rules: list[Rule], schema: pa.Schema, spark: Any) -> list[Rule]:
    """``rules`` (CHECKs and invariants in delta-rs' SQL) with their Spark SQL; a division
    typed on an empty DataFrame of the table's ``schema`` (no job), or, when its operands'
    types cannot be resolved, the rule's :attr:`Rule.problem`. Without a session
    (``spark`` ``None``: an ``open()`` without one) a division is not typed and no
    problem recorded: nothing is evaluated before a batch, whose session types it."""
    type_of = _types_on(schema, spark)
    return [
        rule
        if rule.problem is not None
        else dataclasses.replace(rule, **_spark_sql(str(rule.expression), schema, spark, type_of))
        for rule in rules
    ]


def _spark_sql(
    expression: str, schema: pa.Schema, spark: Any, type_of: Callable[[str], str]
) -> dict[str, Any]:
    """The ``spark`` and ``problem`` of the rule of ``expression``, kept per table schema
    when typed by a session; without one, never from what was kept (``open()`` reads the
    same in any process) and no problem for a division left untyped."""
    if spark is None:
        text, problem = _translated(expression, type_of)
        if problem is not None and _NO_SESSION in problem:
            problem = None  # typed at the write, with the batch's session
        return {"spark": text, "problem": problem}
    key = (schema.to_string(), expression)
    text, problem = _TRANSLATED.get(key) or _translated(expression, type_of)
    if key not in _TRANSLATED:
        if len(_TRANSLATED) >= _TRANSLATED_KEPT:
            _TRANSLATED.clear()
        _TRANSLATED[key] = (text, problem)
    return {"spark": text, "problem": problem}


_TRANSLATED: dict[tuple[str, str], tuple[str, str | None]] = {}
"""Each (table schema, delta-rs expression)'s Spark SQL and problem, so typing a division's
operands (a Spark analysis) runs once per table schema, not at every batch's write."""
_TRANSLATED_KEPT = 256


def _translated(expression: str, type_of: Callable[[str], str]) -> tuple[str, str | None]:
    """The Spark SQL of the delta-rs ``expression`` and, when it cannot be read alike, why."""
    from fanout_delta.dialect import Untranslatable, integer_divisions, spark_expression

    text = spark_expression(expression)
    try:
        return integer_divisions(text, type_of), None
    except Untranslatable as exc:
        return text, str(exc)


_NO_SESSION = "no Spark session to analyse it with"


def _types_on(schema: pa.Schema, spark: Any) -> Callable[[str], str]:
    """The Spark type (``simpleString``) of a Spark SQL expression on the columns of
    ``schema``, analysed by ``spark`` on an empty DataFrame made on first use."""
    frames: list[Any] = []

    def type_of(expression: str) -> str:
        from pyspark.sql import functions as F

        if spark is None:
            raise RuntimeError(_NO_SESSION)
        if not frames:
            frames.append(spark.createDataFrame(schema.empty_table()))
        return str(frames[0].select(F.expr(expression)).schema[0].dataType.simpleString())

    return type_of


def _may_hold_nulls(spark_schema: Any, path: Sequence[str]) -> bool:
    """Whether the Spark schema holds the array or map at ``path`` (struct levels only)
    and lets its elements or values be null."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    kind: Any = spark_schema
    for name in path:
        if not isinstance(kind, StructType) or name not in kind.fieldNames():
            return False
        kind = kind[name].dataType
    if isinstance(kind, ArrayType):
        return bool(kind.containsNull)
    return isinstance(kind, MapType) and bool(kind.valueContainsNull)
