"""A Kafka sink renamed after it committed its very first batch and before any ledger mark
(docs/architecture.md §8.3, "A sink renamed mid-batch").

The run's start check (:mod:`fanout.steps.renamed`) asks about the sinks the ledger names;
a sink killed in its very first batch (its transactions committed, then no mark and no
failure row) is not among them. Renamed and restarted, the new name found no marker of its
own and wrote the batch again: ``read_committed`` readers got its records twice.

The marker groups that say the old name committed the batch are named by that name
(``fanout/<scope>/<sink>/p<n>``), and nothing on the cluster lists them on the embedded
broker: Tansu 0.6 answers ``ListGroups`` with each group id cut at its first ``/`` (every
fanout group reads ``fanout``), and describing or listing the offsets of such a prefix finds
nothing. The records themselves name their writer: every record of a batch carries the
headers ``fanout.pipeline``, ``fanout.sink`` and ``fanout.batch_id``
(:data:`fanout_kafka.records.BATCH_HEADERS`), and the old name's batch is at the end of the
partitions it wrote when the sink restarts. So, at a sink's first write in its scope (its
partition span never recorded there: :func:`fanout_kafka.membership.record_span`), before
anything is written, :func:`tail_writers` reads the last :data:`TAIL_OFFSETS` offsets of
every partition of the topic (``read_committed``), and further back, in rounds four times
as deep, where other writers buried them, down to a record older than the batch's
planning or the log's start; a name found there that the pipeline does not configure,
with records of the batch or a later one, is asked by its own markers in the scope (the
sink's ``_markers_hold``); held, whole or part: :func:`renamed_refusal`. The headers point
at a name, the markers (of this scope: records of an earlier epoch carry no epoch) confirm
it. A read that fails is tried again when the error may pass
(:func:`read_error_is_transient`), and the write refused when it still fails or cannot
pass: never written blindly, but for a right refused (:func:`read_error_is_unauthorized`:
a sink allowed to write its topic, not to read it, cannot tell; warned, and written). A
sink writing without the headers (``headers: false``) cannot be found this way: it is
warned at its open.

Cost: once per sink and scope (its first write there; a name that wrote in the scope before
is not asked, nor a topic ``create_topic`` made at this first write, nor a sink used
outside a :class:`fanout.FanOut`, which gives no configured names): one list-offsets
request, one metadata request and one fetch round of at most :data:`TAIL_OFFSETS` offsets
per partition on an empty or quiet topic; on a busy one, the records written since the
batch's planning, at most 4/3 times over, within ``open_timeout_s``; nothing per batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping
from typing import Any

from fanout.errors import RenamedSinkError

log = logging.getLogger("fanout.kafka")

TAIL_OFFSETS = 50
"""How many offsets at the end of each partition of the topic the first write reads in its
first round (transaction markers take one each): an empty or quiet topic is read whole in
it. A partition whose round reached neither its log start nor a record older than the
batch's planning is read again from further back, the window four times as deep each
round (:func:`tail_writers`)."""

CLOCK_SKEW_MS = 60_000
"""How much earlier than the batch's planning (the driver's clock) a record of it may be
stamped (the producer's clock, on an executor): the read goes back past the planning by
this much before it stops at an older record."""

READ_ATTEMPTS = 3
"""How many times the first write's read is tried when it fails with an error worth
trying again (:func:`read_error_is_transient`) before the write is refused."""

RETRY_PAUSE_S = 0.25
"""The pause before the read's ``n``-th attempt again: ``n`` times this."""

_TRANSIENT_CODES = (
    "_TRANSPORT", "_ALL_BROKERS_DOWN", "_TIMED_OUT", "_TIMED_OUT_QUEUE", "_RESOLVE",
    "_WAIT_COORD", "_IN_PROGRESS", "_PREV_IN_PROGRESS", "REQUEST_TIMED_OUT",
    "NETWORK_EXCEPTION", "LEADER_NOT_AVAILABLE", "NOT_LEADER_FOR_PARTITION",
    "BROKER_NOT_AVAILABLE", "REPLICA_NOT_AVAILABLE", "COORDINATOR_NOT_AVAILABLE",
    "COORDINATOR_LOAD_IN_PROGRESS", "NOT_COORDINATOR", "NOT_ENOUGH_REPLICAS",
    "KAFKA_STORAGE_ERROR", "UNSTABLE_OFFSET_COMMIT", "OFFSET_NOT_AVAILABLE",
    "FETCH_SESSION_ID_NOT_FOUND", "INVALID_FETCH_SESSION_EPOCH", "THROTTLING_QUOTA_EXCEEDED",
    "UNKNOWN_TOPIC_OR_PART",
)  # fmt: skip
"""The librdkafka error codes (``KafkaError`` names) of a broker or connection not
reachable now, or of a topic's metadata not yet on every broker (``UNKNOWN_TOPIC_OR_PART``,
retriable in Kafka: a topic made or deleted a moment ago; tried again, a topic gone is
seen gone by the metadata request, nothing read): worth trying again
(:func:`read_error_is_transient`)."""


def read_error_is_transient(error: Any) -> bool:
    """Whether a librdkafka error met reading the topic's end (or the vanished name's
    markers) may pass if the read is tried again: not when librdkafka calls it fatal;
    yes when it calls it retriable, or when it is a broker or connection not reachable
    now (transport, time-out, leader or coordinator moving, a broker stopped, a topic's
    metadata not yet on every broker). Every other error (an authorization refused,
    :func:`read_error_is_unauthorized`; a partition unknown to the client, a bad
    configuration) is persistent: trying again gives the same answer. ``error``: a
    ``confluent_kafka.KafkaError``, or a ``TimeoutError`` (transient)."""
    if isinstance(error, TimeoutError):
        return True
    from confluent_kafka import KafkaError

    if error.fatal():
        return False
    codes = {getattr(KafkaError, name, None) for name in _TRANSIENT_CODES}
    return bool(error.retriable()) or error.code() in codes


_UNAUTHORIZED_CODES = ("TOPIC_AUTHORIZATION_FAILED", "GROUP_AUTHORIZATION_FAILED")
"""The librdkafka error codes of a right the broker refuses the sink's principal."""


def read_error_is_unauthorized(error: Any) -> bool:
    """Whether a persistent error met reading the topic's end (or a vanished name's
    markers) is a right refused: a sink with producer-only rights (WRITE and DESCRIBE on
    its topic, no READ, which it needs nowhere else: its markers are group offsets on the
    marker topic) cannot read the records, so it cannot tell, and is warned rather than
    refused (:meth:`fanout_kafka.KafkaSink._refuse_vanished_writer`). ``error``: a
    ``confluent_kafka.KafkaError``."""
    from confluent_kafka import KafkaError

    codes = {getattr(KafkaError, name, None) for name in _UNAUTHORIZED_CODES}
    return bool(error.code() in codes)


def tail_writers(
    admin: Any,
    config: Mapping[str, Any],
    topic: str,
    pipeline: str,
    exclude: Collection[str],
    batch_id: int,
    timeout_s: float,
    depth: int = TAIL_OFFSETS,
    since_ms: int | None = None,
) -> dict[str, int] | None:
    """The sinks of ``pipeline`` not in ``exclude`` whose committed records at the end of
    ``topic`` are of batch ``batch_id`` or later, each with the highest batch id seen.
    ``None``: cannot tell (the read did not end within ``timeout_s``). ``admin``: an admin
    client of ``config``.

    The first round reads the last ``depth`` offsets of each partition (``read_committed``):
    an empty or quiet topic is read whole in it. When it names no such sink, each partition
    whose round neither began at its log start nor met a record stamped before
    ``since_ms`` (the batch's planning, :data:`CLOCK_SKEW_MS` earlier; ``None``: unknown, the
    read goes back to the log start) is read again from four times as far back from its
    end, until the rounds name a sink or every partition is read back that far (records
    of other writers buried the batch: :mod:`fanout_kafka.renamed`). Worst case: every
    record of the topic since the batch's planning (without it, the whole topic) read at
    most 4/3 times over, within ``timeout_s``.

    :raises confluent_kafka.KafkaException: when the offsets or the records cannot be read
        (a persistent error at once; a transient one, :func:`read_error_is_transient`, when
        ``timeout_s`` passes with it still there).
    """
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    deadline = time.monotonic() + timeout_s
    found = admin.list_topics(topic, timeout=_left(deadline)).topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        return {}
    wanted = {TopicPartition(topic, p): OffsetSpec.latest() for p in sorted(found.partitions)}
    answers = admin.list_offsets(wanted, isolation_level=IsolationLevel.READ_COMMITTED,
                                 request_timeout=_left(deadline))  # fmt: skip
    ends = {tp.partition: int(f.result().offset) for tp, f in answers.items()}
    ends = {p: end for p, end in ends.items() if end > 0}
    starts = {p: max(end - depth, 0) for p, end in ends.items()}
    bound = None if since_ms is None else since_ms - CLOCK_SKEW_MS
    log_starts: dict[int, int] | None = None
    while starts:
        read = _read_round(config, topic, pipeline, exclude, batch_id, starts, deadline)
        if read is None:
            return None
        writers, oldest = read
        if writers:
            return writers
        deeper = [
            p for p, start in starts.items()
            if start > 0 and (bound is None or oldest.get(p) is None or oldest[p] >= bound)
        ]  # fmt: skip
        if deeper and log_starts is None:  # the log starts: asked once, when going deeper
            earliest = {TopicPartition(topic, p): OffsetSpec.earliest() for p in deeper}
            answers = admin.list_offsets(earliest, request_timeout=_left(deadline))
            log_starts = {tp.partition: int(f.result().offset) for tp, f in answers.items()}
        log_starts = log_starts or {}
        starts = {
            p: max(ends[p] - 4 * (ends[p] - starts[p]), log_starts.get(p, 0), 0)
            for p in deeper
            if starts[p] > log_starts.get(p, 0)
        }
    return {}


def _left(deadline: float) -> float:
    """The seconds left until ``deadline`` (a request given none fails at once: at least
    a millisecond)."""
    return max(deadline - time.monotonic(), 0.001)


def _read_round(
    config: Mapping[str, Any],
    topic: str,
    pipeline: str,
    exclude: Collection[str],
    batch_id: int,
    starts: Mapping[int, int],
    deadline: float,
) -> tuple[dict[str, int], dict[int, int]] | None:
    """One round of :func:`tail_writers`: each partition of ``starts`` read from its
    offset to its end (``read_committed``); the writers named and, per partition, the
    timestamp of the first record read (none: no record, or one without a timestamp).
    ``None``: the ends not all reached by ``deadline``, and no error met meanwhile.

    :raises confluent_kafka.KafkaException: a persistent error at once
        (:func:`read_error_is_transient`); the last transient one when ``deadline``
        passes with it.
    """
    from confluent_kafka import (
        TIMESTAMP_NOT_AVAILABLE,
        Consumer,
        KafkaError,
        KafkaException,
        TopicPartition,
    )

    consumer = Consumer({
        **config,
        "group.id": f"fanout/{pipeline}/renamed-check",  # never joined nor committed
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",  # a start before the log's (retention)
        "fetch.wait.max.ms": 10,
    })  # fmt: skip
    writers: dict[str, int] = {}
    oldest: dict[int, int] = {}
    open_ends = set(starts)
    transient: Any = None  # the last transient error met, raised if the deadline passes
    try:
        consumer.assign([TopicPartition(topic, p, start) for p, start in starts.items()])
        while open_ends:
            if time.monotonic() >= deadline:
                if transient is not None:
                    raise KafkaException(transient)
                return None
            message = consumer.poll(0.1)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    open_ends.discard(message.partition())
                    continue
                if not read_error_is_transient(error):
                    raise KafkaException(error)
                transient = error  # librdkafka tries again itself (a broker reconnected)
                continue
            partition = int(message.partition() or 0)
            if partition not in oldest:
                kind, stamp = message.timestamp()
                oldest[partition] = -1 if kind == TIMESTAMP_NOT_AVAILABLE else int(stamp)
            _note(writers, message.headers() or (), pipeline, exclude, batch_id)
    finally:
        consumer.close()
    return writers, {p: t for p, t in oldest.items() if t >= 0}


def _note(
    writers: dict[str, int],
    headers: Any,
    pipeline: str,
    exclude: Collection[str],
    batch_id: int,
) -> None:
    """Count one record's writer in ``writers`` when its headers name a sink of
    ``pipeline`` outside ``exclude`` and a batch at or past ``batch_id``."""
    from fanout_kafka.records import BATCH_HEADERS

    values = dict(headers)
    texts: list[str] = []
    for name in BATCH_HEADERS:
        value = values.get(name)
        try:
            texts.append(value.decode() if isinstance(value, bytes) else "")
        except UnicodeDecodeError:
            return  # not fanout's headers (another writer's of the same names)
    owner, sink, batch = texts
    if owner != pipeline or not sink or sink in exclude or not batch.isdigit():
        return
    written = int(batch)
    if written < batch_id:
        return
    writers[sink] = max(writers.get(sink, written), written)


def renamed_refusal(
    sink: str, other: str, topic: str, pipeline: str, epoch: int, batch_id: int, part: str
) -> RenamedSinkError:
    """The refusal of sink ``sink``'s first write of ``batch_id`` to ``topic``: sink
    ``other``, which the pipeline no longer configures, committed it there (``part``: the
    partitions' note, empty for all). The ways on are the ones every check of a sink renamed
    mid-batch gives (:func:`fanout.contract.sink.renamed_sink_advice`), without removing the
    batch: records cannot be removed from a topic."""
    from fanout.contract.batch import txn_app_id
    from fanout.contract.sink import renamed_sink_advice

    target = f"topic {topic!r}"
    harm = f"put the batch's records in {target} twice"
    return RenamedSinkError(
        f"{target} holds batch {batch_id} of sink {other!r}{part} (epoch {epoch}, its records "
        f"keyed {txn_app_id(pipeline, other, epoch)!r}: their headers name it at the topic's "
        f"end and its markers hold the batch), a sink the pipeline no longer configures, and "
        f"sink {sink!r} has no marker in the epoch. "
        + renamed_sink_advice(target, sink, other, batch_id, harm=harm)
        + ". Records cannot be removed from a topic, so there is no other way on",
        sink=sink,
        batch_id=batch_id,
    )


__all__ = [
    "CLOCK_SKEW_MS",
    "READ_ATTEMPTS",
    "RETRY_PAUSE_S",
    "TAIL_OFFSETS",
    "read_error_is_transient",
    "read_error_is_unauthorized",
    "renamed_refusal",
    "tail_writers",
]
