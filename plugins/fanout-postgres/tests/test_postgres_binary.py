"""The binary COPY encoder against a field-by-field reference written from PostgreSQL's
documented wire formats (``struct``, one value at a time)."""

from __future__ import annotations

import datetime as dt
import random
import struct
from typing import Any

import pyarrow as pa
import pytest
from fanout_postgres.binary import encoder_for

EPOCH_DATE = dt.date(2000, 1, 1)
EPOCH = dt.datetime(2000, 1, 1)
FIXED = {"int2": ">h", "int4": ">i", "int8": ">q", "float4": ">f", "float8": ">d"}
KINDS: dict[str, tuple[str, pa.DataType]] = {
    "i2": ("int2", pa.int16()),
    "i4": ("int4", pa.int32()),
    "i8": ("int8", pa.int64()),
    "f4": ("float4", pa.float32()),
    "f8": ("float8", pa.float64()),
    "flag": ("bool", pa.bool_()),
    "name": ("text", pa.string()),
    "raw": ("bytea", pa.binary()),
    "doc": ("json", pa.string()),
    "docb": ("jsonb", pa.string()),
    "day": ("date", pa.date32()),
    "at": ("timestamp", pa.timestamp("us")),
    "at_utc": ("timestamptz", pa.timestamp("us", tz="UTC")),
}


def reference(kind: str, value: Any) -> bytes:
    """One field as PostgreSQL's binary COPY format defines it."""
    if value is None:
        return struct.pack(">i", -1)
    if kind in FIXED:
        data = struct.pack(FIXED[kind], value)
    elif kind == "bool":
        data = b"\x01" if value else b"\x00"
    elif kind in ("text", "json"):
        data = value.encode()
    elif kind == "jsonb":
        data = b"\x01" + value.encode()
    elif kind == "bytea":
        data = value
    elif kind == "date":
        data = struct.pack(">i", (value - EPOCH_DATE).days)
    else:
        naive = value.replace(tzinfo=None) if value.tzinfo else value
        delta = naive - EPOCH
        data = struct.pack(">q", (delta.days * 86_400 + delta.seconds) * 10**6 + delta.microseconds)
    return struct.pack(">i", len(data)) + data


def random_value(kind: str, rng: random.Random) -> Any:
    if kind == "int2":
        return rng.randint(-(2**15), 2**15 - 1)
    if kind == "int4":
        return rng.randint(-(2**31), 2**31 - 1)
    if kind == "int8":
        return rng.randint(-(2**63), 2**63 - 1)
    if kind == "float4":
        return struct.unpack(">f", struct.pack(">f", rng.uniform(-1e6, 1e6)))[0]
    if kind == "float8":
        return rng.uniform(-1e300, 1e300)
    if kind == "bool":
        return rng.random() < 0.5
    if kind in ("text", "json", "jsonb"):
        return "".join(rng.choice('aé☃𝄞\t\n"\\,x') for _ in range(rng.randint(0, 12)))
    if kind == "bytea":
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 9)))
    if kind == "date":
        return EPOCH_DATE + dt.timedelta(days=rng.randint(-80_000, 80_000))
    moment = EPOCH + dt.timedelta(microseconds=rng.randint(-(10**15), 10**15))
    return moment.replace(tzinfo=dt.UTC) if kind == "timestamptz" else moment


def table_of(names: list[str], rows: int, null_share: float, seed: int) -> pa.Table:
    rng = random.Random(seed)
    columns = {
        name: pa.array(
            [
                None if rng.random() < null_share else random_value(KINDS[name][0], rng)
                for _ in range(rows)
            ],
            KINDS[name][1],
        )
        for name in names
    }
    return pa.table(columns)


def expected(table: pa.Table, kinds: list[str]) -> bytes:
    out = []
    for row in table.to_pylist():
        out.append(struct.pack(">h", len(kinds)))
        out.extend(reference(k, v) for k, v in zip(kinds, row.values(), strict=True))
    return b"".join(out)


ALL = list(KINDS)


@pytest.mark.parametrize(
    ("names", "null_share"),
    [
        (ALL, 0.0),  # every column fixed-width where it can be: few operands
        (ALL, 0.3),  # nulls everywhere: fixed columns field by field, lengths of -1
        (["i8", "f8", "at_utc"], 0.0),  # fixed-size only: the block is the rows
        (["i8", "f8", "at_utc"], 0.5),
        (["name", "docb", "raw"], 0.0),  # variable-size only
        (["docb", "i4", "doc"], 0.4),  # jsonb with nulls: the version byte moves into the values
        (["name"], 1.0),  # every value null
    ],
)
def test_rows_match_the_wire_format_field_by_field(names: list[str], null_share: float) -> None:
    table = table_of(names, 300, null_share, seed=len(names) * 7 + int(null_share * 10))
    kinds = [KINDS[n][0] for n in names]
    encode = encoder_for(table.schema, kinds)
    assert encode is not None
    assert encode(table) == expected(table, kinds)


def test_a_table_of_several_chunks_and_a_sliced_one_encode_like_one_piece() -> None:
    whole = table_of(ALL, 200, 0.2, seed=5)
    kinds = [KINDS[n][0] for n in ALL]
    encode = encoder_for(whole.schema, kinds)
    assert encode is not None
    chunked = pa.concat_tables([whole.slice(0, 70), whole.slice(70, 1), whole.slice(71)])
    assert chunked.column(0).num_chunks == 3
    assert encode(chunked) == expected(whole, kinds)
    assert encode(whole.slice(33, 50)) == expected(whole.slice(33, 50), kinds)
    assert encode(whole.slice(0, 0)) == b""
