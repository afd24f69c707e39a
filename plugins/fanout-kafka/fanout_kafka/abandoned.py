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

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from fanout.errors import TransientSinkError
from fanout_kafka.membership import marked_beyond
from fanout_kafka.producer_init import init_transactions
from fanout_kafka.turns import turn

if TYPE_CHECKING:
    from fanout_kafka.settings import WriterSettings


def end_abandoned_transactions(settings: WriterSettings, partitions: int, batch_id: int) -> None:
    """Initialise the transactional ids of partitions ``0..partitions-1`` and of the
    partitions beyond them that hold a marker (written while the sink had more
    partitions), each in turn with the tasks' ends (:mod:`fanout_kafka.turns`): any
    transaction left open under them is aborted, and the markers it held back are applied.

    :raises fanout.TransientSinkError: when an id cannot be initialised.
    """
    from confluent_kafka import KafkaException, Producer

    def end(partition: int) -> None:
        producer = Producer(settings.producer_config(partition))
        with turn(settings.end_turns):
            init_transactions(producer, settings.operation_timeout_s)

    try:
        # as the markers' reader looks beyond the count, so does this
        count = partitions + marked_beyond(settings, partitions)
        with ThreadPoolExecutor(max_workers=min(count, 8)) as pool:
            list(pool.map(end, range(count)))
    except KafkaException as exc:
        raise TransientSinkError(
            "cannot end the transactions an earlier attempt left open (to read its "
            f"partition markers): {exc}",
            sink=settings.sink, batch_id=batch_id,
        ) from exc  # fmt: skip


__all__ = ["end_abandoned_transactions"]
