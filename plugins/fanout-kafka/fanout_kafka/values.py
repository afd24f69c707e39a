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
import math
from typing import Any

from fanout.contract.calendar import iso_text
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
    ``CAST(x AS STRING)`` and ``to_json`` spell it (``1.0E20``, ``1.0E-4``:
    :func:`~fanout.contract.spark_text.double_text`), a NaN or an infinity as Spark's
    ``to_json`` writes it: ``"NaN"``, ``"Infinity"``, ``"-Infinity"``."""
    texts: list[str] = []
    text = json.dumps(
        _marked(value, texts), default=json_default, separators=(",", ":"),
        ensure_ascii=False,
    )  # fmt: skip
    if not texts:
        return text
    pieces = text.split(_MARK_JSON)  # the k-th mark is the k-th float met by _marked
    joined = [pieces[0]]
    for float_text, piece in zip(texts, pieces[1:], strict=True):
        joined += (float_text, piece)
    return "".join(joined)


_MARK = "\ud800"
"""A float's place in a row before its JSON is written (:func:`_marked`): a lone
surrogate, which no string of a row holds (Arrow's strings are UTF-8, which cannot encode
one), and which ``json.dumps`` keeps as it is."""
_MARK_JSON = f'"{_MARK}"'


def _marked(value: Any, texts: list[str]) -> Any:
    """``value`` with each float replaced by :data:`_MARK`, its JSON text appended to
    ``texts`` in the order ``json.dumps`` writes them: the ``json`` module writes a float
    as Python's ``repr`` (``1e+20``) and offers no hook to write it otherwise."""
    kind = type(value)
    if kind is float:
        texts.append(double_text(value) if math.isfinite(value) else f'"{double_text(value)}"')
        return _MARK
    if kind is dict:  # a row: most of its values need no walk (one call less each)
        return {k: v if type(v) in _LEAVES else _marked(v, texts) for k, v in value.items()}
    if isinstance(value, dict):
        return {key: _marked(item, texts) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_marked(item, texts) for item in value]
    return value


_LEAVES = frozenset({str, int, bool, type(None)})


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
