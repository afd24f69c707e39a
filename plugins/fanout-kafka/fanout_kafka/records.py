"""Rows to Kafka records: key, value and headers, checked before anything is sent.

A partition's rows are encoded and checked *before* its transaction begins, so a record
the topic cannot take fails the batch (or goes to the dead-letter target) without a byte
on the broker, and the transaction stays open only while its records are being sent.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import TYPE_CHECKING, Any, NamedTuple

from fanout.contract.spark_json import spark_json
from fanout.partitioned.worker_gc import collection_paused
from fanout_kafka.values import json_bytes, json_default, to_bytes

if TYPE_CHECKING:
    import pyarrow as pa

    from fanout.contract.dead_letters import DeadLetter

RECORD_OVERHEAD_BYTES = 36
"""A record's own framing at most, as librdkafka counts it against the producer's
``message.max.bytes`` (``RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD``: the varints of length,
timestamp and offset deltas, key and value lengths and header count at their widest, and
the attributes byte)."""

RECORD_BATCH_HEADER_BYTES = 61
"""The v2 record batch header, which the broker counts with the records against the
topic's ``max.message.bytes`` (a record alone in its batch: its size plus this)."""

LIMIT_SOURCES = (
    "max_record_bytes: by default the topic's max.message.bytes less the record batch "
    "header, at most the producer's message.max.bytes; sizes as librdkafka counts them"
)
"""Where the sink's record size limit comes from, for its messages."""

Headers = list[tuple[str, bytes]]

BATCH_HEADERS = ("fanout.pipeline", "fanout.sink", "fanout.batch_id")
"""The fixed headers of every record (``headers`` true or a list of columns)."""

ERROR_HEADER, TOPIC_HEADER, SIZE_HEADER = "fanout.error", "fanout.topic", "fanout.record_bytes"
"""What every letter to a ``kafka:`` dead-letter topic adds (:func:`dead_letter_headers`)."""
COLUMN_HEADER, VALUE_HEADER = "fanout.column", "fanout.value"
"""What a route letter adds: the column and the value the route refused."""

LETTER_HEADERS = (ERROR_HEADER, TOPIC_HEADER, SIZE_HEADER, COLUMN_HEADER, VALUE_HEADER)
"""The headers a letter to a ``kafka:`` dead-letter topic adds to the record's own."""

FIXED_HEADERS = BATCH_HEADERS + LETTER_HEADERS
"""Every header name fanout writes itself: a header column of one of these names would
put a second header of that name on the record (a consumer reading the first one gets the
wrong value), so the ``headers`` option refuses them."""


class Record(NamedTuple):
    """One Kafka record, ready to produce (a tuple: a partition holds a million)."""

    key: bytes | None
    value: bytes | None
    headers: Headers

    @property
    def size(self) -> int:
        """The record's size as librdkafka counts it against ``message.max.bytes``: key,
        value, each header with its two length varints, and :data:`RECORD_OVERHEAD_BYTES`
        (a bound of its size on the wire)."""
        return (
            len(self.key or b"")
            + len(self.value or b"")
            + headers_size(self.headers)
            + RECORD_OVERHEAD_BYTES
        )


def headers_size(headers: Iterable[tuple[str, bytes]]) -> int:
    """The bytes of ``headers`` in a record as librdkafka counts them: each name (UTF-8)
    and value, each preceded by its length as a zigzag varint."""
    total = 0
    for name, value in headers:
        size = len(name.encode())
        total += size + _varint_size(size) + len(value) + _varint_size(len(value))
    return total


def _varint_size(length: int) -> int:
    """The bytes of ``length`` as a zigzag varint (7 bits a byte of ``2 * length``)."""
    return max(1, ((2 * length).bit_length() + 6) // 7)


@dataclass(frozen=True)
class BadRecord:
    """A record the topic cannot take, and why."""

    record: Record
    reason: str


@dataclass(frozen=True)
class Encoder:
    """Encodes rows (dicts) into records.

    :param key_columns: the key: one column (its text or bytes) or several (a JSON array);
        ``None`` for keyless records. A null in a key column is a bad record.
    :param value_column: ``None`` for the JSON of the whole row, else a string or binary
        column taken as is (a null value is a tombstone).
    :param header_columns: columns added as headers (their text, or bytes).
    :param headers: fixed headers added to every record (pipeline, sink, batch id).
    :param max_record_bytes: records over this size are bad records.
    """

    key_columns: tuple[str, ...] | None
    value_column: str | None
    header_columns: tuple[str, ...]
    headers: tuple[tuple[str, bytes], ...]
    max_record_bytes: int

    def encode(self, row: Mapping[str, Any]) -> Record | BadRecord:
        """One row as a record, or as a bad record saying why it cannot be sent."""
        headers: Headers = list(self.headers)
        for column in self.header_columns:
            value = row.get(column)
            if value is not None:
                headers.append((column, to_bytes(value)))
        value = (
            json_bytes(row)
            if self.value_column is None
            else _optional_bytes(row[self.value_column])
        )
        key: bytes | None = None
        null_key: str | None = None
        if self.key_columns is not None:
            nulls = [c for c in self.key_columns if row.get(c) is None]
            if nulls:
                null_key = ", ".join(map(repr, nulls))
            elif len(self.key_columns) == 1:
                key = to_bytes(row[self.key_columns[0]])
            else:
                key = json_bytes([row[c] for c in self.key_columns])
        record = Record(key, value, headers)
        if null_key is not None:
            return BadRecord(
                record, f"null key: key column(s) {null_key} are null in row {_preview(row)}"
            )
        if record.size > self.max_record_bytes:
            return BadRecord(
                record,
                f"{named(record)} is over the sink's limit of {self.max_record_bytes} bytes "
                f"({LIMIT_SOURCES})",
            )
        return record

    def encode_arrow(
        self, batches: Iterable[pa.RecordBatch]
    ) -> tuple[list[Record], list[BadRecord]]:
        """Every row of Arrow record batches encoded (as :meth:`encode_all` would), column
        by column where the types allow it (:mod:`fanout_kafka.vector`)."""
        good: list[Record] = []
        bad: list[BadRecord] = []
        for more_good, more_bad in self.encoded_batches(batches):
            good += more_good
            bad += more_bad
        return good, bad

    def encoded_batches(
        self, batches: Iterable[pa.RecordBatch]
    ) -> Iterator[tuple[list[Record], list[BadRecord]]]:
        """:meth:`encode_arrow` one batch at a time: each non-empty batch's good and bad
        records, as the batch is encoded."""
        for batch in batches:
            if batch.num_rows:
                yield self._encode_batch(batch)

    def _encode_batch(self, batch: pa.RecordBatch) -> tuple[list[Record], list[BadRecord]]:
        import pyarrow as pa
        import pyarrow.compute as pc

        from fanout.contract import float32
        from fanout_kafka import temporal, utf8

        table = float32.widened(pa.Table.from_batches([batch]))
        found = utf8.rows_not_utf8(table, self._text_columns(table.column_names))
        if found is None:
            return self._encode_table(table)
        rows, columns = found
        good, bad = self._encode_table(table.filter(pc.invert(rows)))
        broken = table.filter(rows)
        whys = utf8.reasons(broken, columns)
        letters = temporal.python_safe(utf8.as_bytes(broken, columns))
        for row, why in zip(letters.to_pylist(maps_as_pydicts="strict"), whys, strict=True):
            encoded = self.encode(row)
            record = encoded.record if isinstance(encoded, BadRecord) else encoded
            bad.append(BadRecord(record, f"{named(record)}: {why}"))
        return good, bad

    def _text_columns(self, names: Sequence[str]) -> list[str]:
        """The columns written as text (JSON, keys, headers): all but a value column."""
        if self.value_column is None:
            return list(names)
        return [*(self.key_columns or ()), *self.header_columns]

    def _encode_table(self, table: pa.Table) -> tuple[list[Record], list[BadRecord]]:
        import pyarrow.compute as pc

        from fanout_kafka import temporal, vector

        if table.num_rows == 0:
            return [], []
        values = (
            vector.json_rows(table)
            if self.value_column is None
            else vector.key_bytes(table.column(self.value_column))
        )
        keys: Any = None
        if self.key_columns is not None:
            keys = (
                vector.key_bytes(table.column(self.key_columns[0]))
                if len(self.key_columns) == 1
                else vector.json_arrays(table, self.key_columns)
            )
        if (
            values is None
            or (self.key_columns is not None and keys is None)
            or (self.header_columns)
        ):
            rows = temporal.python_safe(table).to_pylist(maps_as_pydicts="strict")
            return self.encode_all(rows)
        fixed = headers_size(self.headers) + RECORD_OVERHEAD_BYTES
        size = pc.add(pc.binary_length(values).fill_null(0), fixed)
        if keys is not None:
            size = pc.add(size, pc.binary_length(keys).fill_null(0))
        suspect = pc.greater(size, self.max_record_bytes)
        for column in self.key_columns or ():
            suspect = pc.or_(suspect, table.column(column).is_null())
        key_list = keys.to_pylist() if keys is not None else repeat(None)
        records = records_of(key_list, values.to_pylist(), self.headers)
        if not pc.any(suspect).as_py():
            return records, []
        encoded: list[Record | BadRecord] = list(records)
        # let the row-by-row path say why, in its words
        positions = pc.indices_nonzero(suspect).to_pylist()
        suspects = temporal.python_safe(table.take(positions))
        for position, row in zip(
            positions, suspects.to_pylist(maps_as_pydicts="strict"), strict=True
        ):
            encoded[position] = self.encode(row)
        good = [r for r in encoded if isinstance(r, Record)]
        bad = [r for r in encoded if isinstance(r, BadRecord)]
        return good, bad

    def encode_all(self, rows: Iterable[Mapping[str, Any]]) -> tuple[list[Record], list[BadRecord]]:
        """Every row encoded: the good records and the bad ones, in row order."""
        good: list[Record] = []
        bad: list[BadRecord] = []
        for row in rows:
            encoded = self.encode(row)
            if isinstance(encoded, BadRecord):
                bad.append(encoded)
            else:
                good.append(encoded)
        return good, bad


def records_of(
    keys: Iterable[bytes | None], values: Iterable[bytes | None],
    headers: Iterable[tuple[str, bytes]],
) -> list[Record]:  # fmt: skip
    """A record for each key and value, all sharing one list of ``headers`` (nothing
    mutates a record's headers)."""
    shared = list(headers)
    pairs = zip(keys, values, repeat(shared))
    # tuple.__new__ builds each Record in C; Record(...) runs a Python __new__ per row.
    # The tuples hold a list (headers), so the collector tracks them: paused, it does not
    # walk them ~every 700 records (~0.1 us a record).
    with collection_paused():
        return list(map(tuple.__new__, repeat(Record), pairs))


def batch_headers(pipeline: str, sink: str, batch_id: int) -> tuple[tuple[str, bytes], ...]:
    """The fixed headers of every record of one batch."""
    values = (pipeline.encode(), sink.encode(), str(batch_id).encode())
    return tuple(zip(BATCH_HEADERS, values, strict=True))


def dead_letter_headers(record: Record, reason: str, topic: str) -> Headers:
    """A dead letter's headers: the record's own, plus why and where it was bound."""
    return [
        *record.headers,
        (ERROR_HEADER, reason.encode()),
        (TOPIC_HEADER, topic.encode()),
        (SIZE_HEADER, str(record.size).encode()),
    ]


def bad_letter(bad: BadRecord, topic: str, partition: int | None) -> DeadLetter:
    """A bad record as a core dead letter: the record's key, value and headers (a list of
    ``[name, value]`` pairs, in order, repeats kept) in ``details``, each byte kept
    (:func:`letter_bytes`), with the topic it was bound for and its size."""
    from fanout.contract.dead_letters import DeadLetter

    record = bad.record
    return DeadLetter(
        row=None,
        reason=bad.reason,
        partition=partition,
        details={
            "topic": topic,
            "key": letter_bytes(record.key),
            "value": letter_bytes(record.value),
            "headers": [[k, letter_bytes(v)] for k, v in record.headers],
            "record_bytes": record.size,
        },
    )


def letter_bytes(value: bytes | None) -> str | dict[str, str] | None:
    """Record bytes in a dead letter, losing none: their text when they are UTF-8, else
    ``{"base64": "<their base64>"}`` (base64 as the core writes binary values; the object
    tells it from text)."""
    if value is None:
        return None
    try:
        return value.decode()
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(value).decode("ascii")}


def _optional_bytes(value: Any) -> bytes | None:
    return None if value is None else to_bytes(value)


def _preview(row: Mapping[str, Any], limit: int = 200) -> str:
    """``row`` as JSON for an error message, its floats spelled as everywhere else fanout
    writes a value (Spark's ``1.0E20``, not Python's ``1e+20``), cut at ``limit``."""
    text = spark_json(dict(row), default=json_default)
    return text if len(text) <= limit else text[:limit] + "..."


def named(record: Record) -> str:
    """``record of <size> bytes (key '<key>')``: how messages name a record."""
    return f"record of {record.size} bytes (key {_preview_bytes(record.key)})"


def _preview_bytes(value: bytes | None, limit: int = 80) -> str:
    if value is None:
        return "null"
    text = value[:limit].decode(errors="replace")
    return repr(text + ("..." if len(value) > limit else ""))


def first(items: Sequence[BadRecord], count: int = 3) -> str:
    """The reasons of the first few bad records, for an error message."""
    shown = "; ".join(b.reason for b in items[:count])
    more = f" (and {len(items) - count} more)" if len(items) > count else ""
    return shown + more
