"""What a partitioned sink's result says when partitions were skipped: already written
only when every written partition was held before this write (a replay), not when a
rival attempt of a partition's Spark task committed it during this write."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fanout.contract.sink import SinkResult
from fanout.partitioned.outcome import PartitionOutcome
from fanout.partitioned.sink import PartitionedSink


class TwoPartitions(PartitionedSink):
    """A kit sink of two partitions (never written here: its outcomes are given)."""

    def __init__(self) -> None:
        self.name, self.partitions = "events", 2

    def partitioned_by(self) -> Sequence[str] | None:
        return None


def _result(*outcomes: PartitionOutcome) -> SinkResult:
    prepared: Any = None  # read only when no partition reported
    return TwoPartitions().finish_partitions(None, prepared, outcomes)  # type: ignore[arg-type]


def test_partitions_held_before_the_write_are_already_written() -> None:
    result = _result(PartitionOutcome(0, "skipped", 3), PartitionOutcome(1, "empty"))
    assert (result.rows, result.already_written) == (3, True)


def test_a_partition_a_rival_attempt_committed_during_the_write_is_not_already_written() -> None:
    """A speculative copy committed the partition and the original, fenced, reported it
    skipped: the sink said ``already written`` (read: a replay) for rows this very write
    put in the target."""
    result = _result(
        PartitionOutcome(0, "skipped", 3, rival=True), PartitionOutcome(1, "skipped", 2)
    )
    assert (result.rows, result.already_written) == (5, False)
    assert result.details["skipped_partitions"] == [0, 1]


def test_a_committed_partition_beside_held_ones_is_not_already_written() -> None:
    result = _result(PartitionOutcome(0, "committed", 3, 3), PartitionOutcome(1, "skipped", 2))
    assert (result.rows, result.already_written) == (5, False)
