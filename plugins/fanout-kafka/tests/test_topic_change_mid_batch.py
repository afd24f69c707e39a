"""The sink's ``topic`` changed between a batch half written and its replay: the replay
would skip the partitions committed to the old topic, and the new one would miss their
rows. It is refused on the driver before anything is written; with the old topic back the
replay completes exactly once (:mod:`fanout_kafka.target`). The kill-and-restart run of it
is one step of test_partition_membership's
``test_a_batch_killed_mid_way_is_refused_while_partitions_topic_or_input_differ`` (one
kill, a refused restart per change); here, the target offsets as data."""

from __future__ import annotations

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
