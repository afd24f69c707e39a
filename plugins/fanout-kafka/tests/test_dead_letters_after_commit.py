"""A record ends in exactly one place -- the topic or the Delta dead-letter table -- when
a partition's Kafka commit fails after its letters are known, and when the letters cannot
be parked after the commit (fanout_kafka.journal).

Real broker, real Delta table. The producer refuses records over its
``message.max.bytes`` (MSG_SIZE_TOO_LARGE) while ``max_record_bytes`` lets them through
the encoder: a refusal that depends on the attempt's settings, as a broker's may depend on
batching."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from fanout_kafka import KafkaSink
from fanout_kafka.transaction import PartitionWriter
from kafka_log import committed_values
from kafkatools import Broker, create_topic

from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.sink import SinkContext
from fanout.deadletters.delta import DeltaDeadLetters
from fanout.delta_tables.io import read_delta
from fanout.errors import TransientSinkError
from fanout.partitioned.membership import PartitionPlan

KILL = Path(__file__).with_name("kill_partition.py")
PLAN = PartitionPlan(1, (("id", "string"),))
SMALL = [f"s{i}" for i in range(4)]
MID, BIG = "mid", "big"  # ~1500 and ~3000 bytes
PAYLOAD = {MID: "m" * 1500, BIG: "b" * 3000}


def _rows() -> list[dict[str, str]]:
    return [{"id": k, "v": PAYLOAD.get(k, f"small-{k}")} for k in [*SMALL, MID, BIG]]


def _sink(
    kafka: Broker, topic: str, pipeline: str, dead: DeltaDeadLetters, message_max_bytes: int
) -> KafkaSink:
    sink = KafkaSink(
        "events", bootstrap_servers=kafka.bootstrap, topic=topic, key="id", value="v",
        partitions=1, max_record_bytes=100_000,
        producer={"message.max.bytes": message_max_bytes, "linger.ms": 0},
    )  # fmt: skip
    sink.open(SinkContext(pipeline, dead_letters=dead))
    return sink


def _batch(pipeline: str) -> Batch:
    return Batch(None, BatchInfo(pipeline, 0), "events", txn_app_id(pipeline, "events"))


class FailingCommit:
    """Commit hooks whose ``before`` vetoes the commit: the partition's Kafka
    transaction is aborted after its letters are known (as a failed commit is)."""

    def before(self, partition: int, rows: int, written: int) -> None:
        raise TransientSinkError("the commit failed", sink="events")

    def after(self, partition: int, rows: int, written: int) -> None:
        pass


def _attempt(sink: KafkaSink, pipeline: str, hooks: Any = None) -> Any:
    batch = _batch(pipeline)
    committed = sink.committed_partitions(batch, PLAN)
    settings = replace(sink.settings(batch), plan=PLAN)
    writer = PartitionWriter(settings, 0, 0, hooks)
    return committed, writer.run([pa.RecordBatch.from_pylist(_rows())])


def _letters(path: str) -> list[tuple[int, int, str, str]]:
    if not (Path(path) / "_delta_log").exists():
        return []
    rows = read_delta(path).to_pylist()
    found = []
    for row in rows:
        details = json.loads(row["details"])
        found.append((row["batch_id"], row["partition"], row["source"], details["key"]))
    return sorted(found)


def _topic_keys(kafka: Broker, topic: str) -> list[str]:
    values = committed_values(kafka.bootstrap, topic)
    by_value = {v.encode(): k for k, v in ((r["id"], r["v"]) for r in _rows())}
    return sorted(by_value[v] for v in values)


@pytest.mark.parametrize(
    ("retry_max_bytes", "in_topic", "parked"),
    [
        # the retry refuses more: before the fix MID was in neither place (lost)
        (1000, SMALL, [MID, BIG]),
        # the retry takes all: before the fix BIG was in both places
        (100_000, [*SMALL, MID, BIG], []),
    ],
)
def test_a_failed_commit_leaves_no_letters_and_the_replay_parks_its_own(
    kafka: Broker, tmp_path: Path, retry_max_bytes: int, in_topic: list[str], parked: list[str]
) -> None:
    topic, pipeline = f"dl-{uuid.uuid4().hex[:8]}", f"dl{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap, topic, 1)
    path = str(tmp_path / "dead")
    dead = DeltaDeadLetters(path)

    first = _sink(kafka, topic, pipeline, dead, 2000)  # refuses BIG only
    _, failed = _attempt(first, pipeline, FailingCommit())
    assert failed.status == "failed" and failed.failure.transient
    parked_by_the_failed_attempt = _letters(path)

    retry = _sink(kafka, topic, pipeline, dead, retry_max_bytes)  # a restart, new settings
    committed, done = _attempt(retry, pipeline)
    assert committed == []
    assert (done.status, done.written, done.dead_lettered) == (
        "committed", len(in_topic), len(parked),
    )  # fmt: skip
    assert _topic_keys(kafka, topic) == sorted(in_topic)
    assert _letters(path) == sorted((0, 0, "refused", k) for k in parked)
    assert parked_by_the_failed_attempt == []  # none for a partition that did not commit


class FlakyDelta(DeltaDeadLetters):
    """The Delta table, whose first write fails (as when the task is killed between the
    partition's commit and the letters' park)."""

    failures = 1

    def write(self, *args: Any, **kwargs: Any) -> int:
        if FlakyDelta.failures:
            FlakyDelta.failures -= 1
            raise OSError("the object store is away")
        return super().write(*args, **kwargs)


def test_letters_not_parked_after_the_commit_are_parked_once_by_the_replay(
    kafka: Broker, tmp_path: Path
) -> None:
    topic, pipeline = f"dl-{uuid.uuid4().hex[:8]}", f"dl{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap, topic, 1)
    path = str(tmp_path / "dead")
    FlakyDelta.failures = 1

    first = _sink(kafka, topic, pipeline, FlakyDelta(path), 2000)  # refuses BIG
    _, failed = _attempt(first, pipeline)
    assert failed.status == "failed" and failed.failure.transient
    assert "the partition committed" in failed.failure.message
    assert _topic_keys(kafka, topic) == sorted([*SMALL, MID])
    assert _letters(path) == []

    # the replay, with settings under which the broker would take BIG: the committed
    # partition is skipped, and its letters (from the journal) are parked, not BIG's record
    replay = _sink(kafka, topic, pipeline, FlakyDelta(path), 100_000)
    committed, skipped = _attempt(replay, pipeline)
    assert [c.partition for c in committed] == [0]
    assert (skipped.status, skipped.dead_lettered) == ("skipped", 1)
    assert _letters(path) == [(0, 0, "refused", BIG)]
    reasons = [r["reason"] for r in read_delta(path).to_pylist()]
    assert reasons == [
        "record of 3101 bytes (key 'big') refused by the producer: over its message.max.bytes "
        "of 2000 bytes (max_record_bytes, 100000, let it through)"
    ]

    again = _sink(kafka, topic, pipeline, FlakyDelta(path), 100_000)  # and once more
    _, skipped = _attempt(again, pipeline)
    assert (skipped.status, skipped.dead_lettered) == ("skipped", 1)
    assert _letters(path) == [(0, 0, "refused", BIG)]
    assert _topic_keys(kafka, topic) == sorted([*SMALL, MID])


@pytest.mark.parametrize(
    ("point", "retry_max_bytes", "status", "in_topic", "parked"),
    [
        # killed with its transaction open: the replay aborts it and decides afresh
        ("before_commit", 1000, "committed", SMALL, [MID, BIG]),
        # killed between the commit and the park: the replay skips the partition and
        # parks what the committed transaction's journal names, not what it would refuse
        ("after_commit", 1000, "skipped", [*SMALL, MID], [BIG]),
        ("after_commit", 100_000, "skipped", [*SMALL, MID], [BIG]),
    ],
)
def test_a_task_killed_around_the_commit_leaves_each_record_in_one_place(
    kafka: Broker, tmp_path: Path, point: str, retry_max_bytes: int, status: str,
    in_topic: list[str], parked: list[str],
) -> None:  # fmt: skip
    topic, pipeline = f"dl-{uuid.uuid4().hex[:8]}", f"dl{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap, topic, 1)
    path = str(tmp_path / "dead")
    killed = subprocess.run(
        [sys.executable, str(KILL), kafka.bootstrap, topic, pipeline, path, "2000", point],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    parked_before_the_replay = _letters(path)

    replay = _sink(kafka, topic, pipeline, DeltaDeadLetters(path), retry_max_bytes)
    _, done = _attempt(replay, pipeline)
    assert (done.status, done.dead_lettered) == (status, len(parked))
    assert _topic_keys(kafka, topic) == sorted(in_topic)
    assert _letters(path) == sorted((0, 0, "refused", k) for k in parked)
    assert parked_before_the_replay == []  # the killed task parked nothing
