"""A batch Spark replays reaching a Kafka lag sink from the spool (fanout.steps.replay_lag):
the sink wrote batch 1 and the driver died before its mark; its marker groups were deleted
before the restart, so it cannot tell whether the topic holds the batch. Refused at the
replay, the sink lagged and the batch was spooled for it; Spark committed it, and the next
run's catch-up, which no longer sees a replay, sent it again. Now the catch-up asks the
sink first: refused, and the printed skip (through the real CLI) gives it up; each record
once. Real Spark, the embedded broker, Delta ledger and spool."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kafkatools import Broker, delete_marker_groups, key_counts, read_topic

from fanout import BatchInfo, FanOut, SinksBehindError
from fanout.testing.faults import DieAfterWrite, DriverKilled
from tests.cli_process import fanout_process, printed_command

pytestmark = pytest.mark.integration


def _now() -> int:
    return int(time.time() * 1000)


def test_a_replay_a_kafka_lag_sink_was_refused_is_not_sent_again_by_its_catch_up(
    spark: Any, kafka: Broker, tmp_path: Path
) -> None:
    pipeline, topic = f"lagk{uuid.uuid4().hex[:6]}", f"lag-{uuid.uuid4().hex[:8]}"
    sink = {"type": "kafka", "name": "k", "bootstrap_servers": kafka.bootstrap, "topic": topic,
            "key": "id", "partitions": 2, "create_topic": {"partitions": 2},
            "on_failure": "lag"}  # fmt: skip

    planned: dict[int, int] = {}

    def run(*batches: int, final: bool = False, plugins: tuple[object, ...] = ()) -> str:
        """``batches`` (keys ``10 * id`` + 0..2; a batch planned before is replayed with
        its planning time, else planned now) through a FanOut built for them, then its
        final catch-up if ``final``; the sink's last error."""
        fan = FanOut(pipeline, str(tmp_path / "ledger"), [sink], retries=0, backoff_s=0,
                     spool=str(tmp_path / "spool"), probe_interval_s=3600,
                     plugins=plugins)  # fmt: skip
        fan.catchup.stop()  # the test drives the catch-up
        try:
            for batch_id in batches:
                when = planned.setdefault(batch_id, _now())
                info = BatchInfo(pipeline, batch_id, "query-1", [{"src": {"0": batch_id + 1}}],
                                 batch_timestamp_ms=when)  # fmt: skip
                rows = [(batch_id * 10 + n,) for n in range(3)]
                fan.process(spark.createDataFrame(rows, "id BIGINT"), info)
            if final:
                with pytest.raises(SinksBehindError):
                    fan.final_catch_up()
            return fan.lagging.lags()["k"].error or ""
        finally:
            fan.close()

    with pytest.raises(DriverKilled):  # batch 0 written and marked, batch 1 written only
        run(0, 1, plugins=(DieAfterWrite("k", 1),))
    written = {"0": 1, "1": 1, "2": 1, "10": 1, "11": 1, "12": 1}
    assert key_counts(read_topic(kafka.bootstrap, topic, 6, timeout=15)) == written
    delete_marker_groups(kafka.bootstrap, pipeline, "k", 2)

    refused = run(1)  # the replay: k lags with the refusal, batch 1 spooled
    assert "batch 1 of epoch 0 is a replay" in refused
    error = run(2, final=True)  # Spark committed 1: 2 held back; the catch-up of 1 asks
    assert error.startswith(
        "SinkRecordsGoneError: sink 'k', batch 1: pipeline "
        f"'{pipeline}', sink 'k': batch 1 of epoch 0 was spooled for the sink from a replay"
    ), error
    assert key_counts(read_topic(kafka.bootstrap, topic, 6, timeout=15, idle=3.0)) == written

    done = fanout_process(*printed_command(error, "fanout ledger skip"))  # the topic holds 1
    assert done.returncode == 0, done.stderr
    fan = FanOut(pipeline, str(tmp_path / "ledger"), [sink], retries=0, backoff_s=0,
                 spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip
    try:
        assert fan.final_catch_up()["k"].state == "live"  # batch 2 from the spool
    finally:
        fan.close()
    after = {**written, "20": 1, "21": 1, "22": 1}
    assert key_counts(read_topic(kafka.bootstrap, topic, 9, timeout=15, idle=3.0)) == after
