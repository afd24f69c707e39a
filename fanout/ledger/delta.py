"""The ledger: which sink committed which batch, kept in a Delta table (ARCHITECTURE §3).

One row per (pipeline, sink, batch, attempt outcome). Every ``committed`` row is appended
in a Delta commit that also carries two idempotent-write transactions:

- ``fanout/<pipeline>/<sink>`` at version ``batch_id``: the sink's mark. "Which batch did
  sink S last commit?" is :meth:`DeltaLedger.last_committed`, a log lookup, and marking a
  batch twice is a no-op.
- ``fanout/<pipeline>`` at the highest batch id any sink of the pipeline committed: the
  pipeline's high-water mark, read by the checkpoint-reset guard without a scan.

The default engine is delta-rs: a mark is a few milliseconds from the driver, no Spark job.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fanout.contract.batch import txn_app_id
from fanout.contract.locations import shown_location
from fanout.delta_tables.compaction import Compaction
from fanout.delta_tables.compaction import compact as compact_table
from fanout.delta_tables.io import (
    COMMIT_ATTEMPTS,
    Filter,
    commit_properties,
    is_commit_conflict,
    one_line,
    open_fanout_table,
    read_arrow,
    refuse_unusable_location,
    transaction_version,
)
from fanout.delta_tables.retention import (
    LOG_RETENTION_PROPERTY,
    OWN_LOG_RETENTION,
    check_ledger_retention,
    parse_interval,
)
from fanout.errors import (
    CheckpointResetError,
    CompactionError,
    LedgerError,
    ZombieBatchError,
)
from fanout.ledger.begun import BEGUN
from fanout.ledger.entry import (
    MARK_HOLD,
    OWN_ROWS,
    LedgerEntry,
    LedgerView,
    MaintenanceReport,
    as_of_log,
    entries_from_arrow,
    entries_to_arrow,
    epoch_app_id,
    epoch_follows,
    epoch_owners,
    epoch_taken_message,
    ledger_location,
    ledger_schema,
    lost_app_id,
    pipeline_app_id,
    replaced_app_id,
    skip_app_id,
)
from fanout.ledger.gaps import is_skip, written_beside_skip
from fanout.ledger.recovery import (
    RECOVERY,
    RecoveryReport,
    late_mark,
    recovery_app_id,
    refused_start,
    report_entries,
    report_of,
    started_from_app_id,
)
from fanout.ledger.refusals import ADMITTED, REFUSED
from fanout.ledger.target_records import (
    DEAD_LETTER,
    TargetRecord,
    record_entry,
    records_of,
    since_app_id,
    since_code,
    target_app_id,
    target_digest,
)
from fanout.observe.secrets import location_secrets, redact

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable


log = logging.getLogger(__name__)


class DeltaLedger:
    """The ledger as a Delta table at ``path``, written with delta-rs.

    :param path: table location (local path or object-store URI).
    :param storage_options: passed to delta-rs for object stores.
    :param checkpoint_interval: a Delta log checkpoint every this many commits, so a
        lookup reads one checkpoint and fewer than this many JSON commits, however old
        the ledger is (set when the table is created). delta-rs replays the JSON commits
        since the checkpoint on every refresh and commit: over 300 marks, with 20 a mark
        costs 8.3 ms on average and a lookup 1.1 ms; with 100, 9.5 and 2.3 ms.
    :param compact_after_files: once this ledger has added this many data files (one per
        commit) since it opened or last compacted, it compacts the table's small files into
        one, right after the commit that reached the count (``None``: never; ``fanout
        ledger maintain`` still does). delta-rs' commit costs grow with the table's active
        files, about 0.1 ms each: without compaction a mark costs 7 ms on a new ledger and
        60 ms after 600 marks.
    :param mark_linger_s: how long a mark may wait for the marks of the batch's other
        sinks still writing, to share their commit (see :meth:`mark_committed`).
    :param log_retention: the ledger's ``delta.logRetentionDuration`` (a Delta interval),
        set when the table is created, and when an existing ledger has none (``None``:
        leave the table's own). delta-rs lists every file of the log directory at every
        commit, and removes the log files older than this (before the last checkpoint)
        as it commits; Delta's default keeps 30 days of them. On a local disk, 3,000
        batches 10 s apart made a batch's lookup and mark 32-36 ms slower with Delta's
        default, 4 ms with 15 minutes (``bench/bench_aged.py``). fanout reads no old
        version of its ledger (the marks are transactions, kept in every checkpoint).
    """

    def __init__(
        self,
        path: str,
        *,
        storage_options: Mapping[str, str] | None = None,
        checkpoint_interval: int = 20,
        compact_after_files: int | None = 32,
        mark_linger_s: float = 0.1,
        log_retention: str | None = OWN_LOG_RETENTION,
    ) -> None:
        if checkpoint_interval < 1:
            raise ValueError("checkpoint_interval must be >= 1")
        if compact_after_files is not None and compact_after_files < 2:
            raise ValueError("compact_after_files must be >= 2, or None")
        self.path = str(path)
        self.storage_options = dict(storage_options or {})
        self.checkpoint_interval = checkpoint_interval
        self.compact_after_files = compact_after_files
        self.mark_linger_s = mark_linger_s
        if log_retention is not None:
            parse_interval(log_retention)  # ValueError now, not at the first commit
        self.log_retention = log_retention
        self._files_added = 0  # data files committed since opening or compacting
        self._lock = threading.Lock()  # one ledger commit or refresh at a time
        self._queue_lock = threading.Lock()
        self._queued: list[_MarkRequest] = []
        self._table: DeltaTable | None = None
        self._txns = _KnownTransactions()
        self._reports: dict[tuple[str, int], RecoveryReport | None] = {}  # immutable rows

    def __repr__(self) -> str:
        return f"DeltaLedger({self.path!r})"

    @property
    def _shown(self) -> str:
        """The ledger's location as its errors and logs name it (a password masked)."""
        return shown_location(self.path)

    @property
    def _where(self) -> str:
        return f"ledger at {self._shown}"

    def _masked(self, exc: BaseException) -> str:
        """``exc``'s text on one line, the location's password masked (the store's own
        error names the location as written)."""
        return redact(one_line(str(exc)), location_secrets(self.path))

    def __getstate__(self) -> dict[str, Any]:
        """Configuration only (pickled with a ``FanOut`` under Spark Connect): no lock,
        no queued marks, no open table; ``open()`` runs again where it lands."""
        live = ("_lock", "_queue_lock", "_queued", "_table", "_txns", "_files_added", "_reports")
        return {k: v for k, v in self.__dict__.items() if k not in live}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._queue_lock = threading.Lock()
        self._queued = []
        self._table = None
        self._txns = _KnownTransactions()
        self._files_added = 0
        self._reports = {}

    # -- setup ----------------------------------------------------------------------

    def open(self) -> None:
        """Create the ledger table when missing (idempotent, safe against a racing peer).

        Raises :class:`fanout.ConfigurationError` when the table sets a
        ``delta.setTransactionRetentionDuration`` (see :mod:`fanout.delta_tables.retention`),
        or when delta-rs cannot keep a table at its path
        (:func:`fanout.delta_tables.io.refuse_unusable_location`).
        """
        refuse_unusable_location(self.path, self._where, self.storage_options)
        with self._lock:
            self._table = self._load_or_create()
            self._keep_log_short(self._table)
            self._files_added = len(self._table.file_uris())  # a long uncompacted ledger
        # the ledger's transaction ids are its marks: refuse a table that expires them
        check_ledger_retention(self._table.metadata().configuration, self._where)

    def exists(self) -> bool:
        """Whether the ledger table is there (read only: a pipeline that never ran has
        none yet); raises as :meth:`check` does for a location or store it cannot read."""
        refuse_unusable_location(self.path, self._where, self.storage_options)
        return _open_ledger(self.path, self.storage_options) is not None

    def check(self) -> list[str]:
        """:meth:`open`'s checks, changing nothing (``fanout validate``): what :meth:`open`
        would create or change, as "would ..." texts (empty: nothing); raises as
        :meth:`open` does for a location or a table it would refuse."""
        refuse_unusable_location(self.path, self._where, self.storage_options)
        table = _open_ledger(self.path, self.storage_options)
        if table is None:
            return ["create the ledger table"]
        _check_is_ledger(table, self._shown)
        check_ledger_retention(table.metadata().configuration, self._where)
        if self.log_retention is None or _keeps_a_log_retention(table):
            return []
        return [f"set {LOG_RETENTION_PROPERTY} = {self.log_retention!r} on the ledger table"]

    def _load_or_create(self) -> DeltaTable:
        from deltalake import DeltaTable

        table = _open_ledger(self.path, self.storage_options)
        if table is not None:
            _check_is_ledger(table, self._shown)
            return table
        try:
            return DeltaTable.create(
                self.path,
                schema=ledger_schema(),
                mode="ignore",
                partition_by=["pipeline"],
                name="fanout_ledger",
                description="fanout ledger: per-sink completion of each micro-batch",
                configuration={
                    "delta.checkpointInterval": str(self.checkpoint_interval),
                    **self._log_configuration(),
                },
                storage_options=self.storage_options or None,
            )
        except Exception as exc:
            table = _open_ledger(self.path, self.storage_options)  # lost a creation race?
            if table is None:
                raise LedgerError(
                    f"cannot create the ledger at {self._shown}: {self._masked(exc)}"
                ) from exc
            return table

    def _log_configuration(self) -> dict[str, str]:
        return {} if self.log_retention is None else {LOG_RETENTION_PROPERTY: self.log_retention}

    def _keep_log_short(self, table: DeltaTable) -> None:
        """Give a ledger made before fanout set its log retention (or with the property
        removed) this ledger's, in one metadata commit. A failure (another writer's
        commit meanwhile) is logged: the marks do not depend on it, the next start tries
        again."""
        if self.log_retention is None or _keeps_a_log_retention(table):
            return
        try:
            table.alter.set_table_properties(self._log_configuration())
        except Exception as exc:
            if self._log_retention_set_meanwhile():
                return  # another FanOut opening the same ledger set it first
            log.warning(
                "ledger %s: could not set %s = %r (its log keeps Delta's default 30 days, "
                "and every mark lists all of it): %s",
                self._shown, LOG_RETENTION_PROPERTY, self.log_retention, self._masked(exc),
            )  # fmt: skip
            return
        log.info(
            "ledger %s: keeps %s of log from now on (%s)",
            self._shown, self.log_retention, LOG_RETENTION_PROPERTY,
        )  # fmt: skip

    def _log_retention_set_meanwhile(self) -> bool:
        try:
            table = _open_ledger(self.path, self.storage_options)
        except Exception:
            return False
        return table is not None and _keeps_a_log_retention(table)

    def _fresh(self) -> DeltaTable:
        """The ledger table at its latest version (caller holds the lock)."""
        return self._loaded(refresh=True)

    def _loaded(self, *, refresh: bool) -> DeltaTable:
        """The ledger table as loaded, brought to its latest version when ``refresh``
        (caller holds the lock)."""
        if self._table is None:
            refuse_unusable_location(self.path, self._where, self.storage_options)
            table = _open_ledger(self.path, self.storage_options)
            if table is None:
                raise LedgerError(
                    f"no ledger at {self._shown}: a FanOut creates it when it starts; check "
                    "the path"
                )
            _check_is_ledger(table, self._shown)
            self._table = table
        elif refresh:
            try:
                self._table.update_incremental()
            except Exception as exc:  # the store unreachable: name the ledger, mask it
                raise LedgerError(
                    f"cannot read the {self._where}: {self._masked(exc)}; check that its "
                    "store is reachable, then run again (a query: restart it; Spark replays "
                    "the batch, and each sink whose mark of it is missing writes it again, "
                    "which the sink's own records of the batch make a no-op)"
                ) from exc
        return self._table

    def _version(self, table: DeltaTable, app_id: str) -> int | None:
        """``transaction_version`` of ``app_id`` on ``table``, remembered for its version."""
        return self._txns.get(table, app_id)

    # -- lookups (log only) ---------------------------------------------------------

    def last_committed(
        self, pipeline: str, sinks: Iterable[str], epoch: int = 0
    ) -> dict[str, int | None]:
        """The last batch id each sink committed, read from the log's txn actions."""
        with self._lock:
            return self._marks(self._fresh(), pipeline, sinks, epoch)

    def high_water(self, pipeline: str, epoch: int = 0) -> int | None:
        """The highest batch id any sink of ``pipeline`` committed, from the log."""
        with self._lock:
            table = self._fresh()
            return self._version(table, pipeline_app_id(pipeline, epoch))

    def current_epoch(self, pipeline: str) -> int:
        """The pipeline's epoch, from the log (0 when none was ever started)."""
        with self._lock:
            return self._epoch(self._fresh(), pipeline)

    def lookup(self, pipeline: str, sinks: Iterable[str]) -> LedgerView:
        """Epoch, high-water mark and marks from one refresh of the log (each refresh
        lists the log directory, so a batch pays for one instead of three)."""
        with self._lock:
            table = self._fresh()
            started = self._version(table, epoch_app_id(pipeline))
            epoch = started or 0
            return LedgerView(
                epoch,
                self._version(table, pipeline_app_id(pipeline, epoch)),
                self._marks(table, pipeline, sinks, epoch),
                owner_recorded=started is not None,
            )

    def _marks(
        self, table: DeltaTable, pipeline: str, sinks: Iterable[str], epoch: int
    ) -> dict[str, int | None]:
        return {s: self._version(table, txn_app_id(pipeline, s, epoch)) for s in sinks}

    def _epoch(self, table: DeltaTable, pipeline: str) -> int:
        return self._version(table, epoch_app_id(pipeline)) or 0

    def start_epoch(self, entry: LedgerEntry) -> None:
        """Append the epoch row, with the epoch as the version of its txn action (epoch 0's
        claim: the first version of that txn). Two starts committed from one snapshot
        carry the same txn app id, and delta-rs refuses the second: it checks again on the
        fresh snapshot, and commits again while the epoch is still free.

        When the pipeline's newest ``fanout recover`` report is of the epoch this one
        replaces, the epoch starts from it (:meth:`_from_report`): refused with
        :class:`fanout.ZombieBatchError` when a batch the report did not count was
        committed since."""
        if entry.status != "epoch":
            raise ValueError("start_epoch takes an epoch entry")
        app_id = epoch_app_id(entry.pipeline)
        with self._lock:
            for attempt in range(1, COMMIT_ATTEMPTS + 1):
                table = self._fresh()
                current = self._version(table, app_id)
                if attempt > 1 and current == entry.epoch and self._started_by(table, entry):
                    return  # the commit reported as failed had landed
                if not epoch_follows(entry.epoch, current):  # another query came first
                    raise CheckpointResetError(epoch_taken_message(entry, current))
                txns = {app_id: entry.epoch, **self._from_report(table, entry)}
                try:
                    self._append(table, [entry], txns)
                    return
                except LedgerError as exc:
                    cause = exc.__cause__
                    if attempt == COMMIT_ATTEMPTS or cause is None or not is_commit_conflict(cause):
                        raise

    def check_start(self, entry: LedgerEntry) -> None:
        """Raise what :meth:`start_epoch` would, on the latest snapshot, without writing:
        :class:`fanout.CheckpointResetError` when another query started the epoch first,
        :class:`fanout.ZombieBatchError` when a batch the report it starts from did not
        count was committed since (:meth:`_from_report`). Read by a new epoch's start
        before it fences the sinks (:func:`fanout.steps.unmarked.refuse_unmarked`), so that
        a start refused for it fences nothing; :meth:`start_epoch` checks again. One log
        refresh, and the report's filtered read when there is one, per epoch start."""
        if entry.status != "epoch":
            raise ValueError("check_start takes an epoch entry")
        with self._lock:
            table = self._fresh()
            current = self._version(table, epoch_app_id(entry.pipeline))
            if not epoch_follows(entry.epoch, current):
                raise CheckpointResetError(epoch_taken_message(entry, current))
            self._from_report(table, entry)

    def _from_report(self, table: DeltaTable, entry: LedgerEntry) -> dict[str, int]:
        """The transactions starting ``entry.epoch`` from the pipeline's newest report, when
        that report is of the epoch before (none otherwise: no report to start from).
        Raises :class:`fanout.ZombieBatchError` when ``table`` holds a batch of the old epoch
        the report did not count. The commit carries the report's number, and the old
        epoch's high-water transaction at its version: a mark of the old epoch committed
        after this snapshot makes delta-rs refuse the start (checked again on the fresh
        snapshot), and one committed after the start is refused first, and then fails as a
        late mark (:meth:`_late_mark`)."""
        if entry.epoch == 0:
            return {}
        number = self._version(table, recovery_app_id(entry.pipeline))
        report = None if number is None else self._report(table, entry.pipeline, number)
        if report is None or report.epoch != entry.epoch - 1:
            return {}
        rows = self._committed_as_of_log(
            table, entry.pipeline, report.resume_after + 1, report.epoch
        )
        since = report.since(rows)
        if since:
            raise refused_start(report, entry, since, ledger_location(self))
        txns = {started_from_app_id(entry.pipeline, entry.epoch): report.number}
        old_high = pipeline_app_id(entry.pipeline, report.epoch)
        high = self._version(table, old_high)
        if high is not None:
            txns[old_high] = high
        return txns

    def _report(self, table: DeltaTable, pipeline: str, number: int) -> RecoveryReport | None:
        """Report ``number`` of ``pipeline`` (its rows never change: read once)."""
        key = (pipeline, number)
        if key not in self._reports:
            rows = read_arrow(
                table,
                filters=[
                    ("pipeline", "=", pipeline),
                    ("status", "=", RECOVERY),
                    ("attempt", "=", number),
                ],
            )
            self._reports[key] = report_of(pipeline, number, entries_from_arrow(rows))
        return self._reports[key]

    def record_recovery(
        self, resume: LedgerEntry, counted: Mapping[str, LedgerEntry]
    ) -> RecoveryReport:
        """Record a ``fanout recover`` report: a new checkpoint resumes after ``resume``
        (the mark of the sink furthest behind), and ``counted`` is each sink's counted
        batch in ``resume.epoch``. Its number is the next version of the pipeline's
        ``#recovery`` transaction; two reports committed at once are numbered apart
        (delta-rs refuses the second, which is numbered again on the fresh snapshot)."""
        app_id = recovery_app_id(resume.pipeline)
        with self._lock:
            for attempt in range(1, COMMIT_ATTEMPTS + 1):
                table = self._fresh()
                number = (self._version(table, app_id) or 0) + 1
                entries = report_entries(number, resume, counted)
                try:
                    self._append(table, entries, {app_id: number})
                except LedgerError as exc:
                    cause = exc.__cause__
                    if attempt == COMMIT_ATTEMPTS or cause is None or not is_commit_conflict(cause):
                        raise
                    continue
                report = report_of(resume.pipeline, number, entries)
                assert report is not None
                self._reports[(resume.pipeline, number)] = report
                return report
        raise AssertionError("unreachable")

    # -- each sink's dead-letter target (fanout.deadletters.moved) ----------------------

    def dead_letter_marks(self, pipeline: str, sinks: Sequence[str]) -> dict[str, tuple[int, int]]:
        """Per sink with a recorded dead-letter target: the digest of its last one and the
        batch it applies from, coded (:mod:`fanout.deadletters.moved`), from the log's
        transactions (no scan)."""
        with self._lock:
            table = self._fresh()
            found: dict[str, tuple[int, int]] = {}
            for sink in sinks:
                app = txn_app_id(pipeline, sink)
                digest = self._version(table, target_app_id(app))
                if digest is not None:
                    found[sink] = (digest, self._version(table, since_app_id(app)) or 0)
            return found

    def dead_letter_records(self, pipeline: str, sink: str) -> list[TargetRecord]:
        """Every dead-letter target recorded for ``sink``, in order (a filtered read of its
        ``dead_letter`` rows: only when its target changed)."""
        with self._lock:
            table = self._fresh()
        if "dead_letter" not in {f.name for f in table.schema().fields}:
            return []
        scope: list[Filter] = [("pipeline", "=", pipeline), ("sink", "=", sink)]
        rows = read_arrow(table, filters=[*scope, ("status", "=", DEAD_LETTER)])
        return records_of(entries_from_arrow(rows))

    def record_dead_letters(self, pipeline: str, records: Mapping[str, TargetRecord]) -> None:
        """Append one ``dead_letter`` row per sink, with the transactions naming its digest
        and first batch, in one commit."""
        entries = [record_entry(pipeline, sink, record) for sink, record in records.items()]
        txns: dict[str, int] = {}
        for sink, record in records.items():
            app = txn_app_id(pipeline, sink)
            txns[target_app_id(app)] = target_digest(record.target)
            txns[since_app_id(app)] = since_code(record.since)
        with self._lock:
            for attempt in range(1, COMMIT_ATTEMPTS + 1):
                try:
                    self._append(self._fresh(), entries, txns)
                    return
                except LedgerError as exc:  # another writer's commit meanwhile: again
                    cause = exc.__cause__
                    if attempt == COMMIT_ATTEMPTS or cause is None or not is_commit_conflict(cause):
                        raise

    # -- batches refused before any write (fanout.ledger.refusals) ------------------------

    def record_refusal_row(self, entry: LedgerEntry) -> None:
        """Append a ``refused`` or ``admitted`` row (no transaction), again on the fresh
        snapshot when delta-rs refuses it (as :meth:`record_failure`)."""
        if entry.status not in (REFUSED, ADMITTED):
            raise ValueError("record_refusal_row takes a refused or admitted entry")
        self._append_row(entry)

    def refusal_rows(self, pipeline: str, epoch: int, batch_id: int) -> list[LedgerEntry]:
        """The ``refused`` and ``admitted`` rows of one batch of one epoch: a filtered read
        of the batch's rows (only on a refusal, and on a replay asking about one)."""
        with self._lock:
            table = self._fresh()
        filters: list[Filter] = [("pipeline", "=", pipeline), ("batch_id", "=", batch_id)]
        rows = entries_from_arrow(read_arrow(table, filters=filters))
        return [e for e in rows if e.status in (REFUSED, ADMITTED) and e.epoch == epoch]

    # -- catch-up writes of backfilled batches begun (fanout.ledger.begun) ---------------

    def record_begun(self, entry: LedgerEntry) -> None:
        """Append a ``begun`` row (no transaction), again on the fresh snapshot when
        delta-rs refuses it (as :meth:`record_failure`)."""
        if entry.status != BEGUN:
            raise ValueError("record_begun takes a begun entry")
        self._append_row(entry)

    def begun(self, pipeline: str, sink: str, epoch: int, batch_id: int) -> bool:
        """Whether a ``begun`` row of the batch and sink is there: a read filtered by
        pipeline, sink, epoch, batch and status (file statistics skip most files; a
        ``begun`` row always names its epoch)."""
        with self._lock:
            table = self._fresh()
        filters: list[Filter] = [
            ("pipeline", "=", pipeline), ("sink", "=", sink), ("epoch", "=", epoch),
            ("batch_id", "=", batch_id), ("status", "=", BEGUN),
        ]  # fmt: skip
        return read_arrow(table, columns=["status"], filters=filters).num_rows > 0

    def _late_mark(
        self, table: DeltaTable, entry: LedgerEntry, version: Callable[[str], int | None]
    ) -> ZombieBatchError | None:
        """The failure of the mark ``entry`` when it is of an epoch a later one replaced,
        started from a report that did not count its batch (``None``: a mark of the
        current epoch, the common path, reads nothing more: the epoch's version is the
        lookup's)."""
        current = version(epoch_app_id(entry.pipeline))
        if current is None or entry.epoch >= current:
            return None
        number = version(started_from_app_id(entry.pipeline, entry.epoch + 1))
        report = None if number is None else self._report(table, entry.pipeline, number)
        if report is None or not report.beyond(entry):
            return None
        high = version(pipeline_app_id(entry.pipeline, 0))
        owner = self._owners(table, entry.pipeline, high).get(entry.epoch + 1)
        return late_mark(report, entry, owner, ledger_location(self))

    def _started_by(self, table: DeltaTable, entry: LedgerEntry) -> bool:
        """Whether ``table`` holds ``entry``'s epoch row: its query started the epoch."""
        high = self._version(table, pipeline_app_id(entry.pipeline, 0))
        return self._owners(table, entry.pipeline, high).get(entry.epoch) == entry.query_id

    # -- writes ---------------------------------------------------------------------

    def mark_committed(self, entry: LedgerEntry) -> bool:
        """Append the committed row with its txn actions unless the mark exists.

        Marks wait for one another (one Delta commit at a time). Those that queued up while
        a commit was running are committed together, in one commit, by whichever caller
        takes the lock next. Called by the dispatcher (with a :data:`MARK_HOLD`), a queued
        mark first waits while another sink of its batch is still writing, at most
        ``mark_linger_s``: the batch's sinks that finish within that time share one commit,
        made by the last of them. Every mark is still durable before its call returns.
        """
        if entry.status != "committed":
            raise ValueError("mark_committed takes a committed entry")
        request = _MarkRequest(entry)
        with self._queue_lock:
            self._queued.append(request)
        hold = MARK_HOLD.get()
        if hold is not None:
            hold.release_and_wait(self.mark_linger_s)
        with self._lock:
            if not request.settled:
                self._commit_queued()
        return request.outcome()

    def _commit_queued(self) -> None:
        """Commit every queued mark in one Delta commit (caller holds the lock).

        The marks are checked and committed on one snapshot: the one loaded, without listing
        the log again (the batch's lookup just did). Every mark commit carries the
        pipeline's high-water transaction, so when another writer (a zombie driver) has
        committed a mark of the same pipeline since, delta-rs refuses the commit; the marks
        are then checked again on the fresh snapshot, so a mark the other writer already
        recorded counts as done, never as a failure or a second row.
        """
        with self._queue_lock:
            requests, self._queued = self._queued, []
        try:
            for attempt in range(1, COMMIT_ATTEMPTS + 1):
                try:
                    self._commit_requests(
                        [r for r in requests if not r.settled], refresh=attempt > 1
                    )
                    return
                except LedgerError as exc:
                    cause = exc.__cause__
                    if attempt == COMMIT_ATTEMPTS or cause is None or not is_commit_conflict(cause):
                        raise
                    log.info(
                        "ledger %s: lost a commit race, checking the marks again: %s",
                        self._shown,
                        cause,
                    )
        except BaseException as exc:
            for request in requests:
                if not request.settled:
                    request.fail(exc)
            raise

    def _commit_requests(self, requests: Sequence[_MarkRequest], *, refresh: bool) -> None:
        """Check ``requests`` on the loaded (``refresh``: latest) snapshot and commit those
        not yet recorded."""
        table = self._loaded(refresh=refresh)
        versions: dict[str, int | None] = {}

        def version(app_id: str) -> int | None:
            if app_id not in versions:
                versions[app_id] = self._version(table, app_id)
            return versions[app_id]

        accepted: list[_MarkRequest] = []
        txns: dict[str, int] = {}
        late: list[tuple[_MarkRequest, ZombieBatchError]] = []
        for request in requests:
            entry = request.entry
            sink_app = txn_app_id(entry.pipeline, entry.sink, entry.epoch)
            done = version(sink_app)
            replacing = done == entry.batch_id and _replaces_lost(entry, sink_app, version)
            beside = False
            if done is not None and done >= entry.batch_id and not replacing:
                beside = self._beside_skip(table, entry, version(skip_app_id(sink_app)))
                if not beside:
                    # a late mark made again (the catch-up's next try of its spooled batch)
                    # passes: its first failed, and failing each try stalled the sink for good
                    request.settle(False)
                    continue
            error = self._late_mark(table, entry, version)
            if error is not None:  # recorded all the same: the sink holds the batch
                late.append((request, error))
            pipeline_app = pipeline_app_id(entry.pipeline, entry.epoch)
            high = version(pipeline_app)
            if not beside:  # beside a skip's mark: the sink's transaction stays at it
                versions[sink_app] = txns[sink_app] = entry.batch_id
            if is_skip(entry):  # a write's own mark of a batch it holds reads the marks
                versions[skip_app_id(sink_app)] = txns[skip_app_id(sink_app)] = entry.batch_id
            if entry.lost or replacing:  # §5: a write's own mark replaces a lost one
                app = lost_app_id(sink_app) if entry.lost else replaced_app_id(sink_app)
                versions[app] = txns[app] = entry.batch_id
            versions[pipeline_app] = txns[pipeline_app] = max(
                entry.batch_id, -1 if high is None else high
            )
            accepted.append(request)
        if accepted:
            self._append(table, [r.entry for r in accepted], txns)
        for request in accepted:
            request.settle(True)
        for request, error in late:
            request.fail(error)

    def _beside_skip(self, table: DeltaTable, entry: LedgerEntry, skipped: int | None) -> bool:
        """Whether ``entry``, a mark its sink's transaction already holds, is a write's own
        mark of a batch the sink's marks hold only by a ``fanout ledger skip`` made while
        the write ran (:func:`fanout.ledger.gaps.written_beside_skip`). ``skipped``: the
        batch of the sink's last skip mark, from the log (:func:`skip_app_id`); the marks
        are read (one scan of the sink's marks of the epoch from the batch on) only when
        it is at or past the batch, so a mark made twice stays a look at the log."""
        if entry.error is not None or entry.lost:
            return False
        if skipped is None or skipped < entry.batch_id:
            return False
        marks = [
            (e.batch_id, is_skip(e))
            for e in self._committed_as_of_log(table, entry.pipeline, entry.batch_id, entry.epoch)
            if e.sink == entry.sink
        ]
        return written_beside_skip(entry, marks)

    def record_failure(self, entry: LedgerEntry) -> None:
        """Append a failed-attempt row (no txn action), again on the fresh snapshot when
        delta-rs refuses it (another writer's compaction of the ledger, planned after
        this snapshot, removed the files it was based on)."""
        self._append_row(entry)

    def _append_row(self, entry: LedgerEntry) -> None:
        """Append ``entry`` alone, without a transaction, again on the fresh snapshot when
        delta-rs refuses it (:meth:`record_failure`)."""
        with self._lock:
            for attempt in range(1, COMMIT_ATTEMPTS + 1):
                try:
                    self._append(self._fresh(), [entry], {})
                    return
                except LedgerError as exc:
                    cause = exc.__cause__
                    if attempt == COMMIT_ATTEMPTS or cause is None or not is_commit_conflict(cause):
                        raise

    def _append(
        self, table: DeltaTable, entries: Sequence[LedgerEntry], txns: Mapping[str, int]
    ) -> None:
        from deltalake import write_deltalake

        base = table.version()
        try:
            write_deltalake(
                table,
                entries_to_arrow(entries),
                mode="append",
                schema_mode="merge",  # a ledger made by an older fanout gains new columns
                commit_properties=commit_properties(txns) if txns else None,
            )
        except Exception as exc:
            raise LedgerError(
                f"cannot write to the ledger at {self._shown}: {self._masked(exc)}"
            ) from exc
        # write_deltalake advances `table` to the version it committed: no refresh needed
        self._txns.committed(table, base, txns)
        self._files_added += len({entry.pipeline for entry in entries})  # one per partition
        if self.compact_after_files is not None and self._files_added >= self.compact_after_files:
            self._compact(table)

    def _compact(self, table: DeltaTable) -> None:
        """Rewrite the table's small files (caller holds the lock): :meth:`_compaction`.
        A failure (another writer compacted first) is logged: the marks are committed,
        and the next compaction tries again."""
        base = table.version()
        try:
            done = self._compaction(table)
        except CompactionError as exc:  # rows stay duplicated: say so loudly
            log.error("ledger %s: %s", self._shown, self._masked(exc))
            table.update_incremental()
        except Exception as exc:
            log.warning(
                "ledger %s: compacting its small files failed: %s", self._shown, self._masked(exc)
            )  # to an application's handlers too: masked
            table.update_incremental()  # the known transactions follow its version
        else:
            log.debug("ledger %s: compacted %s small files", self._shown, done.files_removed)
            self._txns.committed(table, base, {})  # carries no transaction
        self._files_added = 0

    def refused_compaction(self) -> str | None:
        """What a compaction of the ledger's table that left rows twice and cannot be taken
        back says, naming the fix (``fanout status``), changing nothing; ``None`` when there
        is none, or no ledger yet (:func:`fanout.delta_tables.compaction.refused_compaction`)."""
        from fanout.delta_tables.compaction import refused_compaction

        table = _open_ledger(self.path, self.storage_options)
        if table is None:
            return None
        return refused_compaction(table, self._where, self.storage_options)

    def _compaction(self, table: DeltaTable) -> Compaction:
        """Compact the ledger by overwriting it with its own rows, one file per pipeline,
        rather than by delta-rs' ``OPTIMIZE`` (ARCHITECTURE §4). delta-rs commits an
        ``OPTIMIZE`` whose files another compaction removed first (it only refuses what
        removed files with ``dataChange=true``), duplicating every row both rewrote; an
        overwrite removes them with ``dataChange=true``, so delta-rs refuses any
        compaction of the ledger planned before it and committed after it (an overwrite
        or an ``OPTIMIZE``). Marks committed meanwhile stay (delta-rs keeps the files the
        overwrite did not read), and so do all the transactions (the marks): they live in
        the log, not in the files. The one race left, an ``OPTIMIZE`` by another program
        committed between this compaction's snapshot and its commit, is taken back
        (:func:`fanout.delta_tables.compaction.compact`). Nobody streams the ledger, so
        its compaction may be a data change."""
        return compact_table(
            table,
            self._where,
            self.storage_options,
            rewrite=_overwrite_with_own_rows,
            data_change=True,
        )

    # -- scans (people, the guard's slow path, recovery) ----------------------------
    #
    # Every reader of the ledger's rows reads them as of the log (`as_of_log`: a lost mark
    # a write's own mark replaced is left out): `rows`, `committed_entries`, the epochs'
    # owners. The rows as written are read on purpose only: `committed_entries_with_
    # replaced` (a refused query's check), `read` (tests, people), the compaction.

    def read(self, pipeline: str | None = None) -> pa.Table:
        """The ledger rows *as written*, optionally of one pipeline (a scan): with the lost
        marks a write's own mark replaced. For tests and people inspecting the table; no
        reader of fanout's reads it (``tests/unit/test_ledger_readers.py``): they read
        :meth:`rows` or :meth:`committed_entries`."""
        with self._lock:
            table = self._fresh()
        return read_arrow(table, filters=[("pipeline", "=", pipeline)] if pipeline else ())

    def rows(self, pipeline: str | None = None) -> list[dict[str, Any]]:
        """The ledger rows, optionally of one pipeline, as of the log
        (:func:`fanout.ledger.entry.as_of_log`), as dicts of the table's columns (a scan;
        ``fanout status``)."""
        return as_of_log(self.read(pipeline).to_pylist())

    def mark_times(self, pipeline: str | None = None) -> pa.Table:
        """The committed rows' :data:`fanout.app.activity.MARK_COLUMNS`, optionally of one
        pipeline: the columns :func:`fanout.app.activity.newest_marks_of` judges a
        pipeline's activity by (projected and filtered in the scan; lost marks are left
        in, it counts none)."""
        with self._lock:
            table = self._fresh()
        filters: list[Any] = [("status", "=", "committed")]
        if pipeline:
            filters.append(("pipeline", "=", pipeline))
        columns = ["pipeline", "sink", "epoch", "batch_id", "status", "error", "finished_at"]
        return read_arrow(table, columns=columns, filters=filters)

    def sink_names(self, pipeline: str) -> list[str]:
        """The sinks ``pipeline``'s rows name, sorted: of marks and failures, not of the
        ledger's own rows (:data:`~fanout.ledger.entry.OWN_ROWS`). Two columns read, no row
        made a dict (``fanout ledger skip``'s check of ``--sink``). The same names as :meth:`rows`
        gives: the lost marks :func:`~fanout.ledger.entry.as_of_log` leaves out are only
        those whose sink's own mark of the batch stays."""
        import pyarrow as pa
        import pyarrow.compute as pc

        with self._lock:
            table = self._fresh()
        read = read_arrow(table, columns=["sink", "status"], filters=[("pipeline", "=", pipeline)])
        own = pc.is_in(read.column("status"), value_set=pa.array(OWN_ROWS))
        names = read.column("sink").filter(pc.invert(own)).unique()
        return sorted(str(name) for name in names.to_pylist())

    def pipelines(self) -> list[str]:
        """The names of the pipelines the ledger holds rows of, sorted."""
        with self._lock:
            table = self._fresh()
        names = read_arrow(table, columns=["pipeline"]).column("pipeline").unique()
        return sorted(str(name) for name in names.to_pylist())

    def committed_entries(
        self, pipeline: str, min_batch_id: int = 0, epoch: int | None = None
    ) -> list[LedgerEntry]:
        """Committed rows of ``pipeline`` with ``batch_id >= min_batch_id`` (of ``epoch``),
        as of the log."""
        with self._lock:
            table = self._fresh()
        return self._committed_as_of_log(table, pipeline, min_batch_id, epoch)

    def failed_batches(
        self, pipeline: str, min_batch_id: int, epoch: int, *, sink: str | None = None,
        error: str | None = None,
    ) -> list[int]:  # fmt: skip
        """The batches of ``epoch`` from ``min_batch_id`` on that a failed row names (of
        ``sink``, its error beginning with ``error``, when given): a filtered scan of a few
        columns; ``fanout ledger skip`` only."""
        with self._lock:
            table = self._fresh()
        present = {f.name for f in table.schema().fields}
        columns = ["batch_id", "epoch"] if "epoch" in present else ["batch_id"]
        filters: list[Filter] = [
            ("pipeline", "=", pipeline),
            ("status", "=", "failed"),
            ("batch_id", ">=", min_batch_id),
        ]
        if sink is not None:
            filters.append(("sink", "=", sink))
        if error is not None:
            columns.append("error")
        read = read_arrow(table, columns=columns, filters=filters).to_pylist()
        return sorted(
            {
                int(r["batch_id"])
                for r in read
                if (r.get("epoch") or 0) == epoch
                and (error is None or (r["error"] or "").startswith(error))
            }
        )

    def committed_entries_with_replaced(
        self, pipeline: str, min_batch_id: int = 0, epoch: int | None = None
    ) -> list[LedgerEntry]:
        """:meth:`committed_entries` as written: with the lost marks own marks replaced."""
        with self._lock:
            table = self._fresh()
        return self._committed_as_written(table, pipeline, min_batch_id, epoch)

    @classmethod
    def _committed_as_of_log(
        cls, table: DeltaTable, pipeline: str, min_batch_id: int, epoch: int | None
    ) -> list[LedgerEntry]:
        """:meth:`committed_entries` as ``table`` holds them."""
        return as_of_log(cls._committed_as_written(table, pipeline, min_batch_id, epoch))

    @staticmethod
    def _committed_as_written(
        table: DeltaTable, pipeline: str, min_batch_id: int, epoch: int | None
    ) -> list[LedgerEntry]:
        """:meth:`committed_entries_with_replaced` as ``table`` holds them."""
        rows = read_arrow(
            table,
            filters=[
                ("pipeline", "=", pipeline),
                ("status", "=", "committed"),
                ("batch_id", ">=", min_batch_id),
            ],
        )
        entries = entries_from_arrow(rows)
        return entries if epoch is None else [e for e in entries if e.epoch == epoch]

    def epoch_start(self, pipeline: str, epoch: int) -> int | None:
        """The batch ``epoch`` started at, from its ``epoch`` row (epoch 0: its claim;
        ``None``: no row, or a ledger from before the ``epoch`` column). The first start
        committed wins (a second start of one epoch is refused), so the lowest is taken."""
        with self._lock:
            table = self._fresh()
        if "epoch" not in {f.name for f in table.schema().fields}:
            return None
        filters: list[Filter] = [
            ("pipeline", "=", pipeline),
            ("status", "=", "epoch"),
            ("epoch", "=", epoch),
        ]
        rows = read_arrow(table, columns=["batch_id"], filters=filters).column("batch_id")
        return min((int(b) for b in rows.to_pylist() if b is not None), default=None)

    def epoch_owners(self, pipeline: str) -> dict[int, str]:
        """Per epoch of ``pipeline``, the query id it belongs to (see
        :func:`fanout.ledger.entry.epoch_owners`), from the few rows that tell: the epoch
        rows, and epoch 0's rows from its high-water mark on (its latest mark, and failed
        attempts after it). Never a scan of the pipeline's whole history."""
        with self._lock:
            table = self._fresh()
            high = self._version(table, pipeline_app_id(pipeline, 0))
        return self._owners(table, pipeline, high)

    def _owners(self, table: DeltaTable, pipeline: str, high: int | None) -> dict[int, str]:
        """:meth:`epoch_owners` as ``table`` holds them, epoch 0's high-water mark at
        ``high``."""
        present = {f.name for f in table.schema().fields}  # older ledgers lack columns
        wanted = ["pipeline", "sink", "batch_id", "status", "query_id", "epoch", "error"]
        columns = [c for c in wanted if c in present]
        scope: list[Filter] = [("pipeline", "=", pipeline)]
        recent: list[Filter] = [*scope, ("batch_id", ">=", high if high is not None else 0)]
        reads = [[*scope, ("status", "=", "epoch")]] if "epoch" in present else []
        if "epoch" in present:  # epoch 0: the column's 0, or null in rows from before it
            reads += [[*recent, ("epoch", "=", 0)], [*recent, ("epoch", "=", None)]]
        else:
            reads.append(recent)
        entries = [
            entry
            for filters in reads
            for entry in entries_from_arrow(read_arrow(table, columns=columns, filters=filters))
        ]
        return epoch_owners(e for e in as_of_log(entries) if e.status == "epoch" or e.epoch == 0)

    # -- maintenance ----------------------------------------------------------------

    def maintain(
        self,
        *,
        checkpoint: bool = True,
        compact: bool = True,
        vacuum_retention_hours: int | None = 168,
        cleanup_logs: bool = True,
    ) -> MaintenanceReport:
        """Keep lookups O(1) and the table small.

        :param checkpoint: write a log checkpoint now.
        :param compact: merge the small files (one per mark) into larger ones.
        :param vacuum_retention_hours: delete files unreferenced for longer than this;
            ``None`` skips vacuum. Keep it above the longest time a reader may hold an old
            version.
        :param cleanup_logs: drop log entries older than the table's log retention.
        """
        with self._lock:
            table = self._fresh()
            before = table.version()
            compacted = 0
            if compact:
                table, compacted = self._compact_retrying(table)
                table.update_incremental()
                self._files_added = 0
            vacuumed: list[str] = []
            if vacuum_retention_hours is not None:
                table, vacuumed = self._vacuum_retrying(table, vacuum_retention_hours, compact)
            if checkpoint:
                table.create_checkpoint()
            if cleanup_logs:
                table.cleanup_metadata()
            table.update_incremental()
            return MaintenanceReport(
                version_before=before,
                version_after=table.version(),
                checkpoint_created=checkpoint,
                files_compacted=compacted,
                files_vacuumed=list(vacuumed),
            )

    def _compact_retrying(self, table: DeltaTable) -> tuple[DeltaTable, int]:
        """Compact, on a fresh snapshot again when another writer's commit (a mark, another
        maintenance) made delta-rs refuse this one: a compaction rewrites what it read, so
        trying again on what is there now is safe (caller holds the lock)."""
        for attempt in range(1, MAINTAIN_COMPACTION_ATTEMPTS + 1):
            try:
                return table, self._compaction(table).files_removed
            except Exception as exc:
                if not is_commit_conflict(exc):
                    raise
                if attempt == MAINTAIN_COMPACTION_ATTEMPTS:
                    raise LedgerError(
                        f"{self._where}: other writers committed while each of {attempt} "
                        f"compactions ran, and delta-rs refused every one ({self._masked(exc)}); "
                        "nothing was lost: run `fanout ledger maintain` again"
                    ) from exc
                table = self._fresh()
        raise AssertionError("unreachable")

    def _vacuum_retrying(
        self, table: DeltaTable, hours: int, compacted: bool
    ) -> tuple[DeltaTable, list[str]]:
        """Vacuum, on a fresh snapshot again when delta-rs refused its commit (delta-rs
        commits a vacuum: a mark or a compaction committed since the snapshot, a running
        pipeline's own compaction, refuses it before it deletes anything); caller holds
        the lock. Before, its bare ``CommitFailedError`` ended ``fanout ledger maintain``
        with a traceback. ``compacted``: a compaction ran before it (the error says it
        stays)."""
        for attempt in range(1, MAINTAIN_COMPACTION_ATTEMPTS + 1):
            try:
                done = table.vacuum(
                    retention_hours=hours, dry_run=False, enforce_retention_duration=False
                )
                return table, list(done)
            except Exception as exc:
                if not is_commit_conflict(exc) or attempt == MAINTAIN_COMPACTION_ATTEMPTS:
                    why = (
                        f"other writers committed while each of {attempt} vacuums ran"
                        if is_commit_conflict(exc)
                        else "its vacuum failed"
                    )
                    raise LedgerError(
                        f"{self._where}: {why} ({self._masked(exc)}); "
                        f"{'the compaction before it stays, ' if compacted else ''}nothing "
                        "was lost: run `fanout ledger maintain` again"
                    ) from exc
                table = self._fresh()
        raise AssertionError("unreachable")


MAINTAIN_COMPACTION_ATTEMPTS = 5
"""How many times ``maintain`` compacts on a fresh snapshot before giving up."""

LEDGER_COLUMNS = ("batch_id", "pipeline", "sink", "status")
"""The columns without which a Delta table cannot be a ledger (of any fanout version)."""


def _check_is_ledger(table: DeltaTable, path: str) -> None:
    """Refuse a Delta table that is not a ledger, before reading or writing it."""
    columns = [field.name for field in table.schema().fields]
    missing = [name for name in LEDGER_COLUMNS if name not in columns]
    if missing:
        raise LedgerError(
            f"the Delta table at {path} is not a fanout ledger: it has no columns "
            f"{', '.join(map(repr, missing))} (its columns: {', '.join(map(repr, columns))})"
        )


def _overwrite_with_own_rows(table: DeltaTable, commit: Any) -> dict[str, int]:
    """Overwrite ``table`` with its rows as its loaded snapshot holds them (one file per
    partition); nothing when it has fewer than two files."""
    from deltalake import write_deltalake

    files = len(table.file_uris())
    if files < 2:
        return {"numFilesRemoved": 0, "numFilesAdded": 0}
    rows = read_arrow(table)
    write_deltalake(
        table,
        rows,
        mode="overwrite",
        partition_by=list(table.metadata().partition_columns) or None,
        commit_properties=commit,
    )
    return {"numFilesRemoved": files, "numFilesAdded": len(table.file_uris())}


def _keeps_a_log_retention(table: DeltaTable) -> bool:
    """Whether the table sets its own ``delta.logRetentionDuration``."""
    return table.metadata().configuration.get(LOG_RETENTION_PROPERTY) is not None


class _KnownTransactions:
    """Transaction versions known at one version of the ledger table.

    A Delta version is immutable, so what was read from it, or committed to make it, holds
    as long as the table stays at that version: a lookup after the driver's own commit, with
    no other writer in between, reads nothing from the log. (Each ``transaction_version``
    call replays the log's transactions: about 0.3-1 ms, five or more per batch.)
    """

    def __init__(self) -> None:
        self._at: int | None = None
        self._known: dict[str, int | None] = {}

    def get(self, table: DeltaTable, app_id: str) -> int | None:
        """``app_id``'s version on ``table``, read from its log the first time."""
        self._follow(table.version())
        if app_id not in self._known:
            self._known[app_id] = transaction_version(table, app_id)
        return self._known[app_id]

    def committed(self, table: DeltaTable, base: int, txns: Mapping[str, int]) -> None:
        """``table`` was advanced from version ``base`` by a commit of ``txns``."""
        version = table.version()
        if self._at == base and version == base + 1:  # our commit alone: extend
            self._known.update(txns)
            self._at = version
        else:  # other commits in between, whose transactions are unknown
            self._follow(version)

    def _follow(self, version: int) -> None:
        if version != self._at:
            self._at, self._known = version, {}


class _MarkRequest:
    """One caller's mark waiting to be committed, alone or with others."""

    def __init__(self, entry: LedgerEntry) -> None:
        self.entry = entry
        self.settled = False
        self._written = False
        self._error: BaseException | None = None

    def settle(self, written: bool) -> None:
        self._written, self.settled = written, True

    def fail(self, error: BaseException) -> None:
        self._error, self.settled = error, True

    def outcome(self) -> bool:
        """True when this call wrote the mark; raises what its commit raised."""
        if self._error is not None:
            raise self._error
        return self._written


def _open_ledger(path: str, storage_options: Mapping[str, str] | None) -> DeltaTable | None:
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


def _replaces_lost(entry: LedgerEntry, sink_app: str, version: Callable[[str], int | None]) -> bool:
    """Whether the mark ``entry``, its sink's transaction ``sink_app`` already at its batch,
    is a write's own mark replacing a lost one (:func:`fanout.ledger.entry.replaces_lost`),
    told from the log alone: the lost mark's commit set :func:`lost_app_id` at the batch,
    and no replacing mark set :func:`replaced_app_id` there yet."""
    if entry.error is not None:
        return False
    batch = entry.batch_id
    return version(lost_app_id(sink_app)) == batch and version(replaced_app_id(sink_app)) != batch
