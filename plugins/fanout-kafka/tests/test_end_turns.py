"""Transaction ends take turns on Tansu (:mod:`fanout_kafka.turns`): without them, two
partitions' commits ending at once leave Tansu's last stable offset stuck and the markers
committed afterwards unapplied."""

from __future__ import annotations

import multiprocessing
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from fanout_kafka import KafkaSink
from fanout_kafka.records import Encoder
from fanout_kafka.settings import WriterSettings
from fanout_kafka.transaction import PartitionWriter
from fanout_kafka.turns import TANSU_CLUSTER_ID, needs_turns, turn, turn_file
from kafkatools import Broker, create_topic, marker

from fanout.contract.sink import SinkContext

WRITERS, BATCHES, ROUNDS, ROWS = 4, 3, 30, 12


def hold(path: str | None, inside: str, log: str, holds: int, start: Any) -> None:
    """In another process: enter the turn ``holds`` times, noting any overlap. Inside, it
    waits up to 0.1 s for another process to be inside too (each names itself by a file in
    ``inside``), so that without the lock they overlap however the processes are
    scheduled on a busy machine; with it, the wait always runs out."""
    start.wait(60)  # every process imported this module: start together
    here = Path(inside)
    mine = here / str(os.getpid())
    for _ in range(holds):
        with turn(path):
            mine.touch()
            overlapped, deadline = False, time.monotonic() + 0.1
            while not overlapped and time.monotonic() < deadline:
                overlapped = any(other != mine for other in here.iterdir())
                time.sleep(0.005)
            mine.unlink()
            with open(log, "a") as out:
                out.write("overlap\n" if overlapped else "alone\n")


@pytest.mark.parametrize("locked", [True, False])
def test_a_turn_is_held_by_one_process_at_a_time(tmp_path: Path, locked: bool) -> None:
    """Without the lock the same processes do overlap: the check can fail."""
    path = str(tmp_path / "ends.lock") if locked else None
    inside, log = str(tmp_path / "inside"), str(tmp_path / "log")
    Path(inside).mkdir()
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(3)
    workers = [context.Process(target=hold, args=(path, inside, log, 10, start)) for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    lines = Path(log).read_text().splitlines()
    assert len(lines) == 30
    if locked:
        assert lines == ["alone"] * 30
    else:
        assert "overlap" in lines


def test_only_tansu_needs_turns_and_each_broker_has_its_own_file() -> None:
    assert needs_turns(TANSU_CLUSTER_ID)
    assert not needs_turns("MkU3OEVBNTcwNTJENDM2Qg")  # a Kafka cluster id
    assert not needs_turns(None)
    assert turn_file("127.0.0.1:9092") == turn_file("127.0.0.1:9092")
    assert turn_file("127.0.0.1:9092") != turn_file("127.0.0.1:9093")


def test_a_sink_opened_on_the_embedded_broker_ends_in_turns(spark: Any, kafka: Broker) -> None:
    topic = f"t-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, 2)
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic, key="id",
                     partitions=2)  # fmt: skip
    sink.open(SinkContext("turns", spark))
    # the embedded broker is Tansu; a broker given by FANOUT_KAFKA_BOOTSTRAP is a real Kafka
    assert sink._end_turns == (turn_file(kafka.bootstrap) if kafka.embedded else None)


def settings(kafka: Broker, pipeline: str, topic: str, turns: bool) -> WriterSettings:
    return WriterSettings(
        pipeline=pipeline,
        sink="events",
        scope=pipeline,
        bootstrap_servers=kafka.bootstrap,
        topic=topic,
        producer={"linger.ms": 5},
        transactional_id_prefix=f"fanout-{topic}",
        marker_topic=f"{topic}-markers",
        transaction_timeout_ms=60000,
        encoder=Encoder(("id",), None, (), (), 1_000_000),
        end_turns=turn_file(kafka.bootstrap) if turns else None,
    )


def stream(kafka: Broker, turns: bool) -> list[int]:
    """BATCHES batches of WRITERS partitions (two at a time, as two executor cores run
    them) into a fresh 3-partition topic; the markers afterwards."""
    pipeline = f"turns{uuid.uuid4().hex[:8]}"
    config = settings(kafka, pipeline, f"{pipeline}-records", turns)
    create_topic(kafka.bootstrap, config.topic, 3)
    create_topic(kafka.bootstrap, config.marker_topic, 1)

    def write(batch: int, partition: int) -> str:
        ids = [batch * 1000 + partition * 100 + i for i in range(ROWS)]
        rows = pa.RecordBatch.from_pydict({"id": ids, "v": [str(i) for i in ids]})
        return PartitionWriter(config, partition, batch).run([rows]).status

    with ThreadPoolExecutor(2) as pool:
        for batch in range(BATCHES):
            done = list(pool.map(lambda p, b=batch: write(b, p), range(WRITERS)))
            assert done == ["committed"] * WRITERS, done
    return [marker(kafka.bootstrap, pipeline, "events", p, config.marker_topic)
            for p in range(WRITERS)]  # fmt: skip


def test_concurrent_partition_commits_leave_every_marker_applied(kafka: Broker) -> None:
    """ROUNDS streams whose partitions commit two at a time: every marker says the last
    batch. With the turns removed, Tansu stuck within 15 streams in each of 3 tries (markers
    such as [1, 1, 1, 1] or [2, 2, 2, 2])."""
    if kafka.hides_aborted:
        pytest.skip("a real Kafka ends transactions atomically: nothing to take turns for")
    for round_ in range(ROUNDS):
        markers = stream(kafka, turns=True)
        assert markers == [BATCHES] * WRITERS, f"round {round_}: markers {markers}"
