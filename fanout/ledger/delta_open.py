"""Opening the ledger's Delta table (ARCHITECTURE §4): finding it, creating it, refusing a
table that is no ledger, and keeping its log short (maintenance). Functions of the
ledger's location and configuration, holding no state:
:class:`fanout.ledger.delta_table.LedgerTable` keeps what they open.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from fanout.contract.locations import shown_location
from fanout.delta_tables.io import one_line, open_fanout_table
from fanout.delta_tables.retention import LOG_RETENTION_PROPERTY
from fanout.errors import LedgerError
from fanout.ledger.entry import ledger_schema
from fanout.observe.secrets import location_secrets, redact

if TYPE_CHECKING:
    from deltalake import DeltaTable


log = logging.getLogger("fanout.ledger.delta")  # the name its logs always had

LEDGER_COLUMNS = ("batch_id", "pipeline", "sink", "status")
"""The columns without which a Delta table cannot be a ledger (of any fanout version)."""


def masked_error(path: str, exc: BaseException) -> str:
    """``exc``'s text on one line, the password of the ledger at ``path`` masked (the
    store's own error names the location as written)."""
    return redact(one_line(str(exc)), location_secrets(path))


def open_ledger(path: str, storage_options: Mapping[str, str] | None) -> DeltaTable | None:
    """:func:`fanout.delta_tables.io.open_table` for the ledger: a store that cannot be
    read (unreachable, credentials not found) is a :class:`fanout.LedgerError` naming the
    ledger, not delta-rs' bare ``OSError``/``DeltaError`` (a traceback in ``fanout status``)."""
    return open_fanout_table(
        path,
        storage_options,
        error=LedgerError,
        what="ledger",
        mask=lambda text: redact(text, location_secrets(path)),  # the store names the path
    )


def check_is_ledger(table: DeltaTable, path: str) -> None:
    """Refuse a Delta table that is not a ledger, before reading or writing it."""
    columns = [field.name for field in table.schema().fields]
    missing = [name for name in LEDGER_COLUMNS if name not in columns]
    if missing:
        raise LedgerError(
            f"the Delta table at {path} is not a fanout ledger: it has no columns "
            f"{', '.join(map(repr, missing))} (its columns: {', '.join(map(repr, columns))})"
        )


def load_or_create(
    path: str,
    storage_options: dict[str, str],
    checkpoint_interval: int,
    log_retention: str | None,
) -> DeltaTable:
    """The ledger table at ``path``, created when missing (safe against a racing peer)."""
    from deltalake import DeltaTable

    table = open_ledger(path, storage_options)
    if table is not None:
        check_is_ledger(table, shown_location(path))
        return table
    try:
        return DeltaTable.create(
            path,
            schema=ledger_schema(),
            mode="ignore",
            partition_by=["pipeline"],
            name="fanout_ledger",
            description="fanout ledger: per-sink completion of each micro-batch",
            configuration={
                "delta.checkpointInterval": str(checkpoint_interval),
                **_log_configuration(log_retention),
            },
            storage_options=storage_options or None,
        )
    except Exception as exc:
        table = open_ledger(path, storage_options)  # lost a creation race?
        if table is None:
            raise LedgerError(
                f"cannot create the ledger at {shown_location(path)}: {masked_error(path, exc)}"
            ) from exc
        return table


def keep_log_short(
    table: DeltaTable, path: str, storage_options: dict[str, str], log_retention: str | None
) -> None:
    """Give a ledger made before fanout set its log retention (or with the property
    removed) ``log_retention``, in one metadata commit. A failure (another writer's
    commit meanwhile) is logged: the marks do not depend on it, the next start tries
    again."""
    if log_retention is None or keeps_a_log_retention(table):
        return
    try:
        table.alter.set_table_properties(_log_configuration(log_retention))
    except Exception as exc:
        if _log_retention_set_meanwhile(path, storage_options):
            return  # another FanOut opening the same ledger set it first
        log.warning(
            "ledger %s: could not set %s = %r (its log keeps Delta's default 30 days, "
            "and every mark lists all of it): %s",
            shown_location(path), LOG_RETENTION_PROPERTY, log_retention, masked_error(path, exc),
        )  # fmt: skip
        return
    log.info(
        "ledger %s: keeps %s of log from now on (%s)",
        shown_location(path), log_retention, LOG_RETENTION_PROPERTY,
    )  # fmt: skip


def log_retention_change(table: DeltaTable, log_retention: str | None) -> list[str]:
    """What :func:`keep_log_short` would change on ``table``, as a "would ..." text
    (``fanout validate``); empty: nothing."""
    if log_retention is None or keeps_a_log_retention(table):
        return []
    return [f"set {LOG_RETENTION_PROPERTY} = {log_retention!r} on the ledger table"]


def keeps_a_log_retention(table: DeltaTable) -> bool:
    """Whether the table sets its own ``delta.logRetentionDuration``."""
    return table.metadata().configuration.get(LOG_RETENTION_PROPERTY) is not None


def _log_configuration(log_retention: str | None) -> dict[str, str]:
    return {} if log_retention is None else {LOG_RETENTION_PROPERTY: log_retention}


def _log_retention_set_meanwhile(path: str, storage_options: dict[str, str]) -> bool:
    try:
        table = open_ledger(path, storage_options)
    except Exception:
        return False
    return table is not None and keeps_a_log_retention(table)
