"""Append mode's partitioning must be deterministic: a keyless append hashing a
non-deterministic column is refused. (A ``partitions`` changed between a kill and the
restart is refused too: test_append_kill, one kill for both.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fanout_postgres import PostgresSink
from pg_data import run_stream, write_files
from pgcheck import query

from fanout import FanOut, PartitioningError
from fanout.routes.route import Route
from fanout.sink_spec import SinkSpec


def test_keyless_append_with_uuid_in_its_select_is_refused_and_keyed_is_written_once(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """Append without keys hashes the whole row: uuid() there is refused at FanOut(...),
    with nothing written; with keys, only the keys must be deterministic."""
    files = write_files(tmp_path / "input", files=2, rows=20, step=20)
    route = Route(select=("*", "uuid() AS event_id"))
    options: dict[str, Any] = {"url": pg_url, "table": "events", "mode": "append",
                               "create_table": True, "partitions": 3}  # fmt: skip
    with pytest.raises(PartitioningError) as refused:
        FanOut("pg-uuid", str(tmp_path / "ledger"),
               [SinkSpec(PostgresSink("events", **options), route)])  # fmt: skip
    message = str(refused.value)
    assert (
        "sink 'events': route select expression 'uuid() AS event_id' is not deterministic"
        in message
    )
    assert "no key" in message
    assert query(pg_url, "SELECT count(*) FROM pg_tables WHERE tablename = 'events'") == [(0,)]

    keyed = PostgresSink("events", keys=["id"], **options)
    fan = FanOut("pg-uuid", str(tmp_path / "ledger"), [SinkSpec(keyed, route)])
    run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")
    got = query(pg_url, "SELECT id, length(event_id) FROM events ORDER BY id")
    assert got == [(r["id"], 36) for chunk in files for r in chunk]
