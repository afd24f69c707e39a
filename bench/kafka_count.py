"""Whether a Kafka topic holds exactly ``n`` records once each, read by a consumer (never
from the watermarks, which Tansu reports wrong). Shared by bench_kafka.py and
bench_three_sinks.py (three_checks.py).

Tansu sometimes stops serving committed records to read_committed readers: from one offset
on, every later record of every partition stays hidden, although each later transaction
committed (its commit marker is in the log) and nothing ever aborted (the last stable
offset is stuck; seen in about 1 run in 7, with either connection setting). When that
happens and a read_uncommitted reader finds exactly ``n`` records with ``n`` distinct keys,
the topic counts as verified on the uncommitted read (:attr:`TopicCount.lso_stuck`); any
other shortfall or any extra record is wrong.

Every partition is read from offset 0, not from the offset the broker calls its earliest:
Tansu answers "earliest" with the batch it stored first by its wall clock, so a clock
stepped back while it stored a partition (this VM's clock is stepped now and then) hides
the partition's first records from a reader that starts there. Sessions 14 to 27 took
that for the broker dropping them ("its log start offset moved").
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from dataclasses import dataclass


@dataclass(frozen=True)
class TopicRead:
    """What one consumer read from the beginning of a topic."""

    keys: set[bytes | None]
    per_partition: dict[int, int]
    errors: list[str]

    @property
    def count(self) -> int:
        """Records read."""
        return sum(self.per_partition.values())


@dataclass(frozen=True)
class TopicCount:
    """The verdict on a topic that should hold ``n`` records once each.

    :param exact: a read_committed reader found exactly ``n`` records, ``n`` distinct keys.
    :param lso_stuck: it found fewer, none twice, and a read_uncommitted reader found
        exactly ``n`` once each (Tansu's stuck last stable offset, see the module).
    :param committed: the read_committed read.
    :param detail: both reads per partition and the first consumer errors, when not exact.
    """

    exact: bool
    lso_stuck: bool
    committed: TopicRead
    detail: str = ""


def read_topic(
    bootstrap: str,
    topic: str,
    n: int,
    isolation: str,
    timeout_s: float,
    quiet_s: float = 1.0,
) -> TopicRead:
    """Keys, records per partition and errors seen reading ``topic`` from the beginning
    (until ``n`` records and ``quiet_s`` more to see any extra, ``timeout_s``, or 30 s
    without a record)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"verify-{uuid.uuid4().hex}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",  # where offset 0 is gone (not on Tansu)
            "log_level": 0,
        }
    )
    keys: set[bytes | None] = set()
    per_partition: dict[int, int] = defaultdict(int)
    errors: list[str] = []
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        # from offset 0, not from Tansu's "earliest" (the batch it stored first by its clock)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        count, deadline, quiet_until = 0, time.monotonic() + timeout_s, None
        last_record = time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - last_record < 30:
            if count >= n:
                quiet_until = quiet_until or time.monotonic() + quiet_s
                if time.monotonic() > quiet_until:
                    break
            for message in consumer.consume(10_000, timeout=0.2):
                if message.error():
                    errors.append(str(message.error()))
                    continue
                last_record = time.monotonic()
                count += 1
                partition = message.partition()
                assert partition is not None  # a consumed record always has one
                per_partition[partition] += 1
                keys.add(message.key())
    finally:
        consumer.close()
    return TopicRead(keys, dict(per_partition), errors)


def count_once(
    bootstrap: str, topic: str, n: int, timeout_s: float = 300, quiet_s: float = 1.0
) -> TopicCount:
    """Read ``topic`` read_committed and judge it (see the module); a read that falls short
    is read again read_uncommitted."""
    committed = read_topic(bootstrap, topic, n, "read_committed", timeout_s, quiet_s)
    if committed.count == n and len(committed.keys) == n:
        return TopicCount(True, False, committed)
    uncommitted = read_topic(bootstrap, topic, n, "read_uncommitted", 60, quiet_s)
    detail = (
        f"read_committed per partition {dict(sorted(committed.per_partition.items()))}, "
        f"read_uncommitted {dict(sorted(uncommitted.per_partition.items()))}, "
        f"consumer errors {committed.errors[:3]}"
    )
    stuck = (
        committed.count < n
        and len(committed.keys) == committed.count
        and uncommitted.count == n == len(uncommitted.keys)
    )
    if stuck:
        return TopicCount(False, True, committed, detail)
    return TopicCount(False, False, committed, detail)
