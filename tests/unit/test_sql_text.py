"""The SQL text fanout writes inline (:mod:`fanout.contract.sql`): one literal and one
identifier quoting, used by delta-rs predicates, the spool's and PostgreSQL's printed
``DELETE``; here read back by delta-rs from a real table. No JVM."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake
from fanout_postgres.statements import forget_marks_sql

from fanout.contract.sql import sql_identifier, sql_literal
from fanout.delta_tables.io import open_table, predicate, read_arrow


def test_quotes_are_doubled_and_delta_rs_reads_the_condition_back(tmp_path: Path) -> None:
    assert (sql_literal("it's"), sql_identifier('a"b')) == ("'it''s'", '"a""b"')
    filters = [('a"b', "=", "it's"), ("n", ">=", 2)]
    assert predicate(filters) == '"a""b" = \'it\'\'s\' AND "n" >= 2'
    path = str(tmp_path / "t")
    rows = {'a"b': ["it's", "it's", "its"], "n": [1, 2, 3]}
    write_deltalake(path, pa.table(rows))
    table = open_table(path)
    assert table is not None
    read = read_arrow(table, columns=['a"b', "n"], filters=filters)
    assert read.to_pylist() == [{'a"b': "it's", "n": 2}]
    assert forget_marks_sql("fanout", "o'brien", "pg") == (
        "DELETE FROM fanout.progress WHERE pipeline = 'o''brien' AND sink = 'pg'"
    )
