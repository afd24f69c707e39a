"""``fanout validate`` on a pipeline file whose source declares its schema: a Kafka sink
whose key column the source does not have fails the check, naming the sink and the column,
with exit code 2, before any stream; the topics a run would create are named, not created."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient
from kafkatools import Broker

from tests.in_process_cli import Cli
from tests.integration.checklist import validate

SINKS = """[[sinks]]
type = "kafka"
name = "events"
bootstrap_servers = "{bootstrap}"
topic = "{topic}"
key = "order_id"
marker_topic = "{topic}-markers"

[[sinks]]
type = "kafka"
name = "audit"
bootstrap_servers = "{bootstrap}"
topic = "{topic}-audit"
create_topic = {{ partitions = 2, replication_factor = 1 }}
marker_topic = "{topic}-markers"
"""


def test_validate_fails_a_key_column_the_source_does_not_have(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path, fanout_cli: Cli
) -> None:
    sinks = SINKS.format(bootstrap=kafka.bootstrap, topic=topic)
    validated = validate(tmp_path, "id LONG, price DOUBLE", sinks, fanout_cli)
    assert validated.code == 2
    assert validated.lines == [
        "  OK    source: builds with its schema and transform",
        f"  OK    ledger {tmp_path}/ledger: opens",
        f"  INFO  ledger {tmp_path}/ledger: would create the ledger table",
        "  OK    sink events: options",
        "  OK    sink events: opens its target",
        f"  INFO  sink events: would create topic '{topic}-markers' (option 'marker_topic') "
        "with 1 partition(s)",
        "  FAIL  sink events: target takes the routed schema: sink 'events': column(s) "
        "'order_id' named by option 'key' are not in the batch (columns: id, price); add them "
        "in the query or the sink's select, or change the option",
        "  OK    sink audit: options",
        "  OK    sink audit: opens its target",
        f"  INFO  sink audit: would create topic '{topic}-audit' (option 'topic') with 2 "
        "partition(s)",
        f"  INFO  sink audit: would create topic '{topic}-markers' (option 'marker_topic') "
        "with 1 partition(s)",
        "  OK    sink audit: target takes the routed schema",
    ]
    assert "configuration error: 1 of 8 checks failed:" in validated.err
    assert not (tmp_path / "checkpoint").exists()
    assert not (tmp_path / "ledger").exists()
    with AdminClient({"bootstrap.servers": kafka.bootstrap}) as admin:
        topics = admin.list_topics(timeout=10).topics
    assert sorted(t for t in topics if t.startswith(topic)) == [topic]


HEADER_CLASH = """[[sinks]]
type = "kafka"
name = "events"
bootstrap_servers = "{bootstrap}"
topic = "{topic}"
key = "id"
headers = ["fanout.batch_id"]
marker_topic = "{topic}-markers"
"""


def test_validate_fails_a_header_column_named_like_a_fixed_header(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path, fanout_cli: Cli
) -> None:
    """Up to this version it passed, and every record carried two ``fanout.batch_id``
    headers, the column's after fanout's."""
    sinks = HEADER_CLASH.format(bootstrap=kafka.bootstrap, topic=topic)
    validated = validate(tmp_path, "id LONG, `fanout.batch_id` STRING", sinks, fanout_cli)
    assert validated.code == 2
    failed = [line for line in validated.lines if line.startswith("  FAIL")]
    assert failed == [
        "  FAIL  sink events: opens its target: Kafka sink 'events': option 'headers' names "
        "column(s) 'fanout.batch_id', which fanout writes as headers itself (fanout.pipeline, "
        "fanout.sink, fanout.batch_id, fanout.error, fanout.topic, fanout.record_bytes, "
        "fanout.column, fanout.value): each record would carry two headers of that name, and "
        "a consumer reading the first would get the wrong value. Rename the column in the "
        "query or the sink's select (e.g. 'fanout_batch_id') and list the new name in "
        "'headers'"
    ]
