"""The sink's ``topic`` changed between a batch half written and its replay: the replay
would skip the partitions committed to the old topic, and the new one would miss their
rows. It is refused on the driver before anything is written; with the old topic back the
replay completes exactly once (:mod:`fanout_kafka.target`)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from fanout_kafka.errors import KafkaMarkerError
from fanout_kafka.target import (
    ASPECTS,
    DEAD_LETTER,
    ENCODING,
    ROUTE,
    TargetCheck,
    TargetStamp,
    compare,
    encoding_text,
    legacy_target_group,
    legacy_topic_digest,
    pack_legacy_target,
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


SAFE = ["order_id", "status"]
STRICT = [*SAFE, "CAST(IF(status = 'paid', status, '1') AS INT) AS flag"]
"""A route refusing the paid orders (a CAST the ANSI mode refuses): route dead letters."""


def test_route_changed_between_a_kill_and_the_restart_is_refused_before_any_letter(
    kafka: Broker, topic: str, tmp_path: Path
) -> None:
    """The first attempt's route refused no row, so no dead-letter target recorded it; the
    restart's route refuses rows the committed partitions already wrote. The target
    offsets refuse it before the letters are written (``Sink.check_replay``)."""
    rows = write_input(tmp_path / "input", FILES, ROWS)
    pipeline = f"rerouted{uuid.uuid4().hex[:6]}"
    dlq = f"{topic}-dlq"
    create_topic(kafka.bootstrap, dlq, 1)
    dead = ("--dead-letter", f"kafka:{dlq}")
    killed = _drive(tmp_path, kafka, topic, pipeline, *dead, "--select", *SAFE,
                    "--kill", f"{KILL_BATCH}:{KILL_PARTITION}")  # fmt: skip
    assert killed.returncode in (KILL_EXIT_CODE, -9), killed.stderr[-3000:]
    held = key_counts(read_topic(kafka.bootstrap, topic, ROWS))  # batch 0 + partitions 0..1
    assert ROWS < sum(held.values()) < 2 * ROWS and set(held.values()) == {1}
    paid = {str(r["order_id"]) for r in rows if r["status"] == "paid"}
    assert paid & (set(held) - {str(i) for i in range(ROWS)})  # the new route refuses some

    changed = _drive(tmp_path, kafka, topic, pipeline, *dead, "--select", *STRICT)
    assert changed.returncode != 0, changed.stderr[-3000:]
    err = changed.stderr
    assert "KafkaMarkerError" in err, err[-3000:]
    assert (
        f"sink 'events', batch {KILL_BATCH}: route changed in the middle of batch "
        f"{KILL_BATCH}: partition(s) {list(range(KILL_PARTITION + 1))} committed it under "
        "another route than now, and a replay skips them, so a row the new route refuses "
        "would be both in the topic" in err
    ), err[-3000:]
    assert "Nothing was written. Set the route ('where', 'select') back until this" in err
    assert read_topic(kafka.bootstrap, dlq, 0, timeout=5) == []  # no letter written
    assert key_counts(read_topic(kafka.bootstrap, topic, sum(held.values()))) == held
    assert ("events", KILL_BATCH) not in committed_marks(tmp_path / "ledger", pipeline)

    restored = _drive(tmp_path, kafka, topic, pipeline, *dead, "--select", *SAFE)
    assert restored.returncode == 0, restored.stderr[-3000:]
    records = read_topic(kafka.bootstrap, topic, FILES * ROWS)
    assert key_counts(records) == {str(r["order_id"]): 1 for r in rows}
    assert read_topic(kafka.bootstrap, dlq, 0, timeout=5) == []
    assert committed_marks(tmp_path / "ledger", pipeline) == {
        ("events", b): 1 for b in range(FILES)
    }


# -- the target offsets, as data --------------------------------------------------------

KEYED = encoding_text(("order_id",), None, True)
NOW = TargetStamp("orders", KEYED, "", "r1")


def test_a_target_offset_holds_the_digests_and_the_batch() -> None:
    offset = pack_target(NOW, 41)
    assert 0 < offset < 2**63
    assert offset >> 43 == topic_digest("orders") < 2**20
    assert offset & 0xFFFF == 42
    assert compare([3], [offset], [-1001], NOW, 41) == TargetCheck()
    assert compare([3], [offset], [-1001], NOW, 40) == TargetCheck(unknown=[3])  # another batch
    assert compare([3], [-1001], [-1001], NOW, 41) == TargetCheck(unknown=[3])  # an older fanout
    assert target_group("fanout/p/events/p3") == "fanout/p/events/p3.target"
    assert legacy_target_group("fanout/p/events/p3") == "fanout/p/events/p3.topic"


def test_each_changed_option_is_named() -> None:
    then = [
        pack_target(replace(NOW, encoding=encoding_text(("order_id",), "payload", True)), 7),
        pack_target(replace(NOW, dead_letter="kafka:dlq"), 7),
        pack_target(replace(NOW, route="r0"), 7),
        pack_target(replace(NOW, topic="old"), 7),
        pack_target(NOW, 7),
    ]
    check = compare([0, 1, 2, 3, 4], then, [-1001] * 5, NOW, 7)
    assert check == TargetCheck(
        moved={(20, topic_digest("old")): [3]},
        changed={(ENCODING,): [0], (DEAD_LETTER,): [1], (ROUTE,): [2]},
    )


def test_every_encoding_option_is_covered() -> None:
    changed = [
        encoding_text(("customer",), None, True),  # key
        encoding_text(None, None, True),  # keyless
        encoding_text(("order_id",), "payload", True),  # value
        encoding_text(("order_id",), None, False),  # headers
        encoding_text(("order_id",), None, ("status",)),  # header columns
    ]
    for text in changed:
        offset = pack_target(replace(NOW, encoding=text), 7)
        check = compare([0], [offset], [-1001], NOW, 7)
        assert check.changed and not check.moved, text  # each one is told from the others


def test_a_change_the_tags_cannot_name_lists_the_candidates() -> None:
    def tags(stamp: TargetStamp) -> int:
        return (pack_target(stamp, 7) >> 16) & 0x3F

    # a route whose 2-bit tag equals r1's: only the rest digest differs
    tags_equal = next(r for r in (f"r{i}" for i in range(2, 200))
                      if tags(replace(NOW, route=r)) == tags(NOW))  # fmt: skip
    offset = pack_target(replace(NOW, route=tags_equal), 7)
    assert compare([2], [offset], [-1001], NOW, 7) == TargetCheck(changed={ASPECTS: [2]})
    with pytest.raises(KafkaMarkerError) as raised:
        refuse_moved(TargetCheck(changed={ASPECTS: [2]}), "orders", 7, list, sink="events")
    assert str(raised.value) == (
        "sink 'events', batch 7: one of: value/headers/key encoding, dead_letter, route "
        "changed in the middle of batch 7: partition(s) [2] committed it under another "
        "value/headers/key encoding / dead_letter / route than now, and a replay skips them, "
        "so its records would be in two encodings; or its dead letters would be split across "
        "two targets; or a row the new route refuses would be both in the topic (written by a "
        "committed partition) and in the dead letters, and one only the old route refuses in "
        "neither. Nothing was written. Set 'value', 'headers' and 'key' / 'dead_letter' / the "
        "route ('where', 'select') back until this batch completes, then change it (a change "
        "between batches is safe)."
    )


def test_the_refusal_of_a_changed_encoding_says_what_to_do() -> None:
    check = TargetCheck(changed={(ENCODING,): [0, 1]})
    with pytest.raises(KafkaMarkerError) as raised:
        refuse_moved(check, "orders", 3, list, sink="events")
    assert str(raised.value) == (
        "sink 'events', batch 3: value/headers/key encoding changed in the middle of batch 3: "
        "partition(s) [0, 1] committed it under another value/headers/key encoding than now, "
        "and a replay skips them, so its records would be in two encodings. Nothing was "
        "written. Set 'value', 'headers' and 'key' back until this batch completes, then "
        "change it (a change between batches is safe)."
    )


def test_last_sessions_offsets_are_compared_on_the_topic_only() -> None:
    legacy = [pack_legacy_target("orders", 7), pack_legacy_target("old", 7),
              pack_legacy_target("old", 6)]  # fmt: skip
    other = replace(NOW, encoding="anything", dead_letter="x", route="r9")
    check = compare([0, 1, 5], [-1001, pack_target(NOW, 6), -1001], legacy, other, 7)
    assert check == TargetCheck(moved={(31, legacy_topic_digest("old")): [1]}, unknown=[5])
    with pytest.raises(KafkaMarkerError) as raised:
        refuse_moved(check, "orders", 7, lambda: ["orders", "old"], sink="events")
    assert "partition(s) [1] to 'old' committed it, and 'topic' is now 'orders'" in str(
        raised.value
    )
    assert "Set 'topic' back to 'old' until this batch completes" in str(raised.value)


def test_partitions_without_a_recorded_target_are_not_refused() -> None:
    check = compare([0, 1], [-1001, pack_target(NOW, 2)], [-1001] * 2,
                    replace(NOW, topic="orders-v2"), 3)  # fmt: skip
    assert check == TargetCheck(unknown=[0, 1])
    refuse_moved(check, "orders-v2", 3, lambda: ["orders"], sink="events")  # no error


def test_the_refusal_of_a_deleted_old_topic_names_its_digest() -> None:
    check = compare([0, 2], [pack_target(replace(NOW, topic="gone"), 3)] * 2, [-1001] * 2, NOW, 3)
    with pytest.raises(KafkaMarkerError) as raised:
        refuse_moved(check, "orders", 3, lambda: ["orders", "other"], sink="events")
    text = str(raised.value)
    assert raised.value.sink == "events" and raised.value.batch_id == 3
    assert (
        f"partition(s) [0, 2] to a topic not in the cluster now (digest "
        f"{topic_digest('gone'):08x}) committed it, and 'topic' is now 'orders'" in text
    ), text
    assert "Set 'topic' back to the old topic until this batch completes" in text
