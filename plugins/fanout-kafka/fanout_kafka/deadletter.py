"""Dead letters in a Delta table; and the rows failing the sink's route, to either kind
of target.

Each partition appends its dead letters itself, on the executor, *before* the Kafka
transaction that commits its marker (:meth:`fanout_kafka.transaction.PartitionWriter.commit`),
with the Delta transaction ``("fanout/<pipeline>/<sink>/dead_letter/p<n>/<bad|refused>",
batch_id)``: a committed partition is skipped on replay, so its letters must be in the
table by then; a replay of an uncommitted partition finds them and appends nothing.

Rows failing the sink's route (``where``/``select``, evaluated by fanout before any
partition writes) are written by :class:`RouteDeadLetters` before the partitions, as
records whose value is the JSON of the row before the route: to a Delta target with the
transaction ``(<sink txn app id>/route_dead_letter, batch_id)`` and partition -1; to a
dead-letter topic in one transaction of a producer of their own (``<prefix>#route-0``)
that also commits a marker of its own (group ``fanout/<pipeline>/<sink>#route/p0``), so a
replay skips them like a partition that committed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from fanout.errors import SinkWriteError, TransientSinkError
from fanout_kafka.delta_letters import write
from fanout_kafka.options import DeadLetter
from fanout_kafka.records import Record, dead_letter_headers, json_bytes

if TYPE_CHECKING:
    from fanout.contract.batch import Batch
    from fanout.deadletters.model import DeadLetter as Letter
    from fanout_kafka.sink import KafkaSink

ROUTE = "route"
"""What tells the route letters' producer, marker and Delta transaction from the sink's."""
ROUTE_PARTITION = -1
"""The ``partition`` of a route letter in a Delta target (it never reached a partition)."""


class RouteDeadLetters:
    """Writes the rows failing a Kafka sink's route to its dead-letter target, once per
    batch (see the module docstring); what ``KafkaSink.route_dead_letters`` returns.

    Each letter becomes a record: no key, the row before the route as JSON, the batch
    headers plus ``fanout.error`` (the reason), ``fanout.topic``, ``fanout.record_bytes``
    and, when known, ``fanout.column`` and ``fanout.value``.
    """

    def __init__(self, sink: KafkaSink, dead: DeadLetter) -> None:
        self.sink = sink
        self.dead = dead

    def records(self, batch: Batch, letters: Sequence[Letter]) -> list[Record]:
        """The letters as dead-letter records."""
        settings = self.sink.settings(batch)
        records = []
        for letter in letters:
            base = Record(None, json_bytes(dict(letter.row)), list(settings.encoder.headers))
            headers = dead_letter_headers(base, letter.reason, settings.topic)
            if letter.column is not None:
                headers.append(("fanout.column", letter.column.encode()))
            if letter.value is not None:
                headers.append(("fanout.value", str(letter.value).encode()))
            records.append(Record(None, base.value, headers))
        return records

    def write(self, batch: Batch, letters: Sequence[Letter]) -> int:
        """Write ``letters`` for ``batch`` once; return how many the batch has."""
        if not letters:
            return 0
        records = self.records(batch, letters)
        if self.dead.kind == "delta":
            rows = [
                {
                    "partition": ROUTE_PARTITION,
                    "key": r.key,
                    "value": r.value,
                    "headers": r.headers,
                    "error": letter.reason,
                    "record_bytes": r.size,
                }
                for r, letter in zip(records, letters, strict=True)
            ]
            write(
                self.dead.target, rows, txn_app_id=batch.txn_app_id, pipeline=batch.pipeline,
                sink=batch.sink_name, batch_id=batch.batch_id, topic=str(self.sink.topic),
                kind=f"{ROUTE}_dead_letter",
            )  # fmt: skip
        else:
            self._produce(batch, records)
        return len(letters)

    def _produce(self, batch: Batch, records: list[Record]) -> None:
        """One transaction to the dead-letter topic with a marker of its own; skipped when
        the marker says this batch's route letters are there already."""
        from fanout_kafka.transaction import PartitionWriter

        settings = self.sink.settings(batch)
        settings = replace(
            settings,
            sink=f"{settings.sink}#{ROUTE}",
            topic=self.dead.target,
            transactional_id_prefix=f"{settings.transactional_id_prefix}#{ROUTE}",
            dead_letter=None,
        )
        outcome = PartitionWriter(settings, 0, batch.batch_id).write(records, [])
        if outcome.status == "failed":
            error = TransientSinkError if outcome.transient else SinkWriteError
            raise error(
                f"the rows failing the route could not be written to dead-letter topic "
                f"{self.dead.target!r}: {outcome.error}",
                sink=batch.sink_name,
                batch_id=batch.batch_id,
            )
