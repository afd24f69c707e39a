"""Ties on ``order_by`` have one winner whatever the arrival order (issue 13, item 8).

Two rows of one key with the same ``order_by`` value: a replay may deliver them in the
other order, so the winner must not depend on it. The rule: the greatest ``order_by``
wins, then the greatest value of each remaining column in the table's column order.
"""

from __future__ import annotations

from typing import Any

from fanout_postgres import PostgresSink
from pg_data import SCHEMA
from pgcheck import execute, query

from fanout.contract.batch import Batch, BatchInfo
from fanout.contract.sink import SinkContext

ROWS = [
    (7, "a", 2.0, 1),  # ties with the next row on version; customer 'a' < 'b'
    (7, "b", 1.0, 1),  # the winner: same version, greatest customer
    (7, "z", 9.0, 0),  # an older version never wins
    (8, "b", 5.0, 3),  # ties on version and customer; amount decides
    (8, "b", 6.0, 3),  # the winner
]


def _write(spark: Any, url: str, table: str, rows: list[tuple[Any, ...]]) -> list[tuple]:
    execute(
        url,
        f"CREATE TABLE {table} (id bigint PRIMARY KEY, customer text NOT NULL, "
        "amount double precision, version bigint NOT NULL)",
    )
    sink = PostgresSink("pg", url=url, table=table, order_by="version", partitions=1)
    sink.open(SinkContext("ties"))
    # one input partition: rows arrive in list order
    df = spark.createDataFrame(rows, SCHEMA).coalesce(1)
    sink.write(Batch(df, BatchInfo("ties", 0, "q"), "pg", "fanout/ties/pg"))
    return query(url, f"SELECT id, customer, amount, version FROM {table} ORDER BY id")


def test_the_winner_of_a_tie_does_not_depend_on_arrival_order(spark: Any, pg_url: str) -> None:
    forward = _write(spark, pg_url, "orders_forward", ROWS)
    backward = _write(spark, pg_url, "orders_backward", ROWS[::-1])

    assert forward == [(7, "b", 1.0, 1), (8, "b", 6.0, 3)]
    assert backward == forward
