"""Small helpers over delta-rs shared by the ledger and the Delta sink plugin.

Delta's idempotent writes pair an application id with a monotonically increasing version
(``txn`` actions in the log). delta-rs records them but does not skip by itself, so every
writer checks :func:`transaction_version` first.

Every read of a Delta table's rows in fanout goes through :func:`read_arrow` (or
:func:`read_delta`), never ``DeltaTable.to_pyarrow_table()``/``to_pyarrow_dataset()``:
those read through a pyarrow dataset over delta-rs' Python filesystem with pre-buffering,
so Arrow I/O threads keep Python-owned buffers alive after the read returns. When the last
of them is released while the interpreter finalizes, the thread's ``PyGILState_Ensure``
calls ``pthread_exit`` inside a ``noexcept`` C++ destructor and the process aborts
(exit 134, "terminate called without an active exception") in about 2 of 3 short runs.
:func:`read_arrow` runs the scan in delta-rs' own engine (DataFusion, ``QueryBuilder``),
which hands back finished Arrow data and leaves no such thread work behind.
"""

from __future__ import annotations

import logging
import os
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fanout.contract.locations import local_path, shown_location, uncreatable_directory
from fanout.contract.sql import sql_identifier, sql_literal
from fanout.errors import ConfigurationError, FanoutError, HistoryUnsettledError

log = logging.getLogger(__name__)

_PERCENT_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
UNSAFE_RENAME = "AWS_S3_ALLOW_UNSAFE_RENAME"
_TRUTHY = {"1", "true", "on", "yes", "y"}

COMMIT_ATTEMPTS = 3
"""How often a check-then-write runs again after losing a commit race before giving up
(the caller then reports the conflict as transient)."""

_A_FILE = (
    "it is a file, not a directory: a Delta table is a directory; give the table's "
    "directory, or a path where nothing is yet to create one there"
)

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import CommitProperties, DeltaTable


def unusable_location(
    path: str,
    storage_options: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """Why delta-rs cannot keep a table at ``path`` for fanout, or ``None``.

    A local path that is a file: a Delta table is a directory (delta-rs says the path
    "does not exist"). A missing local path under a file
    (:func:`fanout.contract.locations.uncreatable_directory`).

    A local path holding a percent escape (``/data/a%41b``; in a ``file:`` URL, an escaped
    ``%``: ``file:/data/a%2541b``): delta-rs (1.x) creates the directory as named, then
    reads the table at the decoded name (``/data/aAb``) and fails its first commit with
    "File not found". A ``%`` that starts no escape (``/data/100%``) works, as do spaces.

    An object store with ``AWS_S3_ALLOW_UNSAFE_RENAME`` on (in ``storage_options`` or the
    environment, where delta-rs reads it too): its commits may overwrite each other, and
    fanout's fencing of a zombie driver and its marks rest on a lost commit race failing.
    """
    local = local_path(path)
    if local is None:
        return unsafe_commits(storage_options, environ)
    if os.path.exists(local) and not os.path.isdir(local):
        return _A_FILE
    uncreatable = uncreatable_directory(local)
    if uncreatable is not None:
        return uncreatable
    found = _PERCENT_ESCAPE.search(local)
    if found is None:
        return None
    return (
        f"the local path {local!r} holds {found.group()!r}, which delta-rs reads as a "
        f"percent escape: it would create the directory as named and look for the table "
        f"at the decoded name. Rename the directory so that no '%' is followed by two hex "
        f"digits"
    )


def unsafe_commits(
    storage_options: Mapping[str, str] | None, environ: Mapping[str, str] | None = None
) -> str | None:
    """Why an object store's Delta commits would not be exclusive, or ``None``: delta-rs
    told to allow unsafe renames (``AWS_S3_ALLOW_UNSAFE_RENAME``, any case)."""
    env = os.environ if environ is None else environ
    given = [(k, v, "storage option") for k, v in (storage_options or {}).items()]
    if UNSAFE_RENAME in env:
        given.append((UNSAFE_RENAME, env[UNSAFE_RENAME], "environment variable"))
    for key, value, kind in given:
        if key.upper() == UNSAFE_RENAME and str(value).strip().lower() in _TRUTHY:
            return (
                f"the {kind} {key}={value} lets delta-rs commit without an exclusive write, "
                "so two commits of one version may overwrite each other; fanout's exactly-once "
                "rests on a lost commit race failing (a zombie driver's marks, the sinks' app "
                f"transactions). Remove {key}: delta-rs commits to AWS S3 with conditional "
                "writes; an S3-compatible store that supports them takes "
                "conditional_put='etag'"
            )
    return None


def refuse_unusable_location(
    path: str, where: str, storage_options: Mapping[str, str] | None = None
) -> None:
    """Raise :class:`fanout.ConfigurationError` ``"<where>: <why>"`` when delta-rs cannot
    keep a table at ``path`` (:func:`unusable_location`)."""
    unusable = unusable_location(path, storage_options)
    if unusable is not None:
        raise ConfigurationError(f"{where}: {unusable}")


def open_table(path: str, storage_options: Mapping[str, str] | None = None) -> DeltaTable | None:
    """Open the Delta table at ``path``, or return ``None`` when there is none yet;
    a :class:`fanout.ConfigurationError` when ``path`` is a local file."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    local = local_path(path)
    if local is not None and os.path.exists(local) and not os.path.isdir(local):
        raise ConfigurationError(f"{path}: {_A_FILE}")
    try:
        return DeltaTable(path, storage_options=dict(storage_options or {}) or None)
    except TableNotFoundError:
        return None


def open_fanout_table(
    path: str,
    storage_options: Mapping[str, str] | None,
    *,
    error: type[FanoutError],
    what: str,
    mask: Callable[[str], str],
    location: str | None = None,
) -> DeltaTable | None:
    """:func:`open_table` for one of fanout's own tables: a store that cannot be read
    (unreachable, credentials not found) raises ``error`` naming the table, not delta-rs'
    bare ``OSError``/``DeltaError`` (a traceback in ``fanout status``).

    :param what: what the table is, as the error names it (``"ledger"``, ``"spool"``).
    :param location: where it is, as the error names it (default ``path``), printed
        through :func:`fanout.contract.locations.shown_location` (a password masked).
    :param mask: masks the location's secrets in the store's own error text, which
        may name the location as written.
    """
    try:
        return open_table(path, storage_options)
    except FanoutError:
        raise
    except Exception as exc:
        raise error(
            f"cannot read the {what} at {shown_location(location or path)} (check the path, "
            "the store's credentials: storage options or the environment delta-rs reads them "
            f"from, and that it can be reached): {type(exc).__name__}: " + mask(one_line(str(exc)))
        ) from exc


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CAUSE = "\u21b3"  # the arrow delta-rs starts each line of an error's cause chain with


def one_line(text: str) -> str:
    """An error's first line, with the cause chain delta-rs writes on the lines after it
    (``Kernel error -> Generic S3 error`` / ``↳ ... Connection refused``), colours removed:
    the first line alone hides why (a refused connection, credentials not found)."""
    lines = _ANSI.sub("", text).strip().splitlines() or [""]
    causes = [line.strip()[1:].strip() for line in lines[1:] if line.strip().startswith(_CAUSE)]
    return " -> ".join([lines[0].strip(), *[cause for cause in causes if cause]])


Filter = tuple[str, str, Any]
"""A row condition ``(column, operator, value)``; operators ``= != < <= > >=``."""

_OPERATORS = frozenset({"=", "!=", "<", "<=", ">", ">="})


def read_arrow(
    table: DeltaTable,
    *,
    columns: Sequence[str] | None = None,
    filters: Sequence[Filter] = (),
) -> pa.Table:
    """The rows of ``table`` (its loaded version) as a pyarrow table with the table's own
    Arrow schema, optionally projected to ``columns`` and restricted to the rows meeting
    every one of ``filters`` (a conjunction).

    The scan runs in delta-rs' engine (see the module docstring for why not pyarrow's).
    """
    import pyarrow as pa
    from deltalake import QueryBuilder

    schema = pa.schema(table.schema().to_arrow())
    wanted = list(columns) if columns is not None else schema.names
    unknown = [c for c in [*wanted, *(f[0] for f in filters)] if c not in schema.names]
    if unknown:
        raise ValueError(f"no column {unknown[0]!r} in the Delta table (it has {schema.names})")
    sql = f"SELECT {', '.join(sql_identifier(c) for c in wanted)} FROM fanout_read"
    if filters:
        sql += " WHERE " + predicate(filters)
    reader = QueryBuilder().register("fanout_read", table).execute(sql)
    result = pa.table(reader)
    target = pa.schema([schema.field(name) for name in wanted])
    # DataFusion hands strings back as string_view; give callers the table's own types.
    arrays = [result.column(i).cast(field.type) for i, field in enumerate(target)]
    return pa.Table.from_arrays(arrays, schema=target)


def read_delta(
    path: str,
    *,
    columns: Sequence[str] | None = None,
    filters: Sequence[Filter] = (),
    storage_options: Mapping[str, str] | None = None,
) -> pa.Table:
    """The rows of the Delta table at ``path`` (latest version): :func:`read_arrow` on it.

    Raises ``deltalake.exceptions.TableNotFoundError`` when there is no table there.
    """
    from deltalake import DeltaTable

    table = DeltaTable(path, storage_options=dict(storage_options or {}) or None)
    return read_arrow(table, columns=columns, filters=filters)


def predicate(filters: Sequence[Filter]) -> str:
    """``filters`` (a conjunction) as one SQL condition, names and values quoted: what
    :func:`read_arrow` reads, and the ``predicate`` of a delta-rs overwrite or delete."""
    return " AND ".join(_condition(*f) for f in filters)


def _condition(column: str, operator: str, value: Any) -> str:
    if operator not in _OPERATORS:
        raise ValueError(f"unsupported filter operator {operator!r} (use one of {_OPERATORS})")
    if value is None and operator in ("=", "!="):  # SQL's = NULL is never true
        return f"{sql_identifier(column)} IS {'NOT ' if operator == '!=' else ''}NULL"
    return f"{sql_identifier(column)} {operator} {_literal(value)}"


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return sql_literal(value)
    raise TypeError(f"cannot filter on a {type(value).__name__} value ({value!r})")


EPOCH_FENCE = 1 << 62
"""Added to an app transaction's version (plus one, so that "never written" is fenced too)
by a later epoch's fence (the Delta sink's ``fence_earlier_epochs``): a replaced epoch's
writer whose snapshot predates the fence loses its commit to it (delta-rs and delta-spark
conflict on a concurrent ``txn`` of an app id the transaction read), and one that reads it
refuses (:func:`transaction_state`). Batch ids stay far below it."""


def fenced_version(version: int | None) -> int:
    """The version a fence records for an app transaction at ``version`` (``None``: none)."""
    return EPOCH_FENCE + (-1 if version is None else version) + 1


def transaction_state(table: DeltaTable | None, app_id: str) -> tuple[int | None, bool]:
    """The last version recorded for ``app_id`` in the table's log with a later epoch's
    fence cleared (``None``: none), and whether that fence is there (:data:`EPOCH_FENCE`).
    A lifted fence of an app id never written records ``-1``: ``None`` here."""
    if table is None:
        return None, False
    raw = table.transaction_version(app_id)
    if raw is None:
        return None, False
    version, fenced = int(raw), False
    if version >= EPOCH_FENCE:
        version, fenced = version - EPOCH_FENCE - 1, True
    return (None if version < 0 else version), fenced


def transaction_version(table: DeltaTable | None, app_id: str) -> int | None:
    """The last version recorded for ``app_id`` in the table's log, or ``None``, a later
    epoch's fence cleared (:func:`transaction_state`; a writer asks that whether it is
    fenced).

    A log lookup (checkpoint plus the commits after it), never a scan of the data files.
    """
    return transaction_state(table, app_id)[0]


def commit_properties(
    transactions: Mapping[str, int], metadata: Mapping[str, str] | None = None
) -> CommitProperties:
    """Commit properties carrying one idempotent-write transaction per ``app_id: version``.

    Every transaction carries ``lastUpdated`` (now, in epoch milliseconds), as delta-spark
    writes it: under a table's ``delta.setTransactionRetentionDuration`` delta-spark drops a
    transaction without it at the next checkpoint, however recent, which would let a
    replayed batch be written twice (see :mod:`fanout.delta_tables.retention`).
    """
    from deltalake import CommitProperties, Transaction

    now_ms = int(time.time() * 1000)
    return CommitProperties(
        app_transactions=[
            Transaction(app_id=app_id, version=version, last_updated=now_ms)
            for app_id, version in transactions.items()
        ],
        custom_metadata=dict(metadata) if metadata else None,
    )


def is_commit_conflict(error: BaseException) -> bool:
    """Whether ``error`` is delta-rs refusing a commit because another writer committed
    first (on the same transaction app id, on data a merge read, a change of the table's
    metadata or protocol, or by creating the table a create-if-missing write expected
    absent), or because the log files after the snapshot's version are gone (other
    writers committed, and their commits removed the log files older than the table's
    ``delta.logRetentionDuration``: delta-rs cannot check them for conflicts). The
    snapshot is stale: re-check, retry."""
    from deltalake.exceptions import CommitFailedError, DeltaError

    text = str(error).lower()
    if isinstance(error, CommitFailedError):
        return any(
            sign in text
            for sign in (
                "concurrent",
                "version already exists",
                "metadata changed",
                "protocol changed",
            )
        )
    return isinstance(error, DeltaError) and (
        "already exists" in text or "invalid table version" in text
    )


def append_once(
    path: str,
    data: pa.Table,
    app_id: str,
    version: int,
    storage_options: Mapping[str, str] | None = None,
    metadata: Mapping[str, str] | None = None,
) -> bool:
    """Append ``data`` to the Delta table at ``path`` (created when missing) in a commit
    carrying the transaction ``(app_id, version)`` and ``metadata`` (the commit's custom
    metadata: :func:`commit_metadata` reads it back), unless the table's log already records
    that version or a later one for ``app_id``. Returns whether it appended.

    The check and the commit use one snapshot: a writer committing the same app id in
    between makes the commit fail (delta-rs' conflict check), and the check runs again on
    the fresh snapshot. This is how per-batch side tables (dead letters) stay exactly once
    across replays and zombie drivers.
    """
    from deltalake import write_deltalake

    commit = commit_properties({app_id: version}, metadata)
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        table = open_table(path, storage_options)
        done = transaction_version(table, app_id)
        if done is not None and done >= version:
            return False
        try:
            if table is not None:
                write_deltalake(table, data, mode="append", commit_properties=commit)
            else:
                options = dict(storage_options) if storage_options else None
                # "error": a table created by another writer since the check is a conflict
                write_deltalake(
                    path, data, mode="error", storage_options=options, commit_properties=commit
                )
            return True
        except Exception as exc:
            if not is_commit_conflict(exc) or attempt == COMMIT_ATTEMPTS:
                raise
            log.info("%s: lost a commit race for %s@%d, checking again: %s",
                     path, app_id, version, exc)  # fmt: skip
    raise AssertionError("unreachable")


HISTORY_FIRST_LOOK = 100
"""How many of the newest commits :func:`commit_metadata` reads before the whole history."""


def commit_metadata(table: DeltaTable, key: str, value: str) -> dict[str, Any] | None:
    """The commit information of the newest commit whose custom metadata has ``key`` equal
    to ``value`` (``None`` when no commit still in the log has it: never written, or its
    commit file removed by log cleanup). Reads the newest :data:`HISTORY_FIRST_LOOK`
    commits first, then the whole history.

    delta-rs' own history, not :func:`numbered_history`: the match is by ``key`` and no
    version is used, and a snapshot older than the newest commit only lists more commits
    (never fewer than ``limit`` unless that was the whole history left)."""
    for limit in (HISTORY_FIRST_LOOK, None):
        history = table.history(limit)
        for info in history:
            if info.get(key) == value:
                return dict(info)
        if limit is not None and len(history) < limit:
            return None  # that was the whole history
    return None


HISTORY_READS = 20
"""How often :func:`numbered_history` lists the history while other writers commit."""

HISTORY_PAUSE_S = (0.005, 0.2)
"""The pause before :func:`numbered_history`'s second read, and the longest one: doubled
each read, with jitter, so readers racing a busy writer do not list the log back to back
(under 3 s over all :data:`HISTORY_READS` reads)."""


def history_pause(attempt: int) -> float:
    """Seconds to wait before read ``attempt`` (1 for the second) of the history: the
    first pause doubled ``attempt - 1`` times, at most the longest, jittered down by up
    to half so that racing readers spread out."""
    first, longest = HISTORY_PAUSE_S
    pause = min(first * 2 ** min(attempt - 1, 16), longest)
    return pause * random.uniform(0.5, 1.0)


def numbered_history(table: DeltaTable, limit: int | None = None) -> list[dict[str, Any]]:
    """The commit infos of the newest ``limit`` (``None``: all) commits of ``table`` up to
    its snapshot's version, newest first, each with its true ``version``: what
    ``table.history(limit)`` would be if delta-rs numbered it right. Every reader of a
    Delta table's history in fanout that uses a version number, or counts entries, reads
    it through here.

    delta-rs (1.6) lists a table's history from the newest commit *in storage* but numbers
    the entries down from the *snapshot's* version (delta-io/delta-rs#4488): when another
    writer committed since the snapshot was loaded, or while the history is listed, every
    number is off by the commits it did not know of, and a version looked up in the
    history names another commit (the one before). So the newest version in storage is
    read before and after the listing (one ``_delta_log`` listing each, from the
    snapshot's version on): the same both times, it is the newest entry listed, the
    entries are numbered down from it, and those past the snapshot's version are dropped
    (the snapshot's callers reason about that version). Another writer committing in
    between: read again after a short pause (:func:`history_pause`), up to
    :data:`HISTORY_READS` times.

    A commit without a commit info (another writer's: delta-spark with
    ``spark.databricks.delta.commitInfo.enabled`` false, a log written by hand) is one
    entry holding its ``version`` alone. delta-rs leaves it out of its history and numbers
    the older entries one too high (and a ``limit`` counts it): when the listing holds
    fewer entries than the commits it read, its oldest entry is checked against its
    commit's file (:func:`_listed_whole`), and when that says a commit lacks a commit
    info, the commits' files are read instead (:func:`_read_commits`).

    :raises HistoryUnsettledError: another writer committed during each of the reads
        (its ``listed``: the last listing, its numbers unknown)."""
    at = table.version()
    listed: list[dict[str, Any]] = []
    for attempt in range(HISTORY_READS):
        if attempt:
            time.sleep(history_pause(attempt))
        newest = latest_version(table)
        listed = table.history(limit)
        if latest_version(table) != newest:
            continue  # a commit landed during the listing: its numbering is unknown
        if not listed or not _listed_whole(table, listed, newest, at, limit):
            return _read_commits(table, limit, at)
        shift = newest - int(listed[0]["version"])  # delta-rs: from the snapshot's version
        numbered = []
        for info in listed:
            version = int(info["version"]) + shift
            if version <= at:
                numbered.append({**info, "version": version})
        return numbered
    raise HistoryUnsettledError(
        f"cannot number the history of the Delta table at {table.table_uri}: other writers "
        f"committed during each of {HISTORY_READS} reads of it (try again once they pause)",
        listed,
    )


def _listed_whole(
    table: DeltaTable,
    listed: Sequence[Mapping[str, Any]],
    newest: int,
    at: int,
    limit: int | None,
) -> bool:
    """Whether delta-rs' history ``listed`` (newest first, read with ``limit`` on a
    snapshot at ``at``, from version ``newest`` in storage) holds an entry for every commit
    it read: as many entries as commits (every version, or those after ``at`` and ``limit``
    more), or, fewer, its oldest entry the commit info of the version that many below
    ``newest``, and no commit file before it (the log's start, or cleaned up). One or two
    reads of a commit file, only when the listing is short."""
    read = newest + 1 if limit is None else min(newest + 1, newest - at + limit)
    if len(listed) == read:
        return True
    oldest = newest - len(listed) + 1
    store = _log_store(table)
    found = _read_commit(store, oldest)
    if found != {k: v for k, v in listed[-1].items() if k != "version"}:
        return False  # a commit above it has no commit info: the numbers are off
    return oldest == 0 or _read_commit(store, oldest - 1) is None


def _read_commits(table: DeltaTable, limit: int | None, at: int) -> list[dict[str, Any]]:
    """The commit infos of the newest ``limit`` commits up to version ``at`` (down to the
    log's start), read from their files, each numbered by its file; a commit without one
    as its ``version`` alone."""
    store, entries = _log_store(table), []
    for version in range(at, -1 if limit is None else max(at - limit, -1), -1):
        info = _read_commit(store, version)
        if info is None:
            break  # the log's start, or cleaned up below here
        entries.append({**info, "version": version})
    return entries


def _log_store(table: DeltaTable) -> Any:
    """delta-rs' own object store of ``table`` (a local disk or an object store alike)."""
    from deltalake.fs import DeltaStorageHandler

    options = getattr(table, "_storage_options", None)
    return DeltaStorageHandler(table.table_uri, dict(options or {}) or None)


def _read_commit(store: Any, version: int) -> dict[str, Any] | None:
    """The commit info in the log's file of ``version`` (``{}``: it has none; ``None``:
    no such file)."""
    import json

    try:
        data = store.open_input_file(f"_delta_log/{version:020d}.json").read()
    except FileNotFoundError:
        return None
    for line in data.decode().splitlines():
        action = json.loads(line) if line.strip() else {}
        if "commitInfo" in action:
            return dict(action["commitInfo"])
    return {}


def latest_version(table: DeltaTable) -> int:
    """The newest version of ``table`` in storage, whatever its snapshot's: delta-rs'
    binding's own call (the Python class does not expose it), which lists the log from the
    snapshot's version on; when it cannot (no such binding call, or the log cleaned up past
    the snapshot's version: "Invalid table version"), the version of a fresh snapshot."""
    # private on purpose: delta-rs 1.x (checked 1.6.6 and its main) has no public call for
    # the newest version but a fresh load of the whole snapshot, nor one for the options
    latest = getattr(getattr(table, "_table", None), "get_latest_version", None)
    if latest is not None:
        try:
            return int(latest())
        except Exception as exc:
            log.debug("%s: listing the log from version %d failed, loading the table: %s",
                      table.table_uri, table.version(), exc)  # fmt: skip
    from deltalake import DeltaTable

    options = getattr(table, "_storage_options", None)
    return DeltaTable(table.table_uri, storage_options=options).version()
