"""Structured logs: JSON lines with pipeline, batch and sink; secrets masked everywhere."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pyarrow as pa
import pytest

from fanout import BatchFailedError, BatchInfo, FanOut, Sink
from fanout.ledger.memory import MemoryLedger
from fanout.observe.logs import (
    JsonFormatter,
    RedactFilter,
    RedactingStream,
    configure,
    register_secrets,
)
from fanout.testing import ArrowFrame, FlakySink, RecordingSink

TOKEN = "tok-9f8e7d6c5b"


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    configure("INFO", "json", stream)
    yield stream
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in saved[0]:
        root.addHandler(handler)
    root.setLevel(saved[1])


def _records(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def test_sink_log_lines_carry_pipeline_batch_and_sink(json_log: io.StringIO) -> None:
    flaky = FlakySink(RecordingSink("pg"), fail_on=[4], times=1, transient=True)
    FanOut("orders", MemoryLedger(), [flaky], backoff_s=0).process(
        ArrowFrame(pa.table({"x": [1]})), BatchInfo("orders", 4, "q")
    )
    records = _records(json_log)
    failed = [r for r in records if r["level"] == "WARNING"]
    assert failed[0]["pipeline"] == "orders" and failed[0]["batch_id"] == 4
    assert failed[0]["sink"] == "pg" and failed[0]["attempt"] == 1
    assert "attempt 1 failed (will retry)" in str(failed[0]["message"])
    done = [r for r in records if "1 rows in" in str(r["message"])]
    assert [(r["pipeline"], r["batch_id"], r["sink"]) for r in done] == [("orders", 4, "pg")]


class TokenSink(Sink):
    def secret_values(self) -> list[str]:
        return [TOKEN]

    def write(self, batch: object) -> int:
        raise RuntimeError(f"auth with {TOKEN} refused")


def test_secrets_are_masked_in_messages_and_tracebacks(json_log: io.StringIO) -> None:
    fan = FanOut("orders", MemoryLedger(), [TokenSink("api")], retries=0)
    with pytest.raises(BatchFailedError):
        fan.process(ArrowFrame(pa.table({"x": [1]})), BatchInfo("orders", 0, "q"))
    try:
        raise ValueError(f"a library echoing {TOKEN}")
    except ValueError:
        logging.getLogger("some.library").exception("unexpected: %s", TOKEN)
    text = json_log.getvalue()
    assert TOKEN not in text
    assert "auth with *** refused" in text
    assert "unexpected: ***" in text and "a library echoing ***" in text


def test_filter_and_formatter_work_on_any_handler() -> None:
    register_secrets(["hunter2"])
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactFilter())
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("embedding.app")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("password is %s", "hunter2", extra={"pipeline": "p", "sink": "s"})
    finally:
        logger.removeHandler(handler)
    record = json.loads(stream.getvalue())
    assert record["message"] == "password is ***"
    assert (record["pipeline"], record["sink"], record["level"]) == ("p", "s", "WARNING")


def test_a_password_in_the_checkpoint_location_is_masked_in_the_log() -> None:
    """A checkpoint at ``s3://KEY:SECRET@bucket/...``: no sink declares its
    password, and a message naming the location (a guard's, recover's) logged it."""
    FanOut(
        "orders", MemoryLedger(), [TokenSink("api")],
        checkpoint_location="s3://KEY:CkptPassw0rd@bucket/ckpt",
    )  # fmt: skip
    record = logging.LogRecord(
        "fanout", logging.WARNING, __file__, 1,
        "checkpoint s3://KEY:CkptPassw0rd@bucket/ckpt: replaced",
        None, None,
    )  # fmt: skip
    RedactFilter().filter(record)
    assert record.getMessage() == "checkpoint s3://KEY:***@bucket/ckpt: replaced"


def test_the_cli_stream_masks_a_short_secret_only_as_a_urls_password() -> None:
    """The example pipeline's PostgreSQL password is ``fanout``: the CLI's streams masked
    the word wherever it stood alone, so ``fanout run`` printed ``*** recover --config``, and
    a password ``1`` made ``status --json`` print ``"last_committed_batch": ***``."""
    out = io.StringIO()
    register_secrets(["fanout", "1", "LongSecretPassw0rd"])
    stream = RedactingStream(out)
    stream.write("fanout recover --config p.toml: batch 1 of sink fanout_pg\n")
    stream.write('"url": "postgresql+psycopg2://fanout:fanout@127.0.0.1:5432/fanout", "n": 1\n')
    stream.write("s3://KEY:LongSecretPassw0rd@b/x and LongSecretPassw0rd alone\n")
    stream.write("az://u:1@acct/x, gs://u:12@b/y\n")
    stream.write("postgresql://u@h/db?sslmode=require&password=fanout&n=12 ?x=fanout1\n")
    assert out.getvalue() == (
        "fanout recover --config p.toml: batch 1 of sink fanout_pg\n"
        '"url": "postgresql+psycopg2://fanout:***@127.0.0.1:5432/fanout", "n": 1\n'
        "s3://KEY:***@b/x and *** alone\n"
        "az://u:***@acct/x, gs://u:12@b/y\n"
        "postgresql://u@h/db?sslmode=require&password=***&n=12 ?x=fanout1\n"
    )


def test_the_default_handler_follows_sys_stderr_as_it_is_at_each_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CLI's handler (no stream given) writes to ``sys.stderr`` as it is when a record
    comes: a stream swapped in after ``configure`` and closed since (pytest's capture at
    the end of a test that ran ``fanout`` in-process) never gets a later record."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    first, second = io.StringIO(), io.StringIO()
    try:
        monkeypatch.setattr("sys.stderr", first)
        configure("INFO", "text")
        logging.getLogger("fanout.test").warning("into the first")
        assert first.getvalue() == "WARNING fanout.test: into the first\n"
        first.close()
        monkeypatch.setattr("sys.stderr", second)
        logging.getLogger("fanout.test").warning("into the second")
        assert second.getvalue() == "WARNING fanout.test: into the second\n"
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
