"""Secrets: ${VAR} interpolation, and no secret in any error fanout logs, records or raises."""

from __future__ import annotations

import logging

import pytest

from fanout import BatchFailedError, BatchInfo, ConfigurationError, FanOut, Sink
from fanout.ledger.memory import MemoryLedger
from fanout.observe.secrets import expand_env, redact
from fanout.testing import ArrowFrame

PASSWORD = "s3cr3t-Pa55"


def test_expand_env_substitutes_and_defaults() -> None:
    env = {"PG_PASSWORD": PASSWORD}
    assert expand_env("postgresql://u:${PG_PASSWORD}@h/db", what="x", environ=env) == (
        f"postgresql://u:{PASSWORD}@h/db"
    )
    assert expand_env("${MISSING:-fallback}", what="x", environ=env) == "fallback"
    assert expand_env("no reference", what="x", environ=env) == "no reference"


def test_expand_env_names_the_missing_variable_not_a_value() -> None:
    with pytest.raises(ConfigurationError) as missing:
        expand_env("postgresql://u:${PG_PASSWORD}@h", what="sink 'pg' option 'url'", environ={})
    assert str(missing.value) == (
        "sink 'pg' option 'url': environment variable 'PG_PASSWORD' is referenced but not "
        "set; export PG_PASSWORD=... before starting the pipeline"
    )


def test_redact_masks_every_occurrence() -> None:
    assert redact(f"a {PASSWORD} b {PASSWORD}", [PASSWORD, ""]) == "a *** b ***"


class LeakySink(Sink):
    """Fails with its password in the error, as some drivers do."""

    def secret_values(self) -> list[str]:
        return [PASSWORD]

    def write(self, batch: object) -> int:
        try:
            raise OSError(f"connect to postgresql://u:{PASSWORD}@db failed")
        except OSError as inner:
            raise RuntimeError(f"cannot write: {inner}") from inner


def test_secret_never_reaches_errors_logs_or_ledger(caplog: pytest.LogCaptureFixture) -> None:
    import pyarrow as pa

    caplog.set_level(logging.DEBUG)
    ledger = MemoryLedger()
    fan = FanOut("p", ledger, [LeakySink("pg")], retries=0)
    with pytest.raises(BatchFailedError) as failed:
        fan.process(ArrowFrame(pa.table({"x": [1]})), BatchInfo("p", 0, "q"))
    error = failed.value
    texts = [str(error), repr(error), caplog.text]
    texts += [
        str(e) for e in (error.__cause__, error.failures["pg"], error.failures["pg"].__cause__)
    ]
    texts += [e.error or "" for e in ledger.entries]
    assert all(PASSWORD not in text for text in texts)
    assert "connect to postgresql://u:***@db failed" in str(error)
    assert [e.status for e in ledger.entries] == ["epoch", "failed"]


def test_expand_env_nested_defaults_and_no_reexpansion() -> None:
    env = {"PGPASSWORD": "p${NOT_A_REF}w", "HOST": "db"}
    url = "${PG_URL:-postgresql://u:${PGPASSWORD:-x}@${HOST}:5432/${DB:-shop}}"
    assert expand_env(url, what="x", environ=env) == "postgresql://u:p${NOT_A_REF}w@db:5432/shop"
    assert expand_env(url, what="x", environ={**env, "PG_URL": "sqlite://"}) == "sqlite://"
    with pytest.raises(ConfigurationError) as unclosed:
        expand_env("${PG_URL:-abc", what="sink 'pg' option 'url'", environ={})
    assert "is not closed" in str(unclosed.value)
