"""A Delta dead-letter target describes itself masked (``Delta table s3://KEY:***@...``)
since fanout masks a location's password and SAS ``sig=`` there; the Kafka sink's target
offsets hold a digest of that description, so a partition an earlier version committed
under ``Delta table s3://KEY:SECRET@...`` went by the very same target. Before, the
replay of that batch after the upgrade was refused: "its dead letters would be split
across two targets", with no ``dead_letter`` to restore (it is the same text)."""

from __future__ import annotations

from fanout_kafka.records import Encoder
from fanout_kafka.settings import WriterSettings
from fanout_kafka.target import DEAD_LETTER, TargetStamp, compare, pack_target

from fanout.deadletters.delta import DeltaDeadLetters
from fanout.deadletters.moved import checked

LOCATIONS = (
    "s3://KEY:Kafka-dl-secret-81@bucket/dl",
    "abfss://dl@acct.dfs.core.windows.net/t?sv=2022&sp=rw&sig=KafkaSig0123456789",
)


def _settings(location: str) -> WriterSettings:
    return WriterSettings(
        pipeline="p", sink="events", scope="p", bootstrap_servers="127.0.0.1:1",
        topic="orders", producer={}, transactional_id_prefix="fanout-orders",
        marker_topic="orders-markers", transaction_timeout_ms=60000,
        encoder=Encoder(("id",), None, (), (), 1_000_000),
        dead_letters=checked(DeltaDeadLetters(location)),
    )  # fmt: skip


def test_a_partition_committed_under_the_unmasked_description_went_by_the_same_target() -> None:
    for location in LOCATIONS:
        now = _settings(location).target_stamp()
        assert "***" in now.dead_letter and "secret" not in now.dead_letter.lower()
        then = TargetStamp(now.topic, now.encoding, f"Delta table {location}", now.route)
        assert compare([0, 1], [pack_target(then, 7), pack_target(now, 7)], [-1, -1], now,
                       7).changed == {}  # fmt: skip
        # another table is still another target
        elsewhere = TargetStamp(now.topic, now.encoding, "Delta table /other", now.route)
        assert compare([0], [pack_target(elsewhere, 7)], [-1], now, 7).changed == {
            (DEAD_LETTER,): [0]
        }
