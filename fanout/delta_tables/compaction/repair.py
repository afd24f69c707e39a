"""A fanout compaction whose process ended between its commit and its check, found by a
later scan of the table's history and checked as its own process would have: taken back
when it duplicated rows, or refused loudly when it cannot be taken back any more."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, TypeVar

from fanout.delta_tables import io as deltaio
from fanout.delta_tables.compaction import refusals
from fanout.delta_tables.compaction.files import changed, duplicates, files, missing, undone
from fanout.delta_tables.compaction.scan import remember_checked, since_checked, unread_unmarked
from fanout.delta_tables.compaction.tags import compaction_token, taken_back
from fanout.delta_tables.compaction.take_back import take_back
from fanout.errors import CompactionError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from deltalake import DeltaTable

log = logging.getLogger(__name__)
_T = TypeVar("_T")


def repair_unchecked(
    table: DeltaTable,
    what: str,
    storage_options: Mapping[str, str] | None,
    *,
    data_change: bool = False,
) -> int | None:
    """Check every fanout compaction in ``table``'s history up to its loaded version since
    the last checked point (:mod:`fanout.delta_tables.compaction.scan`) and take back each
    that duplicated rows and was not taken back: its process ended between its commit and
    its check. Return the version up to which every fanout compaction is checked (the
    loaded version; ``table`` is advanced past the takings back, if any); ``None``, nothing
    read, on a table without fanout's mark
    (:func:`~fanout.delta_tables.compaction.scan.unread_unmarked`: its next fanout
    compaction checks it).

    :param what: the table as messages name it.
    :param data_change: the ``dataChange`` of a taking back's actions (as
        :func:`fanout.delta_tables.compaction.compact`).
    :raises CompactionError: a compaction duplicated rows and cannot be taken back (a later
        commit rewrote its files), or taking it back failed; the message says what to do.
        Raised after every other compaction was checked, and again by every later scan
        (no compaction records it checked) until a person fixes the table and marks it so,
        as the message says.
    :raises HistoryUnsettledError: other writers committed during each read of the history.
    """
    if unread_unmarked(table):
        return None
    at, refused = scan(table, what, storage_options, data_change=data_change)
    return unless(refused, at)


def would_take_back(
    table: DeltaTable, what: str, storage_options: Mapping[str, str] | None
) -> list[int]:
    """What :func:`repair_unchecked` would do, changing nothing (``fanout validate``): the
    versions of the unchecked compactions it would take back (none on a table without
    fanout's mark, which it does not read either).

    :raises CompactionError: one of them cannot be taken back (as :func:`repair_unchecked`).
    """
    would: list[int] = []
    if unread_unmarked(table):
        return would
    _, refused = scan(table, what, storage_options, data_change=False, would=would)
    return unless(refused, would)


def refused_compaction(
    table: DeltaTable, what: str, storage_options: Mapping[str, str] | None
) -> str | None:
    """What a fanout compaction of ``table`` that left rows twice and cannot be taken back
    says (its :class:`CompactionError`'s text, naming the fix), changing nothing (``fanout
    status``); ``None`` when there is none."""
    try:
        would_take_back(table, what, storage_options)
    except CompactionError as exc:
        return str(exc)
    return None


def unless(refused: CompactionError | None, result: _T) -> _T:
    """``result``, unless a compaction was ``refused``: that error then."""
    if refused is not None:
        raise refused
    return result


def scan(
    table: DeltaTable,
    what: str,
    options: Mapping[str, str] | None,
    *,
    data_change: bool,
    would: list[int] | None = None,
) -> tuple[int, CompactionError | None]:
    """:func:`repair_unchecked`'s work: the version up to which every fanout compaction is
    checked (before the oldest refused one, if any) and the first refusal; given
    ``would``, nothing is taken back nor remembered: the versions to take back are added
    to it."""
    uri, at = table.table_uri, table.version()
    history = since_checked(table)
    backs = taken_back(history)
    refused: CompactionError | None = None
    checked = at
    for info in reversed(history):  # the oldest first
        token = compaction_token(info)
        version = int(info["version"])
        if token is None or token in backs:
            continue
        if info.get("readVersion") == version - 1:
            continue  # planned on the version before its commit: nothing raced it
        try:
            taken = _repair(table, what, version, token, options, data_change, would is not None)
            if taken and would is not None:
                would.append(version)
        except CompactionError as exc:
            refused = refused or exc
            checked = min(checked, version - 1)
    # A refused compaction is never recorded checked: every later scan (this process's
    # next compaction, the next run's) finds and reports it again until a person fixes
    # the table and marks it fixed (the error says how); compactions go on meanwhile.
    if would is None:
        remember_checked(uri, checked)
    return checked, refused


def _repair(
    table: DeltaTable,
    what: str,
    version: int,
    token: str,
    storage_options: Mapping[str, str] | None,
    data_change: bool,
    dry: bool,
) -> bool:
    """Check the unchecked compaction committed at ``version`` as its own process would
    have; take it back if it duplicated rows (``dry``: not, only say so). Return whether it
    was (would be) taken back."""
    try:
        gone, new = changed(table, version, storage_options)
    except Exception as exc:  # its log cleaned up since (delta.logRetentionDuration)
        why = f"{type(exc).__name__}: {deltaio.one_line(str(exc))}"
        raise CompactionError(refusals.versions_unreadable(what, version, token, why)) from exc
    if not duplicates(gone, new, what, version):
        return False
    loaded = table.version()
    table.update_incremental()  # what a later commit did to its files decides
    if loaded < table.version():
        if token in taken_back(deltaio.numbered_history(table, table.version() - loaded)):
            return False  # another run took it back (or a person fixed it) after our snapshot
    now = files(table)
    if undone(gone, new, now):
        return False  # undone since (by hand, or by a taking back not tagged as fanout's)
    moved = sorted(f.path for f in new if f.path not in now)
    vacuumed = missing(table, gone, storage_options)
    if moved or vacuumed:
        why = (
            f"since then a later commit removed its files {moved}, which now hold those rows"
            if moved
            else f"the files it removed are gone from storage (vacuumed): {vacuumed}"
        )
        raise CompactionError(refusals.cannot_take_back(what, version, token, why))
    if dry:
        return True
    log.warning(
        "%s: the compaction committed at version %d was never checked (its process ended "
        "after committing it) and rewrote files another compaction had rewritten first: "
        "taking it back", what, version,
    )  # fmt: skip
    take_back(table, what, version, (gone, new), token, data_change, storage_options)
    return True
