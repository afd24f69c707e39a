"""JSON text whose floats are spelled as Spark's ``to_json`` spells them, for every place
fanout writes a row's value as JSON (a Kafka record, a dead letter, a PostgreSQL ``json``
value): ``1.0E20``, ``1.0E-4``, ``0.1`` (Java's ``Double.toString``:
:func:`~fanout.contract.spark_text.double_text`), not Python's ``1e+20``, ``0.0001``; a NaN
or an infinity as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (JSON has no such
numbers; Python would write a bare ``NaN``, which no JSON reader takes). The same value is
then the same text in every sink and in its dead letters.

A ``float`` (32-bit) value must arrive as the double of its own Spark text
(:func:`~fanout.contract.float32.widened`), or its widened double's digits are spelled.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from fanout.contract.spark_text import double_text

COMPACT = (",", ":")
"""``separators`` for JSON without spaces (a Kafka record)."""


def float_json(value: float) -> str:
    """One float as JSON, as Spark's ``to_json`` writes it: ``1.0E20``, ``"NaN"``."""
    text = double_text(value)
    return text if math.isfinite(value) else f'"{text}"'


def spark_json(
    value: Any,
    *,
    default: Callable[[Any], Any] | None = None,
    separators: tuple[str, str] | None = None,
) -> str:
    """``json.dumps(value, default=default, separators=separators, ensure_ascii=False)``,
    but each float in it (at any depth) spelled by :func:`float_json`. A dict's keys are
    written as ``json.dumps`` writes them (a key that is a float is the caller's to spell)."""
    texts: list[str] = []
    text = json.dumps(
        _marked(value, texts), default=default, separators=separators, ensure_ascii=False
    )
    if not texts:
        return text
    pieces = text.split(_MARK_JSON)  # the k-th mark is the k-th float met by _marked
    joined = [pieces[0]]
    for float_text, piece in zip(texts, pieces[1:], strict=True):
        joined += (float_text, piece)
    return "".join(joined)


_MARK = "\ud800"
"""A float's place in a value before its JSON is written (:func:`_marked`): a lone
surrogate, which no string of a row holds (Arrow's strings are UTF-8, which cannot encode
one), and which ``json.dumps`` keeps as it is with ``ensure_ascii=False``."""
_MARK_JSON = f'"{_MARK}"'


def _marked(value: Any, texts: list[str]) -> Any:
    """``value`` with each float replaced by :data:`_MARK`, its JSON text appended to
    ``texts`` in the order ``json.dumps`` writes them: the ``json`` module writes a float
    as Python's ``repr`` (``1e+20``) and offers no hook to write it otherwise."""
    kind = type(value)
    if kind is float:
        texts.append(float_json(value))
        return _MARK
    if kind is dict:  # a row: most of its values need no walk (one call less each)
        return {k: v if type(v) in _LEAVES else _marked(v, texts) for k, v in value.items()}
    if isinstance(value, dict):
        return {key: _marked(item, texts) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_marked(item, texts) for item in value]
    if isinstance(value, float):  # a float's subclass (numpy's float64)
        texts.append(float_json(float(value)))
        return _MARK
    return value


_LEAVES = frozenset({str, int, bool, type(None)})

__all__ = ["COMPACT", "float_json", "spark_json"]
