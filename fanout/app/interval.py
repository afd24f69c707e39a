"""The interval strings Spark takes as a processing-time trigger, checked without Spark.

``fanout run`` hands ``pipeline.trigger.processing_time`` to
``DataStreamWriter.trigger(processingTime=...)``; Spark parses it with its interval parser
(``IntervalUtils.stringToInterval``) when the query starts and refuses what it cannot read
with a JVM ``IllegalArgumentException``. This module mirrors what Spark 4.2 accepts (tried
against a real session): an optional ``interval`` prefix, then one or more
``<number> <unit>`` pairs separated by whitespace, case-insensitive; each number an integer
with an optional sign, seconds also with up to 9 decimals; units ``week``, ``day``,
``hour``, ``minute``, ``second``, ``millisecond``, ``microsecond`` (singular or plural;
``year`` and ``month`` only when they add up to 0 months); the total not negative. Spark
refuses abbreviations (``10s``, ``1 min``, ``500 ms``) and words (``ten seconds``).
"""

from __future__ import annotations

import re
from decimal import Decimal

_MICROS = {
    "week": 7 * 86_400_000_000,
    "day": 86_400_000_000,
    "hour": 3_600_000_000,
    "minute": 60_000_000,
    "second": 1_000_000,
    "millisecond": 1_000,
    "microsecond": 1,
}
_MONTHS = {"year": 12, "month": 1}
_SPACE = "[ \t\n\r\f\v]"  # what Spark trims and splits on: ASCII whitespace only
_PAIR = re.compile(
    rf"([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)){_SPACE}+([a-z]+?)s?(?:{_SPACE}+|$)", re.ASCII
)
_LONG_MAX = 2**63 - 1


def interval_ms(text: str) -> int | None:
    """The interval ``text`` in milliseconds as Spark's processing-time trigger reads it, or
    ``None`` when Spark would refuse it."""
    rest = re.sub(rf"^{_SPACE}+|{_SPACE}+$", "", text).lower()
    rest = re.sub(rf"^interval{_SPACE}+", "", rest)
    micros, months, pos = 0, 0, 0
    while pos < len(rest):
        match = _PAIR.match(rest, pos)
        if match is None:
            return None
        number, unit = match.group(1), match.group(2)
        if ("." in number and unit != "second") or len(number.partition(".")[2]) > 9:
            return None  # Spark takes a fraction of seconds only, to the nanosecond
        if unit in _MONTHS:
            months += int(number) * _MONTHS[unit]
        elif unit in _MICROS:
            micros += int(Decimal(number) * _MICROS[unit])
        else:
            return None
        if abs(micros) > _LONG_MAX:
            return None
        pos = match.end()
    if pos == 0 or months != 0 or micros < 0:
        return None
    return micros // 1000
