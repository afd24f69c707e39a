"""Reading a Delta table's history for the fanout compactions not yet checked: back to the
last checked point (the newest :data:`~fanout.delta_tables.compaction.tags.CHECKED_TAG`
record, the version this process checked last, or the table's mark,
:mod:`~fanout.delta_tables.compaction.marker`), newest first. A table without the mark is
read by a compaction only (which then commits the mark), not by an open."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fanout.delta_tables import io as deltaio
from fanout.delta_tables.compaction.marker import compactions_after, expires_marks
from fanout.delta_tables.compaction.tags import checked_mark, compaction_token

if TYPE_CHECKING:
    from deltalake import DeltaTable

FIRST_LOOK = 100
"""How many of the newest commits :func:`since_checked` reads first when looking for the
last checked point (then four times as many, up to the whole history)."""

RECENT = 20
"""How many of the newest commits :func:`worth_a_scan` reads on a table that expires app
transactions (one GET each on an object store, at every open of a Delta sink that does not
compact)."""

_checked_through: dict[str, int] = {}
"""Per table URI, the version up to which this process checked every fanout compaction:
the next scan reads only the commits after it."""


def checked_through(uri: str) -> int | None:
    """The version up to which this process checked every fanout compaction of the table
    at ``uri``, if it did."""
    return _checked_through.get(uri)


def remember_checked(uri: str, version: int) -> None:
    """Remember that every fanout compaction of the table at ``uri`` is checked up to
    ``version`` (the next scan of this process reads only the commits after it)."""
    _checked_through[uri] = version


def worth_a_scan(table: DeltaTable) -> bool:
    """Whether ``table`` may hold a fanout compaction an open checks (a sink no longer
    compacting scans only then): fanout committed compactions after its mark, or, when it
    cannot trust the mark (it expires app transactions), a fanout compaction is among its
    newest :data:`RECENT` commits. A table without the mark is not looked at
    (:func:`unread_unmarked`)."""
    if expires_marks(table):
        return any(
            compaction_token(info) is not None for info in deltaio.numbered_history(table, RECENT)
        )
    after = compactions_after(table)
    return after is not None and after < table.version()


def unread_unmarked(table: DeltaTable) -> bool:
    """Whether an open leaves ``table``'s history unread: it holds no mark, keeps app
    transactions, and this process checked none of it. It may hold fanout compactions all
    the same (by a fanout built before the mark; a mark a retention since removed expired),
    checked at its next fanout compaction: that one's scan reads back to the newest checked
    record (:func:`since_checked`), once, then commits the mark."""
    return (
        checked_through(table.table_uri) is None
        and compactions_after(table) is None
        and not expires_marks(table)
    )


def since_checked(table: DeltaTable) -> list[dict[str, Any]]:
    """The numbered commit infos of ``table`` after the last version up to which every
    fanout compaction was checked (the version this process checked last, or the newest
    checked record), up to its loaded version, newest first; never at or before the mark's
    version (:func:`~fanout.delta_tables.compaction.marker.compactions_after`). Without a
    version checked by this process, the newest :data:`FIRST_LOOK` commits are read first,
    then four times as many, up to the whole history (or the mark): on a table without the
    mark, back to the newest checked record (or its first commit)."""
    at, cached = table.version(), checked_through(table.table_uri)
    cached = cached if cached is not None and cached <= at else None
    bound = compactions_after(table)
    floor = max((v for v in (cached, bound) if v is not None), default=None)
    if floor == at:
        return []
    if floor is None:
        limit = FIRST_LOOK
    else:
        limit = at - floor if cached is not None else min(FIRST_LOOK, at - floor)
    while True:
        history = deltaio.numbered_history(table, limit)
        seen: list[dict[str, Any]] = []
        for info in history:
            if floor is not None and int(info["version"]) <= floor:
                return seen
            seen.append(info)
            mark = checked_mark(info)
            if mark is not None and (floor is None or mark > floor):
                floor = mark
        if len(history) < limit or (floor is not None and int(history[-1]["version"]) <= floor + 1):
            return seen  # the whole history, or every commit after the checked point
        limit = limit * 4 if bound is None else min(limit * 4, at - bound)
