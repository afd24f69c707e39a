"""Upsert keys PostgreSQL calls equal must meet in one partition.

The partitions of an upsert are Spark's hash of the key columns, and each partition is one
transaction that chooses every key's row by ``order_by``. PostgreSQL decides which rows are
one key with the column type's ``=``, which can be coarser than Spark's equality of the
batch's values: ``citext`` ignores case, ``char(n)`` trailing spaces, ``uuid`` reads
``A0EE...`` and ``{a0ee...}`` as one value, ``bigint`` reads ``'7'`` and ``'07'`` as one. Two
rows of such a key hashed to two partitions are written by two transactions, and the one
committing last wins, whatever ``order_by`` says.

So a key column is hashed on a *fold* of its values: a Spark SQL expression that is equal
for any two values PostgreSQL calls equal. A fold may be coarser than PostgreSQL (it only
decides partitions; the values written are the batch's own). Where no fold is known, the
plan refuses the key unless the sink writes one partition, and names the cast that makes
Spark see the key PostgreSQL sees.

Only a Spark ``string`` written to a non-text type can be read coarser: every other Spark
type reaches only the columns that hold it without reinterpretation
(:data:`fanout_postgres.types.COMPATIBLE`), and never one that rounds it
(:func:`fanout_postgres.types.loss`); Spark's hash already folds ``-0.0`` into ``0.0``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_CASE = "regexp_replace(lower(regexp_replace({c}, '[^ -~]', '?')), '[ik?]+', '?')"
"""``citext``: ``lower`` of the ASCII letters, every run of characters a locale's ``lower``
may change otherwise as one ``?``. PostgreSQL lowers by the database's locale, Spark by
Java's root locale; they agree on ASCII, except that some locales and ICU lower ``I`` (and
``İ``, and the Kelvin sign to ``k``) otherwise. No other character lowers to, or from, an
ASCII one, so the runs of the others and of ``i``/``k`` are where two spellings of a
citext-equal key can differ, and ``?`` for each run is equal for both."""

_TRAILING_SPACES = "rtrim({c})"
"""``char(n)`` ignores trailing spaces; ``varchar(n)`` cuts a value's excess trailing
spaces to fit."""

_UUID = "lower(regexp_replace({c}, '[^0-9A-Fa-f]', ''))"
"""``uuid`` reads any case, braces and hyphens between groups of four digits: its hex
digits, lowered, are the value."""


HASHED = "__fanout_hash_"
"""The prefix of the columns a partitioned frame hashes a folded key on (dropped by the
tasks before anything is written)."""


def hashed(column: str) -> str:
    """The name of the column ``column``'s fold is hashed on."""
    return HASHED + column


class KeyRefused(Exception):
    """No fold covers the target type's equality of a string key."""

    def __init__(self, examples: str, cast: str | None) -> None:
        super().__init__(examples)
        self.examples = examples
        """Strings the type reads as one value, for the message."""
        self.cast = cast
        """The Spark type whose values PostgreSQL reads one for one, or ``None``."""


_READ_AS_ONE: dict[str, str] = {
    "int": "'7', '07' and ' 7'",
    "numeric": "'1.5' and '1.50'",
    "float": "'1.5' and '1.50'",
    "bool": "'t', 'true' and 'yes'",
    "date": "'2024-01-02' and '2024-1-2'",
    "timestamp": "'2024-01-02 03:00+00' and '2024-01-02 04:00+01'",
    "json": "'{\"a\":1}' and '{ \"a\": 1 }'",
}


@dataclass(frozen=True)
class KeyHash:
    """How one key column is hashed into partitions.

    :param column: the target column (the partitioned frame's name of it).
    :param fold: the Spark SQL expression hashed instead of the column (``{c}`` is the
        quoted column), or ``None`` when the column's own values are hashed.
    """

    column: str
    fold: str | None

    def over(self, quoted_column: str) -> str:
        """The fold as Spark SQL over ``quoted_column``."""
        return (self.fold or "{c}").format(c=quoted_column)


def key_fold(spark_type: Any, sa_type: Any) -> str | None:
    """The fold of a key of ``spark_type`` written to a column of ``sa_type``: ``None`` when
    equal values are equal to PostgreSQL too, else a template over ``{c}``; raises
    :class:`KeyRefused` when no fold is known."""
    import sqlalchemy as sa
    from pyspark.sql import types as T
    from sqlalchemy.dialects import postgresql as pg

    from fanout_postgres import types as pgtypes

    sa_type = pgtypes.without_domain(sa_type)
    if isinstance(spark_type, T.ArrayType) and isinstance(sa_type, sa.ARRAY):
        try:
            inner = key_fold(spark_type.elementType, sa_type.item_type)
        except KeyRefused as refused:
            cast = None if refused.cast is None else f"array<{refused.cast}>"
            raise KeyRefused(refused.examples, cast) from None
        return None if inner is None else f"transform({{c}}, x -> {inner.format(c='x')})"
    if pgtypes.spark_kind(spark_type) == "nested":
        if isinstance(spark_type, T.StructType) and isinstance(sa_type, pg.JSONB):
            return None  # written as one JSON text per value, read back structurally
        raise KeyRefused("spellings its type's equality reads as one value", None)
    if not isinstance(spark_type, T.StringType):
        return None
    if isinstance(sa_type, pg.CITEXT):
        return _CASE
    if isinstance(sa_type, sa.Enum):
        return None  # labels are exact
    if isinstance(sa_type, sa.String):
        fixed = isinstance(sa_type, sa.CHAR) or pgtypes.max_length(sa_type) is not None
        return _TRAILING_SPACES if fixed else None
    if isinstance(sa_type, sa.Uuid):
        return _UUID
    kind = pgtypes.target_kind(sa_type)
    examples = _READ_AS_ONE.get(kind, "several spellings of one value")
    raise KeyRefused(examples, _spark_cast(sa_type, kind))


def _spark_cast(sa_type: Any, kind: str) -> str | None:
    import sqlalchemy as sa

    if kind == "int":
        if isinstance(sa_type, sa.SmallInteger):
            return "smallint"
        return "bigint" if isinstance(sa_type, sa.BigInteger) else "int"
    if kind == "numeric":
        precision, scale = getattr(sa_type, "precision", None), getattr(sa_type, "scale", None)
        return f"decimal({precision},{scale or 0})" if precision else None
    if kind == "timestamp":
        return "timestamp" if getattr(sa_type, "timezone", False) else "timestamp_ntz"
    if kind == "float":
        return "float" if isinstance(sa_type, sa.REAL) else "double"
    return {"bool": "boolean", "date": "date"}.get(kind)
