"""Rows failing a Kafka sink's route (a malformed CAST) go to its dead-letter topic in a
transaction of their own, before any partition writes; a replay after the driver died
before the ledger mark duplicates neither records nor dead letters."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from kafkatools import Broker, create_topic, marker, read_topic

from fanout import BatchFailedError, BatchInfo, FanOut, RouteError
from fanout.routes.route import Route
from fanout.routes.settings import session_settings
from fanout.testing.faults import MarkLost
from tests.integration.streams import delta_rows

SCHEMA = "id LONG, amount STRING"
BAD = {2: "abc", 11: "1.5.0"}
ROWS = [{"id": i, "amount": BAD.get(i, str(i))} for i in range(12)]
GOOD = [i for i in range(12) if i not in BAD and i > 3]
WHERE = "CAST(amount AS INT) > 3"


def test_rows_failing_the_route_go_to_the_dead_letter_topic_once(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    dlq, markers = f"{topic}-dlq", f"{topic}-markers"
    create_topic(kafka.bootstrap, dlq, 1)
    pipeline = f"kroute{uuid.uuid4().hex[:6]}"
    sink = {"type": "kafka", "name": "events", "bootstrap_servers": kafka.bootstrap,
            "topic": topic, "key": "id", "partitions": 2, "dead_letter": f"kafka:{dlq}",
            "marker_topic": markers, "create_topic": True, "where": WHERE}  # fmt: skip
    batch, info = spark.createDataFrame(ROWS, SCHEMA), BatchInfo(pipeline, 8, "q")
    ledger = str(tmp_path / "ledger")

    with pytest.raises(BatchFailedError):  # the driver "dies" before the ledger mark
        FanOut(pipeline, MarkLost(ledger, "events"), [sink], retries=0).process(batch, info)
    result = FanOut(pipeline, ledger, [sink], retries=0).process(batch, info)["events"]

    assert result.already_written is True  # every partition skipped
    assert result.dead_lettered == 2
    records = read_topic(kafka.bootstrap, topic, len(GOOD))
    assert sorted(int(r["key"]) for r in records) == GOOD
    dead = sorted(read_topic(kafka.bootstrap, dlq, 2), key=lambda r: json.loads(r["value"])["id"])
    assert [(r["key"], json.loads(r["value"])) for r in dead] == [
        (None, {"id": 2, "amount": "abc"}),
        (None, {"id": 11, "amount": "1.5.0"}),
    ]
    for record, value in zip(dead, ("abc", "1.5.0"), strict=True):
        headers = record["headers"]
        assert headers["fanout.error"].startswith(
            f"route where {WHERE!r} failed: [CAST_INVALID_INPUT] The value '{value}' "
        )
        assert headers["fanout.value"] == value and "fanout.column" not in headers
        assert (headers["fanout.sink"], headers["fanout.batch_id"]) == ("events", "8")
        assert headers["fanout.topic"] == topic
    # the route letters' own marker says batch 8 is there: the replay skipped them
    assert marker(kafka.bootstrap, pipeline, "events#route", 0, markers) == 9
    # and their route's fingerprint, committed with them, matched the replay's
    stamp = marker(kafka.bootstrap, pipeline, "events#route", 0, markers, suffix=".route")
    batch_settings = session_settings(spark.range(0))
    assert stamp == int(Route(where=WHERE).stamp(batch_settings).fingerprint, 16)
    marks = [r for r in delta_rows(tmp_path / "ledger") if r["status"] == "committed"]
    assert [(r["rows"], r["dead_lettered"]) for r in marks] == [(len(GOOD), 2)]


def test_route_letters_to_a_delta_table_use_the_one_layout(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    sink = {"type": "kafka", "name": "events", "bootstrap_servers": kafka.bootstrap,
            "topic": topic, "partitions": 2, "dead_letter": str(tmp_path / "dlq"),
            "where": WHERE}  # fmt: skip
    batch = spark.createDataFrame(ROWS, SCHEMA)
    pipeline = f"kroute{uuid.uuid4().hex[:6]}"
    for run in range(2):  # a replay under a fresh ledger writes nothing twice
        fan = FanOut(pipeline, str(tmp_path / f"ledger{run}"), [sink])
        assert fan.process(batch, BatchInfo(pipeline, 0, "q"))["events"].dead_lettered == 2
    rows = sorted(delta_rows(tmp_path / "dlq"), key=lambda r: json.loads(r["row"])["id"])
    assert [(r["sink"], r["batch_id"], r["partition"], r["source"]) for r in rows] == [
        ("events", 0, None, "route")
    ] * 2  # fanout's one layout: a route's rows have no partition
    assert [json.loads(r["row"]) for r in rows] == [
        {"id": 2, "amount": "abc"},
        {"id": 11, "amount": "1.5.0"},
    ]
    assert all(r["reason"].startswith(f"route where {WHERE!r} failed: ") for r in rows)
    assert sorted(json.loads(r["value"])["id"] for r in read_topic(kafka.bootstrap, topic,
                  len(GOOD))) == GOOD  # fmt: skip


def test_a_replay_under_a_changed_route_is_refused_before_anything_is_written(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    """The driver died after the sink and its route letters committed, before the ledger
    mark; the restart runs another route, which refuses no row: writing its letters
    (none) and skipping the committed partitions would leave rows 2 and 11 as letters
    while the new route sends row 11 to the topic. Refused; the old route completes."""
    dlq, markers = f"{topic}-dlq", f"{topic}-markers"
    create_topic(kafka.bootstrap, dlq, 1)
    pipeline = f"kroute{uuid.uuid4().hex[:6]}"
    sink = {"type": "kafka", "name": "events", "bootstrap_servers": kafka.bootstrap,
            "topic": topic, "key": "id", "partitions": 2, "dead_letter": f"kafka:{dlq}",
            "marker_topic": markers, "create_topic": True, "where": WHERE}  # fmt: skip
    changed = {**sink, "where": "id > 3"}
    batch, info = spark.createDataFrame(ROWS, SCHEMA), BatchInfo(pipeline, 8, "q")
    ledger = str(tmp_path / "ledger")
    with pytest.raises(BatchFailedError):
        FanOut(pipeline, MarkLost(ledger, "events"), [sink], retries=0).process(batch, info)

    with pytest.raises(BatchFailedError) as failed:
        FanOut(pipeline, ledger, [changed], retries=0).process(batch, info)
    error = failed.value.failures["events"]
    assert isinstance(error, RouteError) and (error.sink, error.batch_id) == ("events", 8)
    old, new = (Route(where=w).stamp(session_settings(batch)) for w in (WHERE, "id > 3"))
    assert f"Kafka topic {dlq} holds this batch's route dead letters" in str(error)
    assert f"chosen by another route (fingerprint {old.fingerprint})" in str(error)
    assert f"now {new.text} (fingerprint {new.fingerprint})" in str(error)
    assert new.text.startswith("where 'id > 3' under spark.sql.ansi.enabled=true, ")

    result = FanOut(pipeline, ledger, [sink], retries=0).process(batch, info)["events"]
    assert (result.already_written, result.dead_lettered) == (True, 2)
    records = read_topic(kafka.bootstrap, topic, len(GOOD))
    assert sorted(int(r["key"]) for r in records) == GOOD
    dead = read_topic(kafka.bootstrap, dlq, 2)
    assert sorted(json.loads(r["value"])["id"] for r in dead) == [2, 11]
