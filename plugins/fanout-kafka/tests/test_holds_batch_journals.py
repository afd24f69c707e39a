"""``holds_batch`` of a Kafka sink with a Delta dead-letter table counts the letters of a
batch from its partitions' refused groups (committed with every transaction with letters),
reads only the journals committed without a count, and answers as precisely as those allow
when such a journal is gone (the marker topic's retention removed it while the group
offsets live on).

Before, each partition's journal was read with a consumer of its own, also for a batch
with no letters, and a journal gone made ``holds_batch`` raise (after the read's 60 s on
Tansu, which returns nothing for a missing record; Kafka answers out of range): "cannot
tell", where before the journals it said ``True``. At a new epoch "cannot tell" admits
the start, which writes the batch's rows a second time.

Tansu neither expires records (``retention.ms`` is accepted and not applied: records
produced with ``retention.ms=100`` were all read back 8 s later) nor deletes them
(``DeleteRecords`` closes the connection), so a journal is made gone the way it looks to
a reader: its partition's letters group is moved to the offset after the journal, which
holds the transaction's commit marker (no record a consumer returns), with a record after
it. A journal committed without a count (fanout before this change) is written with
``_send_refused`` doing nothing, as that version did for a Delta table. Real broker, real
Delta table, no Spark.
"""

from __future__ import annotations

import logging
import shlex
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from fanout_kafka import KafkaSink
from fanout_kafka.journal import pack_refused
from fanout_kafka.markers import marker_group
from fanout_kafka.transaction import PartitionWriter
from kafkatools import Broker, create_topic, marker

from fanout import PartlyHeld
from fanout.app.cli import main
from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.sink import SinkContext
from fanout.deadletters.delta import DeltaDeadLetters
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry, ledger_location
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
        self.ledger = DeltaLedger(str(tmp_path / f"ledger {self.pipeline}"))
        self.shown = f"'{tmp_path}/ledger {self.pipeline}'"  # as commands name it: quoted
        self.sink = KafkaSink(SINK, bootstrap_servers=kafka.bootstrap, topic=self.topic,
                              key="id", value="v", partitions=partitions,
                              marker_topic=self.markers, max_record_bytes=1000)  # fmt: skip
        context = SinkContext(self.pipeline, dead_letters=self.dead,
                              ledger=ledger_location(self.ledger))  # fmt: skip
        self.sink.open(context)

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

    def lose_journal(self, p: int) -> int:
        """Make partition p's last journal gone: its letters group moved to the offset
        after it (the commit marker), a record produced after that. Returns the new
        position."""
        gone = self.offset(p, ".letters") + 1
        self.commit(p, ".letters", gone)
        producer = Producer({"bootstrap.servers": self.kafka.bootstrap})
        producer.produce(self.markers, b"after", partition=0)
        assert producer.flush(10) == 0
        return gone

    def holds(self, batch_id: int) -> Any:
        return self.sink.holds_batch(self.pipeline, 0, batch_id)

    def skip_as_printed(self, text: str, batch_id: int) -> None:
        """Run the ``fanout ledger skip`` command ``text`` prints (between backticks), as
        printed, once another sink of the pipeline committed ``batch_id`` (what a skip
        requires): it records the batch for this sink."""
        self.ledger.open()  # created, as a FanOut's start does
        self.ledger.mark_committed(
            LedgerEntry(self.pipeline, "other", batch_id, "committed", query_id="q")
        )
        command = next(c for c in text.split("`") if c.startswith("fanout ledger skip "))
        assert main(shlex.split(command)[1:]) == 0
        assert self.ledger.last_committed(self.pipeline, [SINK]) == {SINK: batch_id}


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


def uncounted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Partitions written from now on commit no letter count, as fanout before this change
    did for a Delta dead-letter table."""
    monkeypatch.setattr(PartitionWriter, "_send_refused", lambda self, producer, letters: None)


def test_the_letters_are_counted_from_the_refused_groups_with_the_journals_gone(
    setup: Any,
) -> None:
    """Every partition's commit with letters counted them (``.refused``): a batch without
    letters is whole and a batch whose letters were not parked is held in part with their
    exact count, without reading a journal, so one gone changes nothing. Before, the count
    was committed only for a dead-letter topic, each journal was read (one consumer each)
    and, gone, the read raised."""
    s = setup(2)
    s.write(0, {0: 1, 1: 2})
    assert (s.offset(0, ".refused"), s.offset(1, ".refused")) == (
        pack_refused(0, 1),
        pack_refused(0, 2),
    )
    s.write(1, {})
    for p in (0, 1):
        s.lose_journal(p)
    assert s.holds(1) is True
    s.write(2, {0: 3}, parked=False)
    s.lose_journal(0)
    assert s.holds(2) == PartlyHeld(2, 2, letters=3)
    from fanout_kafka.letters import NamedLetters, named_letters

    assert named_letters(s.settings(1), 1, 2) == NamedLetters(0)  # no journal read
    assert named_letters(s.settings(2), 2, 2) == NamedLetters(3)


def test_journals_committed_without_a_count_are_read_by_one_consumer(
    setup: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A guard (the version before read them too, one consumer each): journals with no
    count are read, their batch told from them: batch 0's letters, not parked, are
    waiting; batch 1, without letters, is whole."""
    uncounted(monkeypatch)
    s = setup(2)
    s.write(0, {0: 1, 1: 2}, parked=False)
    assert s.holds(0) == PartlyHeld(2, 2, letters=3)
    s.write(1, {})
    assert s.holds(1) is True
    from fanout_kafka.letters import NamedLetters, named_letters

    assert named_letters(s.settings(1), 1, 2) == NamedLetters(0, read=2)


def test_a_gone_journal_without_a_count_holds_the_batch_in_part_and_says_what_to_do(
    setup: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Partition 0's journal, committed without a count, is gone: batch 1 may have set
    rows aside that are not in the table. Not ``True`` (``fanout recover`` would record
    the batch and its replay skip the sink), not ``None`` (a new epoch would write every
    partition's rows again): held in part, one letter counted for the partition, and a
    warning naming it and the way on. This holds also when the table has letters of the
    batch (the single-partition rule of the branch before is gone)."""
    uncounted(monkeypatch)
    s = setup(2)
    s.write(0, {0: 1})
    s.write(1, {})
    gone = s.lose_journal(0)
    with caplog.at_level(logging.WARNING, logger="fanout_kafka"):
        assert s.holds(1) == PartlyHeld(2, 2, letters=1)
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    dead = s.dead.describe()
    assert warning == [
        f"sink {SINK!r}, batch 1: the letters journal of partition(s) 0 (offset {gone}) on "
        f"marker topic {s.markers!r} is gone (the topic's retention or compaction removed "
        "it; the partitions' offsets still point at it), and their commits recorded no "
        "letter count (fanout before a count for a Delta table): cannot tell whether they "
        f"set rows of this batch aside for {dead}. Counted as one waiting letter each, so "
        "the batch reads as held in part: a new epoch is refused and `fanout recover` "
        "records no lost mark. A replay cannot write them either (it rebuilds them from "
        f"the journal). Every partition committed its rows to {s.topic!r}: if you accept "
        f"that those partitions' refused rows of batch 1 may be missing from {dead}, "
        "record the batch for this sink with `fanout ledger skip --ledger "
        f"{s.shown} --pipeline {s.pipeline} --sink {SINK} --through 1 "
        "--epoch 0` and restart the query."
    ]
    s.skip_as_printed(warning[0], 1)
    one = setup(1)
    one.write(0, {0: 2})  # parked: the table holds letters of batch 0
    one.lose_journal(0)
    assert one.holds(0) == PartlyHeld(1, 1, letters=1)


def test_a_replay_skipping_a_partition_whose_journal_is_gone_parks_what_it_can_tell(
    setup: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replay of a committed partition reads its journal to park its letters. Gone,
    the read waited 60 s on Tansu and failed (Kafka: out of range). Now a journal whose
    partition's count is an earlier batch's is not needed (batch 1 set nothing aside: the
    partition is skipped), and one whose letters cannot be rebuilt (its count is this
    batch's, or there is none) fails the partition at once, not as transient, saying
    what is lost and what to do."""
    s = setup(1)
    s.write(0, {0: 1})
    s.write(1, {})
    s.lose_journal(0)
    skipped = s.run(1, 0, 0)
    assert (skipped.status, skipped.dead_lettered) == ("skipped", 0)

    def gone_message(s: Setup, gone: int, what: str, batch_id: int) -> str:
        return (
            f"JournalGone: the letters journal of this committed partition (offset {gone} "
            f"of marker topic {s.markers!r}) is gone (the topic's retention or compaction "
            f"removed it): {what} row(s) it set aside for {s.dead.describe()} cannot be "
            f"rebuilt (its rows are in {s.topic!r}). Raise the marker topic's retention.ms "
            "above the longest time a failed batch may wait for its replay. To go on "
            "without those rows, once every other partition committed the batch (`fanout "
            f"recover --ledger {s.shown} --pipeline {s.pipeline}` shows "
            f"the part): `fanout ledger skip --ledger {s.shown} --pipeline "
            f"{s.pipeline} --sink {SINK} --through {batch_id} --epoch 0`, then restart"
        )

    s.write(2, {0: 2}, parked=False)
    gone = s.lose_journal(0)
    failed = s.run(2, 0, 2)
    assert (failed.status, failed.failure.transient) == ("failed", False)
    assert gone_message(s, gone, "2", 2) in failed.failure.message, failed.failure.message
    s.skip_as_printed(failed.failure.message, 2)

    uncounted(monkeypatch)
    old = setup(1)
    old.write(0, {0: 1}, parked=False)
    gone = old.lose_journal(0)
    failed = old.run(0, 0, 1)
    assert (failed.status, failed.failure.transient) == ("failed", False)
    message = gone_message(old, gone, "an unknown number of", 0)
    assert message in failed.failure.message, failed.failure.message


def test_a_transaction_aborted_after_sending_its_count_leaves_the_committed_one(
    setup: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A guard: the ``.refused`` count goes with the transaction
    (``send_offsets_to_transaction``), so an attempt aborted after sending it (its journal
    produced, its count sent) leaves the letters and refused groups where the last
    committed transaction put them. Sent outside the transaction, an aborted attempt's
    count would stand beside the committed journal (this test fails then)."""
    s = setup(1)
    s.write(0, {0: 2})
    position = s.offset(0, ".letters")
    assert s.offset(0, ".refused") == pack_refused(0, 2)
    real_end = PartitionWriter._end

    def end(self: PartitionWriter, finish: Callable[[float], None]) -> None:
        if getattr(finish, "__name__", "") == "commit_transaction":
            raise RuntimeError("killed before the commit")
        real_end(self, finish)

    monkeypatch.setattr(PartitionWriter, "_end", end)
    assert s.run(1, 0, 3).status == "failed"
    monkeypatch.undo()
    assert (s.offset(0, ".letters"), s.offset(0, ".refused")) == (position, pack_refused(0, 2))
    from fanout_kafka.letters import NamedLetters, named_letters

    assert named_letters(s.settings(1), 1, 1) == NamedLetters(0)
    assert (s.holds(0), s.holds(1)) == (True, False)
