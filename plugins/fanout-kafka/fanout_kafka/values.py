"""A row's values as Kafka bytes: keys and headers as text or JSON, rows as compact JSON
(dates ISO 8601, instants in UTC, decimals as text, bytes base64, NaN and infinities as
the strings Spark's ``to_json`` writes, since JSON has no such numbers, maps with string
keys as objects). Shared by the row and the vectorised encoders. The column types these
cannot write faithfully are refused on the batch's schema first
(:mod:`fanout_kafka.json_types`)."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from typing import Any

from fanout.contract.calendar import iso_text
from fanout.contract.spark_json import COMPACT, spark_json
from fanout.contract.spark_text import double_text, plain_decimal


def to_bytes(value: Any) -> bytes:
    """A key or header value as bytes: text as UTF-8, bytes as is, anything else as its
    JSON text (numbers, booleans, dates...)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, float):
        return double_text(value).encode()
    if isinstance(value, list | tuple | dict):  # floats in it as in the value's JSON
        return json_text(value).encode()
    text = json.dumps(value, default=json_default, separators=(",", ":"), ensure_ascii=False)
    return text.strip('"').encode()


def json_bytes(value: Any) -> bytes:
    """Compact JSON (UTF-8) of a row or a list of values."""
    return json_text(value).encode()


def json_text(value: Any) -> str:
    """Compact JSON of ``value``; each float in it (at any depth) spelled as Spark's
    ``CAST(x AS STRING)`` and ``to_json`` spell it (``1.0E20``, ``1.0E-4``), a NaN or an
    infinity as Spark's ``to_json`` writes it: ``"NaN"``, ``"Infinity"``, ``"-Infinity"``
    (:func:`~fanout.contract.spark_json.spark_json`)."""
    return spark_json(value, default=json_default, separators=COMPACT)


def json_default(value: Any) -> Any:
    """JSON for what ``json`` cannot write: dates and times as ISO 8601 (an instant in UTC,
    ``+00:00``, whatever zone Spark's session gave it: the same instant is the same text,
    at the top level and nested, as the column-wise path writes it), decimals as plain text
    with their scale (Spark's ``CAST(d AS STRING)``),
    bytes as base64."""
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return iso_text(value)
    if isinstance(value, decimal.Decimal):
        return plain_decimal(value)  # not 1E-7
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")
