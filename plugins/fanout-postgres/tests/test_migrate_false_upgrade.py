"""A user whose fanout tables are at revision 0003 (before upsert's route records) upgrades
fanout and keeps ``migrate: false``: the upsert sink's open, and ``fanout validate``, refuse
naming the sink, the revision, what is missing and the command that migrates."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
from fanout_postgres import PostgresSink
from fanout_postgres.migrate import upgrade
from fanout_postgres.url import display
from pgcheck import execute, query
from sqlalchemy.engine import make_url

from fanout.app.cli import main
from fanout.contract.sink import SinkContext
from fanout.errors import ConfigurationError
from tests.in_process_cli import Cli
from tests.integration.checklist import validate

SINK = """[[sinks]]
type = "postgres"
name = "pg"
url = "{url}"
table = "events"
mode = "upsert"
keys = ["id"]
migrate = false
"""


def _at_0003(pg_url: str) -> str:
    """fanout's tables at revision 0003, a target table; the message's spelling of the URL
    (quoted for a shell in the command it names: it holds a ``?``)."""
    upgrade(pg_url, schema="fanout", revision="0003_progress_route")
    execute(pg_url, "CREATE TABLE events (id bigint PRIMARY KEY, v text)")
    return display(make_url(pg_url))


def _problem(shown: str) -> str:
    return (
        "postgres sink 'pg' (table events): fanout's tables in schema 'fanout' are at "
        "revision 0003_progress_route, not 0008_upsert_routes_target (missing: column "
        "fanout.progress.target_oid, table fanout.upsert_routes); run `fanout migrate "
        f"--url {shlex.quote(shown)} --schema fanout` or set migrate: true"
    )


def test_an_upsert_sink_at_revision_0003_is_refused_at_open(pg_url: str) -> None:
    shown = _at_0003(pg_url)
    sink = PostgresSink("pg", url=pg_url, table="events", mode="upsert", keys=["id"], migrate=False)
    with pytest.raises(ConfigurationError) as refused:
        sink.open(SinkContext("old"))
    assert str(refused.value) == _problem(shown)
    assert query(pg_url, "SELECT version_num FROM fanout.alembic_version") == [
        ("0003_progress_route",)
    ]  # nothing migrated

    command = shlex.split(str(refused.value).split("`")[1])
    assert command[:3] == ["fanout", "migrate", "--url"]
    assert main(command[1:]) == 0  # the command as named
    assert query(pg_url, "SELECT version_num FROM fanout.alembic_version") == [
        ("0008_upsert_routes_target",)
    ]
    sink.open(SinkContext("old"))  # now at head: fine
    sink.close()


def test_validate_fails_an_upsert_sink_at_revision_0003(
    spark: Any, pg_url: str, tmp_path: Path, fanout_cli: Cli
) -> None:
    shown = _at_0003(pg_url)
    validated = validate(tmp_path, "id LONG, v STRING", SINK.format(url=pg_url), fanout_cli, "old")
    assert validated.code == 2
    assert [line for line in validated.out.splitlines() if "sink pg" in line] == [
        "  OK    sink pg: options",
        f"  FAIL  sink pg: opens its target: {_problem(shown)}",
    ]
