"""What a partition task of the Kafka sink is given: the batch's plain, picklable writer
settings, and the producer and consumer configurations derived from them."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fanout.errors import ConfigurationError
from fanout.observe.secrets import NO_SECRETS, SinkSecrets
from fanout_kafka.markers import marker_group
from fanout_kafka.options import (
    client_batch_size,
    client_max_message_bytes,
    connection_settings,
)
from fanout_kafka.records import RECORD_BATCH_HEADER_BYTES, Encoder

if TYPE_CHECKING:
    from fanout.contract.batch import BatchInfo
    from fanout.contract.dead_letters import DeadLetterTarget
    from fanout.contract.earlier_letters import EarlierLetters
    from fanout.partitioned.membership import PartitionPlan
    from fanout_kafka.target import TargetStamp

LIVELY_CONNECTIONS: dict[str, Any] = {"enable.sparse.connections": False}
"""Connect to the brokers the metadata names at once, not on demand. The sink's producer
and marker consumer live for one partition of one batch; with librdkafka's sparse
connections, ``init_transactions`` waited 50-500 ms for a connection to the transaction
coordinator (its bootstrap connection is dropped after the first metadata, and the next
connection waits for a timer), about 0.5 s of every partition's write of a small batch.
The ``producer`` option can set ``enable.sparse.connections`` back to true (very large
clusters)."""


KAFKA_TARGET = "Kafka topic "
"""How a ``kafka:`` dead-letter target describes itself, before its topic
(:meth:`fanout_kafka.deadletter.KafkaDeadLetters.describe`)."""


@dataclass(frozen=True)
class WriterSettings:
    """Everything a partition task needs; plain, picklable configuration."""

    pipeline: str
    sink: str
    scope: str
    bootstrap_servers: str
    topic: str
    producer: Mapping[str, Any]
    transactional_id_prefix: str
    marker_topic: str
    transaction_timeout_ms: int
    encoder: Encoder
    dead_topic: str | None = None
    """The dead-letter topic (``dead_letter = "kafka:<topic>"``): bad records are produced
    there in the partition's own transaction."""
    dead_letters: DeadLetterTarget | None = None
    """Any other dead-letter target (a Delta table): bad records are written there right
    after the partition's transaction commits, which names them in a journal
    (:mod:`fanout_kafka.journal`)."""
    info: BatchInfo | None = None
    """The batch (for the dead letters' records)."""
    txn_app_id: str = ""
    """The sink's transaction id ``fanout/<scope>/<sink>`` (the dead letters' key)."""
    operation_timeout_s: float = 60.0
    retries: int = 5
    plan: PartitionPlan | None = None
    """The batch's partitioning, committed with each partition (:mod:`fanout_kafka.membership`)."""
    route_stamp: int | None = None
    """A route-letters writer's route fingerprint as a number, committed in the letters'
    transaction as the offset of group ``<marker group>.route``
    (:mod:`fanout_kafka.deadletter`); ``None`` for every other writer."""
    end_turns: str | None = None
    """The lock file every task holds while it commits or aborts, on a broker whose
    transaction ends race (Tansu: :mod:`fanout_kafka.turns`); ``None`` elsewhere."""
    attempt: str = ""
    """The token of this attempt of the batch, on a broker whose markers may be held back
    (Tansu): a run of a partition that an earlier run of the same attempt committed does
    not write it again (:mod:`fanout_kafka.reruns`); empty elsewhere."""
    route: str = ""
    """The fingerprint of the route the batch went through (:attr:`fanout.Batch.route`),
    part of the target offset (:mod:`fanout_kafka.target`)."""
    route_earlier: tuple[str, ...] = ()
    """Fingerprints older fanout versions gave the same route
    (:attr:`~fanout.contract.route_stamp.RouteStamp.earlier`): a partition committed under
    one of them is of the same route."""
    speculation: bool | None = None
    """Whether the session runs speculative task attempts (``spark.speculation``), ``None``
    when unknown: a fenced attempt waits for a rival's marker only when one can exist
    (:mod:`fanout_kafka.rivals`)."""
    max_batch_bytes: int | None = None
    """The smallest ``max.message.bytes`` of the topics the producer writes record batches
    to (target and dead-letter topic): its ``batch.size`` is capped to it
    (:func:`producer_config`)."""
    secrets: SinkSecrets = NO_SECRETS
    """The sink's secrets and its pipeline's, masked in a bad record's reason (the
    letter's ``fanout.error`` header, the journal naming it, the partition's failure)."""
    ledger: str | None = None
    """The pipeline's ledger as the commands fanout prints name it (``SinkContext.ledger``;
    ``None``: unknown), for the ``fanout ledger skip`` an error prints."""
    earlier: EarlierLetters | None = None
    """What the sink's earlier dead-letter targets hold of the batch
    (:attr:`fanout.Batch.earlier`; set only when its ``dead_letter`` moved since an attempt
    of the batch): a partition whose letters one of them holds parks none
    (:func:`fanout.deadletters.moved.write_letters`)."""

    @property
    def letter_limit(self) -> int:
        """The largest dead letter a ``kafka:`` dead-letter topic gets whole (a larger one
        goes without its value): the sink's record limit, the producer's own, and the
        record batch limit of the topics the producer writes to."""
        limit = min(self.encoder.max_record_bytes, client_max_message_bytes(self.producer))
        if self.max_batch_bytes is not None:
            limit = min(limit, self.max_batch_bytes - RECORD_BATCH_HEADER_BYTES)
        return limit

    @property
    def has_dead_letters(self) -> bool:
        """Whether bad records have somewhere to go (else they fail the partition)."""
        return self.dead_topic is not None or self.dead_letters is not None

    def transactional_id(self, partition: int) -> str:
        """``<prefix>-<partition>``."""
        return f"{self.transactional_id_prefix}-{partition}"

    def marker_group(self, partition: int) -> str:
        """``fanout/<scope>/<sink>/p<partition>`` (the scope is the pipeline, plus
        ``@e<epoch>`` after an accepted checkpoint reset)."""
        return marker_group(self.scope, self.sink, partition)

    def producer_config(self, partition: int, *, reports: bool = False) -> dict[str, Any]:
        """The transactional producer's librdkafka settings (``reports``: delivery
        reports for every record, not only failures: a partition writing a letters
        journal needs its offset, :mod:`fanout_kafka.journal`)."""
        config = producer_config(
            self.producer,
            self.bootstrap_servers,
            self.transactional_id(partition),
            self.transaction_timeout_ms,
            max_batch_bytes=self.max_batch_bytes,
        )
        if reports:
            config["delivery.report.only.error"] = False
        return config

    def letters_group(self, partition: int) -> str:
        """``<marker group>.letters``: its offset is the partition's letters journal."""
        from fanout_kafka.journal import letters_group

        return letters_group(self.marker_group(partition))

    def refused_group(self, partition: int) -> str:
        """``<marker group>.refused``: its offset counts the dead letters of the
        partition's last committed transaction with letters, and names its batch
        (:mod:`fanout_kafka.journal`)."""
        from fanout_kafka.journal import refused_group

        return refused_group(self.marker_group(partition))

    def target_group(self, partition: int) -> str:
        """``<marker group>.target``: its offset says where and how the partition
        committed its batch: topic, encoding, dead-letter target, route
        (:mod:`fanout_kafka.target`)."""
        from fanout_kafka.target import target_group

        return target_group(self.marker_group(partition))

    def target_stamp(self) -> TargetStamp:
        """What the target offset records of this batch (:mod:`fanout_kafka.target`)."""
        from fanout_kafka.target import TargetStamp, encoding_text

        encoder = self.encoder
        headers: object = encoder.header_columns or bool(encoder.headers)
        dead = (
            f"kafka:{self.dead_topic}" if self.dead_topic is not None
            else self.dead_letters.describe() if self.dead_letters is not None
            else ""
        )  # fmt: skip
        return TargetStamp(
            topic=self.topic,
            encoding=encoding_text(encoder.key_columns, encoder.value_column, headers),
            dead_letter=dead,
            route=self.route,
            route_earlier=self.route_earlier,
            dead_letter_earlier=self._earlier_targets(),
            dead_letter_written=self._written_target(dead),
        )

    def _written_target(self, shown: str) -> tuple[str, ...]:
        """The target as earlier versions described it, when that differs from ``shown``
        (:meth:`target_stamp`'s): a Delta target's location as written, its password or
        SAS ``sig=`` not masked (a partition they committed holds a digest of that). Only
        digests of it are compared, never committed or printed."""
        delta = sys.modules.get("fanout.deadletters.delta")  # a Delta target imported it
        if self.dead_topic is not None or self.dead_letters is None or delta is None:
            return ()
        from fanout.deadletters.moved import unchecked

        target = unchecked(self.dead_letters)
        if not isinstance(target, delta.DeltaDeadLetters):
            return ()
        written = f"Delta table {target.path}"
        return (written,) if written != shown else ()

    def _earlier_targets(self) -> tuple[str, ...]:
        """The earlier dead-letter targets fanout asked what they hold of this batch, as
        :meth:`target_stamp` spells a target, when the tasks park letters
        (:attr:`dead_letters`: a target other than a topic), through
        :func:`fanout.deadletters.moved.write_letters`, which parks none they hold. Under a
        dead-letter topic a committed partition's letters a journal names are parked
        nowhere: a move to a topic is not accepted."""
        earlier = self.earlier
        if earlier is None or self.dead_letters is None or self.info is None:
            return ()
        if (earlier.epoch, earlier.batch_id) != (self.info.epoch, self.info.batch_id):
            return ()
        spelled = []
        for held in earlier.held:
            topic = held.target.removeprefix(KAFKA_TARGET)
            spelled.append(f"kafka:{topic}" if topic != held.target else held.target)
        return tuple(spelled)

    def route_group(self, partition: int) -> str:
        """``<marker group>.route``: its offset is the route fingerprint of the letters."""
        return self.marker_group(partition) + ".route"

    def consumer_config(self, partition: int) -> dict[str, Any]:
        """The marker consumer's settings (it only reads and commits through the producer)."""
        return {
            **LIVELY_CONNECTIONS,
            **connection_settings(self.producer),
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": self.marker_group(partition),
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }


def producer_config(
    producer: Mapping[str, Any],
    bootstrap_servers: str,
    transactional_id: str,
    transaction_timeout_ms: int,
    *,
    max_batch_bytes: int | None = None,
) -> dict[str, Any]:
    """A transactional producer's settings: the passthrough, then what the sink owns.

    :param max_batch_bytes: the topics' record batch limit (``max.message.bytes``).
        librdkafka packs records into one record batch up to ``batch.size`` (1000000 by
        default), and a broker refuses a record batch over the topic's limit *whole*
        (``MESSAGE_TOO_LARGE``): every record in it would be refused (dead-lettered), though
        each fits alone. So ``batch.size`` is capped to the limit. A record larger than
        ``batch.size`` still goes, alone in its batch (librdkafka's rule), and the sink's
        per-record check keeps records over the limit out.
    """
    config: dict[str, Any] = {
        "partitioner": "murmur2_random",  # the Java client's: keys land where Java puts them
        "message.timeout.ms": transaction_timeout_ms,
        "allow.auto.create.topics": False,
        # the sink acts only on failed deliveries; skipping the Python callback of every
        # delivered record saves about a tenth of the producer's CPU (the binding still
        # frees each record's state: confluent-kafka-python filters these reports itself)
        "delivery.report.only.error": True,
        **LIVELY_CONNECTIONS,
        **producer,
        "bootstrap.servers": bootstrap_servers,
        "transactional.id": transactional_id,
        "transaction.timeout.ms": transaction_timeout_ms,
        "enable.idempotence": True,
        "acks": "all",
    }
    config.pop("request.required.acks", None)
    if max_batch_bytes is not None and client_batch_size(producer) > max_batch_bytes:
        config["batch.size"] = max_batch_bytes
    return config


def scope_of(txn_app_id: str, sink: str) -> str:
    """The pipeline scope inside a batch's transaction id ``fanout/<scope>/<sink>``: the
    pipeline name, or ``<pipeline>@e<epoch>`` after an accepted checkpoint reset, so the
    markers of a new epoch start afresh like every other idempotency record."""
    return txn_app_id.removeprefix("fanout/").removesuffix(f"/{sink}")


def check_producer_accepted(
    sink: str,
    producer: Mapping[str, Any],
    bootstrap_servers: str,
    prefix: str | None,
    transaction_timeout_ms: int,
) -> None:
    """librdkafka accepts the names and values of the producer settings the sink's
    partitions would use (:func:`producer_config`; no connection needed).

    :raises fanout.ConfigurationError: naming what it refused."""
    from confluent_kafka import KafkaException, Producer

    config = producer_config(producer, bootstrap_servers, f"{prefix}-0", transaction_timeout_ms)
    try:
        Producer(config)  # librdkafka checks names and values; no connection needed
    except (KafkaException, ValueError, TypeError) as exc:
        raise ConfigurationError(f"Kafka sink {sink!r}: invalid producer settings: {exc}") from None
