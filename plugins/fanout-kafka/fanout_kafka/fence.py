"""Closing a replaced epoch's scope to its stragglers (:meth:`fanout.Sink.fence_earlier_epochs`).

A checkpoint reset accepted as epoch ``e`` replaces a query whose tasks may still run (an
executor Spark gave up on, a failed job's task). Such a *straggler* writes partition ``p``
of a batch of epoch ``e-1`` under transactional id ``<prefix>-<p>`` (the same id in every
epoch) and marks it in marker group ``fanout/<pipeline>@e<e-1>/<sink>/p<p>``. The new
epoch reads that batch's input again under its own marker groups, so a straggler that
commits after the new epoch's start asked :meth:`~fanout_kafka.KafkaSink.holds_batch`
would have its records written twice.

The fence, on the driver at the new epoch's start (before ``holds_batch``), for each
partition ``p`` of the old scope's partition span (the span group's count, the new
``partitions`` and the markers beyond them, as :func:`fanout_kafka.abandoned.
end_abandoned_transactions` counts them):

1. ``init_transactions`` with ``<prefix>-<p>``: every producer of that id initialised
   before is fenced (its commit fails) and its open transaction aborted (its records are
   never visible to read_committed readers);
2. read the old scope's marker of ``p`` (stable, now that no transaction of the id is
   open) and, in a transaction of that producer holding no record, commit it back *fenced*:
   :data:`fanout_kafka.markers.FENCED_BIT` set above the real offset
   (``FENCED_BIT | max(offset, 0)``).

A straggler task that starts after the fence initialises its own producer (which fences
the fence's, harmlessly: it is done) and then reads its marker, as every task does
(:meth:`fanout_kafka.transaction.PartitionWriter.prepare`): it finds the bit and refuses
(:class:`EpochFencedError`) without writing. The mark is carried by the offset, not by the
commit's metadata string, because the embedded Tansu broker keeps no offset-commit metadata
(:mod:`fanout_kafka.membership`); it costs nothing per batch: the task reads the same
offset it always read.

Races, per partition: a straggler initialised before step 1 cannot commit after it. One
initialised between step 1 and step 2's commit fences the fence's producer, so step 2's
commit fails and the partition is fenced again from step 1 (up to :data:`ATTEMPTS`
times), which fences that straggler in turn and aborts its transaction, or reads the
marker it committed first (then ``holds_batch`` sees it). One initialised after step 2's
commit reads the fenced marker (its read is after its own ``init_transactions``, and the
fence's commit is complete by then: committed offsets are read stable) and refuses. So
when the fence returns, every write of the old scope that had not committed cannot, and
every one that did is in the marker ``holds_batch`` reads (the readers on the driver
clear the bit: :func:`real_offset`).

Epochs before ``e-1`` were closed the same way by the start of ``e-1``; the transactional
ids being shared, step 1 fences their stragglers' producers again anyway.

On Tansu (:mod:`fanout_kafka.abandoned`) every partition's id is initialised once before
any partition's step 1: a transaction left open under one partition's id holds back the
marker of another partition committed beside it, which that partition's step 2 would read
as none (and mark fenced at none) if it ran first.

``<prefix>`` is the ``transactional_id_prefix`` recorded in scope ``e-1``
(:meth:`ScopeFence.of_writers`, :mod:`fanout_kafka.former_ids`), the one its tasks hold,
when it differs from the prefix now configured: a prefix changed together with the reset.

:func:`lift_fence` (the start of ``e`` refused) commits the real offsets back the same way
(a marker that had none becomes ``0``, which the readers take for none: a task commits
``batch + 1``, never ``0``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fanout.errors import TransientSinkError
from fanout_kafka.errors import EpochFencedError
from fanout_kafka.markers import FENCED_BIT, is_fenced

log = logging.getLogger("fanout_kafka")

ATTEMPTS = 5
"""How many times a partition's fence is made again when a producer started meanwhile
fenced the fence's own (each time it fences that one)."""


@dataclass(frozen=True)
class ScopeFence:
    """The sink's settings a fence of one scope needs (on the driver).

    :param sink: the sink's name.
    :param scope: the scope closed (or opened again): ``<pipeline>`` or ``<pipeline>@e<n>``.
    :param epoch: the epoch whose start closes it (named in the refusals).
    :param bootstrap_servers: the brokers.
    :param producer: the sink's librdkafka settings (connection settings, passthrough).
    :param prefix: the transactional id prefix (``<prefix>-<p>``).
    :param marker_topic: the marker topic.
    :param transaction_timeout_ms: the transactions' timeout.
    :param timeout_s: each broker operation's bound.
    :param end_turns: Tansu's transaction-end turn file (:mod:`fanout_kafka.turns`).
    """

    sink: str
    scope: str
    epoch: int
    bootstrap_servers: str
    producer: Mapping[str, Any]
    prefix: str
    marker_topic: str
    transaction_timeout_ms: int
    timeout_s: float
    end_turns: str | None = None

    def partitions(self, partitions: int) -> int:
        """How many partitions' ids and markers the fence covers: the larger of
        ``partitions`` and the scope's recorded span, then those beyond with a marker."""
        from fanout_kafka.driver_admins import admin_config
        from fanout_kafka.markers import marker_group, span_group
        from fanout_kafka.membership import _admin, _markers_beyond, read_offsets

        config = admin_config(self.producer, self.bootstrap_servers)
        (span,) = read_offsets(
            config, self.marker_topic, [span_group(self.scope, self.sink)], self.timeout_s
        )
        count = max(partitions, span)
        beyond = _markers_beyond(
            _admin(config), self.marker_topic,
            lambda p: marker_group(self.scope, self.sink, p), count, self.timeout_s,
        )  # fmt: skip
        return count + len(beyond)

    def close(self, partitions: int) -> None:
        """Fence every partition's id and mark its marker (the module docstring), under
        the prefix the scope was written with (:meth:`of_writers`).

        :raises fanout.TransientSinkError: when a partition cannot be fenced."""
        fence = self.of_writers()
        fence._each(fence.partitions(partitions), fence=True)

    def open(self, partitions: int) -> None:
        """Undo :meth:`close`: every fenced marker committed back to its real offset.

        :raises fanout.TransientSinkError: when a partition cannot be opened."""
        fence = self.of_writers()
        fence._each(fence.partitions(partitions), fence=False)

    def of_writers(self) -> ScopeFence:
        """This fence under the ``transactional_id_prefix`` recorded in its scope
        (:mod:`fanout_kafka.former_ids`: the ids the scope's tasks hold) when one is and
        differs from :attr:`prefix` (changed together with the checkpoint reset): the ids
        of the prefix now configured fence no task of the replaced epoch, nor end the
        transaction its killed run left open. No record (none written, gone, or a sink of
        an older fanout): :attr:`prefix`, as before. One offset read and one record read.

        :raises fanout.TransientSinkError: when the record cannot be read.
        """
        from dataclasses import replace

        from confluent_kafka import KafkaException

        from fanout.observe.secrets import redact
        from fanout_kafka.former_ids import prefix_in_scope, rights_refused
        from fanout_kafka.options import secret_values

        try:
            written = prefix_in_scope(self.producer, self.bootstrap_servers, self.marker_topic,
                                      self.scope, self.sink, self.timeout_s)  # fmt: skip
        except (KafkaException, TimeoutError) as exc:
            said = redact(str(exc), secret_values(self.producer))
            if rights_refused(exc):
                log.warning(
                    "sink %s: cannot read the transactional_id_prefix recorded in scope %r on "
                    "marker topic %r (%s): the scope is closed under the ids of %r; a prefix "
                    "changed together with the checkpoint reset is not fenced. Grant the "
                    "sink's principal READ on that topic",
                    self.sink, self.scope, self.marker_topic, said, self.prefix,
                )  # fmt: skip
                return self
            raise TransientSinkError(
                f"cannot read the transactional_id_prefix recorded in scope {self.scope!r} "
                f"on marker topic {self.marker_topic!r} (epoch {self.epoch}'s start): {said}",
                sink=self.sink,
            ) from exc  # fmt: skip
        if written is None or written == self.prefix:
            return self
        log.info(
            "sink %s: scope %r was written under transactional_id_prefix %r (now %r): closed "
            "under its ids", self.sink, self.scope, written, self.prefix,
        )  # fmt: skip
        return replace(self, prefix=written)

    def _each(self, count: int, *, fence: bool) -> None:
        from confluent_kafka import KafkaException

        what = "close" if fence else "open again"
        try:
            with ThreadPoolExecutor(max_workers=max(min(count, 8), 1)) as pool:
                # Tansu only: every open transaction ended first. Kafka applies a
                # transaction's offsets with its commit, and a stable offset fetch
                # (require_stable, KIP-447) of a group waits only on a transaction with
                # offsets pending for that same group, i.e. this partition's own id,
                # which step 1 ended; another partition's open transaction holds back
                # the LSO of the data partitions it wrote, which no marker read consults.
                if self.end_turns is not None:
                    list(pool.map(self._end, range(count)))
                list(pool.map(lambda p: self._one(p, fence=fence), range(count)))
        except (KafkaException, TimeoutError) as exc:
            raise TransientSinkError(
                f"cannot {what} scope {self.scope!r} of the sink's marker topic "
                f"{self.marker_topic!r} to the replaced epoch's tasks still running "
                f"(epoch {self.epoch}'s start): {exc}",
                sink=self.sink,
            ) from exc  # fmt: skip

    def _end(self, partition: int) -> None:
        """Initialise partition ``partition``'s id, aborting a transaction left open under
        it. On Tansu such a transaction holds back the markers of the transactions
        committed beside it (:mod:`fanout_kafka.abandoned`): every partition's is ended
        before any marker is read, or a partition's step 2 read its marker while another
        partition's step 1 had not yet released it, marked it fenced at none, and the
        replaced batch's committed partition was read as never written."""
        from confluent_kafka import Producer

        from fanout_kafka.producer_init import init_transactions
        from fanout_kafka.settings import producer_config
        from fanout_kafka.turns import turn

        transactional_id = f"{self.prefix}-{partition}"
        config = producer_config(self.producer, self.bootstrap_servers, transactional_id,
                                 self.transaction_timeout_ms)  # fmt: skip
        with turn(self.end_turns):
            init_transactions(Producer(config), self.timeout_s)

    def _one(self, partition: int, *, fence: bool) -> None:
        """Fence (or open) one partition, again while another producer of the id fences
        the fence's own before it commits."""
        from confluent_kafka import KafkaException

        from fanout_kafka.failures import FENCED_CODES

        for attempt in range(1, ATTEMPTS + 1):
            try:
                self._transact(partition, fence=fence)
                return
            except KafkaException as exc:
                if exc.args[0].code() not in FENCED_CODES or attempt == ATTEMPTS:
                    raise
                log.info("sink %s: fence of partition %s fenced meanwhile; again", self.sink,
                         partition)  # fmt: skip

    def _transact(self, partition: int, *, fence: bool) -> None:
        from confluent_kafka import Consumer, Producer, TopicPartition

        from fanout_kafka.driver_admins import admin_config
        from fanout_kafka.markers import marker_group
        from fanout_kafka.membership import read_offsets
        from fanout_kafka.producer_init import init_transactions
        from fanout_kafka.settings import producer_config
        from fanout_kafka.turns import turn

        transactional_id = f"{self.prefix}-{partition}"
        config = producer_config(
            self.producer, self.bootstrap_servers, transactional_id, self.transaction_timeout_ms
        )
        producer = Producer(config)
        with turn(self.end_turns):
            init_transactions(producer, self.timeout_s)  # step 1: fences, aborts
        group = marker_group(self.scope, self.sink, partition)
        config = admin_config(self.producer, self.bootstrap_servers)
        (offset,) = read_offsets(config, self.marker_topic, [group], self.timeout_s)
        if fence:
            if is_fenced(offset):
                return
            wanted = FENCED_BIT | max(offset, 0)
        else:
            if not is_fenced(offset):
                return
            wanted = offset - FENCED_BIT
        consumer = Consumer({**admin_config(self.producer, self.bootstrap_servers),
                             "group.id": group, "enable.sparse.connections": True})  # fmt: skip
        try:
            metadata = consumer.consumer_group_metadata()
        finally:
            consumer.close()
        producer.begin_transaction()
        marker = TopicPartition(self.marker_topic, 0, wanted)
        producer.send_offsets_to_transaction([marker], metadata, self.timeout_s)
        with turn(self.end_turns):
            producer.commit_transaction(self.timeout_s)


__all__ = ["ATTEMPTS", "EpochFencedError", "ScopeFence"]
