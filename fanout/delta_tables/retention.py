"""Delta's retention properties against fanout.

``delta.setTransactionRetentionDuration`` against fanout's transaction ids: fanout skips a
batch a Delta table already holds by the table's transaction ``(app id, batch id)``. A
table with ``delta.setTransactionRetentionDuration`` forgets a transaction once its
``lastUpdated`` is older than that: delta-rs when it reads the log, delta-spark at its
checkpoints. A batch written to the table but not yet marked in the ledger when the
pipeline stopped (a crash between the two) is then written a second time by a restart that
comes later than the retention. Sinks and the ledger check the property when they open;
:func:`retention_of` reads it.

``delta.logRetentionDuration`` against a long-running stream: every batch adds a file to
a table's log, and delta-rs lists the whole log directory at each commit. fanout's own
tables keep :data:`OWN_LOG_RETENTION`; a sink table on disk whose log is long is a warning
(:func:`long_log_advice`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import timedelta

from fanout.contract.locations import local_path
from fanout.errors import ConfigurationError

PROPERTY = "delta.setTransactionRetentionDuration"
"""The Delta table property that expires transaction ids."""

LOG_RETENTION_PROPERTY = "delta.logRetentionDuration"
"""The Delta table property saying how long log files are kept (checkpoints keep the
table's state, transaction ids included, so it bounds time travel, not the marks)."""

OWN_LOG_RETENTION = "interval 15 minutes"
"""How much Delta log fanout's own tables keep (the ledger, the spool): delta-rs lists every
file of the log directory at each commit, and fanout reads no old version of them."""

LEDGER_FLOOR = timedelta(days=3650)
"""The shortest retention the ledger table accepts: its epoch id is written once per
epoch and its high-water mark only by commits, so any retention a pipeline can outlive
would make it forget which batches are done."""

LONG_LOG_FILES = 10_000
"""A log directory this long costs every batch's commit ~0.1 s: delta-rs lists its files
and checks each one's age at each commit (~10 us a file a batch on a local disk,
``bench/bench_aged.py``)."""

_US_PER_LOG_FILE = 10


def log_files_on_disk(path: str) -> int | None:
    """How many files the Delta table at ``path`` keeps in its ``_delta_log`` directory,
    when the path is on a local or mounted disk; ``None`` for an object store (counting
    would list it) or when there is no log."""
    local = local_path(path)
    if local is None:
        return None
    log = os.path.join(local, "_delta_log")
    try:
        with os.scandir(log) as entries:
            return sum(1 for _ in entries)
    except OSError:
        return None


def long_log_advice(where: str, files: int, configuration: Mapping[str, str | None]) -> str:
    """The warning for a table whose log directory holds ``files`` files: what it costs a
    batch, and how to keep less."""
    retention = configuration.get(LOG_RETENTION_PROPERTY)
    kept = f"{retention!r}" if retention else "unset: Delta keeps 30 days"
    return (
        f"{where} keeps {files:,} files in its _delta_log ({LOG_RETENTION_PROPERTY} "
        f"{kept}); delta-rs lists them and checks each one's age at every commit, about "
        f"{files * _US_PER_LOG_FILE / 1e6:.2f} s a batch on a local disk. If nothing needs "
        f"its older versions (time travel, a sink's backfill_from), keep less log: ALTER "
        f"TABLE ... SET TBLPROPERTIES ('{LOG_RETENTION_PROPERTY}' = 'interval 1 day') "
        f"(delta-rs: DeltaTable(path).alter.set_table_properties({{"
        f"'{LOG_RETENTION_PROPERTY}': 'interval 1 day'}})); the next commits remove the "
        f"older log, up to the last checkpoint"
    )


_UNITS = {
    "microsecond": timedelta(microseconds=1),
    "millisecond": timedelta(milliseconds=1),
    "second": timedelta(seconds=1),
    "minute": timedelta(minutes=1),
    "hour": timedelta(hours=1),
    "day": timedelta(days=1),
    "week": timedelta(weeks=1),
}
_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+?)s?\s*(?=\d|$)")


def parse_interval(text: str) -> timedelta:
    """A Delta interval property (``"interval 7 days"``, ``"interval 1 day 12 hours"``)
    as a ``timedelta``; ``ValueError`` when it is not one."""
    body = text.strip().lower()
    if body.startswith("interval"):
        body = body[len("interval") :]
    body = body.strip()
    total, pos = timedelta(0), 0
    while pos < len(body):
        match = _PART.match(body, pos)
        if match is None or match.group(2) not in _UNITS:
            raise ValueError(f"not a Delta interval: {text!r}")
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos == 0:
        raise ValueError(f"not a Delta interval: {text!r}")
    return total


def retention_of(configuration: Mapping[str, str | None] | None, where: str) -> timedelta | None:
    """The table's transaction retention (``None``: not set, ids never expire).

    :param where: names the table in the error raised for a value that is no interval.
    """
    value = (configuration or {}).get(PROPERTY)
    if value is None:
        return None
    try:
        return parse_interval(value)
    except ValueError:
        raise ConfigurationError(
            f"{where}: table property {PROPERTY} = {value!r} is not an interval fanout can "
            "read (e.g. 'interval 30 days'); fanout cannot tell when its transaction ids "
            "expire. Set it to such a value or remove it"
        ) from None


def short_retention_error(
    where: str, value: str, floor: timedelta, consequence: str, other_remedy: str = ""
) -> str:
    """The message refusing a retention shorter than ``floor``: where, the property, its
    value, what it breaks and what to do."""
    days = _days(floor)
    return (
        f"{where}: table property {PROPERTY} = {value!r} expires fanout's transaction ids "
        f"after less than {_show(floor)}; {consequence}. Remove the property (Spark SQL: "
        f"ALTER TABLE ... UNSET TBLPROPERTIES ('{PROPERTY}')) or set it to at least "
        f"'interval {days} days' (delta-rs: DeltaTable(path).alter.set_table_properties("
        f"{{'{PROPERTY}': 'interval {days} days'}}))"
        + (f", or {other_remedy}" if other_remedy else "")
    )


def _show(span: timedelta) -> str:
    hours = span.total_seconds() / 3600
    return f"{hours:g} hours" if hours < 48 else f"{hours / 24:g} days"


def _days(span: timedelta) -> str:
    return f"{max(1.0, span.total_seconds() / 86400):g}"


def check_ledger_retention(configuration: Mapping[str, str | None] | None, where: str) -> None:
    """Refuse a ledger table whose transaction ids expire within :data:`LEDGER_FLOOR`."""
    retention = retention_of(configuration, where)
    if retention is not None and retention < LEDGER_FLOOR:
        raise ConfigurationError(
            short_retention_error(
                where,
                str((configuration or {})[PROPERTY]),
                LEDGER_FLOOR,
                "the ledger would forget its marks, the pipeline's high-water mark and its "
                "epoch, and with them which batches are done (fanout never sets it)",
            )
        )
