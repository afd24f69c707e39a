"""The catalog queries behind the nondeterministic-collation decisions, on the embedded
server. It has no ICU, so no nondeterministic collation can be created there: the test
creates a libc collation and marks it nondeterministic in the catalog (``pg_collation`` is
per database; the test's database is dropped with the server). Only the catalog is read:
no value is compared under it. :mod:`test_collation_decisions` takes the decisions from
what is reflected here; :mod:`test_nondeterministic_collations` runs them end to end where
the server has ICU."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from fanout_postgres.identifiers import TableName
from fanout_postgres.plan import PlanError, PlanOptions, build_plan, reflect
from pgcheck import execute
from pyspark.sql import types as T


def test_reflect_reads_the_columns_and_indexes_compared_by_a_nondeterministic_collation(
    pg_url: str,
) -> None:
    execute(
        pg_url,
        'CREATE COLLATION loose (provider = libc, locale = "C")',
        'CREATE COLLATION "Odd one" (provider = libc, locale = "C")',
        "UPDATE pg_collation SET collisdeterministic = false "
        "WHERE collname IN ('loose', 'Odd one')",
        "CREATE TABLE users (email text COLLATE loose PRIMARY KEY, name text, "
        'tag text COLLATE "C", seq bigint NOT NULL, dropped text COLLATE loose)',
        "ALTER TABLE users DROP COLUMN dropped",
        'CREATE UNIQUE INDEX users_name ON users (name COLLATE "Odd one", seq)',
        'CREATE UNIQUE INDEX users_tag ON users (tag COLLATE "C")',
        "CREATE UNIQUE INDEX users_email ON users (email COLLATE loose, seq)",
        "CREATE UNIQUE INDEX users_part ON users (tag COLLATE loose) WHERE seq > 0",
    )
    engine = sa.create_engine(pg_url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            info = reflect(conn, TableName("users"))
    finally:
        engine.dispose()

    assert info is not None
    # email's own; name by its unique index's; tag's partial index is no arbiter
    assert dict(info.loose_collations) == {"email": "loose", "name": "Odd one"}
    assert info.index_collations == ((frozenset({"name", "seq"}), (("name", "Odd one"),)),)

    # the index on (name, seq) is the arbiter of keys (name, seq): refused
    schema = T.StructType([T.StructField(n, T.StringType()) for n in ("email", "name")]
                          + [T.StructField("seq", T.LongType())])  # fmt: skip
    options = PlanOptions("pg", TableName("users"), "upsert", ["name", "seq"], ["seq"], None,
                          1, "fanout", None, None)  # fmt: skip
    with pytest.raises(PlanError) as caught:
        build_plan(info, options, schema)
    assert str(caught.value) == (
        "the unique index on the keys (name, seq) of table users compares column name by the "
        'nondeterministic collation "Odd one", not by the column\'s own collation: the sink '
        "chooses each key's row by the column's, and the index would call two of them one "
        "key; give the column that collation (ALTER TABLE ... ALTER COLUMN name TYPE ... "
        'COLLATE "Odd one")'
    )
