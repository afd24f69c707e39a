"""Dead letters as a sink sees them: the rows it refuses (:class:`DeadLetter`) and the
target it hands them to (:class:`DeadLetterTarget`), given in
:attr:`fanout.SinkContext.dead_letters`.

A sink only produces rejected rows; fanout resolves the sink's ``dead_letter`` option into a
target (:mod:`fanout.deadletters.target`) and writes the rows failing the sink's route there
itself. A row the sink's own target refuses goes to ``context.dead_letters.write(batch,
letters, source="refused", partition=...)``, or fails the batch naming sink, batch, column
and value when the sink has no target.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from fanout.contract.batch import Batch

Source = Literal["route", "refused"]
"""Why a row is a dead letter: it failed the sink's route (``where``/``select``, found by
fanout before any write), or the sink's target refused it."""


@dataclass(frozen=True)
class DeadLetter:
    """One refused row.

    :param row: the row as the sink (or, for a route, as the batch) had it; ``None`` when
        only the sink's encoding of it exists.
    :param reason: why it was refused (the database's or broker's message, Spark's error).
    :param column: the column at fault, when known.
    :param value: that column's value, when known.
    :param partition: the sink's write partition that refused it, when it has partitions.
    :param details: small facts of the sink's own (a Kafka record's topic, key, headers
        and size; a PostgreSQL target table), kept as a JSON object.
    """

    row: Mapping[str, Any] | None
    reason: str
    column: str | None = None
    value: Any = None
    partition: int | None = None
    details: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class DeadLetterTarget(Protocol):
    """A place dead letters are kept: a Delta table, a PostgreSQL table, a topic...

    Instances hold configuration only (they may be pickled to the executors); whatever
    they connect to is opened inside :meth:`write`.
    """

    kind: str
    """The grammar's kind (``"delta"``, ``"postgres"``, ``"kafka"``...)."""

    def describe(self) -> str:
        """The target for people (no secrets): ``"Delta table /data/dead"``."""
        ...

    def write(
        self,
        batch: Batch,
        letters: Sequence[DeadLetter],
        *,
        source: Source,
        partition: int | None = None,
    ) -> int:
        """Keep ``letters`` of ``batch`` unless this target already holds them (idempotent
        per ``(batch.idempotency_key, source, partition)``: see :func:`letter_kind`);
        return how many letters the batch has (also when they were there already)."""
        ...


def letter_kind(source: Source, partition: int | None = None) -> str:
    """The suffix of a batch's dead-letter transaction id: ``dead_letters/<source>`` or
    ``dead_letters/<source>/p<partition>`` (for :meth:`fanout.IdempotencyKey.derived`)."""
    kind = f"dead_letters/{source}"
    return kind if partition is None else f"{kind}/p{partition}"
