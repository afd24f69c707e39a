"""The ledger's model: one row per attempt outcome (:class:`LedgerEntry`), what a batch reads
before it writes (:class:`LedgerView`), and what the dispatcher needs of a ledger
(:class:`Ledger`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from fanout.contract.batch import pipeline_scope
from fanout.contract.locations import command_location, same_table_key
from fanout.version import __version__

if TYPE_CHECKING:
    import pyarrow as pa

Status = Literal[
    "committed", "failed", "epoch", "recovery", "dead_letter", "refused", "admitted", "begun"
]
"""A row's status: a sink's mark (``committed``) or failed attempt (``failed``), or one of
the ledger's own rows (:data:`OWN_ROWS`)."""

OWN_ROWS: tuple[Status, ...] = (
    "epoch", "recovery", "dead_letter", "refused", "admitted", "begun"
)  # fmt: skip
"""The statuses of the ledger's own rows, of no sink's progress: an epoch's start or claim,
a ``fanout recover`` report (:mod:`fanout.ledger.recovery`), a sink's dead-letter target
(:mod:`fanout.ledger.target_records`), a batch refused before any write and a replay of it
admitted (:mod:`fanout.ledger.refusals`), a catch-up write of a backfilled batch that may
have begun (:mod:`fanout.ledger.begun`). ``fanout status`` and the sinks' names leave them
out; each other reader reads the statuses it wants."""


def pipeline_app_id(pipeline: str, epoch: int = 0) -> str:
    """The transaction id carrying a pipeline's high-water mark: ``fanout/<pipeline>``
    (``fanout/<pipeline>@e<epoch>`` in later epochs)."""
    return f"fanout/{pipeline_scope(pipeline, epoch)}"


def epoch_app_id(pipeline: str) -> str:
    """The transaction id whose version is the pipeline's current epoch."""
    return f"fanout/{pipeline}#epoch"


LOST_MARK = "unmarked"
"""How the ``error`` of a lost mark begins: a mark fanout recorded, when a new epoch
started, for a batch a sink holds by its own records but never marked (ARCHITECTURE §5, "A
batch written but never marked"). Its ``rows`` and ``dead_lettered`` are unknown (null)."""


def refused_query(query_id: str | None, epoch: int) -> str:
    """How a lost mark of ``epoch`` recorded at the refusal of query ``query_id``'s start of
    the epoch after it begins: that query's checkpoint re-reads the batch (it was refused
    for re-reading it)."""
    return f"{LOST_MARK}: recorded when query {query_id} was refused epoch {epoch + 1}"


REWRITTEN = f"{LOST_MARK}, rewritten"
"""How the ``error`` of a lost mark begins when the new epoch started anyway, the sink's
rewrite of the batch being harmless (:meth:`fanout.Sink.harmless_rewrite`): no report is
stale for it."""


@dataclass(frozen=True)
class LedgerEntry:
    """One ledger row: the outcome of one attempt of one sink on one batch."""

    pipeline: str
    sink: str
    batch_id: int
    status: Status
    query_id: str | None = None
    rows: int | None = None
    dead_lettered: int | None = None
    attempt: int = 1
    started_at: datetime | None = None
    finished_at: datetime | None = None
    duration_ms: int | None = None
    source_offsets: str | None = None
    error: str | None = None
    fanout_version: str = __version__
    epoch: int = 0
    batch_timestamp_ms: int | None = None  # Spark's planning time; None in older ledgers
    dead_letter: str | None = None  # a "dead_letter" row's target (fanout.deadletters.moved)

    @property
    def lost(self) -> bool:
        """Whether this is a lost mark (:data:`LOST_MARK`): committed by the sink's own
        records, recorded at a new epoch's start; its row counts are unknown, not 0."""
        return self.status == "committed" and (self.error or "").startswith(LOST_MARK)

    def offsets(self) -> Any:
        """The recorded source offsets, parsed from JSON (``None`` when not recorded)."""
        return json.loads(self.source_offsets) if self.source_offsets else None


def lost_app_id(sink_app: str) -> str:
    """The app transaction a lost mark's commit sets at its batch, beside the sink's own
    ``sink_app``: a write's own mark of that batch made after it (the batch was in flight)
    tells from the log alone that the batch's only mark is a lost one
    (:func:`replaces_lost`)."""
    return f"{sink_app}#lost"


def replaced_app_id(sink_app: str) -> str:
    """The app transaction the mark replacing a lost one sets at its batch: made again, it
    is a no-op, as every mark made twice."""
    return f"{sink_app}#replaced"


def skip_app_id(sink_app: str) -> str:
    """The app transaction a ``fanout ledger skip`` mark's commit sets at its batch, beside
    the sink's own ``sink_app``: a write's own mark of a batch at or before it, finding the
    sink's transaction there already, reads the sink's marks only then
    (:func:`fanout.ledger.gaps.written_beside_skip`), so a mark made twice stays a look at
    the log alone."""
    return f"{sink_app}#skip"


Row = TypeVar("Row", LedgerEntry, dict[str, Any])


def _batch_key(entry: LedgerEntry) -> tuple[str, str, int, int]:
    return (entry.pipeline, entry.sink, entry.epoch, entry.batch_id)


def replaces_lost(entry: LedgerEntry, recorded: Iterable[LedgerEntry]) -> bool:
    """Whether the mark ``entry`` is recorded although its sink's mark of its batch exists:
    every committed row of that batch ``recorded`` holds for the sink is a lost mark
    (:data:`LOST_MARK`), and ``entry`` is a write's own mark (no ``error``: not a lost mark,
    not a skip's). A lost mark ``fanout recover`` recorded while the batch was in flight
    (the query's write done, its mark not yet) would otherwise keep the batch's counts
    null for good: the query's own mark, recorded after it, was a no-op."""
    if entry.error is not None:
        return False
    same = [r for r in recorded if r.status == "committed" and _batch_key(r) == _batch_key(entry)]
    return bool(same) and all(r.lost for r in same)


def as_of_log(rows: Iterable[Row]) -> list[Row]:
    """``rows`` (ledger rows, as entries or as dicts read from the table) as the ledger's
    log tells them: without the lost marks a write's own mark of the same sink and batch
    replaced (:func:`replaces_lost`; ARCHITECTURE §5, "A batch in flight"), so a reader
    sees one mark per sink and batch (but for a write's own mark recorded beside a skip's
    of its batch, :func:`fanout.ledger.gaps.written_beside_skip`). The one filter of
    replaced lost marks: every reader of the ledger's rows gets them through it
    (:meth:`Ledger.committed_entries`,
    :meth:`~fanout.ledger.delta.DeltaLedger.rows`); the rows as written are read only on
    purpose (:meth:`Ledger.committed_entries_with_replaced`). Rows of older ledgers have
    no ``epoch``: 0."""
    listed = list(rows)
    facts = [_mark_facts(row) for row in listed]
    own = {key for key, committed, error in facts if committed and error is None}
    return [
        row
        for row, (key, committed, error) in zip(listed, facts, strict=True)
        if not (committed and (error or "").startswith(LOST_MARK) and key in own)
    ]


def _mark_facts(row: LedgerEntry | Mapping[str, Any]) -> tuple[tuple[Any, ...], bool, str | None]:
    """A row's (pipeline, sink, epoch, batch), whether it is a mark, and its ``error``."""
    if isinstance(row, LedgerEntry):
        return _batch_key(row), row.status == "committed", row.error
    key = (row["pipeline"], row["sink"], row.get("epoch") or 0, row["batch_id"])
    return key, row["status"] == "committed", row.get("error")


@dataclass(frozen=True)
class LedgerView:
    """What a batch reads from the ledger before it writes, taken at one moment: the
    pipeline's current epoch, that epoch's high-water mark, each sink's last committed
    batch in it (``None``: never), and whether an ``epoch`` row records the epoch's owner
    (every epoch a reset started has one; epoch 0 once its first query claimed it)."""

    epoch: int
    high_water: int | None
    marks: dict[str, int | None]
    owner_recorded: bool = True


def ledger_schema() -> pa.Schema:
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    return pa.schema(
        [
            pa.field("pipeline", pa.string(), nullable=False),
            pa.field("query_id", pa.string()),
            pa.field("batch_id", pa.int64(), nullable=False),
            pa.field("sink", pa.string(), nullable=False),
            pa.field("status", pa.string(), nullable=False),
            pa.field("rows", pa.int64()),
            pa.field("dead_lettered", pa.int64()),
            pa.field("attempt", pa.int32()),
            pa.field("started_at", ts),
            pa.field("finished_at", ts),
            pa.field("duration_ms", pa.int64()),
            pa.field("source_offsets", pa.string()),
            pa.field("error", pa.string()),
            pa.field("fanout_version", pa.string()),
            pa.field("epoch", pa.int32()),
            pa.field("batch_timestamp_ms", pa.int64()),
            pa.field("dead_letter", pa.string()),
        ]
    )


def entries_to_arrow(entries: Sequence[LedgerEntry]) -> pa.Table:
    """Ledger entries as an Arrow table with the ledger's schema."""
    import pyarrow as pa

    return pa.Table.from_pylist([asdict(e) for e in entries], schema=ledger_schema())


def entries_from_arrow(table: pa.Table) -> list[LedgerEntry]:
    """Ledger rows read back as entries (columns unknown to this version are ignored)."""
    names = {f.name for f in ledger_schema()}
    return [
        LedgerEntry(**{k: v for k, v in row.items() if k in names and v is not None})
        for row in table.to_pylist()
    ]


def epoch_owners(entries: Iterable[LedgerEntry]) -> dict[int, str]:
    """Per epoch, the query id it belongs to: the query that started it (its ``epoch``
    row; epoch 0's claim), else the query id of its latest row that has one, a mark or a
    failed attempt (both name the query that planned their batch: epoch 0 of a ledger from
    before claims). Rows without a query id are no evidence; epochs without a known query
    id are left out."""
    started: dict[int, str] = {}
    last: dict[int, tuple[int, str]] = {}
    for entry in entries:
        if entry.query_id is None:
            continue
        if entry.status == "epoch":
            started[entry.epoch] = entry.query_id
        elif entry.status in ("committed", "failed"):
            current = last.get(entry.epoch)
            if current is None or entry.batch_id >= current[0]:
                last[entry.epoch] = (entry.batch_id, entry.query_id)
    owners = {epoch: query for epoch, (_, query) in last.items()}
    owners.update(started)
    return owners


class Ledger(Protocol):
    """What the dispatcher needs from a ledger. :class:`DeltaLedger` is the real one;
    :class:`MemoryLedger` serves unit tests and benchmarks."""

    def open(self) -> None:
        """Create the ledger if missing and check it is usable; called before the stream."""

    def last_committed(
        self, pipeline: str, sinks: Iterable[str], epoch: int = 0
    ) -> dict[str, int | None]:
        """The last batch id each sink committed (``None``: never), without a scan."""

    def lookup(self, pipeline: str, sinks: Iterable[str]) -> LedgerView:
        """Epoch, high-water mark and marks of the current epoch in one read, without a
        scan: what the dispatcher needs before every batch; and whether an ``epoch`` row
        records the epoch's owner (``owner_recorded``: when not, the batch's query claims
        it with :meth:`start_epoch`; a ledger that leaves it at its default never claims)."""

    def start_epoch(self, entry: LedgerEntry) -> None:
        """Record that ``entry.query_id`` starts epoch ``entry.epoch`` at ``entry.batch_id``
        (for epoch 0: claims the pipeline's first epoch, which no query started). Raises
        :class:`fanout.CheckpointResetError` when the pipeline is no longer in the epoch
        before it, or epoch 0 was claimed already (another query came first)."""

    def check_start(self, entry: LedgerEntry) -> None:
        """Raise what :meth:`start_epoch` would for ``entry`` (an ``epoch`` row; anything
        else: ``ValueError``), on the ledger as it is now, without writing:
        :class:`fanout.CheckpointResetError` when another query started the epoch first (or
        the pipeline is no longer in the epoch before it), :class:`fanout.ZombieBatchError`
        when the old epoch's query committed a batch after the ``fanout recover`` report the
        start is from (a ledger that keeps reports). Asked by a new epoch's start before it
        fences the sinks (:meth:`fanout.steps.admit.Admission.check_start`), so that a start
        refused for it fences nothing; :meth:`start_epoch` checks again. Once per epoch
        start, never per batch."""

    def sink_names(self, pipeline: str) -> list[str]:
        """The sinks ``pipeline``'s rows name, sorted: of marks (lost ones too) and failed
        attempts, any epoch; not of the epochs', recoveries' or dead-letter targets' own
        rows. Read by the start's check for a sink renamed mid-batch
        (:func:`fanout.steps.renamed.vanished_sinks`) and ``fanout ledger skip``'s check of
        ``--sink``: rare paths."""

    def mark_committed(self, entry: LedgerEntry) -> bool:
        """Record that ``entry.sink`` committed ``entry.batch_id``; idempotent.
        Returns ``False`` when the mark was already there."""

    def record_failure(self, entry: LedgerEntry) -> None:
        """Record a failed attempt (best effort: callers log what this raises)."""

    def committed_entries(
        self, pipeline: str, min_batch_id: int = 0, epoch: int | None = None
    ) -> list[LedgerEntry]:
        """The marks of the pipeline at or after ``min_batch_id``, of one epoch or
        (``None``) all, as of the log (:func:`as_of_log`: a lost mark a write's own mark
        replaced is left out). A scan: rare paths. The reader of marks; the rows as written
        are :meth:`committed_entries_with_replaced`."""

    def failed_batches(
        self, pipeline: str, min_batch_id: int, epoch: int, *, sink: str | None = None,
        error: str | None = None,
    ) -> list[int]:  # fmt: skip
        """The batch ids of ``epoch`` at or after ``min_batch_id`` that a failed attempt's
        row of ``pipeline`` names (sorted, once each): batches Spark handed to the pipeline.
        Only the rows of ``sink`` whose ``error`` begins with ``error``, when given (the
        error's type: ``"SinkRecordsGoneError:"``). A scan: ``fanout ledger skip`` only,
        when no mark shows its batch ran."""

    def committed_entries_with_replaced(
        self, pipeline: str, min_batch_id: int = 0, epoch: int | None = None
    ) -> list[LedgerEntry]:
        """:meth:`committed_entries` as written: with the lost marks a write's own mark
        replaced. No reader of marks wants them; a refused query's check does (the lost
        mark its refusal recorded names the query, also once the old query's own mark of
        the batch replaced it: ARCHITECTURE §5). Read on purpose only."""

    def epoch_start(self, pipeline: str, epoch: int) -> int | None:
        """The batch ``epoch`` of ``pipeline`` started at: the ``batch_id`` of its
        ``epoch`` row (epoch 0: of its claim); ``None`` when no row records it (epoch 0 of
        a ledger from before claims, or of a query whose id was unknown). A read of the
        epoch rows: rare paths only (a new epoch's start)."""

    def epoch_owners(self, pipeline: str) -> dict[int, str]:
        """Per epoch of the pipeline, the streaming query id it belongs to (see
        :func:`epoch_owners`); epochs without a known query id are left out. A scan: the
        checkpoint guard reads it once per start and when the epoch changes."""

    def record_refusal_row(self, entry: LedgerEntry) -> None:
        """Append ``entry``, a ``refused`` or ``admitted`` row (no transaction; anything
        else: ``ValueError``): a batch refused before any sink wrote it, a replay of it
        admitted (:mod:`fanout.ledger.refusals`, which alone writes them). Only on refusals
        and on such replays."""

    def refusal_rows(self, pipeline: str, epoch: int, batch_id: int) -> list[LedgerEntry]:
        """The ``refused`` and ``admitted`` rows of one batch of one epoch
        (:mod:`fanout.ledger.refusals`, which alone reads them): a read of the batch's
        rows, only on a refusal and on a replay asking about one."""

    def record_begun(self, entry: LedgerEntry) -> None:
        """Append ``entry``, a ``begun`` row (no transaction; anything else:
        ``ValueError``): a catch-up write of a backfilled batch to its sink may begin
        (:mod:`fanout.ledger.begun`, which alone writes them). Once per such batch and
        sink, before its first write; never on the live path."""

    def begun(self, pipeline: str, sink: str, epoch: int, batch_id: int) -> bool:
        """Whether a ``begun`` row records that a catch-up write of batch ``batch_id`` of
        ``epoch`` to ``sink`` may have begun (:mod:`fanout.ledger.begun`, which alone reads
        them): a filtered read, once per backfilled batch a catch-up writes."""


class MarkHold(Protocol):
    """A written sink's place among the sinks of its batch still writing.

    The dispatcher sets it in :data:`MARK_HOLD` around a sink's ``mark_committed`` call, so
    a ledger whose marks share commits (:class:`~fanout.ledger.delta.DeltaLedger`) can let
    the mark wait, briefly, for the marks of the sinks finishing next: one ledger commit
    per batch instead of one per sink. Ledgers are free to ignore it.
    """

    def release_and_wait(self, timeout: float) -> None:
        """Stop counting this sink as writing (its mark is queued); return once no other
        sink of the batch is writing, or after ``timeout`` seconds."""


MARK_HOLD: ContextVar[MarkHold | None] = ContextVar("fanout_mark_hold", default=None)
"""The calling thread's :class:`MarkHold` while the dispatcher marks a sink it wrote."""


@dataclass(frozen=True)
class MaintenanceReport:
    """What :meth:`DeltaLedger.maintain` did."""

    version_before: int
    version_after: int
    checkpoint_created: bool
    files_compacted: int
    files_vacuumed: list[str] = field(default_factory=list)


def now_utc() -> datetime:
    """The current time, timezone-aware, as the ledger stores it."""
    return datetime.now(UTC)


def epoch_follows(epoch: int, recorded: int | None) -> bool:
    """Whether ``epoch`` may be started when the pipeline's epoch transaction is at
    ``recorded`` (``None``: no ``epoch`` row yet): epoch 0 is claimed only while none is
    recorded; a later epoch follows the one before it, claimed or not."""
    if epoch == 0:
        return recorded is None
    return (recorded or 0) == epoch - 1


def epoch_taken_message(entry: LedgerEntry, current: int | None) -> str:
    """The refusal of an epoch another query took first: ``entry`` would start epoch
    ``entry.epoch`` from ``entry.epoch - 1`` (or claim epoch 0 while no query did), and the
    pipeline's epoch transaction is at ``current`` (``None``: never written)."""
    if entry.epoch == 0 and current == 0:
        taken = (
            f"query {entry.query_id} cannot claim epoch 0: another query claimed it meanwhile "
            "(its first batch ran at the same time as this one)"
        )
    else:
        action = "claim epoch 0" if entry.epoch == 0 else f"start epoch {entry.epoch}"
        taken = (
            f"query {entry.query_id} cannot {action}: the pipeline is at epoch {current or 0} "
            "already (another query accepted a checkpoint reset meanwhile)"
        )
    return (
        f"pipeline {entry.pipeline!r}: {taken}. Two checkpoints of one pipeline are running: "
        "stop one; the other continues."
    )


def ledger_location(ledger: object) -> str:
    """Where ``ledger`` keeps its marks, as the commands fanout prints name it
    (``fanout recover --ledger ...``): its path
    (:func:`fanout.contract.locations.command_location`: absolute, so they run from any
    directory), or (a ledger without one, in memory) the object itself."""
    path = getattr(ledger, "path", None)
    if path is None:
        return f"{type(ledger).__name__}@{id(ledger):x}"
    return command_location(str(path))


def ledger_key(ledger: object) -> str:
    """What two spellings of one ledger have in common, for what this process keeps per
    pipeline and ledger (one catch-up, one writer of each sink, the abandoned writes): its
    path as :func:`fanout.contract.locations.same_table_key` reads it (``/data/ledger``,
    ``/data/ledger/`` and ``file:///data/ledger`` are one ledger), or (a ledger without
    one) the object itself. Never printed: a URI's password is kept in it."""
    path = getattr(ledger, "path", None)
    if path is None:
        return f"{type(ledger).__name__}@{id(ledger):x}"
    return same_table_key(str(path))
