"""Ordinary operator actions between two runs of a Kafka sink (docs/architecture.md §8,
plugins/fanout-kafka/README.md "Operator actions between runs"): each starts without a
refusal and leaves every id exactly once among the committed records, or is refused with a
way on that works as printed. Real Spark, the tests' broker, an in-process ledger; a
"crash" is the driver dying after the sink's partitions committed and before its ledger
mark (:class:`fanout.testing.faults.MarkLost`).

- The bootstrap list changed to another name of the same broker (``localhost`` for
  ``127.0.0.1``) between a crash and the replay: the markers are group offsets on the
  cluster, named by the pipeline's scope and the sink, never by the address, so the
  replay skips the committed batch (safe).
- The ``topic`` option changed after a clean stop: the next batch goes to the new topic,
  no refusal; the old topic keeps its batches (safe: the marks are per batch, and a
  batch is only compared with the topic it was written to).
- The ``topic`` option changed between a crash and the replay: refused (the committed
  partitions' rows would be only in the old topic); the way it prints (set the topic
  back, finish the batch, change it after) works.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from kafkatools import Broker, create_topic, read_topic

from fanout import BatchFailedError, BatchInfo, FanOut
from fanout.testing.faults import MarkLost

pytestmark = pytest.mark.integration


def _sink(bootstrap: str, topic: str) -> dict[str, Any]:
    """Sink ``k``; its markers on the broker's default marker topic, whatever ``topic``."""
    return {"type": "kafka", "name": "k", "bootstrap_servers": bootstrap, "topic": topic,
            "key": "id", "partitions": 2}  # fmt: skip


def _ids(bootstrap: str, topic: str, expected: int) -> list[int]:
    return sorted(int(r["key"]) for r in read_topic(bootstrap, topic, expected))


def _every(*batches: int) -> list[int]:
    return sorted(b * 10 + i for b in batches for i in range(4))


def _moved(kafka: Broker, topic: str) -> str:
    """A new topic of 3 partitions for the sink to move to."""
    moved = f"{topic}-moved"
    create_topic(kafka.bootstrap, moved, 3)
    return moved


class _Runs:
    """The runs of one new pipeline of sink ``k`` (its ledger under the test's tmp_path),
    each a ``FanOut`` closed after its batches."""

    def __init__(self, spark: Any, kafka: Broker, tmp_path: Path) -> None:
        self.spark, self.bootstrap = spark, kafka.bootstrap
        self.pipeline, self.ledger = f"kops{uuid.uuid4().hex[:6]}", str(tmp_path / "ledger")

    def _batch(self, fan: FanOut, batch_id: int) -> bool:
        """Batch ``batch_id`` (ids 10b .. 10b+3): whether ``k`` held it already."""
        rows = self.spark.range(batch_id * 10, batch_id * 10 + 4)
        info = BatchInfo(self.pipeline, batch_id, "q", [{"s": batch_id}], batch_timestamp_ms=1000)
        return bool(fan.process(rows, info)["k"].already_written)

    def run(self, topic: str, *batches: int, bootstrap: str | None = None) -> list[bool]:
        """A run writing ``batches`` to ``topic``: whether each was already written."""
        fan = FanOut(self.pipeline, self.ledger, [_sink(bootstrap or self.bootstrap, topic)],
                     retries=0)  # fmt: skip
        try:
            return [self._batch(fan, batch_id) for batch_id in batches]
        finally:
            fan.close()

    def crash(self, topic: str, batch_id: int) -> None:
        """A run whose driver dies after ``k``'s partitions committed ``batch_id``, before
        its ledger mark."""
        with pytest.raises(BatchFailedError):
            fan = FanOut(self.pipeline, MarkLost(self.ledger, "k"),
                         [_sink(self.bootstrap, topic)], retries=0)  # fmt: skip
            try:
                self._batch(fan, batch_id)
            finally:
                fan.close()


@pytest.fixture
def runs(spark: Any, kafka: Broker, tmp_path: Path) -> _Runs:
    """A new pipeline's runs."""
    return _Runs(spark, kafka, tmp_path)


def test_another_name_of_the_same_broker_replays_a_crashed_batch_once(
    kafka: Broker, topic: str, runs: _Runs
) -> None:
    if not kafka.bootstrap.startswith("127.0.0.1:"):
        pytest.skip("needs the embedded broker's 127.0.0.1 address, also reached as localhost")
    alias = kafka.bootstrap.replace("127.0.0.1", "localhost")
    runs.run(topic, 0)
    runs.crash(topic, 1)

    assert runs.run(topic, 1, 2, bootstrap=alias) == [True, False]
    assert _ids(kafka.bootstrap, topic, 12) == _every(0, 1, 2)


def test_a_topic_changed_after_a_clean_stop_takes_the_next_batch(
    kafka: Broker, topic: str, runs: _Runs
) -> None:
    moved = _moved(kafka, topic)
    runs.run(topic, 0, 1)

    assert runs.run(moved, 2) == [False]
    assert _ids(kafka.bootstrap, topic, 8) == _every(0, 1)
    assert _ids(kafka.bootstrap, moved, 4) == _every(2)


def test_a_topic_changed_between_a_crash_and_its_replay_is_refused_with_a_way_that_works(
    kafka: Broker, topic: str, runs: _Runs
) -> None:
    moved = _moved(kafka, topic)
    runs.run(topic, 0)
    runs.crash(topic, 1)

    with pytest.raises(BatchFailedError) as refused:
        runs.run(moved, 1)
    text = str(refused.value.failures["k"])
    assert text.startswith(
        f"sink 'k', batch 1: option 'topic' changed in the middle of batch 1: partition(s) "
        f"[0, 1] to {topic!r} committed it, and 'topic' is now {moved!r}."
    )
    assert text.endswith(
        f"Nothing was written. Set 'topic' back to {topic!r} until this batch completes, "
        f"then change it (a change between batches is safe)."
    )

    # the way on, as printed: the topic set back finishes the batch, then the change
    assert runs.run(topic, 1) == [True]
    assert runs.run(moved, 2) == [False]
    assert _ids(kafka.bootstrap, topic, 8) == _every(0, 1)
    assert _ids(kafka.bootstrap, moved, 4) == _every(2)
