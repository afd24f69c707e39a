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
every partition of the topic (``read_committed``), and a name found there that the pipeline
does not configure, with records of the batch or a later one, is asked by its own markers
in the scope (the sink's ``_markers_hold``); held, whole or part: :func:`renamed_refusal`.
The headers point at a name, the markers (of this scope: records of an earlier epoch carry
no epoch) confirm it.

Cost: once per sink and scope (its first write there; a name that wrote in the scope before
is not asked, nor a topic ``create_topic`` made at this first write, nor a sink used
outside a :class:`fanout.FanOut`, which gives no configured names): one list-offsets
request, one metadata request and one fetch round of at most :data:`TAIL_OFFSETS` offsets
per partition; nothing per batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping
from typing import Any

from fanout.errors import RenamedSinkError

log = logging.getLogger("fanout.kafka")

TAIL_OFFSETS = 50
"""How many offsets at the end of each partition of the topic the first write reads
(transaction markers take one each): the old name's batch is found only when records of
other writers after it do not fill them in every partition it wrote."""


def tail_writers(
    admin: Any,
    config: Mapping[str, Any],
    topic: str,
    pipeline: str,
    exclude: Collection[str],
    batch_id: int,
    timeout_s: float,
    depth: int = TAIL_OFFSETS,
) -> dict[str, int] | None:
    """The sinks of ``pipeline`` not in ``exclude`` whose committed records among the last
    ``depth`` offsets of each partition of ``topic`` are of batch ``batch_id`` or later,
    each with the highest batch id seen. ``None``: cannot tell (the partitions' ends were
    not all reached within ``timeout_s``). ``admin``: an admin client of ``config``.

    :raises confluent_kafka.KafkaException: when the offsets or the records cannot be read.
    """
    from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    deadline = time.monotonic() + timeout_s
    found = admin.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        return {}
    wanted = {TopicPartition(topic, p): OffsetSpec.latest() for p in sorted(found.partitions)}
    ends = admin.list_offsets(wanted, isolation_level=IsolationLevel.READ_COMMITTED,
                              request_timeout=timeout_s)  # fmt: skip
    starts = []
    for tp, future in ends.items():
        end = int(future.result().offset)
        if end > 0:
            starts.append(TopicPartition(topic, tp.partition, max(end - depth, 0)))
    if not starts:
        return {}
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
    open_ends = {tp.partition for tp in starts}
    try:
        consumer.assign(starts)
        while open_ends:
            if time.monotonic() >= deadline:
                return None
            message = consumer.poll(0.1)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    open_ends.discard(message.partition())
                    continue
                raise KafkaException(error)
            _note(writers, message.headers() or (), pipeline, exclude, batch_id)
    finally:
        consumer.close()
    return writers


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


__all__ = ["TAIL_OFFSETS", "renamed_refusal", "tail_writers"]
