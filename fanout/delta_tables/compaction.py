"""Compaction (``OPTIMIZE``) of a Delta table with delta-rs, taken back when it raced
another compaction of the same files (ARCHITECTURE §4).

delta-rs (1.6) commits a compaction even when a compaction committed since its snapshot
already removed the same files: its conflict check counts only removals with
``dataChange=true``, and a compaction's are ``false``. Both rewrites then stay in the
table and every row they both rewrote is there twice. No delta-rs call refuses that
commit (an ``OPTIMIZE`` drops the app transactions it is given; an overwrite after a
compaction commits the same way, see ``tests/integration/test_delta_rs_compaction_races.py``),
so :func:`compact` checks its own commit right after it: when the files it added hold
more rows than the files it actually removed, another compaction came first, and it
commits the files it removed back and its own added files away, ``dataChange=false``
(readers streaming the table see neither commit). A reader of the table between the two
commits sees the duplicated rows (a few milliseconds).

A process killed between the compaction's commit and its check (``kill -9``, an OOM
kill, an evicted pod) leaves that compaction unchecked. So before it compacts,
:func:`compact` (and :func:`repair_unchecked`, which the Delta sink runs at its open)
looks in the table's history since the last checked point for fanout's compactions
(tagged ``fanoutCommit = "compaction <token>"``) not taken back (no ``"take back
<token>"`` after them), and checks each as :func:`compact` checks its own: one that
duplicated rows is taken back the same way, ``dataChange`` as the caller's, or, when a
later compaction already rewrote its files, refused loudly (:class:`CompactionError`,
logged by the callers, naming the files and the version to restore). A refused one is
never recorded as checked: the compactions go on, and each reports it again until a
RESTORE undoes it or a person's fix commits with ``"take back <token>"`` (as
``fanoutCommit`` or Spark's ``userMetadata``). Every compaction
fanout commits records in its commit info the version up to which every fanout
compaction was checked (``fanoutCompactionsChecked``), so the scan reads the history
back to the newest such record only (and a process remembers the version it checked
last). A compaction whose snapshot was the version just before its commit
(``readVersion``) cannot have raced and is passed without reading its snapshots.
Readers streaming the table skip the late taking back (``dataChange=false``) as they
skipped the compaction; a reader of the latest version saw the rows twice from the
compaction to the next fanout run that compacts the table (or opens its sink).

What it cannot see: a compaction by another program (a scheduled ``OPTIMIZE``) that
planned before this one committed and commits after it duplicates the rows the same
way; only that program's own commit could be checked, and it carries no fanout tag.
Nor the Delta sink's Spark engine's compaction (delta-spark's ``OPTIMIZE``, untagged),
nor, past its :data:`RECENT` newest commits, a sink's table whose ``compact_every`` was
removed after the crash (its open then looks only there) until a fanout compaction of
the table runs again.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from fanout.delta_tables.values import partition_text
from fanout.errors import CompactionError, HistoryUnsettledError

if TYPE_CHECKING:
    from deltalake import DeltaTable

log = logging.getLogger(__name__)
_T = TypeVar("_T")

_COMMIT_TAG = "fanoutCommit"
"""The commit info key marking fanout's compaction and its taking back, to find their
versions in the table's history."""

CHECKED_TAG = "fanoutCompactionsChecked"
"""The commit info key of fanout's compaction recording the version up to which every
fanout compaction in the table's history was checked before it (:func:`repair_unchecked`
reads the history back to the newest one)."""

FIRST_LOOK = 100
"""How many of the newest commits :func:`repair_unchecked` reads first when looking for
the last checked point (then four times as many, up to the whole history)."""

_checked_through: dict[str, int] = {}
"""Per table URI, the version up to which this process checked every fanout compaction:
the next scan reads only the commits after it."""


@dataclass(frozen=True)
class Compaction:
    """What :func:`compact` did.

    :ivar files_removed: small files the compaction removed (0 when taken back).
    :ivar files_added: files it added (0 when taken back).
    :ivar taken_back: another compaction had removed some of the same files first:
        this one committed, then was taken back at ``version``.
    :ivar version: the table's version after the compaction (and its taking back).
    """

    files_removed: int
    files_added: int
    taken_back: bool
    version: int


@dataclass(frozen=True)
class _File:
    path: str
    size: int
    modification_time: int
    rows: int | None
    partition_values: dict[str, str | None]


def compact(
    table: DeltaTable,
    what: str,
    storage_options: Mapping[str, str] | None,
    *,
    rewrite: Callable[[DeltaTable, Any], Mapping[str, Any]] | None = None,
    data_change: bool = False,
) -> Compaction:
    """Compact ``table``'s small files from its loaded snapshot; take the compaction back
    at once when another compaction had removed some of the same files since that
    snapshot. ``table`` ends at the table's latest version.

    :param what: the table as messages name it (``"ledger at /x"``, ``"sink 'orders'
        table /y"``).
    :param rewrite: commits the compaction: called with ``table`` and the
        ``CommitProperties`` to commit with, returns delta-rs' metrics (``None``: delta-rs
        ``OPTIMIZE``, which bin-packs the small files, ``dataChange=false``).
    :param data_change: the ``dataChange`` of the taking back's actions: ``False`` where
        readers may stream the table (they skip such commits), ``True`` where none does
        (a compaction planned before it then fails to commit).
    :raises CompactionError: the compaction duplicated rows and taking it back failed
        (the message names the files to remove), or an earlier fanout compaction left
        unchecked duplicated rows and cannot be taken back (:func:`repair_unchecked`; this
        one ran all the same, and the next one reports it again until it is fixed).
    """
    checked, refused = _scan(table, what, storage_options, data_change=data_change)
    # a refusal is reported at every compaction until a person fixes it
    return _unless(refused, _compact(table, what, storage_options, checked, rewrite, data_change))


def repair_unchecked(
    table: DeltaTable,
    what: str,
    storage_options: Mapping[str, str] | None,
    *,
    data_change: bool = False,
) -> int:
    """Check every fanout compaction in ``table``'s history up to its loaded version since
    the last checked point (the module docstring says which) and take back each that
    duplicated rows and was not taken back: its process ended between its commit and its
    check. Return the version up to which every fanout compaction is checked (the loaded
    version; ``table`` is advanced past the takings back, if any).

    :param what: the table as messages name it.
    :param data_change: the ``dataChange`` of a taking back's actions (as :func:`compact`).
    :raises CompactionError: a compaction duplicated rows and cannot be taken back (a later
        commit rewrote its files), or taking it back failed; the message says what to do.
        Raised after every other compaction was checked, and again by every later scan
        (no compaction records it checked) until a person fixes the table and marks it so,
        as the message says.
    :raises HistoryUnsettledError: other writers committed during each read of the history.
    """
    at, refused = _scan(table, what, storage_options, data_change=data_change)
    return _unless(refused, at)


def _unless(refused: CompactionError | None, result: _T) -> _T:
    """``result``, unless a compaction was ``refused``: that error then."""
    if refused is not None:
        raise refused
    return result


def would_take_back(
    table: DeltaTable, what: str, storage_options: Mapping[str, str] | None
) -> list[int]:
    """What :func:`repair_unchecked` would do, changing nothing (``fanout validate``): the
    versions of the unchecked compactions it would take back.

    :raises CompactionError: one of them cannot be taken back (as :func:`repair_unchecked`).
    """
    would: list[int] = []
    _, refused = _scan(table, what, storage_options, data_change=False, would=would)
    return _unless(refused, would)


def _scan(
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
    history = _since_checked(table, _checked_through.get(uri))
    backs = _taken_back(history)
    refused: CompactionError | None = None
    checked = at
    for info in reversed(history):  # the oldest first
        tag = str(info.get(_COMMIT_TAG))
        version = int(info["version"])
        if not tag.startswith("compaction ") or tag.removeprefix("compaction ") in backs:
            continue
        if info.get("readVersion") == version - 1:
            continue  # planned on the version before its commit: nothing raced it
        token = tag.removeprefix("compaction ")
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
        _checked_through[uri] = checked
    return checked, refused


RECENT = 20
"""How many of the newest commits :func:`recently_compacted` reads (one GET each on an
object store, at every open of a Delta sink that does not compact)."""


def recently_compacted(table: DeltaTable) -> bool:
    """Whether a fanout compaction is among ``table``'s newest :data:`RECENT` commits (a
    sink no longer compacting looks for unchecked ones only then)."""
    from fanout.delta_tables.io import numbered_history

    return any(
        str(info.get(_COMMIT_TAG)).startswith("compaction ")
        for info in numbered_history(table, RECENT)
    )


def _taken_back(history: list[dict[str, Any]]) -> set[str]:
    """The tokens of the compactions taken back (or marked fixed) in ``history``."""
    return {
        str(info.get(key)).removeprefix("take back ")
        for info in history
        for key in (_COMMIT_TAG, "userMetadata")  # a person's "fixed" mark, also from Spark
        if str(info.get(key)).startswith("take back ")
    }


def _since_checked(table: DeltaTable, cached: int | None) -> list[dict[str, Any]]:
    """The numbered commit infos of ``table`` after the last version up to which every
    fanout compaction was checked (the newest :data:`CHECKED_TAG`, or ``cached``), up to
    its loaded version, newest first: the newest :data:`FIRST_LOOK` commits read first,
    then four times as many, up to the whole history."""
    from fanout.delta_tables.io import numbered_history

    at = table.version()
    floor = cached if cached is not None and cached <= at else None
    if floor == at:
        return []
    limit = at - floor if floor is not None else FIRST_LOOK
    while True:
        history = numbered_history(table, limit)
        seen: list[dict[str, Any]] = []
        for info in history:
            if floor is not None and int(info["version"]) <= floor:
                return seen
            seen.append(info)
            mark = _checked_mark(info)
            if mark is not None and (floor is None or mark > floor):
                floor = mark
        if len(history) < limit or (floor is not None and int(history[-1]["version"]) <= floor + 1):
            return seen  # the whole history, or every commit after the checked point
        limit *= 4


def _checked_mark(info: Mapping[str, Any]) -> int | None:
    """The version a commit info records every fanout compaction checked up to, if any."""
    try:
        return int(info[CHECKED_TAG])
    except (KeyError, TypeError, ValueError):
        return None


def _repair(
    table: DeltaTable,
    what: str,
    version: int,
    token: str,
    storage_options: Mapping[str, str] | None,
    data_change: bool,
    dry: bool,
) -> bool:
    """Check the unchecked compaction committed at ``version`` as :func:`compact` checks
    its own; take it back if it duplicated rows (``dry``: not, only say so). Return
    whether it was (would be) taken back."""
    try:
        before = _files(_at_version(table, version - 1, storage_options))
        after = _files(_at_version(table, version, storage_options))
    except Exception as exc:  # its log cleaned up since (delta.logRetentionDuration)
        from fanout.delta_tables.io import one_line

        raise CompactionError(
            f"{what}: the compaction committed at version {version} ({_COMMIT_TAG} = "
            f"'compaction {token}') was never checked against another compaction of the same "
            "files (the process that committed it ended first), and its versions can no "
            f"longer be read ({type(exc).__name__}: {one_line(str(exc))}): if another "
            "compaction removed some of the same files before it, their rows are in the "
            "table twice; look for duplicated rows and deduplicate the table. " + _fix_mark(token)
        ) from exc
    gone = [f for path, f in before.items() if path not in after]
    new = [f for path, f in after.items() if path not in before]
    if not _duplicates(gone, new, what, version):
        return False
    loaded = table.version()
    table.update_incremental()  # what a later commit did to its files decides
    if loaded < table.version():
        from fanout.delta_tables.io import numbered_history

        if token in _taken_back(numbered_history(table, table.version() - loaded)):
            return False  # another run took it back (or a person fixed it) after our snapshot
    now = _files(table)
    if gone and not any(f.path in now for f in new) and all(f.path in now for f in gone):
        return False  # undone since (by hand, or by a taking back not tagged as fanout's)
    moved = sorted(f.path for f in new if f.path not in now)
    missing = _missing(table, gone, storage_options)
    if moved or missing:
        why = (
            f"since then a later commit removed its files {moved}, which now hold those rows"
            if moved
            else f"the files it removed are gone from storage (vacuumed): {missing}"
        )
        raise CompactionError(
            f"{what}: the compaction committed at version {version} ({_COMMIT_TAG} = "
            f"'compaction {token}') rewrote files another compaction had rewritten first, so "
            "rows are in the table twice; the process that committed it ended before it "
            f"checked that, and it cannot be taken back now: {why}. Deduplicate the table, "
            f"or RESTORE it to version {version - 1} if nothing was written since. "
            + _fix_mark(token)
        )
    if dry:
        return True
    log.warning(
        "%s: the compaction committed at version %d was never checked (its process ended "
        "after committing it) and rewrote files another compaction had rewritten first: "
        "taking it back", what, version,
    )  # fmt: skip
    back = _take_back(table, what, version, gone, new, token, data_change)
    _check_taken_back(table, what, version, back, new, storage_options, gone)
    return True


def _fix_mark(token: str) -> str:
    """How a person tells fanout that a refused compaction's duplicated rows are fixed."""
    return (
        "Every fanout compaction of the table reports this again until the fix commits "
        f"with {_COMMIT_TAG} = 'take back {token}' in its commit info (delta-rs: "
        "CommitProperties(custom_metadata=...); Spark: the write option userMetadata = "
        f"'take back {token}'); a RESTORE to the version before it needs no mark"
    )


def _missing(
    table: DeltaTable, files: list[_File], storage_options: Mapping[str, str] | None
) -> list[str]:
    """Which of ``files`` (paths relative to ``table``'s root) are gone from its storage,
    looked up through delta-rs' own object store (a local disk or an object store alike):
    adding back a file vacuum deleted would fail every read of the table."""
    from deltalake.fs import DeltaStorageHandler
    from pyarrow.fs import FileType

    store = DeltaStorageHandler(table.table_uri, dict(storage_options or {}) or None)
    found = store.get_file_info([f.path for f in files])
    gone = [f.path for f, info in zip(files, found, strict=True) if info.type == FileType.NotFound]
    return sorted(gone)


def _committed_version(table: DeltaTable, since: int, tag: str, unchecked: str, then: str) -> int:
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
    from fanout.delta_tables.io import HISTORY_READS, numbered_history

    table.update_incremental()
    try:
        history = numbered_history(table, table.version() - since)
    except HistoryUnsettledError as exc:
        raise CompactionError(
            f"{unchecked}: other writers committed during each of {HISTORY_READS} reads of the "
            "table's history (delta-rs numbers its versions wrongly then). " + then
        ) from exc
    for commit in history:
        if commit.get(_COMMIT_TAG) == tag:
            return int(commit["version"])
    raise CompactionError(f"cannot find this process's commit {tag!r} in the table's history")


def _at_version(table: DeltaTable, version: int, storage_options: Mapping[str, str] | None) -> Any:
    from deltalake import DeltaTable

    return DeltaTable(
        table.table_uri, version=version, storage_options=dict(storage_options or {}) or None
    )


def _files(table: Any) -> dict[str, _File]:
    """The table's active files, by path, with what a re-add needs. The path is the
    file's name in storage, as delta-rs' actions take it: the log holds it URL-encoded
    (``city=New%20York/`` is ``city=New%2520York/`` there), and an action given that
    spelling is encoded again and names no file."""
    from urllib.parse import unquote

    import pyarrow as pa

    actions = pa.table(table.get_add_actions(flatten=False))
    partitions = actions.column("partition") if "partition" in actions.column_names else None
    files: dict[str, _File] = {}
    for i, action in enumerate(
        actions.drop_columns(["partition"] if partitions else []).to_pylist()
    ):
        values: dict[str, str | None] = {}
        if partitions is not None:
            scalar = partitions[i]
            for field in scalar.type:
                values[field.name] = _action_value(scalar[field.name]) if scalar.is_valid else None
        rows = action.get("num_records")
        path = unquote(action["path"])
        files[path] = _File(
            path=path,
            size=int(action["size_bytes"]),
            modification_time=int(action["modification_time"]),
            rows=None if rows is None else int(rows),
            partition_values=values,
        )
    return files


def _action_value(value: Any) -> str | None:
    """A file's partition value (an Arrow scalar) as an action re-adding the file names
    it: as :func:`fanout.delta_tables.values.partition_text` serializes it, a decimal in
    plain notation (``0.0000001``, not ``1E-7``), also a negative one with a fractional
    part, which that serializer refuses (delta-rs cannot write it; delta-spark can)."""
    import pyarrow.types as pat

    if value.is_valid and pat.is_decimal(value.type):
        return format(value.as_py(), "f")
    return partition_text(value)


def _duplicates(gone: list[_File], new: list[_File], what: str, version: int) -> bool:
    """Whether the compaction committed at ``version`` added more rows than it removed:
    some of its files had been removed (rewritten) by another compaction first."""
    if any(f.rows is None for f in [*gone, *new]):
        log.warning(
            "%s: the compaction committed at version %d cannot be checked against a racing "
            "compaction (files without row counts)", what, version,
        )  # fmt: skip
        return False
    return sum(f.rows or 0 for f in new) > sum(f.rows or 0 for f in gone)


def _take_back(
    table: DeltaTable,
    what: str,
    version: int,
    gone: list[_File],
    new: list[_File],
    token: str,
    data_change: bool,
) -> int:
    """Commit ``new`` (the compaction's added files) away and ``gone`` (the files it
    actually removed) back, ``dataChange=false``; return the version committed."""
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
            commit_properties=CommitProperties(custom_metadata={_COMMIT_TAG: f"take back {token}"}),
        )
    except Exception as exc:
        raise CompactionError(
            f"{what}: the compaction committed at version {version} rewrote files another "
            f"compaction had rewritten first, so rows are in the table twice, and taking it "
            f"back failed: {exc}. Remove its files {sorted(f.path for f in new)} from the "
            f"table (dataChange=false) and add back {sorted(f.path for f in gone)}, or "
            f"RESTORE the table to version {version - 1} if nothing was written since"
        ) from exc
    back = _committed_version(
        table,
        version,
        f"take back {token}",
        f"{what}: the compaction committed at version {version} rewrote files another "
        "compaction had rewritten first, and was taken back; whether a third compaction "
        "rewrote its files before that could not be checked",
        f"If a compaction committed between version {version} and the taking back (commit "
        f"info {_COMMIT_TAG} = 'take back {token}') removed some of the files it added, "
        "their rows are in the table twice: deduplicate it, or RESTORE it to version "
        f"{version - 1} if nothing was written since",
    )
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
    new: list[_File],
    storage_options: Mapping[str, str] | None,
    gone: list[_File],
) -> None:
    """Refuse a taking back that came too late: a third compaction committed between the
    compaction and its taking back rewrote (some of) its added files, so their rows are
    in that compaction's file too, twice, and no file can be removed to fix it. Another
    taking back of the same compaction first (a later run's, :func:`repair_unchecked`,
    while this process checked it) left this one changing nothing: accepted."""
    before = _files(_at_version(table, back - 1, storage_options))
    if gone and not any(f.path in before for f in new) and all(f.path in before for f in gone):
        return
    late = sorted(f.path for f in new if f.path not in before)
    if late:
        raise CompactionError(
            f"{what}: the compaction committed at version {version} rewrote files another "
            f"compaction had rewritten first, and before it was taken back (version "
            f"{back}) a third compaction rewrote its files {late}: rows are in the "
            "table twice. Stop the other programs compacting this table, then deduplicate "
            f"it, or RESTORE it to version {version - 1} if nothing was written since"
        )


def _compact(
    table: DeltaTable,
    what: str,
    storage_options: Mapping[str, str] | None,
    checked: int,
    rewrite: Callable[[DeltaTable, Any], Mapping[str, Any]] | None,
    data_change: bool,
) -> Compaction:
    """:func:`compact`'s own compaction and its check, recording ``checked``."""
    from deltalake import CommitProperties

    base, token = table.version(), uuid.uuid4().hex
    tagged = CommitProperties(
        custom_metadata={_COMMIT_TAG: f"compaction {token}", CHECKED_TAG: str(checked)}
    )
    metrics: Mapping[str, Any]
    if rewrite is None:
        metrics = table.optimize.compact(commit_properties=tagged)
    else:
        metrics = rewrite(table, tagged)
    removed, added = int(metrics.get("numFilesRemoved", 0)), int(metrics.get("numFilesAdded", 0))
    if not added:
        return Compaction(removed, added, False, table.version())
    version = _committed_version(
        table,
        base,
        f"compaction {token}",
        f"{what}: the compaction committed after version {base} could not be checked against "
        "another compaction of the same files",
        f"If a compaction by another program (an OPTIMIZE) committed after version {base} "
        "too and removed some of the same files, their rows are now in the table twice "
        "until the next fanout compaction of the table checks it again; to fix it at "
        "once, look in the table's history after version "
        f"{base} for the two compactions (this one's commit info has {_COMMIT_TAG} = "
        f"'compaction {token}'); if both removed a same file, remove this one's added "
        "files (dataChange=false) and add back the files it removed, or RESTORE the table "
        "to the version before it if nothing was written since",
    )
    before = _files(_at_version(table, version - 1, storage_options))
    after = _files(_at_version(table, version, storage_options))
    gone = [f for path, f in before.items() if path not in after]
    new = [f for path, f in after.items() if path not in before]
    if not _duplicates(gone, new, what, version):
        return Compaction(removed, added, False, table.version())
    back = _take_back(table, what, version, gone, new, token, data_change)
    _check_taken_back(table, what, version, back, new, storage_options, gone)
    return Compaction(0, 0, True, table.version())
