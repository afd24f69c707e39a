"""Taking a compaction back: one commit removing the files it added and adding back those it
alone removed, then the check that no third compaction rewrote them in between; and how a
process finds the version of a commit of its own in a history other writers commit to."""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from fanout.delta_tables import io as deltaio
from fanout.delta_tables.compaction import refusals
from fanout.delta_tables.compaction.files import DataFile, at_version, files, undone
from fanout.delta_tables.compaction.tags import COMMIT_TAG, take_back_tag
from fanout.errors import CompactionError, HistoryUnsettledError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from deltalake import DeltaTable

log = logging.getLogger(__name__)


def take_back(
    table: DeltaTable,
    what: str,
    version: int,
    changed: tuple[list[DataFile], list[DataFile]],
    token: str,
    data_change: bool,
    storage_options: Mapping[str, str] | None,
) -> None:
    """Take back the compaction committed at ``version``, which removed and added the files
    ``changed`` holds: commit its added files away and the files it actually removed back
    (``dataChange`` as ``data_change``), then refuse a taking back that came too late
    (:func:`_check_taken_back`)."""
    gone, new = changed
    back = _commit_take_back(table, what, version, gone, new, token, data_change)
    _check_taken_back(table, what, version, back, new, storage_options, gone)


def _commit_take_back(
    table: DeltaTable,
    what: str,
    version: int,
    gone: list[DataFile],
    new: list[DataFile],
    token: str,
    data_change: bool,
) -> int:
    """Commit ``new`` (the compaction's added files) away and ``gone`` (the files it
    actually removed) back; return the version committed."""
    from deltalake import CommitProperties
    from deltalake.transaction import AddAction, RemoveAction

    now = int(time.time() * 1000)
    actions: list[Any] = [
        RemoveAction(f.path, data_change, now, f.size, f.partition_values) for f in new
    ]
    actions += [
        AddAction(
            f.path,
            f.size,
            f.partition_values,
            f.modification_time,
            data_change,
            json.dumps({"numRecords": f.rows}),
        )
        for f in gone
    ]
    partition_by = list(table.metadata().partition_columns)
    try:
        table.create_write_transaction(
            actions,
            "append",
            table.schema(),
            partition_by,
            commit_properties=CommitProperties(custom_metadata={COMMIT_TAG: take_back_tag(token)}),
        )
    except Exception as exc:
        raise CompactionError(
            refusals.taking_back_failed(
                what, version, (f.path for f in new), (f.path for f in gone), exc
            )
        ) from exc
    unchecked, then = refusals.taken_back_unchecked(what, version, token)
    back = committed_version(table, version, take_back_tag(token), unchecked, then)
    log.warning(
        "%s: the compaction committed at version %d raced another compaction of the same "
        "files (their rows were in the table twice): taken back at version %d",
        what, version, back,
    )  # fmt: skip
    return back


def _check_taken_back(
    table: DeltaTable,
    what: str,
    version: int,
    back: int,
    new: list[DataFile],
    storage_options: Mapping[str, str] | None,
    gone: list[DataFile],
) -> None:
    """Refuse a taking back that came too late: a third compaction committed between the
    compaction and its taking back rewrote (some of) its added files, so their rows are
    in that compaction's file too, twice, and no file can be removed to fix it. Another
    taking back of the same compaction first (a later run's scan, while this process
    checked it) left this one changing nothing: accepted."""
    before = files(at_version(table, back - 1, storage_options))
    if undone(gone, new, before):
        return
    late = [f.path for f in new if f.path not in before]
    if late:
        raise CompactionError(refusals.taken_back_too_late(what, version, back, late))


def committed_version(table: DeltaTable, since: int, tag: str, unchecked: str, then: str) -> int:
    """The version of this process's commit tagged ``tag``, made after version ``since``
    (``table`` is brought to its latest version: a commit does not always advance it).
    ``unchecked`` says what was left unchecked, ``then`` what that may have left and what
    to do, when other writers committed during every read: the error is logged by the
    callers, and the table left as it is.

    The history is read numbered by :func:`fanout.delta_tables.io.numbered_history`:
    delta-rs (1.6) numbers it down from the snapshot's version while listing it from the
    newest commit in storage, so a commit landing between the refresh and the listing
    made the commit before this one's look like it (its file then "taken back", its rows
    lost)."""
    table.update_incremental()
    try:
        history = deltaio.numbered_history(table, table.version() - since)
    except HistoryUnsettledError as exc:
        raise CompactionError(
            f"{unchecked}: other writers committed during each of {deltaio.HISTORY_READS} "
            "reads of the table's history (delta-rs numbers its versions wrongly then). " + then
        ) from exc
    for commit in history:
        if commit.get(COMMIT_TAG) == tag:
            return int(commit["version"])
    raise CompactionError(f"cannot find this process's commit {tag!r} in the table's history")
