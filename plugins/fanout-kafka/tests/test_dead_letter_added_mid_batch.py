"""A batch failing on a bad record with no ``dead_letter`` target is let through by adding
one: the partitions that committed have no letters (a bad record fails its partition), so
nothing is split. The refusal of a ``dead_letter`` changed mid-batch refused that too,
and the batch could neither pass (the bad record) nor be let through (the target)."""

from __future__ import annotations

from fanout_kafka.target import DEAD_LETTER, TargetStamp, compare, pack_target

BEFORE = TargetStamp("orders", '{"key": ["id"]}', "", "")


def _changed(then: TargetStamp, now: TargetStamp) -> dict[tuple[str, ...], list[int]]:
    return compare([1], [pack_target(then, 4)], [-1], now, 4).changed


def test_a_dead_letter_target_added_mid_batch_is_accepted() -> None:
    now = TargetStamp("orders", '{"key": ["id"]}', "kafka:orders-dlq", "")
    assert _changed(BEFORE, now) == {}


def test_a_dead_letter_target_removed_or_replaced_mid_batch_is_refused() -> None:
    kafka = TargetStamp("orders", '{"key": ["id"]}', "kafka:orders-dlq", "")
    delta = TargetStamp("orders", '{"key": ["id"]}', "Delta table /dlq", "")
    assert _changed(kafka, BEFORE) == {(DEAD_LETTER,): [1]}
    assert _changed(kafka, delta) == {(DEAD_LETTER,): [1]}


def test_a_target_added_with_another_change_is_still_refused() -> None:
    now = TargetStamp("orders", '{"key": ["id"], "value": "v"}', "kafka:orders-dlq", "")
    assert _changed(BEFORE, now) != {}
