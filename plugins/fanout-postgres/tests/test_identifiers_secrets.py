"""Odd identifiers are quoted, never executed; the password is never shown."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from fanout_postgres import PostgresSink
from fanout_postgres.identifiers import quote_always
from pgcheck import execute, query

from fanout import FanOut
from fanout.app.cli import main as cli_main
from fanout.contract.batch import Batch, BatchInfo
from fanout.contract.sink import SinkContext
from fanout.errors import BatchFailedError, ConfigurationError, FanoutError

ODD_SCHEMA = 'Odd "Schema"'
ODD_TABLE = 'Orders "2026"; drop table x'
ODD_COLUMNS = ("Order Id", "select", 'a"b', "Amount%$")
PASSWORD = "S3cr3t p@ss/w%rd:#1"


def test_odd_table_and_column_names_are_written_to_safely(spark: Any, pg_url: str) -> None:
    q = quote_always
    execute(
        pg_url,
        "CREATE TABLE x (keep int)",
        "INSERT INTO x VALUES (1)",
        f"CREATE SCHEMA {q(ODD_SCHEMA)}",
        f"CREATE TABLE {q(ODD_SCHEMA)}.{q(ODD_TABLE)} ({q(ODD_COLUMNS[0])} bigint PRIMARY KEY, "
        f"{q(ODD_COLUMNS[1])} text, {q(ODD_COLUMNS[2])} text, {q(ODD_COLUMNS[3])} float8)",
    )
    sink = PostgresSink(
        "odd",
        url=pg_url,
        table=[ODD_SCHEMA, ODD_TABLE],
        order_by="select",
        columns={"id": "Order Id", "sel": "select", "ab": 'a"b', "amt": "Amount%$"},
        partitions=2,
    )
    sink.open(SinkContext("odd"))
    df = spark.createDataFrame(
        [(1, "s1", "q'1", 1.5), (2, "s2", 'q"2', 2.5), (1, "s9", "q;--", 9.5)],
        "id LONG, sel STRING, ab STRING, amt DOUBLE",
    )
    sink.write(Batch(df, BatchInfo("odd", 0, "q"), "odd", "fanout/odd/odd"))
    rows = query(pg_url, f"SELECT * FROM {q(ODD_SCHEMA)}.{q(ODD_TABLE)} ORDER BY 1")
    assert rows == [(1, "s9", "q;--", 9.5), (2, "s2", 'q"2', 2.5)]
    assert query(pg_url, "SELECT keep FROM x") == [(1,)]  # not dropped


def test_odd_batch_column_names_are_read_as_names(spark: Any, pg_url: str) -> None:
    # the projection to the table's names is SQL text: each batch name is one identifier
    execute(pg_url, "CREATE TABLE plain_names (id bigint PRIMARY KEY, label text, n float8)")
    sink = PostgresSink(
        "names", url=pg_url, table="plain_names", partitions=2,
        columns={"order.id": "id", "la`bel; x": "label", "select": "n"},
    )  # fmt: skip
    sink.open(SinkContext("names"))
    df = spark.createDataFrame(
        [(1, "a", 1.5), (2, "b`c", 2.5)], "`order.id` LONG, `la``bel; x` STRING, `select` DOUBLE"
    )
    result = sink.write(Batch(df, BatchInfo("names", 0, "q"), "names", "fanout/names/names"))
    assert result.rows == 2
    rows = query(pg_url, "SELECT id, label, n FROM plain_names ORDER BY id")
    assert rows == [(1, "a", 1.5), (2, "b`c", 2.5)]


def test_a_table_name_too_long_for_postgres_is_rejected(pg_url: str) -> None:
    sink = PostgresSink("long", url=pg_url, table="t" * 64)
    with pytest.raises(ConfigurationError, match="longer than 63 bytes"):
        sink.open(SinkContext("odd"))


@pytest.fixture
def secret_url(pg_server: Any, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A database reachable only with a password, given through an environment variable."""
    execute(
        pg_url,
        f"CREATE ROLE fan_user LOGIN PASSWORD '{PASSWORD}'",
        "GRANT ALL ON SCHEMA public TO fan_user",
        "CREATE TABLE items (id bigint PRIMARY KEY, name varchar(3))",
        "ALTER TABLE items OWNER TO fan_user",
    )
    database = pg_url.rsplit("/", 1)[1].split("?", 1)[0]
    execute(pg_url, f"GRANT CREATE ON DATABASE {database} TO fan_user")
    hba = Path(pg_server.data_dir) / "pg_hba.conf"
    original = hba.read_text()
    try:
        hba.write_text(f"local {database} fan_user scram-sha-256\n" + original)
        execute(pg_url, "SELECT pg_reload_conf()")
        _wait_until_refused(pg_url.replace("postgres@", "fan_user:wrong@", 1))
        monkeypatch.setenv("FANOUT_TEST_PG_PASSWORD", PASSWORD)
        yield pg_url.replace("postgres@", "fan_user:${FANOUT_TEST_PG_PASSWORD}@", 1)
    finally:  # also when the setup failed: the next test creating the role needs it gone
        hba.write_text(original)
        execute(pg_url, "SELECT pg_reload_conf()")
        # the role is the server's, not the test database's
        execute(pg_url, "DROP OWNED BY fan_user", "DROP ROLE fan_user")


def _wait_until_refused(url: str) -> None:
    """Until the server refuses ``url``'s wrong password: ``pg_reload_conf`` only signals
    the postmaster, and the test's wrong-password case needs the new rule in force."""
    deadline = time.monotonic() + 60  # a bound, not a timing: a loaded machine reloads late
    while True:
        try:
            query(url, "SELECT 1")
        except psycopg2.OperationalError as exc:
            assert "password authentication failed" in str(exc), exc
            return
        assert time.monotonic() < deadline, "the server still lets fan_user in without its password"
        time.sleep(0.1)


def test_the_password_is_never_shown(
    spark: Any,
    secret_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []
    spec = {"type": "postgres", "name": "pg", "url": secret_url, "table": "items", "partitions": 2}
    # 1. a working pipeline (authenticates with the password), whose batch then fails
    fan = FanOut("secret", str(tmp_path / "ledger"), [spec], retries=0)
    sink = fan.sinks["pg"]
    assert PASSWORD in sink.secret_values()
    texts += [repr(sink), str(sink.__dict__.get("url"))]
    df = spark.createDataFrame([(1, "ok"), (2, "too long")], "id LONG, name STRING")
    with pytest.raises(BatchFailedError) as failed:
        fan.process(df, BatchInfo("secret", 0, "q"))
    texts.append(str(failed.value))
    assert "value too long" in str(failed.value)
    ok = spark.createDataFrame([(1, "ok")], "id LONG, name STRING")
    fan.process(ok, BatchInfo("secret", 1, "q"))
    # 2. errors at open(): a missing table, then a wrong password
    for bad in ({**spec, "table": "nope"}, {**spec, "url": secret_url.replace("${", "x${")}):
        with pytest.raises(FanoutError) as caught:
            FanOut("secret", str(tmp_path / "ledger2"), [bad])
        texts.append(str(caught.value))
    assert "does not exist" in texts[-2] and "authentication failed" in texts[-1]
    # 3. fanout status and the ledger's files
    assert cli_main(["status", "--ledger", str(tmp_path / "ledger")]) == 0
    assert cli_main(["migrate", "--url", secret_url]) == 0
    monkeypatch.setenv("FANOUT_TEST_PG_PASSWORD", "wrong-" + PASSWORD)
    assert cli_main(["migrate", "--url", secret_url]) == 2  # a refused login: configuration
    out, err = capsys.readouterr()
    texts += [out, err, caplog.text]
    assert "authentication failed" in err and "check the user, password and database" in err
    for path in (tmp_path / "ledger").rglob("*"):
        if path.is_file():
            texts.append(path.read_bytes().decode("utf-8", "replace"))
    assert "value too long" in "".join(texts[-3:] + [caplog.text])
    spelled = {PASSWORD, "S3cr3t%20p%40ss%2Fw%25rd%3A%231", "S3cr3t+p%40ss%2Fw%25rd%3A%231"}
    for text in texts:
        for secret in spelled:
            assert secret not in text
    assert os.environ["FANOUT_TEST_PG_PASSWORD"] not in "".join(texts)
