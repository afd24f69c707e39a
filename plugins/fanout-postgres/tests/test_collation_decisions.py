"""The decisions the sink takes for columns under a nondeterministic (ICU) collation, from
reflected metadata, without a server (:mod:`test_nondeterministic_collations` runs them
end to end where the server has ICU; the embedded one has none, so in CI those skip and
these, with :mod:`test_collation_catalog`, are what covers them): a key under such a
collation is refused with ``partitions`` above 1; rows tied on ``order_by`` and the no-op
check compare its text byte for byte (``COLLATE "C"``); a unique index on the keys under
another collation than the column's is refused; and the catalog's rows become those
decisions' inputs (:func:`fanout_postgres.plan.collations_found`)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("fanout_postgres")

import sqlalchemy as sa
from fanout_postgres.identifiers import TableName
from fanout_postgres.plan import (
    PlanError,
    PlanOptions,
    TargetColumn,
    TargetInfo,
    WritePlan,
    build_plan,
    collations_found,
)
from pyspark.sql import types as T

USERS = TableName("users")
SCHEMA = T.StructType(
    [
        T.StructField("email", T.StringType()),
        T.StructField("name", T.StringType()),
        T.StructField("seq", T.LongType()),
    ]
)


def _info(loose: dict[str, str], index_collations: Any = ()) -> TargetInfo:
    """Table users (email text PRIMARY KEY, name text, seq bigint) as reflected."""
    kinds = (("email", sa.Text()), ("name", sa.Text()), ("seq", sa.BigInteger()))
    columns = {
        name: TargetColumn(name, kind, name != "email", has_default=False, generated=False)
        for name, kind in kinds
    }
    return TargetInfo(USERS, columns, ("email",), (frozenset({"email"}),), (), loose,
                      index_collations)  # fmt: skip


def _plan(info: TargetInfo, partitions: int) -> WritePlan:
    options = PlanOptions("pg", USERS, "upsert", None, ["seq"], None, partitions, "fanout",
                          None, None)  # fmt: skip
    return build_plan(info, options, SCHEMA)


def test_a_key_under_a_nondeterministic_collation_is_refused_with_more_than_one_partition() -> None:
    with pytest.raises(PlanError) as caught:
        _plan(_info({"email": "ci"}), partitions=8)
    assert str(caught.value) == (
        "key column 'email' (string) is written to column email of table users (TEXT), "
        "which reads the values its nondeterministic collation ci calls equal (differing in "
        "case or accents, as the collation says) as one key; Spark would hash them to "
        "different partitions, whose transactions commit in any order, so the last would "
        "win whatever order_by says; write it as one partition (option partitions: 1)"
    )
    assert caught.value.columns == ["email"]
    # one partition: nothing to hash, so nothing to refuse
    assert _plan(_info({"email": "ci"}), partitions=1).key_hashes == ()
    # a deterministic collation: a string key into text hashes as it is
    assert _plan(_info({}), partitions=8).partitions == 8


def test_ties_go_to_the_greatest_text_in_byte_order_under_a_nondeterministic_collation() -> None:
    stage = "pg_temp.fanout_stage"
    loose = _plan(_info({"email": "ci", "name": "ci"}), partitions=1).statements
    assert (
        f"ORDER BY {stage}.email, {stage}.seq DESC NULLS LAST, {stage}.name DESC NULLS LAST, "
        f'CAST({stage}.email AS TEXT) COLLATE "C" DESC NULLS LAST, '
        f'CAST({stage}.name AS TEXT) COLLATE "C" DESC NULLS LAST, '
        f"{stage}.__fanout_row DESC) AS w" in loose.write_from_stage
    )
    plain = _plan(_info({}), partitions=1).statements
    assert (
        f"ORDER BY {stage}.email, {stage}.seq DESC NULLS LAST, {stage}.name DESC NULLS LAST, "
        f"{stage}.__fanout_row DESC) AS w" in plain.write_from_stage
    )


def test_the_no_op_check_compares_the_text_byte_for_byte_under_a_nondeterministic_collation() -> (
    None
):
    loose = _plan(_info({"name": "ci"}), partitions=1).statements
    assert loose.write_from_stage.endswith(
        "ON CONFLICT (email) DO UPDATE SET name = excluded.name, seq = excluded.seq WHERE "
        '(users.name, CAST(users.name AS TEXT) COLLATE "C", users.seq) IS DISTINCT FROM '
        '(excluded.name, CAST(excluded.name AS TEXT) COLLATE "C", excluded.seq)'
    )
    assert (
        'WHEN MATCHED AND (t.name, CAST(t.name AS TEXT) COLLATE "C", t.seq) IS DISTINCT FROM '
        '(s.name, CAST(s.name AS TEXT) COLLATE "C", s.seq) THEN UPDATE SET '
        "name = s.name, seq = s.seq" in loose.write_merge
    )
    plain = _plan(_info({}), partitions=1).statements
    assert plain.write_from_stage.endswith(
        "WHERE (users.name, users.seq) IS DISTINCT FROM (excluded.name, excluded.seq)"
    )


def test_a_unique_index_on_the_keys_under_another_collation_is_refused() -> None:
    other = ((frozenset({"email"}), (("email", "ci"),)),)
    for partitions in (1, 8):
        with pytest.raises(PlanError) as caught:
            _plan(_info({"email": "ci"}, other), partitions)
        assert str(caught.value) == (
            "the unique index on the keys (email) of table users compares column email by "
            "the nondeterministic collation ci, not by the column's own collation: the sink "
            "chooses each key's row by the column's, and the index would call two of them "
            "one key; give the column that collation (ALTER TABLE ... ALTER COLUMN email "
            "TYPE ... COLLATE ci)"
        )
        assert caught.value.columns == ["email"]
    # an index of other columns is not the upsert's arbiter
    elsewhere = ((frozenset({"email", "name"}), (("email", "ci"),)),)
    assert _plan(_info({"email": "ci"}, elsewhere), partitions=1).keys == ("email",)


def test_the_catalog_rows_become_loose_columns_and_indexes_under_another_collation() -> None:
    columns = [("name", "ci"), ("email", "ci_accents")]
    indexes = [
        (101, "email", "ci_accents", False),  # the column's own collation
        (102, "email", "default", False),
        (102, "seq", "default", False),
        (103, "tag", "ci", True),  # the index's nondeterministic collation, not the column's
        (103, "seq", "default", False),
    ]
    loose, other = collations_found(columns, indexes)
    assert loose == {"email": "ci_accents", "name": "ci", "tag": "ci"}
    assert other == ((frozenset({"tag", "seq"}), (("tag", "ci"),)),)
    # a column's own nondeterministic collation is kept over an index's
    loose, other = collations_found([("tag", "own")], [(7, "tag", "ci", True)])
    assert loose == {"tag": "own"}
    assert other == ((frozenset({"tag"}), (("tag", "ci"),)),)
    assert collations_found([], [(7, "tag", "C", False)]) == ({}, ())
