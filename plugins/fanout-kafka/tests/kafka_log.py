"""A topic's committed records read from the log itself, for a checker on a broker that
shows aborted transactions to ``read_committed`` readers (Tansu).

A ``read_committed`` reader (librdkafka) drops an aborted transaction's records because
the fetch response lists the aborted transactions; Tansu always sends that list empty, but
it does write the transaction markers into the log: an ABORT control batch after an
aborted transaction (also after one fenced by a new producer with the same
``transactional.id``), a COMMIT control batch after a committed one. So this fetches the
record batches raw (``Fetch`` v4, ``read_uncommitted``) and keeps a transactional batch's
records only once a COMMIT marker of its producer follows: what a ``read_committed``
reader of Kafka returns. Uncompressed batches only (the tests' producers compress
nothing), one broker.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

FETCH_BYTES = 4 << 20
_ABORT, _COMMIT = 0, 1
_CONTROL, _TRANSACTIONAL, _COMPRESSION = 0x20, 0x10, 0x07


@dataclass(frozen=True)
class LogRecord:
    """One record of the log: where it is, and what it holds."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    producer: tuple[int, int] = (-1, -1)
    """The batch's producer id and epoch."""
    headers: tuple[tuple[bytes | None, bytes | None], ...] = ()


def committed_records(bootstrap: str, topic: str, partitions: int) -> list[LogRecord]:
    """Every record of ``topic`` outside a transaction or in a committed one, in log order
    per partition (a transaction still open at the end of the log is left out)."""
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        found: list[LogRecord] = []
        for partition in range(partitions):
            found += _partition_records(sock, topic, partition)
        return found


def committed_values(bootstrap: str, topic: str) -> list[bytes]:
    """The values of :func:`committed_records`, over every partition of ``topic``."""
    from confluent_kafka.admin import AdminClient

    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        metadata = admin.list_topics(topic, timeout=30)
    partitions = len(metadata.topics[topic].partitions)
    records = committed_records(bootstrap, topic, partitions)
    return [r.value for r in records if r.value is not None]


def describe_duplicates(bootstrap: str, topic: str, limit: int = 20) -> str:
    """Where the committed records whose value occurs more than once sit in the log: each
    copy's partition, offset, producer (id, epoch) and headers, for a failure message."""
    from collections import defaultdict

    from confluent_kafka.admin import AdminClient

    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        metadata = admin.list_topics(topic, timeout=30)
    partitions = len(metadata.topics[topic].partitions)
    copies: dict[bytes | None, list[LogRecord]] = defaultdict(list)
    for record in committed_records(bootstrap, topic, partitions):
        copies[record.value].append(record)
    lines = []
    for value, found in copies.items():
        if len(found) < 2:
            continue
        where = "; ".join(
            f"p{r.partition}@{r.offset} producer {r.producer} "
            + ",".join(f"{(k or b'').decode()}={(v or b'').decode()}" for k, v in r.headers)
            for r in found
        )
        lines.append(f"{(value or b'').decode()[:80]}: {where}")
    shown = lines[:limit] + ([f"... {len(lines) - limit} more"] if len(lines) > limit else [])
    return "\n".join(shown)


def _partition_records(sock: socket.socket, topic: str, partition: int) -> list[LogRecord]:
    kept: list[LogRecord] = []
    open_txns: dict[tuple[int, int], list[LogRecord]] = {}  # (producer id, epoch) -> records
    offset = 0
    while True:
        batches = _fetch(sock, topic, partition, offset)
        if not batches:
            return kept
        for batch in batches:
            producer = (batch.producer_id, batch.producer_epoch)
            if batch.control:
                pending = open_txns.pop(producer, [])
                if batch.control_type == _COMMIT:
                    kept += pending
            elif batch.transactional:
                open_txns.setdefault(producer, []).extend(batch.records)
            else:
                kept += batch.records
            offset = batch.next_offset


@dataclass
class _Batch:
    next_offset: int
    producer_id: int
    producer_epoch: int
    control: bool
    transactional: bool
    control_type: int | None
    records: list[LogRecord]


def _fetch(sock: socket.socket, topic: str, partition: int, offset: int) -> list[_Batch]:
    body = struct.pack(">iiiib", -1, 100, 1, FETCH_BYTES, 0)  # read_uncommitted
    body += struct.pack(">i", 1) + _string(topic)
    body += struct.pack(">iiqi", 1, partition, offset, FETCH_BYTES)
    request = struct.pack(">hhi", 1, 4, partition) + _string("fanout-log-check") + body
    sock.sendall(struct.pack(">i", len(request)) + request)
    (size,) = struct.unpack(">i", _receive(sock, 4))
    reader = _Reader(_receive(sock, size))
    reader.take(">i")  # correlation id
    reader.take(">i")  # throttle time
    batches: list[_Batch] = []
    for _ in range(reader.take(">i")):
        reader.string()
        for _ in range(reader.take(">i")):
            got = reader.take(">i")
            error = reader.take(">h")
            reader.take(">q"), reader.take(">q")  # high watermark, last stable offset
            for _ in range(max(reader.take(">i"), 0)):
                reader.take(">q"), reader.take(">q")  # aborted transactions (Tansu: none)
            raw = reader.bytes32() or b""
            if error:
                raise RuntimeError(f"fetch of {topic}[{got}] at {offset}: error code {error}")
            batches += _batches(raw, got)
    return batches


def _batches(raw: bytes, partition: int) -> list[_Batch]:
    """The whole record batches of ``raw`` (a fetch may end in a partial one)."""
    batches, at = [], 0
    while at + 12 <= len(raw):
        base, length = struct.unpack_from(">qi", raw, at)
        if at + 12 + length > len(raw):
            break
        reader = _Reader(raw[at + 12 : at + 12 + length])
        at += 12 + length
        reader.take(">i")  # partition leader epoch
        magic = reader.take(">b")
        if magic != 2:
            raise ValueError(f"record batch magic {magic}: only v2 batches are read")
        reader.take(">I")  # crc
        attributes = reader.take(">h")
        if attributes & _COMPRESSION:
            raise ValueError("compressed record batch: only uncompressed batches are read")
        last_delta = reader.take(">i")
        reader.take(">q"), reader.take(">q")  # timestamps
        producer_id, epoch = reader.take(">q"), reader.take(">h")
        reader.take(">i")  # base sequence
        producer = (producer_id, epoch)
        records = [_record(reader, base, partition, producer) for _ in range(reader.take(">i"))]
        control = bool(attributes & _CONTROL)
        control_type = None
        if control and records and records[0].key is not None:
            control_type = struct.unpack_from(">h", records[0].key, 2)[0]
        transactional = bool(attributes & _TRANSACTIONAL)
        next_offset = base + last_delta + 1
        batches.append(
            _Batch(next_offset, producer_id, epoch, control, transactional, control_type, records)
        )
    return batches


def _record(reader: _Reader, base: int, partition: int, producer: tuple[int, int]) -> LogRecord:
    reader.varint()  # length
    reader.take(">b")  # attributes
    reader.varint()  # timestamp delta
    offset = base + reader.varint()
    key, value = reader.varbytes(), reader.varbytes()
    headers = tuple((reader.varbytes(), reader.varbytes()) for _ in range(reader.varint()))
    return LogRecord(partition, offset, key, value, producer, headers)


class _Reader:
    """Big-endian fields and zigzag varints, read in order."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return int(value)

    def string(self) -> str:
        size = self.take(">h")
        text = self.data[self.at : self.at + size].decode()
        self.at += size
        return text

    def bytes32(self) -> bytes | None:
        size = self.take(">i")
        if size < 0:
            return None
        chunk = self.data[self.at : self.at + size]
        self.at += size
        return chunk

    def varint(self) -> int:
        shift = raw = 0
        while True:
            byte = self.data[self.at]
            self.at += 1
            raw |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (raw >> 1) ^ -(raw & 1)
            shift += 7

    def varbytes(self) -> bytes | None:
        size = self.varint()
        if size < 0:
            return None
        chunk = self.data[self.at : self.at + size]
        self.at += size
        return chunk


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def _receive(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
