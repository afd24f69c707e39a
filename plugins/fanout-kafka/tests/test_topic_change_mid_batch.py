"""The sink's ``topic`` changed between a batch half written and its replay: the replay
would skip the partitions committed to the old topic, and the new one would miss their
rows. It is refused on the driver before anything is written; with the old topic back the
replay completes exactly once (:mod:`fanout_kafka.target`)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from fanout_kafka.errors import KafkaMarkerError
from fanout_kafka.target import (
    TargetCheck,
    committed_digest,
    compare,
    pack_target,
    refuse_moved,
    target_group,
    topic_digest,
)
from kafkatools import Broker, create_topic, key_counts, marker, read_topic

from fanout.testing.faults import KILL_EXIT_CODE
from tests.integration.streams import committed_marks, write_input

DRIVER = Path(__file__).with_name("kafka_driver.py")
FILES, ROWS, PARTITIONS = 3, 40, 4
KILL_BATCH, KILL_PARTITION = 1, 1


def _drive(workdir: Path, kafka: Broker, topic: str, pipeline: str, *extra: str
           ) -> subprocess.CompletedProcess[str]:  # fmt: skip
    cmd = [sys.executable, str(DRIVER), str(workdir), kafka.bootstrap, topic, pipeline, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_topic_changed_between_a_kill_and_the_restart_is_refused_before_writing(
    kafka: Broker, topic: str, tmp_path: Path
) -> None:
    rows = write_input(tmp_path / "input", FILES, ROWS)
    pipeline = f"moved{uuid.uuid4().hex[:6]}"
    killed = _drive(tmp_path, kafka, topic, pipeline, "--kill", f"{KILL_BATCH}:{KILL_PARTITION}")
    assert killed.returncode in (KILL_EXIT_CODE, -9), killed.stderr[-3000:]
    markers = [marker(kafka.bootstrap, pipeline, "events", p, "__fanout_markers")
               for p in range(PARTITIONS)]  # fmt: skip
    assert markers[: KILL_PARTITION + 1] == [KILL_BATCH + 1] * (KILL_PARTITION + 1), markers
    assert all(m <= KILL_BATCH for m in markers[KILL_PARTITION + 1 :]), markers
    held = key_counts(read_topic(kafka.bootstrap, topic, ROWS))  # batch 0 + partitions 0..1
    assert ROWS < sum(held.values()) < 2 * ROWS and set(held.values()) == {1}

    other = f"orders-new-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, other, 3)
    changed = _drive(tmp_path, kafka, other, pipeline)
    assert changed.returncode != 0, (
        "the restart with another topic was not refused: "
        f"{len(read_topic(kafka.bootstrap, other, 1, timeout=5))}+ record(s) in the new topic"
    )
    err = changed.stderr
    assert "KafkaMarkerError" in err, err[-3000:]
    assert f"sink 'events', batch {KILL_BATCH}" in err, err[-3000:]
    assert (
        f"option 'topic' changed in the middle of batch {KILL_BATCH}: partition(s) "
        f"{list(range(KILL_PARTITION + 1))} to {topic!r} committed it, and 'topic' is now "
        f"{other!r}" in err
    ), err[-3000:]
    assert f"Set 'topic' back to {topic!r} until this batch completes" in err
    assert read_topic(kafka.bootstrap, other, 0, timeout=5) == []
    assert key_counts(read_topic(kafka.bootstrap, topic, sum(held.values()))) == held
    assert ("events", KILL_BATCH) not in committed_marks(tmp_path / "ledger", pipeline)

    restored = _drive(tmp_path, kafka, topic, pipeline)  # the old topic again: exactly once
    assert restored.returncode == 0, restored.stderr[-3000:]
    records = read_topic(kafka.bootstrap, topic, FILES * ROWS)
    assert key_counts(records) == {str(r["order_id"]): 1 for r in rows}
    assert read_topic(kafka.bootstrap, other, 0, timeout=5) == []
    assert committed_marks(tmp_path / "ledger", pipeline) == {
        ("events", b): 1 for b in range(FILES)
    }


# -- the target offsets, as data --------------------------------------------------------


def test_a_target_offset_holds_the_topic_digest_and_the_batch() -> None:
    offset = pack_target("orders", 41)
    assert 0 < offset < 2**63
    assert committed_digest(offset, 41) == topic_digest("orders")
    assert committed_digest(offset, 40) is None  # an earlier batch's: unknown
    assert committed_digest(-1001, 41) is None  # no target offset (an older fanout)
    assert target_group("fanout/p/events/p3") == "fanout/p/events/p3.topic"


def test_compare_splits_moved_and_unknown_partitions() -> None:
    offsets = [pack_target("orders", 7), pack_target("old", 7), -1001, pack_target("old", 6)]
    check = compare([0, 1, 2, 5], offsets, "orders", 7)
    assert check == TargetCheck(moved={topic_digest("old"): [1]}, unknown=[2, 5])


def test_partitions_without_a_recorded_topic_are_not_refused() -> None:
    check = compare([0, 1], [-1001, pack_target("orders", 2)], "orders-v2", 3)
    assert check == TargetCheck(unknown=[0, 1])
    refuse_moved(check, "orders-v2", 3, lambda: ["orders"], sink="events")  # no error


def test_the_refusal_of_a_deleted_old_topic_names_its_digest() -> None:
    check = compare([0, 2], [pack_target("gone", 3)] * 2, "orders", 3)
    with pytest.raises(KafkaMarkerError) as raised:
        refuse_moved(check, "orders", 3, lambda: ["orders", "other"], sink="events")
    text = str(raised.value)
    assert raised.value.sink == "events" and raised.value.batch_id == 3
    assert (
        f"partition(s) [0, 2] to a topic not in the cluster now (digest "
        f"{topic_digest('gone'):08x}) committed it, and 'topic' is now 'orders'" in text
    ), text
    assert "Set 'topic' back to the old topic until this batch completes" in text
