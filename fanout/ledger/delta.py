"""The ledger: which sink committed which batch, kept in a Delta table (ARCHITECTURE §3).

One row per (pipeline, sink, batch, attempt outcome). Every ``committed`` row is appended
in a Delta commit that also carries two idempotent-write transactions:

- ``fanout/<pipeline>/<sink>`` at version ``batch_id``: the sink's mark. "Which batch did
  sink S last commit?" is :meth:`DeltaLedger.last_committed`, a log lookup, and marking a
  batch twice is a no-op.
- ``fanout/<pipeline>`` at the highest batch id any sink of the pipeline committed: the
  pipeline's high-water mark, read by the checkpoint-reset guard without a scan.

The default engine is delta-rs: a mark is a few milliseconds from the driver, no Spark job.

:class:`DeltaLedger` is the contract (:class:`fanout.ledger.entry.Ledger`, what the
dispatcher asks of a ledger, and the commands' reads); the work is its collaborators',
each in its own module, all sharing one :class:`~fanout.ledger.delta_table.LedgerTable`
(the table, its lock, its known transactions; opened by :mod:`~fanout.ledger.delta_open`):
:mod:`~fanout.ledger.delta_marks` (the grouped marks), :mod:`~fanout.ledger.delta_epochs`
(epoch starts, recovery reports), :mod:`~fanout.ledger.delta_reads` (reads of one
snapshot), :mod:`~fanout.ledger.delta_maintain` (``fanout ledger maintain``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fanout.contract.batch import txn_app_id
from fanout.delta_tables.retention import OWN_LOG_RETENTION, parse_interval
from fanout.ledger import delta_reads as reads
from fanout.ledger.begun import BEGUN
from fanout.ledger.delta_epochs import EpochStarts
from fanout.ledger.delta_maintain import maintain
from fanout.ledger.delta_marks import MarkQueue
from fanout.ledger.delta_table import LedgerTable
from fanout.ledger.entry import (
    LedgerEntry,
    LedgerView,
    MaintenanceReport,
    as_of_log,
    epoch_app_id,
    pipeline_app_id,
)
from fanout.ledger.recovery import RecoveryReport
from fanout.ledger.refusals import ADMITTED, REFUSED
from fanout.ledger.target_records import (
    TargetRecord,
    record_entry,
    since_app_id,
    since_code,
    target_app_id,
    target_digest,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

_LIVE = ("_table", "_epochs", "_marks")
"""The collaborators holding the live state: never pickled, made again where it lands."""


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
        if log_retention is not None:
            parse_interval(log_retention)  # ValueError now, not at the first commit
        self.mark_linger_s = mark_linger_s
        self._collaborate(
            LedgerTable(
                str(path),
                dict(storage_options or {}),
                checkpoint_interval,
                compact_after_files,
                log_retention,
            )
        )

    def _collaborate(self, table: LedgerTable) -> None:
        """Make the collaborators, each given the one ``table`` (its lock, its loaded
        table, its known transactions shared, never copied)."""
        self._table = table
        self._epochs = EpochStarts(table)
        self._marks = MarkQueue(table, self._epochs)

    def __repr__(self) -> str:
        return f"DeltaLedger({self.path!r})"

    # -- configuration (kept on the table, where its commits read it) -----------------

    @property
    def path(self) -> str:
        """The table's location (local path or object-store URI)."""
        return self._table.path

    @path.setter
    def path(self, value: str) -> None:
        self._table.path = value

    @property
    def storage_options(self) -> dict[str, str]:
        """Passed to delta-rs for object stores."""
        return self._table.storage_options

    @storage_options.setter
    def storage_options(self, value: dict[str, str]) -> None:
        self._table.storage_options = value

    @property
    def checkpoint_interval(self) -> int:
        """A Delta log checkpoint every this many commits (set when the table is created)."""
        return self._table.checkpoint_interval

    @checkpoint_interval.setter
    def checkpoint_interval(self, value: int) -> None:
        self._table.checkpoint_interval = value

    @property
    def compact_after_files(self) -> int | None:
        """Compact once this ledger has added this many data files (``None``: never)."""
        return self._table.compact_after_files

    @compact_after_files.setter
    def compact_after_files(self, value: int | None) -> None:
        self._table.compact_after_files = value

    @property
    def log_retention(self) -> str | None:
        """The ledger's ``delta.logRetentionDuration`` (``None``: the table's own)."""
        return self._table.log_retention

    @log_retention.setter
    def log_retention(self, value: str | None) -> None:
        self._table.log_retention = value

    def __getstate__(self) -> dict[str, Any]:
        """Configuration only (pickled with a ``FanOut`` under Spark Connect): no lock,
        no queued marks, no open table; ``open()`` runs again where it lands."""
        table = self._table
        config = {
            "path": table.path,
            "storage_options": table.storage_options,
            "checkpoint_interval": table.checkpoint_interval,
            "compact_after_files": table.compact_after_files,
        }
        own = {k: v for k, v in self.__dict__.items() if k not in _LIVE}
        linger = {"mark_linger_s": own.pop("mark_linger_s")}
        return {**config, **linger, "log_retention": table.log_retention, **own}

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        table = LedgerTable(
            state.pop("path"),
            state.pop("storage_options"),
            state.pop("checkpoint_interval"),
            state.pop("compact_after_files"),
            state.pop("log_retention"),
        )
        self.__dict__.update(state)  # mark_linger_s, and a subclass' own attributes
        self._collaborate(table)

    # -- setup ----------------------------------------------------------------------

    def open(self) -> None:
        """Create the ledger table when missing (idempotent, safe against a racing peer).

        Raises :class:`fanout.ConfigurationError` when the table sets a
        ``delta.setTransactionRetentionDuration`` (see :mod:`fanout.delta_tables.retention`),
        or when delta-rs cannot keep a table at its path
        (:func:`fanout.delta_tables.io.refuse_unusable_location`).
        """
        self._table.open()

    def exists(self) -> bool:
        """Whether the ledger table is there (read only: a pipeline that never ran has
        none yet); raises as :meth:`check` does for a location or store it cannot read."""
        return self._table.exists()

    def check(self) -> list[str]:
        """:meth:`open`'s checks, changing nothing (``fanout validate``): what :meth:`open`
        would create or change, as "would ..." texts (empty: nothing); raises as
        :meth:`open` does for a location or a table it would refuse."""
        return self._table.check()

    # -- lookups (log only) ---------------------------------------------------------

    def last_committed(
        self, pipeline: str, sinks: Iterable[str], epoch: int = 0
    ) -> dict[str, int | None]:
        """The last batch id each sink committed, read from the log's txn actions."""
        with self._table.lock:
            return self._sink_marks(self._table.fresh(), pipeline, sinks, epoch)

    def high_water(self, pipeline: str, epoch: int = 0) -> int | None:
        """The highest batch id any sink of ``pipeline`` committed, from the log."""
        with self._table.lock:
            table = self._table.fresh()
            return self._table.version(table, pipeline_app_id(pipeline, epoch))

    def current_epoch(self, pipeline: str) -> int:
        """The pipeline's epoch, from the log (0 when none was ever started)."""
        with self._table.lock:
            table = self._table.fresh()
            return self._table.version(table, epoch_app_id(pipeline)) or 0

    def lookup(self, pipeline: str, sinks: Iterable[str]) -> LedgerView:
        """Epoch, high-water mark and marks from one refresh of the log (each refresh
        lists the log directory, so a batch pays for one instead of three)."""
        with self._table.lock:
            table = self._table.fresh()
            started = self._table.version(table, epoch_app_id(pipeline))
            epoch = started or 0
            return LedgerView(
                epoch,
                self._table.version(table, pipeline_app_id(pipeline, epoch)),
                self._sink_marks(table, pipeline, sinks, epoch),
                owner_recorded=started is not None,
            )

    def _sink_marks(
        self, table: DeltaTable, pipeline: str, sinks: Iterable[str], epoch: int
    ) -> dict[str, int | None]:
        return {s: self._table.version(table, txn_app_id(pipeline, s, epoch)) for s in sinks}

    # -- epochs (fanout.ledger.delta_epochs) ------------------------------------------

    def start_epoch(self, entry: LedgerEntry) -> None:
        """Append the epoch row, with the epoch as the version of its txn action (epoch 0's
        claim: the first version of that txn). Two starts committed from one snapshot
        carry the same txn app id, and delta-rs refuses the second: it checks again on the
        fresh snapshot, and commits again while the epoch is still free.

        When the pipeline's newest ``fanout recover`` report is of the epoch this one
        replaces, the epoch starts from it
        (:meth:`~fanout.ledger.delta_epochs.EpochStarts.from_report`): refused with
        :class:`fanout.ZombieBatchError` when a batch the report did not count was
        committed since."""
        if entry.status != "epoch":
            raise ValueError("start_epoch takes an epoch entry")
        self._epochs.start(entry)

    def check_start(self, entry: LedgerEntry) -> None:
        """Raise what :meth:`start_epoch` would, on the latest snapshot, without writing:
        :class:`fanout.CheckpointResetError` when another query started the epoch first,
        :class:`fanout.ZombieBatchError` when a batch the report it starts from did not
        count was committed since
        (:meth:`~fanout.ledger.delta_epochs.EpochStarts.from_report`). Read by a new
        epoch's start before it fences the sinks (:func:`fanout.steps.unmarked.refuse_unmarked`),
        so that a start refused for it fences nothing; :meth:`start_epoch` checks again.
        One log refresh, and the report's filtered read when there is one, per epoch start."""
        if entry.status != "epoch":
            raise ValueError("check_start takes an epoch entry")
        self._epochs.check_start(entry)

    def record_recovery(
        self, resume: LedgerEntry, counted: Mapping[str, LedgerEntry]
    ) -> RecoveryReport:
        """Record a ``fanout recover`` report: a new checkpoint resumes after ``resume``
        (the mark of the sink furthest behind), and ``counted`` is each sink's counted
        batch in ``resume.epoch``. Its number is the next version of the pipeline's
        ``#recovery`` transaction; two reports committed at once are numbered apart
        (delta-rs refuses the second, which is numbered again on the fresh snapshot)."""
        return self._epochs.record_recovery(resume, counted)

    def epoch_start(self, pipeline: str, epoch: int) -> int | None:
        """The batch ``epoch`` started at, from its ``epoch`` row (epoch 0: its claim;
        ``None``: no row, or a ledger from before the ``epoch`` column). The first start
        committed wins (a second start of one epoch is refused), so the lowest is taken."""
        return reads.epoch_start(self._table.snapshot(), pipeline, epoch)

    def epoch_owners(self, pipeline: str) -> dict[int, str]:
        """Per epoch of ``pipeline``, the query id it belongs to (see
        :func:`fanout.ledger.entry.epoch_owners`), from the few rows that tell: the epoch
        rows, and epoch 0's rows from its high-water mark on (its latest mark, and failed
        attempts after it). Never a scan of the pipeline's whole history."""
        with self._table.lock:
            table = self._table.fresh()
            high = self._table.version(table, pipeline_app_id(pipeline, 0))
        return reads.owners(table, pipeline, high)

    # -- each sink's dead-letter target (fanout.deadletters.moved) ----------------------

    def dead_letter_marks(self, pipeline: str, sinks: Sequence[str]) -> dict[str, tuple[int, int]]:
        """Per sink with a recorded dead-letter target: the digest of its last one and the
        batch it applies from, coded (:mod:`fanout.deadletters.moved`), from the log's
        transactions (no scan)."""
        with self._table.lock:
            table = self._table.fresh()
            found: dict[str, tuple[int, int]] = {}
            for sink in sinks:
                app = txn_app_id(pipeline, sink)
                digest = self._table.version(table, target_app_id(app))
                if digest is not None:
                    found[sink] = (digest, self._table.version(table, since_app_id(app)) or 0)
            return found

    def dead_letter_records(self, pipeline: str, sink: str) -> list[TargetRecord]:
        """Every dead-letter target recorded for ``sink``, in order (a filtered read of its
        ``dead_letter`` rows: only when its target changed)."""
        return reads.dead_letter_records(self._table.snapshot(), pipeline, sink)

    def record_dead_letters(self, pipeline: str, records: Mapping[str, TargetRecord]) -> None:
        """Append one ``dead_letter`` row per sink, with the transactions naming its digest
        and first batch, in one commit (again on the fresh snapshot when another writer's
        commit came meanwhile)."""
        entries = [record_entry(pipeline, sink, record) for sink, record in records.items()]
        txns: dict[str, int] = {}
        for sink, record in records.items():
            app = txn_app_id(pipeline, sink)
            txns[target_app_id(app)] = target_digest(record.target)
            txns[since_app_id(app)] = since_code(record.since)
        self._table.append_retrying(entries, txns)

    # -- batches refused before any write (fanout.ledger.refusals) ------------------------

    def record_refusal_row(self, entry: LedgerEntry) -> None:
        """Append a ``refused`` or ``admitted`` row (no transaction), again on the fresh
        snapshot when delta-rs refuses it (as :meth:`record_failure`)."""
        if entry.status not in (REFUSED, ADMITTED):
            raise ValueError("record_refusal_row takes a refused or admitted entry")
        self._table.append_retrying([entry], {})

    def refusal_rows(self, pipeline: str, epoch: int, batch_id: int) -> list[LedgerEntry]:
        """The ``refused`` and ``admitted`` rows of one batch of one epoch: a filtered read
        of the batch's rows (only on a refusal, and on a replay asking about one)."""
        return reads.refusal_rows(self._table.snapshot(), pipeline, epoch, batch_id)

    # -- catch-up writes of backfilled batches begun (fanout.ledger.begun) ---------------

    def record_begun(self, entry: LedgerEntry) -> None:
        """Append a ``begun`` row (no transaction), again on the fresh snapshot when
        delta-rs refuses it (as :meth:`record_failure`)."""
        if entry.status != BEGUN:
            raise ValueError("record_begun takes a begun entry")
        self._table.append_retrying([entry], {})

    def begun(self, pipeline: str, sink: str, epoch: int, batch_id: int) -> bool:
        """Whether a ``begun`` row of the batch and sink is there: a read filtered by
        pipeline, sink, epoch, batch and status (file statistics skip most files; a
        ``begun`` row always names its epoch)."""
        return reads.begun(self._table.snapshot(), pipeline, sink, epoch, batch_id)

    # -- writes (fanout.ledger.delta_marks) -------------------------------------------

    def mark_committed(self, entry: LedgerEntry) -> bool:
        """Append the committed row with its txn actions unless the mark exists.

        Marks wait for one another (one Delta commit at a time). Those that queued up while
        a commit was running are committed together, in one commit, by whichever caller
        takes the lock next. Called by the dispatcher (with a
        :data:`~fanout.ledger.entry.MARK_HOLD`), a queued mark first waits while another
        sink of its batch is still writing, at most ``mark_linger_s``: the batch's sinks
        that finish within that time share one commit, made by the last of them. Every
        mark is still durable before its call returns.
        """
        if entry.status != "committed":
            raise ValueError("mark_committed takes a committed entry")
        return self._marks.mark(entry, self.mark_linger_s)

    def record_failure(self, entry: LedgerEntry) -> None:
        """Append a failed-attempt row (no txn action), again on the fresh snapshot when
        delta-rs refuses it (another writer's compaction of the ledger, planned after
        this snapshot, removed the files it was based on)."""
        self._table.append_retrying([entry], {})

    # -- scans (people, the guard's slow path, recovery: fanout.ledger.delta_reads) ---

    def read(self, pipeline: str | None = None) -> pa.Table:
        """The ledger rows *as written*, optionally of one pipeline (a scan): with the lost
        marks a write's own mark replaced. For tests and people inspecting the table; no
        reader of fanout's reads it (``tests/unit/test_ledger_readers.py``): they read
        :meth:`rows` or :meth:`committed_entries`."""
        return reads.rows_as_written(self._table.snapshot(), pipeline)

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
        return reads.mark_times(self._table.snapshot(), pipeline)

    def sink_names(self, pipeline: str) -> list[str]:
        """The sinks ``pipeline``'s rows name, sorted: of marks and failures, not of the
        ledger's own rows (:data:`~fanout.ledger.entry.OWN_ROWS`). Two columns read, no row
        made a dict (``fanout ledger skip``'s check of ``--sink``). The same names as :meth:`rows`
        gives: the lost marks :func:`~fanout.ledger.entry.as_of_log` leaves out are only
        those whose sink's own mark of the batch stays."""
        return reads.sink_names(self._table.snapshot(), pipeline)

    def pipelines(self) -> list[str]:
        """The names of the pipelines the ledger holds rows of, sorted."""
        return reads.pipelines(self._table.snapshot())

    def committed_entries(
        self, pipeline: str, min_batch_id: int = 0, epoch: int | None = None
    ) -> list[LedgerEntry]:
        """Committed rows of ``pipeline`` with ``batch_id >= min_batch_id`` (of ``epoch``),
        as of the log."""
        return reads.committed_as_of_log(self._table.snapshot(), pipeline, min_batch_id, epoch)

    def failed_batches(
        self, pipeline: str, min_batch_id: int, epoch: int, *, sink: str | None = None,
        error: str | None = None,
    ) -> list[int]:  # fmt: skip
        """The batches of ``epoch`` from ``min_batch_id`` on that a failed row names (of
        ``sink``, its error beginning with ``error``, when given): a filtered scan of a few
        columns; ``fanout ledger skip`` only."""
        table = self._table.snapshot()
        return reads.failed_batches(table, pipeline, min_batch_id, epoch, sink, error)

    def committed_entries_with_replaced(
        self, pipeline: str, min_batch_id: int = 0, epoch: int | None = None
    ) -> list[LedgerEntry]:
        """:meth:`committed_entries` as written: with the lost marks own marks replaced."""
        return reads.committed_as_written(self._table.snapshot(), pipeline, min_batch_id, epoch)

    # -- maintenance (fanout.ledger.delta_table, fanout.ledger.delta_maintain) ----------

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
        return maintain(
            self._table,
            checkpoint=checkpoint,
            compact=compact,
            vacuum_retention_hours=vacuum_retention_hours,
            cleanup_logs=cleanup_logs,
        )

    def refused_compaction(self) -> str | None:
        """What a compaction of the ledger's table that left rows twice and cannot be taken
        back says, naming the fix (``fanout status``), changing nothing; ``None`` when there
        is none, or no ledger yet (:func:`fanout.delta_tables.compaction.refused_compaction`)."""
        return self._table.refused_compaction()
