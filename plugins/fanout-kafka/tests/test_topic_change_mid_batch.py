"""The sink's ``topic`` changed between a batch half written and its replay: the replay
would skip the partitions committed to the old topic, and the new one would miss their
rows. It is refused on the driver before anything is written; with the old topic back the
replay completes exactly once (:mod:`fanout_kafka.target`). The kill-and-restart run of it
is one step of test_partition_membership's
``test_a_batch_killed_mid_way_is_refused_while_partitions_topic_or_input_differ`` (one
kill, a refused restart per change, the route's change among them); here, the target
offsets as data."""

from __future__ import annotations

from dataclasses import replace

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


def test_a_partition_committed_under_an_older_fingerprint_of_the_route_is_not_refused() -> None:
    # the route's stamp now covers the session's settings; before, a sink without a
    # dead-letter target recorded the stamp without them ("r0"), which it still accepts
    then = [pack_target(replace(NOW, route="r0"), 7), pack_target(replace(NOW, route="rX"), 7)]
    now = replace(NOW, route_earlier=("e0", "r0"))
    assert compare([0, 1], then, [-1001] * 2, now, 7) == TargetCheck(changed={(ROUTE,): [1]})
    assert compare([0], then[:1], [-1001], NOW, 7) == TargetCheck(changed={(ROUTE,): [0]})
    # an earlier fingerprint with the dead-letter target added since: accepted too
    added = replace(now, dead_letter="kafka:dlq")
    assert compare([0], then[:1], [-1001], added, 7) == TargetCheck()
    assert pack_target(now, 7) == pack_target(NOW, 7)  # what is recorded: the route alone


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
