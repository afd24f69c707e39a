"""The one layout every dead-letter table has, whatever the sink (:func:`letter_schema`).

A row a sink's route or target refuses (a failing ``CAST``, a constraint violation, an
oversize record, a null key) either fails the batch, naming sink, batch, column and value,
or -- when the sink has a ``dead_letter`` target (:mod:`fanout.deadletters.target`) -- is
kept there as a :class:`fanout.contract.dead_letters.DeadLetter`, counted in the ledger
mark (``SinkResult.dead_lettered``), ``fanout status`` and the metrics.

``value``, ``row`` and ``details`` are JSON that keeps every value the batch had
(:func:`letter_json`), in forms Spark's ``from_json`` reads back with the batch's schema
(but for intervals and maps whose keys are not strings, which it does not read): binary as
base64 (as ``to_json`` writes it), a float as ``to_json`` spells it (``1.0E20``, ``1.0E-4``,
a ``float`` ``1.4E-45``), NaN and the infinities as the strings ``"NaN"``,
``"Infinity"``, ``"-Infinity"`` (JSON has no such numbers), decimals as text of their own
digits, dates and times as ISO 8601, an instant (a timestamp with a zone) in UTC
(``2024-05-01T08:00:00+00:00``), a timestamp without a zone without an offset, a year
outside 1-9999 as Spark spells it (``+10000-01-01``, ``-0001-11-28``: the rows arrive so
from :func:`~fanout.contract.dead_letters.letter_rows`), a day-time
interval as an ISO 8601 duration of days and seconds (``P1DT3600.5S``, ``-P0DT1S``: Arrow
does not say which fields a Spark interval has, so not Spark's ``INTERVAL '...'`` text). A
map is an object; a key that is not a string is its JSON text (``1``, ``true``, a binary
key's base64, a struct key's object: ``to_json`` writes an integer key so too). A row a sink
hands over already as JSON (a PostgreSQL partition's refused row) must be this JSON already
(the PostgreSQL sink builds it with :func:`letter_json` on the executors): it is written
again as it reads.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from fanout.contract.calendar import iso_text
from fanout.contract.dead_letters import MapPairs
from fanout.contract.spark_json import spark_json
from fanout.contract.spark_text import double_text

if TYPE_CHECKING:
    import pyarrow as pa

    from fanout.contract.batch import Batch
    from fanout.contract.dead_letters import DeadLetter, Source


def letter_schema() -> pa.Schema:
    """The columns of every dead-letter Delta table, whatever the sink.

    ``value``, ``row`` and ``details`` hold JSON text; ``partition`` is null for a route's
    letters and for sinks without partitions.
    """
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("pipeline", pa.string(), nullable=False),
            pa.field("sink", pa.string(), nullable=False),
            pa.field("batch_id", pa.int64(), nullable=False),
            pa.field("epoch", pa.int64(), nullable=False),
            pa.field("source", pa.string(), nullable=False),
            pa.field("partition", pa.int32()),
            pa.field("reason", pa.string(), nullable=False),
            pa.field("column", pa.string()),
            pa.field("value", pa.string()),
            pa.field("row", pa.string()),
            pa.field("details", pa.string()),
            pa.field("recorded_at", pa.timestamp("us", tz="UTC"), nullable=False),
        ]
    )


def to_records(batch: Batch, letters: Sequence[DeadLetter], source: Source) -> list[dict[str, Any]]:
    """Dead letters as rows of :func:`letter_schema`."""
    now = datetime.now(UTC)
    return [
        {
            "pipeline": batch.pipeline,
            "sink": batch.sink_name,
            "batch_id": batch.batch_id,
            "epoch": batch.info.epoch,
            "source": source,
            "partition": letter.partition,
            "reason": letter.reason,
            "column": letter.column,
            "value": None if letter.value is None else letter_json(letter.value),
            "row": None if letter.row is None else letter_json(dict(letter.row)),
            "details": letter_json(dict(letter.details)) if letter.details else None,
            "recorded_at": now,
        }
        for letter in letters
    ]


def letter_json(value: Any) -> str:
    """``value`` (a row, a value or details as Arrow's ``to_pylist`` or a sink hands them
    over) as the JSON text of a dead letter, losing nothing (see the module docstring).

    A map may arrive as a dict, a :class:`~fanout.contract.dead_letters.MapPairs` (from
    :func:`~fanout.contract.dead_letters.letter_rows`) or, from Arrow's ``to_pylist``, as a
    list of ``(key, value)`` pairs; each becomes an object (an Arrow map that is empty
    cannot be told from an empty array unless it is a ``MapPairs``). A value of a type none
    of these forms covers is written as its ``str()``. A float is spelled as Spark's
    ``to_json`` spells it (``1.0E20``, not ``1e+20``:
    :func:`~fanout.contract.spark_json.spark_json`).
    """
    return spark_json(_plain(value))


def _plain(value: Any) -> Any:
    """``value`` as what :func:`json.dumps` writes without loss."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value  # NaN and the infinities quoted by spark_json
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, date | time):  # datetime too; an instant in UTC
        return iso_text(value)
    if isinstance(value, timedelta):
        return _duration(value)
    if isinstance(value, Mapping):
        return {_key(k): _plain(v) for k, v in value.items()}
    if isinstance(value, MapPairs) or (
        isinstance(value, list) and value and all(_is_pair(item) for item in value)
    ):
        return {_key(k): _plain(v) for k, v in value}  # an Arrow map: (key, value) pairs
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return str(value)


def _is_pair(item: Any) -> bool:
    return isinstance(item, tuple) and len(item) == 2


def _key(key: Any) -> str:
    """A map key as an object key: a string as is, any other key as the JSON text of its
    plain form (``1``, ``true``, a binary key's base64, ``{"a": 1}``)."""
    plain = _plain(key)
    if isinstance(plain, float):
        return double_text(plain)  # as to_json writes it: 1.0E20, NaN
    return plain if isinstance(plain, str) else spark_json(plain)


def _duration(value: timedelta) -> str:
    """An ISO 8601 duration of whole days and seconds, exact to the microsecond (what
    ``java.time.Duration.parse`` reads): ``P1DT3600.5S``, ``-P0DT0.000001S``."""
    micros = value // timedelta(microseconds=1)
    days, rest = divmod(abs(micros), 86_400 * 1_000_000)
    seconds, fraction = divmod(rest, 1_000_000)
    text = f"{'-' if micros < 0 else ''}P{days}DT{seconds}"
    if fraction:
        text += f".{fraction:06d}".rstrip("0")
    return text + "S"
