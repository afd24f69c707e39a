"""The Spark session settings a route's outcome depends on: part of its fingerprint.

A route is evaluated by the batch's Spark session, and some settings change which rows its
expressions refuse (or let through to an expression that refuses them). Each was tried on
Spark 4.2 with the same expression and rows under both values:

- ``spark.sql.ansi.enabled``: ``CAST('abc' AS INT)`` raises under ANSI, is null without it;
- ``spark.sql.session.timeZone``: ``CAST('2024-03-10 02:30:00' AS TIMESTAMP)`` is another
  instant in another zone (and ``hour()`` of an instant another hour), so a ``where`` or a
  division by it refuses other rows;
- ``spark.sql.timestampType``: ``CAST('... +05:00' AS TIMESTAMP)`` keeps or drops the offset;
- ``spark.sql.legacy.timeParserPolicy``: ``to_timestamp('1/2/2024', 'dd/MM/yyyy')`` parses
  under ``LEGACY`` and raises under ``CORRECTED``;
- ``spark.sql.decimalOperations.allowPrecisionLoss``: ``DECIMAL(38,18) * DECIMAL(38,18)`` of
  123.5 fits with it and overflows (raises) without it.

Not here: ``spark.sql.storeAssignmentPolicy`` (it rules a table insert's casts; a route's
``CAST`` raised alike under ``ANSI``, ``LEGACY`` and ``STRICT``).
"""

from __future__ import annotations

from typing import Any

ROUTE_SETTINGS: tuple[str, ...] = (
    "spark.sql.ansi.enabled",
    "spark.sql.session.timeZone",
    "spark.sql.timestampType",
    "spark.sql.legacy.timeParserPolicy",
    "spark.sql.decimalOperations.allowPrecisionLoss",
)
"""The settings a route's fingerprint covers (:meth:`fanout.routes.route.Route.stamp`)."""

Settings = tuple[tuple[str, str], ...]
"""``(key, value)`` pairs, in :data:`ROUTE_SETTINGS` order."""


def session_settings(df: Any) -> Settings:
    """The values of :data:`ROUTE_SETTINGS` in the session of the batch DataFrame ``df``
    (the one that evaluates its routes); none for an object without a Spark session (a
    test's stand-in), a setting the session cannot read left out."""
    spark = getattr(df, "sparkSession", None)
    conf = getattr(spark, "conf", None)
    if conf is None:
        return ()
    found: list[tuple[str, str]] = []
    for key in ROUTE_SETTINGS:
        try:
            value = conf.get(key)
        except Exception:  # a key this Spark does not know
            continue
        if value is not None:
            found.append((key, str(value)))
    return tuple(found)
