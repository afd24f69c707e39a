"""A row's values as Kafka bytes: keys and headers as text or JSON, rows as compact JSON
(dates ISO 8601, decimals as text, bytes base64). Shared by the row and the vectorised
encoders."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from typing import Any


def to_bytes(value: Any) -> bytes:
    """A key or header value as bytes: text as UTF-8, bytes as is, anything else as its
    JSON text (numbers, booleans, dates...)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    text = json.dumps(value, default=json_default, separators=(",", ":"), ensure_ascii=False)
    return text.strip('"').encode()


def json_bytes(value: Any) -> bytes:
    """Compact JSON (UTF-8) of a row or a list of values."""
    return json.dumps(
        value, default=json_default, separators=(",", ":"), ensure_ascii=False
    ).encode()


def json_default(value: Any) -> Any:
    """JSON for what ``json`` cannot write: dates and times as ISO 8601, decimals as
    text, bytes as base64."""
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")
