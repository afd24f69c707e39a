"""``holds_batch`` of a Kafka sink with a Delta dead-letter table counts the letters of a
batch from its partitions' offsets, and answers as precisely as they allow when a journal
is gone (the marker topic's retention removed it while the group offsets live on).

Before, each partition's journal was read with a consumer of its own, also for a batch
with no letters, and a journal gone made ``holds_batch`` raise (after the read's 60 s on
Tansu, which returns nothing for a missing record; Kafka answers out of range): "cannot
tell", where before the journals it said ``True``. At a new epoch "cannot tell" admits
the start, which writes the batch's rows a second time.

Tansu neither expires records (``retention.ms`` is accepted and not applied: records
produced with ``retention.ms=100`` were all read back 8 s later) nor deletes them
(``DeleteRecords`` closes the connection), so a journal is made gone the way it looks to
a reader: its partition's letters group is moved to the offset after the journal, which
holds the transaction's commit marker (no record a consumer returns), with a record
after it, and, where the version writing it committed one, the ``.journaled`` count
moved with it, as retention would leave them. Real broker, real Delta table, no Spark.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from fanout_kafka import KafkaSink
from fanout_kafka.markers import marker_group
from fanout_kafka.transaction import PartitionWriter
from kafkatools import Broker, create_topic, marker

from fanout import PartlyHeld
from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.sink import SinkContext
from fanout.deadletters.delta import DeltaDeadLetters
from fanout.partitioned.membership import MemberDigest, PartitionPlan

SINK = "events"


class Parks(DeltaDeadLetters):
    """The Delta dead-letter table, whose writes fail while :attr:`failing` (a task
    killed between its partition's commit and the park)."""

    failing = False

    def write(self, *args: Any, **kwargs: Any) -> int:
        if Parks.failing:
            raise OSError("the object store is away")
        return super().write(*args, **kwargs)


class Setup:
    """A sink of ``partitions`` partitions with its own marker topic and Delta table."""

    def __init__(self, kafka: Broker, tmp_path: Path, partitions: int) -> None:
        self.kafka, self.partitions = kafka, partitions
        self.topic, self.pipeline = f"hj-{uuid.uuid4().hex[:8]}", f"hj{uuid.uuid4().hex[:6]}"
        self.markers = f"markers-{uuid.uuid4().hex[:8]}"
        create_topic(kafka.bootstrap, self.topic, 1)
        self.dead = Parks(str(tmp_path / "dead"))
        self.sink = KafkaSink(SINK, bootstrap_servers=kafka.bootstrap, topic=self.topic,
                              key="id", value="v", partitions=partitions,
                              marker_topic=self.markers, max_record_bytes=1000)  # fmt: skip
        self.sink.open(SinkContext(self.pipeline, dead_letters=self.dead))

    def close(self) -> None:
        self.sink.close()

    def settings(self, batch_id: int) -> Any:
        batch = Batch(None, BatchInfo(self.pipeline, batch_id), SINK,
                      txn_app_id(self.pipeline, SINK))  # fmt: skip
        plan = PartitionPlan(self.partitions, (("id", "string"),))
        return replace(self.sink.settings(batch), plan=plan)

    def write(self, batch_id: int, letters: dict[int, int], *, parked: bool = True) -> None:
        """Batch ``batch_id`` in every partition, ``letters[p]`` records of partition p
        over ``max_record_bytes``; their park fails unless ``parked``."""
        Parks.failing = not parked
        try:
            for p in range(self.partitions):
                outcome = self.run(batch_id, p, letters.get(p, 0))
                failed = not parked and letters.get(p, 0)
                assert outcome.status == ("failed" if failed else "committed"), outcome
        finally:
            Parks.failing = False

    def run(self, batch_id: int, p: int, letters: int) -> Any:
        """Partition p's attempt at batch ``batch_id``: one small row and ``letters``
        records over ``max_record_bytes``."""
        rows = [{"id": f"{batch_id}-{p}", "v": "small"}]
        rows += [{"id": f"{batch_id}-{p}-big{i}", "v": "x" * 2000} for i in range(letters)]
        writer = PartitionWriter(self.settings(batch_id), p, batch_id, digest=MemberDigest())
        return writer.run([pa.RecordBatch.from_pylist(rows)])

    def offset(self, p: int, suffix: str) -> int:
        return marker(self.kafka.bootstrap, self.pipeline, SINK, p, self.markers, suffix=suffix)

    def commit(self, p: int, suffix: str, offset: int) -> None:
        """Set group ``<marker group of p><suffix>``'s offset by hand."""
        consumer = Consumer({"bootstrap.servers": self.kafka.bootstrap,
                             "group.id": marker_group(self.pipeline, SINK, p) + suffix,
                             "enable.auto.commit": False})  # fmt: skip
        try:
            consumer.commit(offsets=[TopicPartition(self.markers, 0, offset)], asynchronous=False)
        finally:
            consumer.close()

    def lose_journal(self, p: int, *, counted: tuple[int, int] | None) -> int:
        """Make partition p's last journal gone: its letters group moved to the offset
        after it (the commit marker), a record produced after that; with ``counted``
        (batch, letters), the ``.journaled`` count moved with it (as this version commits
        it), else set to 0, which names another journal (as the version before, which
        committed no count, left it). Returns the new position."""
        gone = self.offset(p, ".letters") + 1
        self.commit(p, ".letters", gone)
        if counted is None:
            self.commit(p, ".journaled", 0)
        else:
            from fanout_kafka.journal import pack_journaled

            self.commit(p, ".journaled", pack_journaled(counted[0], gone, counted[1]))
        producer = Producer({"bootstrap.servers": self.kafka.bootstrap})
        producer.produce(self.markers, b"after", partition=0)
        assert producer.flush(10) == 0
        return gone

    def holds(self, batch_id: int) -> Any:
        return self.sink.holds_batch(self.pipeline, 0, batch_id)


@pytest.fixture
def setup(kafka: Broker, tmp_path: Path) -> Iterator[Callable[[int], Setup]]:
    """Makes a :class:`Setup` of n partitions; closes its sink after the test."""
    made: list[Setup] = []

    def make(partitions: int) -> Setup:
        made.append(Setup(kafka, tmp_path, partitions))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_the_letters_are_counted_from_the_offsets_with_the_journals_gone(setup: Any) -> None:
    """Every partition's commit counted its journal (``.journaled``): a batch without
    letters is whole and a batch whose letters were not parked is held in part with their
    exact count, without reading a journal, so one gone changes nothing. Before, both
    journals were read (one consumer each) and, gone, the read raised."""
    from fanout_kafka.letters import NamedLetters, named_letters

    s = setup(2)
    s.write(0, {0: 1, 1: 2})
    s.write(1, {})
    assert named_letters(s.settings(1), 1, 2) == NamedLetters(0)  # no journal read
    for p, letters in ((0, 1), (1, 2)):
        s.lose_journal(p, counted=(0, letters))
    assert s.holds(1) is True
    s.write(2, {0: 3}, parked=False)
    assert named_letters(s.settings(2), 2, 2) == NamedLetters(3)
    s.lose_journal(0, counted=(2, 3))
    assert s.holds(2) == PartlyHeld(2, 2, letters=3)


def test_a_gone_journal_before_an_earlier_batch_s_journal_named_none_of_this_batch(
    setup: Any,
) -> None:
    """Journals committed without a count (the version before) are read. Partition 0's
    is gone, but partition 1's journal, read, is batch 0's and comes after it: a sink
    writes its batches in order, so partition 0's was batch 0's too, and batch 1, which
    set nothing aside, is held whole."""
    s = setup(2)
    s.write(0, {0: 1, 1: 1})  # partition 0's journal first, then 1's
    s.write(1, {})
    gone = s.lose_journal(0, counted=None)
    s.commit(1, ".journaled", 0)  # partition 1's journal read too
    assert gone < s.offset(1, ".letters")
    assert s.holds(1) is True


def test_a_gone_journal_nothing_dates_holds_the_batch_in_part_and_says_what_to_do(
    setup: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Partition 0's journal, committed without a count, is gone and no other journal
    dates it: batch 1 may have set rows aside that are not in the table. Not ``True``
    (``fanout recover`` would record the batch and its replay skip the sink), not
    ``None`` (a new epoch would write every partition's rows again): held in part, one
    letter counted for the partition, and a warning naming it and the way on."""
    s = setup(2)
    s.write(0, {0: 1})
    s.write(1, {})
    gone = s.lose_journal(0, counted=None)
    with caplog.at_level(logging.WARNING, logger="fanout_kafka"):
        assert s.holds(1) == PartlyHeld(2, 2, letters=1)
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    dead = s.dead.describe()
    assert warning == [
        f"sink {SINK!r}, batch 1: the letters journal of partition(s) 0 (offset {gone}) on "
        f"marker topic {s.markers!r} is gone (the topic's retention or compaction removed "
        "it; the partitions' offsets still point at it), and their commits recorded no "
        "letter count (fanout before the .journaled groups): cannot tell whether they set "
        f"rows of this batch aside for {dead}. Counted as one waiting letter each, so the "
        "batch reads as held in part: a new epoch is refused and `fanout recover` records "
        "no lost mark. A replay cannot write them either (it rebuilds them from the "
        f"journal). Every partition committed its rows to {s.topic!r}: if you accept that "
        f"those partitions' refused rows of batch 1 may be missing from {dead}, record the "
        f"batch for this sink with `fanout ledger skip --ledger <ledger> --pipeline "
        f"{s.pipeline} --sink {SINK} --through 1 --epoch 0` and restart the query."
    ]


@pytest.mark.parametrize(("parked", "held"), [(True, True), (False, PartlyHeld(1, 1, letters=1))])
def test_the_only_gone_journal_is_whole_when_the_table_holds_letters_of_the_batch(
    setup: Any, parked: bool, held: Any
) -> None:
    """One partition, its journal of batch 0 gone and uncounted: every letter of batch 0
    the table holds is that partition's, and a partition parks its letters in one Delta
    commit, so letters there mean all of them; none there, they may be waiting."""
    s = setup(1)
    s.write(0, {0: 2}, parked=parked)
    s.lose_journal(0, counted=None)
    assert s.holds(0) == held


def test_a_replay_skipping_a_partition_whose_journal_is_gone_parks_what_it_can_tell(
    setup: Any,
) -> None:
    """The replay of a committed partition reads its journal to park its letters. Gone,
    the read waited 60 s on Tansu and failed (Kafka: out of range). Now a journal whose
    count says it was an earlier batch's is not needed (batch 1 set nothing aside: the
    partition is skipped), and one whose letters cannot be rebuilt fails the partition at
    once, not as transient, saying what is lost and what to do."""
    s = setup(1)
    s.write(0, {0: 1})
    s.write(1, {})
    s.lose_journal(0, counted=(0, 1))
    skipped = s.run(1, 0, 0)
    assert (skipped.status, skipped.dead_lettered) == ("skipped", 0)

    s.write(2, {0: 2}, parked=False)
    gone = s.lose_journal(0, counted=(2, 2))
    failed = s.run(2, 0, 2)
    assert (failed.status, failed.failure.transient) == ("failed", False)
    assert (
        f"JournalGone: the letters journal of this committed partition (offset {gone} of "
        f"marker topic {s.markers!r}) is gone (the topic's retention or compaction removed "
        f"it): 2 row(s) it set aside for {s.dead.describe()} cannot be rebuilt (its rows are "
        f"in {s.topic!r}). Raise the marker topic's retention.ms above the longest time a "
        "failed batch may wait for its replay. To go on without those rows, once every "
        "other partition committed the batch (`fanout recover --config` shows the part): "
        "`fanout ledger skip ... --through 2` for this sink, then restart"
    ) in failed.failure.message, failed.failure.message


def test_a_transaction_aborted_after_sending_its_count_leaves_the_committed_one(
    setup: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A guard: the ``.journaled`` count goes with the transaction
    (``send_offsets_to_transaction``), so an attempt aborted after sending it (its journal
    produced, its count sent) leaves the letters and journaled groups where the last
    committed transaction put them. Sent outside the transaction, an aborted attempt's
    count would stand beside the committed journal (this test fails then)."""
    from fanout_kafka.journal import pack_journaled
    from fanout_kafka.letters import NamedLetters, named_letters

    s = setup(1)
    s.write(0, {0: 2})
    position = s.offset(0, ".letters")
    assert s.offset(0, ".journaled") == pack_journaled(0, position, 2)
    real_end = PartitionWriter._end

    def end(self: PartitionWriter, finish: Callable[[float], None]) -> None:
        if getattr(finish, "__name__", "") == "commit_transaction":
            raise RuntimeError("killed before the commit")
        real_end(self, finish)

    monkeypatch.setattr(PartitionWriter, "_end", end)
    assert s.run(1, 0, 3).status == "failed"
    monkeypatch.undo()
    assert (s.offset(0, ".letters"), s.offset(0, ".journaled")) == (
        position,
        pack_journaled(0, position, 2),
    )
    assert named_letters(s.settings(1), 1, 1) == NamedLetters(0)
    assert (s.holds(0), s.holds(1)) == (True, False)
