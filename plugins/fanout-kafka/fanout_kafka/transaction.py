"""One Spark partition of one batch, written in one Kafka transaction (on an executor).

The sequence for partition ``p`` of batch ``b`` (ARCHITECTURE §5):

1. encode and check every record (:mod:`fanout_kafka.records`); a bad record without a
   dead-letter target fails the partition, and no transaction is begun;
2. ``init_transactions`` with ``transactional.id = <prefix>-<p>``: this fences any zombie
   of an earlier attempt and completes or aborts its open transaction, so the marker read
   next is final;
3. read the marker: the committed offset of group ``fanout/<pipeline>/<sink>/p<p>`` on the
   marker topic (``read_committed``); ``>= b + 1`` means the partition already holds the
   batch: skip (on Tansu, a marker that does not hold it while an earlier run of this
   task in this attempt got as far as committing fails the partition as transient:
   :mod:`fanout_kafka.reruns`);
4. begin, produce every record (delivery callback on each), flush, check every delivery,
   ``send_offsets_to_transaction`` of offset ``b + 1`` for the marker group (and of the
   plan offset, :mod:`fanout_kafka.membership`, and the target offset naming the topic,
   :mod:`fanout_kafka.target`, each for a group of its own), commit;
5. with a dead-letter target outside the cluster (a Delta table): the transaction of step 4
   also holds a journal naming the partition's dead letters, and they are parked in the
   target only once it committed; a replay that skips the partition parks them from the
   journal (:mod:`fanout_kafka.journal`), so each record ends either in the topic or in
   the target, whatever fails when.

Steps 2 and 3 are round trips to the broker (20-40 ms a partition on a busy machine), made
in a thread of their own while step 1 encodes the rest of the partition, from the moment
its first Arrow batch has encoded with no bad record that would fail the partition (such a
first batch fails it before any producer exists).

Errors: retriable ones are retried here; abortable ones abort the transaction and report a
transient failure (fanout replays the batch; committed partitions skip); a fenced producer
reports that another writer took over the transactional id, unless that writer (a
speculative copy, a successor) commits the batch within ``transaction_timeout_ms``: the
partition is then skipped.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from fanout.errors import shell_word
from fanout.ledger.gaps import LEDGER_UNKNOWN, ledger_note, skip_command
from fanout.partitioned.outcome import PartitionFailure, PartitionOutcome
from fanout_kafka import journal
from fanout_kafka.errors import EpochFencedError
from fanout_kafka.failures import (
    FENCED_CODES,
    REJECTED_RECORD_CODES,
    LettersNotParked,
    TransactionTooLong,
    classify,
    describe,
    is_retriable,
)
from fanout_kafka.failures import Rejected as _Rejected
from fanout_kafka.failures import is_kafka_fatal as _is_kafka_fatal
from fanout_kafka.markers import is_fenced
from fanout_kafka.membership import group_metadata, pack, plan_group_metadata
from fanout_kafka.options import client_max_message_bytes
from fanout_kafka.producer_init import init_transactions
from fanout_kafka.records import BadRecord, Record, bad_letter, dead_letter_headers, named
from fanout_kafka.reruns import MarkerHeldBack, committing_in, note_committing, note_path
from fanout_kafka.rivals import lone_fencing, rival_reason, task_attempt
from fanout_kafka.settings import WriterSettings
from fanout_kafka.target import pack_target
from fanout_kafka.turns import turn

if TYPE_CHECKING:
    import pyarrow as pa

    from fanout.partitioned.membership import MemberDigest
    from fanout.partitioned.task import CommitHooks

log = logging.getLogger("fanout_kafka")
T = TypeVar("T")

TAKEN_OVER = frozenset({"fenced", "timeout"})
"""Failure kinds after which another attempt of the partition may hold the batch: a
fencing, and a transaction that outlived its timeout (a straggler Spark copied)."""
FENCER_POLL_S = 0.2
"""How often a fenced attempt reads the marker while its fencer still writes."""


class PartitionWriter:
    """Writes one partition of one batch in one transaction; see the module docstring.

    :param settings: the sink's configuration.
    :param partition: the Spark partition index (part of the transactional id).
    :param batch_id: the micro-batch id; the marker becomes ``batch_id + 1``.
    :param hooks: the per-partition commit hooks (``fanout_partition_commit`` just
        before the transaction commits, ``fanout_partition_committed`` right after).
    """

    def __init__(
        self,
        settings: WriterSettings,
        partition: int,
        batch_id: int,
        hooks: CommitHooks | None = None,
        digest: MemberDigest | None = None,
    ) -> None:
        self.settings = settings
        self.digest = digest
        self.partition = partition
        self.batch_id = batch_id
        self.hooks = hooks
        self.transactional_id = settings.transactional_id(partition)
        self._note = note_path(settings.end_turns, self.transactional_id)
        self._producer: Any = None
        self._reports = False  # the producer reports every delivery (a journal's offset)
        self._consumer: Any = None
        self._ahead: Future[bool] | None = None  # prepare() running beside the encoding

    # -- the whole task -----------------------------------------------------------------

    def run(self, batches: Iterable[pa.RecordBatch]) -> PartitionOutcome:
        """Encode the partition's Arrow batches, then skip or write it (:meth:`write`);
        :meth:`prepare` runs beside the encoding (see the module docstring)."""
        records: list[Record] = []
        bad: list[BadRecord] = []
        try:
            for good, wrong in self.settings.encoder.encoded_batches(batches):
                records += good
                bad += wrong
                if self._ahead is None and not (bad and not self.settings.has_dead_letters):
                    self._ahead = self._prepare_in_thread()
        except BaseException:
            self.close()  # the input failed: release what the early prepare made
            raise
        return self.write(records, bad)

    def write(
        self,
        records: list[Record],
        bad: list[BadRecord],
        *,
        prepared: bool = False,
    ) -> PartitionOutcome:
        """Skip or write encoded records; never raises for a Kafka failure (the outcome
        carries it), so the driver sees every partition's fate.

        :param prepared: :meth:`prepare` was already called and said "not written yet";
            otherwise its answer is the one :meth:`run` started beside the encoding, or it
            is called now.
        """
        rows = len(records) + len(bad)
        if rows == 0:
            return PartitionOutcome(self.partition, "empty")
        bad = [self._bad(b.record, b.reason) for b in bad]
        try:
            if bad and not self.settings.has_dead_letters:
                raise _Rejected(bad)
            if not prepared and self._prepared():
                return self._skipped(records, bad)
            try:
                written, letters = self.commit(records, bad)
            except _WrittenMeanwhile:
                return self._skipped(records, bad, rival=True)
            # the rows written: a refused row counts in dead_lettered only (SinkResult.rows)
            return PartitionOutcome(self.partition, "committed", rows - len(letters), written,
                                    dead_lettered=len(letters))  # fmt: skip
        except Exception as exc:
            kind, transient = classify(exc)
            attempt: int | None = None
            rival: str | None = "not taken over"
            if kind in TAKEN_OVER:
                attempt = task_attempt()
                rival = rival_reason(self.settings.speculation, attempt)
                waits = rival is not None
                if done := self._committed_by_another(records, bad, kind, waits=waits):
                    return done
            message = self._describe(exc, kind)
            if kind == "fenced" and rival is None:
                message += lone_fencing(self.transactional_id, attempt)
            log.warning("%s", message)
            failure = PartitionFailure(kind, message, transient)
            return PartitionOutcome(self.partition, "failed", rows, failure=failure)
        finally:
            self.close()

    def _committed_by_another(
        self, records: list[Record], bad: list[BadRecord], kind: str, *, waits: bool
    ) -> PartitionOutcome | None:
        """A fenced attempt whose fencer committed the batch (a speculative copy, a
        successor): the partition is written, so this attempt's outcome is "skipped", not
        a failure that stops the pipeline (Spark takes the first attempt to end, which
        may be this one). A fencer still writing is waited for, up to
        ``transaction_timeout_ms`` (its transaction cannot outlive that). A ``timeout``
        (this transaction outlived ``transaction_timeout_ms``, and its commit then looks
        fenced) is checked once: a straggler that speculation copied is one; so is a
        fencing when no rival can exist (``waits`` false: :mod:`fanout_kafka.rivals`).
        ``None`` when the marker does not hold the batch or cannot be read."""
        waits = waits and kind == "fenced"
        deadline = time.monotonic() + self.settings.transaction_timeout_ms / 1000
        try:
            while not self._marker_says_written():
                if not waits or time.monotonic() >= deadline:
                    return None
                time.sleep(FENCER_POLL_S)
            return self._skipped(records, bad, rival=True)
        except Exception as exc:
            log.debug("%s: marker not read after fencing: %s", self.transactional_id, exc)
            return None

    def _skipped(
        self, records: list[Record], bad: list[BadRecord], *, rival: bool = False
    ) -> PartitionOutcome:
        """The outcome of a partition another attempt committed (its letters parked):
        ``rival`` when that attempt committed it while this one ran (the marker did not
        hold the batch when this one read it after fencing the earlier attempts)."""
        letters = self._park_committed(records, bad)
        rows = len(records) + len(bad) - letters  # as "committed" counts them
        return PartitionOutcome(self.partition, "skipped", rows, dead_lettered=letters, rival=rival)

    # -- the steps ------------------------------------------------------------------------

    def _prepare_in_thread(self) -> Future[bool]:
        """:meth:`prepare` started in a thread of its own."""
        pool = ThreadPoolExecutor(1, thread_name_prefix=f"fanout-kafka-prepare-{self.partition}")
        try:
            return pool.submit(self.prepare)
        finally:
            pool.shutdown(wait=False)

    def _prepared(self) -> bool:
        """:meth:`prepare`'s answer: the one started beside the encoding, or a new one."""
        if self._ahead is None:
            return self.prepare()
        return self._ahead.result()

    def prepare(self) -> bool:
        """Initialise the transactional producer (fencing any zombie of this id), then
        read the marker. True when this partition already committed the batch.

        :raises fanout_kafka.reruns.MarkerHeldBack: the marker does not hold the batch, but
            an earlier run of this partition in this attempt of the batch got as far as
            committing it, on a broker that may hold the marker back (Tansu): transient.
        """
        self._new_producer()
        self._check_topics()
        if self._marker_says_written():
            return True
        if committing_in(self._note, self.settings.attempt):  # after the fencing: final
            raise MarkerHeldBack(
                f"partition {self.partition} (transactional.id {self.transactional_id!r}) "
                "ran again in this attempt of the batch (a Spark task or stage retry after "
                "an executor was lost, or a speculative copy) after an earlier run got as "
                "far as committing it, and its marker does not hold the batch: on this "
                "broker (Tansu) a committed transaction's marker is held back while a "
                "transaction a killed task left open shares a partition with it, so the "
                "marker cannot tell; not written again here: the batch's replay ends the "
                "open transactions, reads the markers and skips the partition if it holds "
                "the batch (fanout_kafka/reruns.py)",
                sink=self.settings.sink, batch_id=self.batch_id,
            )  # fmt: skip
        return False

    def _renew_producer(self, *, reports: bool) -> None:
        """Replace the producer with a new one of the same ``transactional.id``. Its
        ``init_transactions`` fences every other attempt of this partition, including one
        that committed the batch since :meth:`prepare` read the marker (a zombie's
        successor): so the marker is read again, and :class:`_WrittenMeanwhile` raised
        when it holds the batch, instead of committing the records a second time."""
        self._new_producer(reports=reports)
        if self._marker_says_written():
            raise _WrittenMeanwhile

    def _marker_says_written(self) -> bool:
        """Whether the marker (read_committed) holds this batch.

        :raises EpochFencedError: when the marker carries a later epoch's fence
            (:mod:`fanout_kafka.fence`): this task is a straggler of a replaced query, read
            after its own ``init_transactions``, so nothing is written."""
        consumer = self._marker_consumer()
        offset = self._committed_offset(consumer, "read the marker")
        if is_fenced(offset):
            group = self.settings.marker_group(self.partition)
            raise EpochFencedError(
                f"partition {self.partition} of batch {self.batch_id} belongs to a query a "
                f"checkpoint reset replaced: marker group {group!r} "
                "was closed by the new epoch's start, which writes this batch, so this task "
                "(a straggler of the replaced query) writes nothing. Nothing to do: restart "
                "the pipeline's current query if it is not running",
                sink=self.settings.sink, batch_id=self.batch_id,
            )  # fmt: skip
        return offset >= self.batch_id + 1

    def _committed_offset(self, consumer: Any, what: str) -> int:
        """The offset ``consumer``'s group committed on the marker topic (retried as
        ``what``; negative when it committed none)."""
        tp = TopicPartition(self.settings.marker_topic, 0)
        (committed,) = self._retrying(what, lambda: consumer.committed([tp], timeout=self._timeout))
        if committed.error:
            raise KafkaException(committed.error)
        return int(committed.offset)

    def _check_topics(self) -> None:
        """Fail fast when a topic vanished since ``open()`` (the producer would otherwise
        wait ``topic.metadata.propagation.max.ms`` and then time out)."""
        dead = self.settings.dead_topic
        topics = [self.settings.topic, self.settings.marker_topic]
        topics += [dead] if dead is not None else []
        for topic in topics:
            metadata = self._retrying(
                "read the topic metadata",
                lambda t=topic: self._producer.list_topics(t, timeout=self._timeout),  # type: ignore[misc]
            )
            found = metadata.topics.get(topic)
            error = (
                found.error if found is not None else KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
            )
            if error is not None:
                raise KafkaException(
                    KafkaError(
                        error.code(),
                        f"topic {topic!r} does not exist on {self.settings.bootstrap_servers!r} "
                        f"(deleted after the sink was opened?): {error.str()}",
                    )
                )

    def commit(self, records: list[Record], bad: list[BadRecord]) -> tuple[int, list[BadRecord]]:
        """Write the records (and dead letters to a dead-letter topic) plus the marker in
        one transaction. Records the broker refuses are dead-lettered in a second
        transaction when a dead-letter target exists. Returns (records written, bad).

        For another target (a Delta table) the committing transaction names the letters
        in a journal (:mod:`fanout_kafka.journal`) and they are parked only once it
        committed: letters parked before a commit that then failed would stay, while the
        replay's records (which the broker may refuse differently) are produced again. A
        failure to park after the commit fails the partition (transient): the replay finds
        it committed and parks the letters from the journal.
        """
        try:
            written = self._transaction(records, bad)
        except _Rejected as rejected:
            if not self.settings.has_dead_letters:
                raise
            kept = _without(records, [r.record for r in rejected.rejected])
            bad = bad + rejected.rejected
            # the refused attempt was aborted: start afresh
            self._renew_producer(reports=self._journals(bad))
            written = self._transaction(kept, bad)
        self._park_after_commit(bad)
        return written, bad

    def _journals(self, bad: list[BadRecord]) -> bool:
        """Whether a transaction with these letters writes a journal (a target other than
        a topic, and letters to name)."""
        return self.settings.dead_letters is not None and bool(bad)

    def _park_after_commit(self, bad: list[BadRecord]) -> None:
        """Park the committed transaction's letters; a failure is transient (the replay
        skips the committed partition and parks them from its journal)."""
        try:
            self._park(bad)
        except Exception as exc:
            target = self.settings.dead_letters
            where = target.describe() if target is not None else "?"
            raise LettersNotParked(
                f"the partition committed, but its {len(bad)} dead letter(s) could not be "
                f"written to {where} yet (a replay writes them from the partition's journal): "
                f"{type(exc).__name__}: {exc}",
                sink=self.settings.sink, batch_id=self.batch_id,
            ) from exc  # fmt: skip

    def _park_committed(self, records: list[Record], bad: list[BadRecord]) -> int:
        """A committed partition met again (a replay): park the letters its journal names
        (once: the target's transaction id skips them when the committed attempt parked
        them already). Returns how many letters the partition has."""
        if self.settings.dead_letters is None:
            # a dead-letter topic: they committed with the records, and the refused group
            # counts them all (the replay's own checks may find fewer: records the producer
            # or broker refused, or a size check since raised; none counted by a version
            # that committed the count only for refused records, or no letters)
            committed = self._read_refused() if self.settings.dead_topic is not None else 0
            return committed or len(bad)
        entries = self._read_journal()
        if entries is None:
            # no journal of this batch: the committed attempt had no letters, or was made
            # before journals existed and parked its letters before committing
            return len(bad)
        letters = journal.rebuild(entries, records, bad)
        self._park(letters)
        return len(letters)

    def _read_refused(self) -> int:
        """How many letters the committed transaction of this batch sent to the
        dead-letter topic (the refused group's offset, :mod:`fanout_kafka.journal`); 0
        when it committed no count: no letters, or a version that counted them only when
        it refused records."""
        settings = self.settings
        config = {
            **settings.consumer_config(self.partition),
            "group.id": settings.refused_group(self.partition),
        }
        consumer = Consumer(config)
        try:
            offset = self._committed_offset(consumer, "read the refused count")
            return journal.unpack_refused(offset, self.batch_id)
        finally:
            consumer.close()

    def _read_journal(self) -> list[tuple[str, str]] | None:
        """The ``(digest, reason)`` entries of this batch's journal for this partition, or
        ``None`` when the letters group points at none of this batch.

        :raises JournalGone: the journal is gone and the refused count does not say it
            was an earlier batch's."""
        from fanout_kafka.letters import read_journals

        settings = self.settings
        config = {
            **settings.consumer_config(self.partition),
            "group.id": settings.letters_group(self.partition),
            "isolation.level": "read_uncommitted",  # as the journal is read
        }
        consumer = Consumer(config)
        try:
            offset = self._committed_offset(consumer, "read the letters journal's offset")
        finally:
            consumer.close()
        if offset < 0:
            return None
        value = read_journals(settings, {self.partition: offset}, self._timeout)[self.partition]
        if value is not None:
            return journal.decode(value, self.batch_id)
        config["group.id"] = settings.refused_group(self.partition)
        consumer = Consumer(config)
        try:
            count = self._committed_offset(consumer, "read the refused count")
        finally:
            consumer.close()
        letters = journal.unpack_refused(count, self.batch_id)
        if count >= 0 and not letters:
            return None  # committed with the journal: an earlier batch's
        what = str(letters) if letters else "an unknown number of"
        epoch = settings.info.epoch if settings.info is not None else 0
        ledger = LEDGER_UNKNOWN if settings.ledger is None else settings.ledger
        skip = skip_command(settings.ledger, settings.pipeline, settings.sink, self.batch_id, epoch)
        raise journal.JournalGone(
            f"the letters journal of this committed partition (offset {offset} of marker "
            f"topic {settings.marker_topic!r}) is gone (the topic's retention or compaction "
            f"removed it): {what} row(s) it set aside for {self._where()} cannot be rebuilt "
            f"(its rows are in {settings.topic!r}). Raise the marker topic's retention.ms "
            "above the longest time a failed batch may wait for its replay. To go on without "
            "those rows, once every other partition committed the batch (`fanout recover "
            f"--ledger {ledger} --pipeline {shell_word(settings.pipeline)}` shows the part): "
            f"`{skip}`, then restart{ledger_note(settings.ledger)}"
        )

    def _where(self) -> str:
        target = self.settings.dead_letters
        return target.describe() if target is not None else "the dead letters"

    def _park(self, bad: list[BadRecord]) -> None:
        """Write ``bad`` to a dead-letter target other than a topic (a Delta table), under
        the transaction ``<txn app id>/dead_letters/refused/p<partition>`` at the batch id:
        called only for a committed partition, whose letters are final (a second call, by
        a replay parking from the journal, writes nothing)."""
        settings = self.settings
        target = settings.dead_letters
        if target is None or not bad:
            return
        from fanout.contract.batch import Batch
        from fanout.deadletters.moved import write_letters

        assert settings.info is not None  # set with dead_letters
        batch = Batch(
            None, settings.info, settings.sink, settings.txn_app_id, earlier=settings.earlier
        )
        letters = [bad_letter(b, settings.topic, self.partition) for b in bad]
        # none when an earlier target of the sink holds them (its dead_letter moved since
        # the attempt that parked them: fanout.deadletters.moved)
        write_letters(target, batch, letters, source="refused", partition=self.partition)

    def _transaction(self, records: list[Record], bad: list[BadRecord]) -> int:
        """One transaction of ``records`` (and letters ``bad``, with those an aborted first
        attempt had refused); returns how many records it wrote."""
        producer, settings = self._producer, self.settings
        failures: list[tuple[KafkaError, Any]] = []

        def delivered(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                failures.append((err, msg))

        journal_value = journal.encode(self.batch_id, bad) if self._journals(bad) else None
        if journal_value is not None and not self._reports:
            self._renew_producer(reports=True)  # to learn the journal's offset
            producer = self._producer
        journal_offset: list[int] = []

        def journaled(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                failures.append((err, msg))
            else:
                journal_offset.append(msg.offset())

        self._retrying("begin the transaction", producer.begin_transaction)
        started = time.monotonic()
        try:
            refused = self._produce_all(producer, settings.topic, records, delivered)
            if refused and not settings.has_dead_letters:
                raise _Rejected(refused)
            if settings.dead_topic is not None:
                for b in [*bad, *refused]:
                    self._produce_dead_letter(producer, b, delivered)
            if journal_value is not None and not refused:
                producer.produce(
                    settings.marker_topic, journal_value,
                    settings.letters_group(self.partition).encode(),
                    partition=0, on_delivery=journaled,
                )  # fmt: skip
            remaining = producer.flush(self._timeout)
            if remaining:
                raise KafkaException(
                    KafkaError(
                        KafkaError._MSG_TIMED_OUT,
                        f"{remaining} record(s) not delivered within {self._timeout:.0f} s",
                        txn_requires_abort=True,
                    )
                )
            self._check_deliveries(failures)
            if refused:
                raise _Rejected(refused)
            if self.hooks is not None:
                self.hooks.before(self.partition, len(records) + len(bad), len(records))
            self._check_duration(started, len(records))  # the coordinator would abort it
            marker = TopicPartition(settings.marker_topic, 0, self.batch_id + 1)
            metadata = self._marker_consumer().consumer_group_metadata()
            self._retrying(
                "send the marker",
                lambda: producer.send_offsets_to_transaction([marker], metadata, self._timeout),
            )
            if settings.route_stamp is not None:  # the route that chose these letters
                stamp = TopicPartition(settings.marker_topic, 0, settings.route_stamp)
                group = group_metadata(
                    settings, self.partition, settings.route_group(self.partition)
                )
                self._retrying(
                    "send the route fingerprint",
                    lambda: producer.send_offsets_to_transaction([stamp], group, self._timeout),
                )
            if settings.plan is not None and self.digest is not None:  # what a replay checks
                packed = pack(settings.plan, self.digest.digest)
                plan = TopicPartition(settings.marker_topic, 0, packed)
                group = plan_group_metadata(settings, self.partition)
                self._retrying(
                    "send the partition plan",
                    lambda: producer.send_offsets_to_transaction([plan], group, self._timeout),
                )
            self._send_target(producer)
            if bad:
                # every letter counted, not only the refused: a replay's size check may
                # let a record through that this one set aside
                self._send_refused(producer, len(bad))
            if journal_value is not None:
                self._send_journal_offset(producer, journal_offset)
            note_committing(self._note, settings.attempt)  # before the commit can land
            self._retrying("commit", lambda: self._end(producer.commit_transaction))
        except BaseException as exc:
            fatal = self._abort()
            if classify(exc)[0] == "fenced":  # an epoch bumped by the coordinator's timeout?
                self._check_duration(started, len(records), cause=exc)
            if fatal is not None and not _is_kafka_fatal(exc):
                # e.g. produce() says only "_FATAL", or a callback's SystemError: report
                # the producer's real fatal error (fenced...) instead
                raise KafkaException(fatal) from exc
            raise
        if self.hooks is not None:
            self.hooks.after(self.partition, len(records) + len(bad), len(records))
        return len(records)

    def _send_target(self, producer: Any) -> None:
        """Commit the target offset (topic, encoding, dead-letter target and route,
        :mod:`fanout_kafka.target`) for the target group, in the transaction: a replay
        compares it with its own."""
        settings = self.settings
        group = group_metadata(settings, self.partition, settings.target_group(self.partition))
        packed = pack_target(settings.target_stamp(), self.batch_id)
        where = TopicPartition(settings.marker_topic, 0, packed)
        self._retrying(
            "send the target offset",
            lambda: producer.send_offsets_to_transaction([where], group, self._timeout),
        )

    def _send_refused(self, producer: Any, letters: int) -> None:
        """Commit the letters count (bad and refused records) for the refused group, in
        the transaction: a replay that skips the partition counts its letters from it (a
        dead-letter topic), and the driver's ``holds_batch`` the letters to find parked (a
        Delta table)."""
        settings = self.settings
        group = group_metadata(settings, self.partition, settings.refused_group(self.partition))
        where = TopicPartition(
            settings.marker_topic, 0, journal.pack_refused(self.batch_id, letters)
        )
        self._retrying(
            "send the refused count",
            lambda: producer.send_offsets_to_transaction([where], group, self._timeout),
        )

    def _send_journal_offset(self, producer: Any, offsets: list[int]) -> None:
        """Commit the journal record's offset for the letters group, in the transaction."""
        if len(offsets) != 1 or offsets[0] < 0:
            raise KafkaException(
                KafkaError(
                    KafkaError._MSG_TIMED_OUT,
                    "the letters journal's delivery was not reported",
                    txn_requires_abort=True,
                )
            )
        settings = self.settings
        group = group_metadata(settings, self.partition, settings.letters_group(self.partition))
        where = TopicPartition(settings.marker_topic, 0, offsets[0])
        self._retrying(
            "send the letters journal's offset",
            lambda: producer.send_offsets_to_transaction([where], group, self._timeout),
        )

    def _check_duration(
        self, started: float, records: int, cause: BaseException | None = None
    ) -> None:
        """Raise :class:`TransactionTooLong` when the transaction begun at ``started``
        has outlived ``transaction.timeout.ms``."""
        elapsed = time.monotonic() - started
        if elapsed * 1000 > self.settings.transaction_timeout_ms:
            raise TransactionTooLong(elapsed, self.settings.transaction_timeout_ms, records) from (
                cause
            )

    def _produce_all(
        self, producer: Any, topic: str, records: list[Record], on_delivery: Callable[..., None]
    ) -> list[BadRecord]:
        refused: list[BadRecord] = []
        produce, poll = producer.produce, producer.poll  # the loop runs once per record
        for start in range(0, len(records), 1000):
            for record in records[start : start + 1000]:
                key, value, headers = record
                while True:
                    try:
                        produce(topic, value, key, headers=headers, on_delivery=on_delivery)
                        break
                    except BufferError:
                        poll(0.05)  # the local queue is full: serve deliveries
                    except KafkaException as exc:
                        err = exc.args[0]
                        if err.code() not in REJECTED_RECORD_CODES:
                            raise
                        refused.append(self._bad(record, self._refusal(record, err)))
                        break
            poll(0)
        return refused

    def _bad(self, record: Record, reason: str) -> BadRecord:
        """A bad record, its reason masked of the pipeline's secrets (a broker's message
        may quote one): built for bad records only."""
        return BadRecord(record, self.settings.secrets.mask(reason))

    def _refusal(self, record: Record, err: KafkaError) -> str:
        """Why the local producer refused ``record``, naming it (librdkafka's own text says
        "Broker:" though nothing was sent)."""
        if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
            limit = client_max_message_bytes(self.settings.producer)
            return (
                f"{named(record)} refused by the producer: over its message.max.bytes of "
                f"{limit} bytes (max_record_bytes, {self.settings.encoder.max_record_bytes}, "
                "let it through)"
            )
        return f"{named(record)} refused by the producer: {err.name()}"

    def _produce_dead_letter(
        self, producer: Any, bad: BadRecord, on_delivery: Callable[..., None]
    ) -> None:
        assert self.settings.dead_topic is not None
        record = bad.record
        headers = dead_letter_headers(record, bad.reason, self.settings.topic)
        letter = Record(record.key, record.value, headers)
        # the letter is the record plus its headers, and a record the producer refused
        # would be refused again: a letter that does not fit is a reference (no value)
        fits = record.size <= self.settings.encoder.max_record_bytes
        fits = fits and letter.size <= self.settings.letter_limit
        producer.produce(
            self.settings.dead_topic,
            record.value if fits else None,
            record.key,
            headers=headers,
            on_delivery=on_delivery,
        )

    def _check_deliveries(self, failures: list[tuple[KafkaError, Any]]) -> None:
        if not failures:
            return
        topic = self.settings.topic

        def own(err: KafkaError, msg: Any) -> bool:  # a record of the topic, refused
            return err.code() in REJECTED_RECORD_CODES and msg.topic() == topic

        rejected = []
        for err, msg in failures:
            if own(err, msg):
                record = Record(msg.key(), msg.value(), list(msg.headers() or []))
                reason = f"{named(record)} rejected by the broker: {err.str()}"
                rejected.append(self._bad(record, reason))
        if len(rejected) == len(failures):
            raise _Rejected(rejected)
        err, msg = next((e, m) for e, m in failures if not own(e, m))
        raise KafkaException(
            KafkaError(
                err.code(),
                f"{len(failures)} record(s) not delivered to {msg.topic()!r}, first: {err.str()}",
                fatal=err.fatal(),
                retriable=err.retriable(),
                txn_requires_abort=True,
            )
        )

    # -- resources ----------------------------------------------------------------------

    @property
    def _timeout(self) -> float:
        return self.settings.operation_timeout_s

    def _new_producer(self, *, reports: bool = False) -> None:
        self._producer = Producer(self.settings.producer_config(self.partition, reports=reports))
        self._reports = reports
        self._retrying(
            "initialise the transactional producer",
            lambda: init_transactions(self._producer, self._timeout),
        )

    def _marker_consumer(self) -> Any:
        if self._consumer is None:
            self._consumer = Consumer(self.settings.consumer_config(self.partition))
        return self._consumer

    def _end(self, end: Callable[[float], None]) -> None:
        """Commit or abort, in turn with the other tasks where the broker needs it."""
        with turn(self.settings.end_turns):
            end(self._timeout)

    def _abort(self) -> KafkaError | None:
        """Abort the open transaction; returns the producer's fatal error, if it has one
        (a fenced or fatal producer cannot abort: the broker aborts for it)."""
        try:
            self._end(self._producer.abort_transaction)
        except KafkaException as exc:
            err = exc.args[0]
            log.debug("abort of %s failed: %s", self.transactional_id, err)
            if err.fatal() or err.code() in FENCED_CODES:
                return err  # type: ignore[no-any-return]
        except Exception as exc:
            log.debug("abort of %s failed: %s", self.transactional_id, exc)
        return None

    def close(self) -> None:
        """Release the producer and the marker consumer (once an early :meth:`prepare`
        that made them has ended)."""
        if self._ahead is not None:
            wait([self._ahead])
            self._ahead = None
        if self._consumer is not None:
            try:
                self._consumer.close()
            except Exception:  # closing is best effort
                pass
            self._consumer = None
        self._producer = None

    def _retrying(self, what: str, operation: Callable[[], T]) -> T:
        """Run a producer/consumer operation, retrying the errors librdkafka calls
        retriable (a coordinator moving, a timeout) with backoff."""
        for attempt in range(1, self.settings.retries + 1):
            try:
                return operation()
            except KafkaException as exc:
                err = exc.args[0]
                if not is_retriable(err) or attempt == self.settings.retries:
                    raise
                log.info("%s: cannot %s (%s); retry %d", self.transactional_id, what, err, attempt)
                time.sleep(min(0.2 * 2 ** (attempt - 1), 5.0))
        raise AssertionError("unreachable")

    def _describe(self, exc: BaseException, kind: str | None) -> str:
        return describe(exc, kind, self.partition, self.transactional_id, self.settings.topic)


class _WrittenMeanwhile(Exception):
    """Another attempt of the partition committed the batch before this attempt's new
    producer fenced it (:meth:`PartitionWriter._renew_producer`)."""


def _without(records: list[Record], refused: list[Record]) -> list[Record]:
    """``records`` less one record equal to each of ``refused`` (key, value and headers:
    records differing only in their headers are different records; equal ones are
    interchangeable), in order."""
    count = Counter((r.key, r.value, tuple(r.headers)) for r in refused)
    kept = []
    for record in records:
        identity = (record.key, record.value, tuple(record.headers))
        if count[identity] > 0:
            count[identity] -= 1
        else:
            kept.append(record)
    return kept


__all__ = ["PartitionWriter", "classify", "is_retriable"]
