"""The sink conformance suite (fanout.testing.conformance) against the Kafka sink: keyed
by ``id``, read back by a read_committed consumer in another process, and a SASL password
never shown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from kafkatools import Broker, _consume, create_topic

from fanout.testing.conformance import SinkConformance, SinkUnderTest

SASL_PASSWORD = "kafka-s3cr3t-for-conformance"


class TestKafkaConformance(SinkConformance):
    @pytest.fixture
    def under_test(self, kafka: Broker, topic: str, tmp_path: Path) -> SinkUnderTest:
        def read() -> list[dict[str, Any]]:
            records = _consume(kafka.bootstrap, topic, 0, 20.0, 2.0)["records"]
            return [json.loads(r["value"]) for r in records]

        def drop() -> None:  # the topic deleted (its marker groups outlive it)
            with AdminClient({"bootstrap.servers": kafka.bootstrap}) as admin:
                admin.delete_topics([topic])[topic].result(10)

        def recreate() -> None:  # as a deploy script would: a new topic id, no record
            drop()
            create_topic(kafka.bootstrap, topic, 3)

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
            recreate=recreate,
            drop=drop,
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

    def test_a_route_changed_between_a_partial_attempt_and_its_replay(
        self, spark: Any, under_test: SinkUnderTest, tmp_path: Path, kafka: Broker
    ) -> None:
        """The suite's check, on a broker that hides aborted records from read_committed
        readers: the partial attempt aborts partition 0's transaction, whose records Tansu
        still shows (plugins/fanout-kafka/README.md), so the exact reads cannot hold there."""
        if not kafka.hides_aborted:
            pytest.skip("the broker shows aborted records to read_committed readers (Tansu)")
        super().test_a_route_changed_between_a_partial_attempt_and_its_replay(
            spark, under_test, tmp_path
        )
