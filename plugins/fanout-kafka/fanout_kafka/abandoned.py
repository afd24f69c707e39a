"""Ending the transactions a killed task left open, before a replay reads its markers, on a
broker that holds a committed transaction's offsets back while a transaction sharing one
of its partitions is open: the Tansu broker.

Tansu (0.6) ends a transaction in two steps. It writes the commit markers into the
transaction's partitions and answers success; but it applies the transaction's offset
commits -- the sink's partition markers -- only once every transaction whose records
overlap it in a shared partition has ended too, and the last of them to end applies them
all. Two tasks of one batch write the same topic partitions, so this happens all the time,
and a live task's end settles it a moment later. A transaction that never ends, because
its task or driver was killed, holds back the markers of every transaction committed
beside it until its transactional id is initialised again, which aborts it. A replay
that read the markers before that found a committed partition unmarked and wrote it
again: its records twice. Kafka applies the offsets with the commit.

So on such a broker the driver initialises every partition's transactional id, as each
task does for its own, before the first write after ``open()`` and before any attempt
that follows an unfinished one: the transactions left open are aborted, the markers they
held back are applied, and only then are the markers read.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING

from fanout.errors import TransientSinkError
from fanout_kafka.membership import marked_beyond
from fanout_kafka.producer_init import init_transactions
from fanout_kafka.turns import turn

if TYPE_CHECKING:
    from fanout_kafka.settings import WriterSettings


def end_abandoned_transactions(
    settings: WriterSettings,
    partitions: int,
    batch_id: int,
    *,
    extra_ids: Sequence[str] = (),
    why: str = "an earlier attempt left open (to read its partition markers)",
) -> None:
    """Initialise the transactional ids of partitions ``0..partitions-1`` (the driver
    passes the sink's partition span, :func:`fanout_kafka.membership.record_span`: every
    partition it has written a batch of the scope in, so a count lowered since keeps the
    others' ids ended and fenced) and of the partitions beyond them that hold a marker
    (written while the sink had more partitions, before the span was recorded), and
    ``extra_ids``, each in turn with the tasks' ends
    (:mod:`fanout_kafka.turns`): any transaction left open under them is aborted, and the
    markers it held back are applied.

    :raises fanout.TransientSinkError: when an id cannot be initialised.
    """
    from confluent_kafka import KafkaException, Producer

    def end(transactional_id: str) -> None:
        config = settings.producer_config(0)
        config["transactional.id"] = transactional_id
        producer = Producer(config)
        with turn(settings.end_turns):
            init_transactions(producer, settings.operation_timeout_s)

    try:
        # as the markers' reader looks beyond the count, so does this
        count = partitions + marked_beyond(settings, partitions)
        ids = [settings.transactional_id(p) for p in range(count)] + list(extra_ids)
        with ThreadPoolExecutor(max_workers=min(len(ids), 8)) as pool:
            list(pool.map(end, ids))
    except KafkaException as exc:
        raise TransientSinkError(
            f"cannot end the transactions {why}: {exc}",
            sink=settings.sink, batch_id=batch_id,
        ) from exc  # fmt: skip


def fence_legacy_transactions(
    settings: WriterSettings, legacy_prefix: str, partitions: int, batch_id: int
) -> None:
    """Initialise the transactional ids of the sink's former default prefix
    (``fanout-<pipeline>-<sink>``, :func:`fanout_kafka.markers.legacy_transactional_id_prefix`):
    every partition's (as :func:`end_abandoned_transactions` counts them) and the route
    dead letters' (``<prefix>#route-0``). A producer of the old version still running is
    fenced, and a transaction it left open is aborted, before the markers are read and
    before anything is written under the new ids, which do not fence the old ones.

    :raises fanout.TransientSinkError: when an id cannot be initialised.
    """
    legacy = replace(settings, transactional_id_prefix=legacy_prefix)
    end_abandoned_transactions(
        legacy, partitions, batch_id,
        extra_ids=[f"{legacy_prefix}#route-0"],
        why=f"left open under the former transactional ids {legacy_prefix}-<p>",
    )  # fmt: skip


__all__ = ["end_abandoned_transactions", "fence_legacy_transactions"]
