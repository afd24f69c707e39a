"""The sink conformance suite (fanout.testing.conformance) against the Kafka sink: keyed
by ``id``, read back by a read_committed consumer in another process, and a SASL password
never shown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kafkatools import Broker, _consume

from fanout.testing.conformance import SinkConformance, SinkUnderTest

SASL_PASSWORD = "kafka-s3cr3t-for-conformance"


class TestKafkaConformance(SinkConformance):
    @pytest.fixture
    def under_test(self, kafka: Broker, topic: str, tmp_path: Path) -> SinkUnderTest:
        def read() -> list[dict[str, Any]]:
            records = _consume(kafka.bootstrap, topic, 0, 20.0, 2.0)["records"]
            return [json.loads(r["value"]) for r in records]

        return SinkUnderTest(
            config={
                "type": "kafka",
                "bootstrap_servers": kafka.bootstrap,
                "topic": topic,
                "key": "id",
                "partitions": 2,
            },
            read=read,
            dead_letter=str(tmp_path / "dead"),
            keyed=True,
            schema_drift="writes",
            secret=SASL_PASSWORD,
            failing_config={
                "type": "kafka",
                "bootstrap_servers": "127.0.0.1:9",
                "topic": topic,
                "open_timeout_s": 2,
                "producer": {
                    "security.protocol": "SASL_PLAINTEXT",
                    "sasl.mechanism": "PLAIN",
                    "sasl.username": "conformance-user",
                    "sasl.password": SASL_PASSWORD,
                },
            },
        )
