"""A dead letter's reason, written on the executors in the partition's transaction, is
masked of every secret of the pipeline: another sink's password and a location's, not
only the PostgreSQL sink's own (the server's message may quote any of them: here a
trigger refusing a row names a replica's URL and a ledger's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pgcheck import execute, query

from fanout import FanOut
from fanout.testing import RecordingSink
from tests.integration.streams import run_stream, write_input

OTHER_PASSWORD = "Other-sink-pw-2207"
CHECKPOINT_PASSWORD = "Ckpt-pw-5813"


class _Guarded(RecordingSink):
    """A sink holding a password."""

    def __init__(self, name: str, password: str) -> None:
        super().__init__(name)
        self.password = password

    def secret_values(self) -> list[str]:
        return [self.password]


def _refusing_table(url: str) -> None:
    execute(url, "CREATE TABLE orders (order_id bigint, customer text, amount float8, status text)")
    execute(
        url,
        "CREATE FUNCTION refuse_two() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.order_id = 2 THEN RAISE EXCEPTION 'order % refused by replica "
        "postgresql://app:%@replica/db, see s3://ck:%@bucket/ckpt', NEW.order_id, "
        f"'{OTHER_PASSWORD}', '{CHECKPOINT_PASSWORD}' USING ERRCODE = 'check_violation'; "
        "END IF; RETURN NEW; END $$",
    )
    execute(url, "CREATE TRIGGER refuse_two BEFORE INSERT ON orders FOR EACH ROW "
                 "EXECUTE FUNCTION refuse_two()")  # fmt: skip


@pytest.mark.usefixtures("no_kept_connections")
def test_a_dead_letter_s_reason_is_masked_of_every_secret_of_the_pipeline(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    _refusing_table(pg_url)
    write_input(tmp_path / "input", 1, 4)
    pg = {"type": "postgres", "name": "pg", "url": pg_url, "table": "orders",
          "mode": "append", "partitions": 1, "dead_letter": "postgres:rejects"}  # fmt: skip
    fan = FanOut(
        "letters",
        str(tmp_path / "ledger"),
        [pg, _Guarded("guarded", OTHER_PASSWORD)],
        # a scheme no filesystem serves (a warning): its password is the pipeline's
        checkpoint_location=f"nofs://ck:{CHECKPOINT_PASSWORD}@bucket/ckpt",
    )
    run_stream(spark, tmp_path / "input", fan, tmp_path / "ckpt")

    assert query(pg_url, "SELECT order_id FROM orders ORDER BY 1") == [(0,), (1,), (3,)]
    assert query(pg_url, "SELECT batch_id, column_name, reason FROM rejects") == [
        (0, None, "order 2 refused by replica postgresql://app:***@replica/db, "
                  "see s3://ck:***@bucket/ckpt")
    ]  # fmt: skip
    # the progress mark keeps the letters for a replay: masked alike
    (kept,) = query(pg_url, "SELECT rejects FROM fanout.progress WHERE sink = 'pg'")
    assert [letter["reason"] for letter in kept[0]] == [
        "order 2 refused by replica postgresql://app:***@replica/db, see s3://ck:***@bucket/ckpt"
    ]
    for password in (OTHER_PASSWORD, CHECKPOINT_PASSWORD):
        for table in ("rejects", "fanout.progress"):
            assert query(pg_url, f"SELECT count(*) FROM {table} t WHERE t::text LIKE %s",
                         (f"%{password}%",)) == [(0,)]  # fmt: skip


LETTERS_PASSWORD = "Letters-pw-4471"


class _Lettered(RecordingSink):
    """A sink whose own dead letters go to a Delta table at an object store: it declares
    no secret, its ``dead_letter``'s password is the pipeline's."""

    dead_letter = f"delta:nofs://dl:{LETTERS_PASSWORD}@bucket/letters"


@pytest.mark.usefixtures("no_kept_connections")
def test_a_dead_letter_s_reason_is_masked_of_another_sink_s_dead_letter_password(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """Before, a dead-letter location was no secret of the pipeline (only a Delta sink
    declared its own): the server's message quoting one reached the rejects table and the
    progress mark as written."""
    url = pg_url
    execute(url, "CREATE TABLE orders (order_id bigint, customer text, amount float8, status text)")
    execute(
        url,
        "CREATE FUNCTION refuse_two() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.order_id = 2 THEN RAISE EXCEPTION 'order % refused, see "
        "nofs://dl:%@bucket/letters', NEW.order_id, "
        f"'{LETTERS_PASSWORD}' USING ERRCODE = 'check_violation'; END IF; RETURN NEW; END $$",
    )
    execute(url, "CREATE TRIGGER refuse_two BEFORE INSERT ON orders FOR EACH ROW "
                 "EXECUTE FUNCTION refuse_two()")  # fmt: skip
    write_input(tmp_path / "input", 1, 4)
    pg = {"type": "postgres", "name": "pg", "url": pg_url, "table": "orders",
          "mode": "append", "partitions": 1, "dead_letter": "postgres:rejects"}  # fmt: skip
    fan = FanOut("letters", str(tmp_path / "ledger"), [pg, _Lettered("lettered")])
    run_stream(spark, tmp_path / "input", fan, tmp_path / "ckpt")

    assert query(pg_url, "SELECT order_id FROM orders ORDER BY 1") == [(0,), (1,), (3,)]
    assert query(pg_url, "SELECT batch_id, column_name, reason FROM rejects") == [
        (0, None, "order 2 refused, see nofs://dl:***@bucket/letters")
    ]
    (kept,) = query(pg_url, "SELECT rejects FROM fanout.progress WHERE sink = 'pg'")
    assert [letter["reason"] for letter in kept[0]] == [
        "order 2 refused, see nofs://dl:***@bucket/letters"
    ]
    for table in ("rejects", "fanout.progress"):
        assert query(pg_url, f"SELECT count(*) FROM {table} t WHERE t::text LIKE %s",
                     (f"%{LETTERS_PASSWORD}%",)) == [(0,)]  # fmt: skip
