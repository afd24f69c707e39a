"""A source's schema changing between batches while a Kafka sink lags: batches of each
shape (a column added, then dropped, then its type changed) are spooled for it, and the
catch-up writes each batch's records exactly as a live Kafka sink wrote them (the same
keys, the same JSON values: no column of another batch, no null for a column the batch did
not have, no value cast to another batch's type). Real Spark, Delta ledger and spool, the
tests' broker; the lagging sink's target down is a stand-in (its writes raise while
``down``), its writes once up are the real sink's."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from fanout_kafka import KafkaSink
from kafkatools import Broker, create_topic, read_topic

from fanout import BatchInfo, FanOut
from fanout.sink_spec import SinkSpec, lag_policy
from fanout.testing.faults import DownWhile

SHAPES = [
    "SELECT id, CAST(id * 2 AS INT) AS a",
    "SELECT id, CAST(id * 2 AS INT) AS a, concat('b', id) AS b",  # b added
    "SELECT id, concat('b', id) AS b",  # a dropped
    "SELECT id, CAST(id AS DOUBLE) / 4 AS a",  # a back, another type
]


class _DownKafka(DownWhile, KafkaSink):
    """The Kafka sink whose brokers are down while ``down`` holds."""

    down_message = "the brokers are down"


def test_batches_of_each_shape_spooled_for_a_kafka_sink_reach_it_as_written_live(
    spark: Any, kafka: Broker, tmp_path: Path
) -> None:
    pipeline = f"kshape{uuid.uuid4().hex[:6]}"
    live_topic, lag_topic = f"{pipeline}-live", f"{pipeline}-lag"
    for name in (live_topic, lag_topic):
        create_topic(kafka.bootstrap, name, 2)
    options: dict[str, Any] = {"bootstrap_servers": kafka.bootstrap, "key": "id", "partitions": 2}
    live = KafkaSink("live", topic=live_topic, **options)
    lagging = _DownKafka("copy", topic=lag_topic, **options)
    fan = FanOut(
        pipeline, str(tmp_path / "ledger"),
        [live, SinkSpec(lagging, lag=lag_policy("copy", {"on_failure": "lag"}))],
        retries=0, backoff_s=0, spool=str(tmp_path / "spool"), probe_interval_s=3600,
    )  # fmt: skip
    try:
        for b, shape in enumerate(SHAPES):
            df = spark.sql(f"{shape} FROM range({b * 10}, {b * 10 + 3})")
            results = fan.process(df, BatchInfo(pipeline, b, "q", [{"s": b}]))
            assert set(results) == {"live"}  # copy lags: the batch spooled for it
        lagging.down = False
        fan.final_catch_up()
    finally:
        fan.close()

    def by_key(topic: str) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for record in read_topic(kafka.bootstrap, topic, 12):
            found.setdefault(record["key"], []).append(record["value"])
        return found

    written_live, caught_up = by_key(live_topic), by_key(lag_topic)
    assert sorted(int(k) for k in written_live) == [b * 10 + i for b in range(4) for i in range(3)]
    assert caught_up == written_live
    assert written_live["11"] == ['{"id":11,"a":22,"b":"b11"}']
    assert written_live["21"] == ['{"id":21,"b":"b21"}']
    assert written_live["31"] == ['{"id":31,"a":7.75}']
