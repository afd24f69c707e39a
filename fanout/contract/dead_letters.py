"""Dead letters as a sink sees them: the rows it refuses (:class:`DeadLetter`) and the
target it hands them to (:class:`DeadLetterTarget`), given in
:attr:`fanout.SinkContext.dead_letters`.

A sink only produces rejected rows; fanout resolves the sink's ``dead_letter`` option into a
target (:mod:`fanout.deadletters.target`) and writes the rows failing the sink's route there
itself. A row the sink's own target refuses goes to ``context.dead_letters.write(batch,
letters, source="refused", partition=...)``, or fails the batch naming sink, batch, column
and value when the sink has no target.

Hand refused letters over *after* the commit that decides them, from what it recorded
(docs/architecture.md §7): record them in the transaction committing the other rows, write
them to the target once that committed, and again when a replay finds the batch committed
(the target keeps a batch's letters once). Letters written before a commit that then fails
stay, and the replay's, which may differ, are skipped as already written
(``examples/sqlite_sink.py`` shows the pattern). Hand them over with
:func:`fanout.deadletters.moved.write_letters` (``write_letters(context.dead_letters, batch,
letters, source="refused", partition=...)``) or the target's ``write``: either writes none
an earlier target of the sink holds (:attr:`fanout.Batch.earlier`, set when the sink's
``dead_letter`` moved since an attempt of the batch), since the target fanout hands a sink
is a :class:`fanout.deadletters.moved.CheckedTarget`, whose ``write`` is ``write_letters``.
It is an instance of the target's class (``isinstance(context.dead_letters, ItsTarget)``
holds, as it did before fanout wrapped it) and reads the target's attributes; only its
``type()`` is the wrapper's, and :func:`fanout.deadletters.moved.unchecked` gives the target
itself. A sink that writes letters its own way (inside its transactions, as fanout-postgres
does with a ``postgres:`` table) skips the partitions an earlier target holds itself
(:func:`fanout.deadletters.moved.refused_elsewhere`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from fanout.contract.route_stamp import RouteStamp

if TYPE_CHECKING:
    import pyarrow as pa

    from fanout.contract.batch import Batch

Source = Literal["route", "refused"]
"""Why a row is a dead letter: it failed the sink's route (``where``/``select``, found by
fanout before any write), or the sink's target refused it."""


@dataclass(frozen=True)
class DeadLetter:
    """One refused row.

    :param row: the row as the sink (or, for a route, as the batch) had it; ``None`` when
        only the sink's encoding of it exists. From an Arrow table, take it from
        :func:`letter_rows`.
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


class MapPairs(list[tuple[Any, Any]]):
    """A map's ``(key, value)`` pairs, as Arrow's ``to_pylist`` hands a map over, marked as
    a map: a dead letter writes it as a JSON object, an empty one too (a plain ``[]`` could
    be an empty array). Its keys may be of any type (binary, a struct)."""


def letter_rows(table: pa.Table) -> list[dict[str, Any]]:
    """The rows of ``table`` as :attr:`DeadLetter.row` takes them: ``to_pylist()``, with
    every map (at any depth) a :class:`MapPairs`, and each date or timestamp outside
    Python's years 1-9999 (at any depth) the text Spark's ``to_json`` writes for it
    (``+10000-01-01T00:00:00+00:00``: :func:`fanout.contract.far_dates.python_safe`), each
    ``float`` (32-bit) the double of its Spark text (``0.1``, not ``0.10000000149011612``:
    :func:`fanout.contract.float32.widened`)."""
    import pyarrow as pa

    from fanout.contract.far_dates import python_safe
    from fanout.contract.float32 import widened
    from fanout.contract.nested_types import holds_arrow_type

    table = widened(python_safe(table))
    rows: list[dict[str, Any]] = table.to_pylist()
    for column in table.schema:
        if holds_arrow_type(column.type, pa.types.is_map):
            for row in rows:
                row[column.name] = _mark_maps(row[column.name], column.type)
    return rows


def _mark_maps(value: Any, kind: pa.DataType) -> Any:
    import pyarrow as pa

    if value is None:
        return None
    if pa.types.is_map(kind):
        key, item = kind.key_type, kind.item_type
        return MapPairs((_mark_maps(k, key), _mark_maps(v, item)) for k, v in value)
    if pa.types.is_struct(kind):
        return {f.name: _mark_maps(value[f.name], f.type) for f in kind}
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return [_mark_maps(v, kind.value_type) for v in value]
    return value


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
        route: RouteStamp | None = None,
    ) -> int:
        """Keep ``letters`` of ``batch`` unless this target already holds them (idempotent
        per ``(batch.idempotency_key, source, partition)``: see :func:`letter_kind`);
        return how many letters the batch has (also when they were there already).

        ``route`` (``source="route"`` only) is the route that chose the letters: record
        its fingerprint (and text) with them, atomically, and when the batch's
        route letters are already kept under another fingerprint, write nothing and raise
        :func:`fanout.deadletters.route_letters.changed_route` (a replay under a changed
        route). fanout calls with ``route`` also when the route refused no row
        (``letters`` empty) so that old letters are checked; it passes ``route`` only to
        a ``write`` that takes it (a target written before it existed gets none).
        """
        ...


@runtime_checkable
class ReplacesLetters(DeadLetterTarget, Protocol):
    """A dead-letter target that can take a batch's letters back: a sink whose replay may
    refuse other rows than the attempt it replays (a PostgreSQL upsert rewrites every
    partition) makes its replay's letters the batch's with :meth:`replace` instead of
    :meth:`DeadLetterTarget.write` (which keeps the first attempt's). The ``delta`` kind
    has it; a ``kafka:`` topic cannot (docs/architecture.md §7)."""

    def replace(self, batch: Batch, letters: Sequence[DeadLetter], *, source: Source) -> int:
        """Make ``letters`` the batch's letters of ``source`` here (none: remove them),
        whatever an earlier attempt wrote, atomically; return how many the batch has."""
        ...


def letter_kind(source: Source, partition: int | None = None) -> str:
    """The suffix of a batch's dead-letter transaction id: ``dead_letters/<source>`` or
    ``dead_letters/<source>/p<partition>`` (for :meth:`fanout.IdempotencyKey.derived`)."""
    kind = f"dead_letters/{source}"
    return kind if partition is None else f"{kind}/p{partition}"


DELTA = "delta"
_KIND = re.compile(r"[a-z][a-z0-9_]+")


def split_target(text: str) -> tuple[str, str]:
    """``(kind, location)`` of a ``dead_letter`` string: ``"<kind>:<location>"``, where the
    kind is a word (``delta``, ``postgres``, ``kafka``...); anything else (a path, or a URI
    such as ``s3://...``) is a Delta table."""
    kind, sep, location = text.partition(":")
    if sep and _KIND.fullmatch(kind) and not location.startswith("//"):
        return kind, location
    return DELTA, text
