"""Dates and timestamps from the integers Arrow and Spark store, for any year.

Python's ``datetime`` holds the years 1 to 9999 only, while Spark holds dates and
timestamps outside them (``date_add(DATE'0001-01-01', -1)`` is 0000-12-31): a sink writing
such values as text computes them from their integers with these. Each sink formats the
parts as its target spells a year (Delta's log and Spark's ``to_json`` differ).
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time

MICROS_PER_DAY = 86_400_000_000


def civil(days: int) -> tuple[int, int, int]:
    """The proleptic Gregorian ``(year, month, day)`` of ``days`` since 1970-01-01, for
    any year (astronomical: the year before 1 is 0; Howard Hinnant's ``civil_from_days``)."""
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (month <= 2), month, day


def clock(micros: int) -> tuple[int, int, int, int, int]:
    """``micros`` since 1970-01-01T00:00 as ``(days, hours, minutes, seconds,
    microseconds)``, the days since 1970-01-01 (negative before it)."""
    days, rest = divmod(micros, MICROS_PER_DAY)
    seconds, fraction = divmod(rest, 1_000_000)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    return days, hours, minutes, seconds, fraction


def iso_text(value: date | time) -> str:
    """A date, time or timestamp as ISO 8601 text, whatever zone Spark's session gave it:
    an instant (an aware ``datetime``) in UTC with its offset
    (``2024-01-02T03:04:05.123456+00:00``, the fraction only when not zero), a
    ``timestamp_ntz`` (naive) as its own wall clock, without offset."""
    if isinstance(value, datetime) and value.utcoffset() is not None:
        return value.astimezone(UTC).isoformat()
    return value.isoformat()
