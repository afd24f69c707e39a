"""The sink contract: what a plugin author implements and what a sink receives.

A sink type is a subclass of :class:`Sink`. Its instances are *configuration*: they are
built on the driver, validated by :meth:`Sink.open` before the stream starts, and may be
pickled to the executors (sinks that write from there). Connections, producers and clients
are therefore created inside :meth:`Sink.write` or inside the partition task, never in
``__init__``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from fanout.errors import ConfigurationError, TransientSinkError
from fanout.options import SinkOption

if TYPE_CHECKING:
    import pyarrow as pa

    from fanout.deadletter import DeadLetter

Guarantee = Literal["transactional", "idempotent", "at_least_once"]
"""What a sink promises when a batch is written again after a crash.

- ``transactional``: a batch lands atomically and the sink can tell whether batch N landed.
- ``idempotent``: writing batch N twice leaves the same state as writing it once.
- ``at_least_once``: a replay may duplicate (fanout warns when such a sink is configured).
"""

GUARANTEES: tuple[Guarantee, ...] = ("transactional", "idempotent", "at_least_once")

Reads = Literal["dataframe", "arrow"]
"""How a sink consumes a batch: the Spark DataFrame, or one Arrow table shared by all
sinks that read Arrow (converted once per batch on the driver)."""


def pipeline_scope(pipeline: str, epoch: int = 0) -> str:
    """``<pipeline>`` in epoch 0, ``<pipeline>@e<epoch>`` after an accepted checkpoint
    reset (``@`` cannot occur in a name, so scopes never collide)."""
    return pipeline if epoch == 0 else f"{pipeline}@e{epoch}"


def txn_app_id(pipeline: str, sink: str, epoch: int = 0) -> str:
    """The stable transaction application id of one sink of one pipeline.

    It names the sink's idempotent-write transaction in Delta (``txnAppId``) and its
    marks in the ledger: ``fanout/<pipeline>/<sink>``; after a checkpoint reset accepted
    with ``on_checkpoint_reset="new_epoch"``, ``fanout/<pipeline>@e<epoch>/<sink>``.
    Sinks that keep their own idempotency records (progress tables, marker groups) key
    them by this id, so a new epoch starts them afresh too.
    """
    return f"fanout/{pipeline_scope(pipeline, epoch)}/{sink}"


@dataclass(frozen=True)
class IdempotencyKey:
    """The one identity of "this batch, for this sink, in this epoch": what a sink writes
    with its data so that a replay of the batch is recognised (or overwrites, never adds).

    The built-in sinks use it as Delta's app transaction ``(app_id, version)``, as the key
    of PostgreSQL's progress rows and as Kafka's marker; a sink of your own names files or
    records with :attr:`token`. It is new after a checkpoint reset accepted with
    ``on_checkpoint_reset="new_epoch"``, so a new epoch never overwrites the old one's data.

    :param app_id: ``fanout/<pipeline>/<sink>`` (``fanout/<pipeline>@e<epoch>/<sink>`` in
        later epochs): see :func:`txn_app_id`.
    :param version: the batch id.
    """

    app_id: str
    version: int

    @property
    def token(self) -> str:
        """The key as one string safe in file names, object keys and identifiers:
        ``<pipeline>[@e<epoch>]~<sink>~<batch id, 12 digits>``. Names never hold ``~``,
        so two keys never share a token; the zero-padded batch id sorts in batch order."""
        scope_and_sink = self.app_id.removeprefix("fanout/")
        return f"{scope_and_sink.replace('/', '~')}~{self.version:012d}"

    def derived(self, kind: str) -> IdempotencyKey:
        """The key of a second record of the same batch (e.g. its dead letters):
        ``<app_id>/<kind>`` at the same version."""
        return IdempotencyKey(f"{self.app_id}/{kind}", self.version)

    def __str__(self) -> str:
        return f"{self.app_id}@{self.version}"


@dataclass(frozen=True)
class BatchInfo:
    """The context of one micro-batch, shared by every sink and every hook.

    :param pipeline: the stable pipeline name given to :class:`fanout.FanOut`.
    :param batch_id: Spark's micro-batch id.
    :param query_id: the streaming query id (stable across restarts on one checkpoint).
    :param source_offsets: the end offsets of this batch, one JSON value per source, as
        read from the checkpoint's ``offsets/<batch_id>``; ``None`` when unreadable.
    :param epoch: 0, or the number of checkpoint resets accepted with
        ``on_checkpoint_reset="new_epoch"``; part of every transaction id.
    :param batch_timestamp_ms: when Spark planned the batch (``batchTimestampMs`` of
        ``offsets/<batch_id>``); a crash replay keeps it, a re-planned batch gets a new
        one. ``None`` when unreadable.
    """

    pipeline: str
    batch_id: int
    query_id: str | None = None
    source_offsets: list[Any] | None = None
    epoch: int = 0
    batch_timestamp_ms: int | None = None


class SharedArrow:
    """Converts a batch DataFrame to Arrow once, for every sink that reads Arrow.

    Thread-safe: sinks run in parallel threads and the first one to ask converts.
    """

    def __init__(self, df: Any) -> None:
        self._df = df
        self._lock = threading.Lock()
        self._table: pa.Table | None = None

    def get(self) -> pa.Table:
        """Return the batch as a ``pyarrow.Table``, converting it on first use."""
        with self._lock:
            if self._table is None:
                self._table = self._df.toArrow()
            return self._table

    def release(self) -> None:
        """Drop the converted table so its memory can be freed after the batch."""
        with self._lock:
            self._table = None


@dataclass
class Batch:
    """One micro-batch as one sink sees it.

    :param df: the batch DataFrame (persisted when several sinks read it).
    :param info: pipeline, batch id, query id and source offsets.
    :param sink_name: the name of the sink receiving this batch.
    :param txn_app_id: the sink's stable idempotency id (see :func:`txn_app_id`); with
        :attr:`batch_id` it forms :attr:`idempotency_key`, which sinks should use.
    :param attempt: 1 for the first attempt in this process, 2 for the first retry, ...
    """

    df: Any
    info: BatchInfo
    sink_name: str
    txn_app_id: str
    attempt: int = 1
    _arrow: SharedArrow | None = field(default=None, repr=False)

    @property
    def batch_id(self) -> int:
        """Spark's micro-batch id; use it as the sink's transaction version."""
        return self.info.batch_id

    @property
    def pipeline(self) -> str:
        """The pipeline name."""
        return self.info.pipeline

    @property
    def query_id(self) -> str | None:
        """The streaming query id."""
        return self.info.query_id

    @property
    def idempotency_key(self) -> IdempotencyKey:
        """This batch's identity for this sink: write it with the data (see
        :class:`IdempotencyKey`). Every built-in sink keys its writes by it."""
        return IdempotencyKey(self.txn_app_id, self.info.batch_id)

    def arrow(self) -> pa.Table:
        """The batch as a ``pyarrow.Table``, converted once and shared by all sinks."""
        if self._arrow is None:
            self._arrow = SharedArrow(self.df)
        return self._arrow.get()


@dataclass(frozen=True)
class SinkResult:
    """What a sink's :meth:`Sink.write` reports.

    :param rows: rows written (for a replay the sink found already written: the rows of
        the batch, with ``details["already_written"] = True``).
    :param details: small, JSON-serialisable facts worth logging (files, partitions...).
    :param dead_lettered: rows the target rejected that went to the sink's dead-letter
        target instead (recorded in the ledger mark, shown by ``fanout status``).
    """

    rows: int
    details: Mapping[str, Any] = field(default_factory=dict)
    dead_lettered: int = 0


class DeadLetterWriter(Protocol):
    """Writes one batch's dead letters to a dead-letter target, once per batch.

    What :meth:`Sink.route_dead_letters` returns; :class:`fanout.deadletter.DeltaDeadLetters`
    is one.
    """

    def write(self, batch: Batch, letters: Sequence[DeadLetter]) -> int:
        """Write ``letters`` for ``batch`` unless the target already holds this batch's
        letters (idempotent per ``(batch.txn_app_id, batch.batch_id)``); return how many
        letters the batch has (also when they were already written)."""
        ...


@dataclass(frozen=True)
class SinkContext:
    """What :meth:`Sink.open` receives.

    :param pipeline: the pipeline name.
    :param spark: the active ``SparkSession`` on the driver, or ``None`` without one.
    """

    pipeline: str
    spark: Any = None


class Sink:
    """Base class of every sink type.

    Subclass it, set :attr:`guarantee`, implement :meth:`write`, and validate options in
    :meth:`open`. Built from configuration as ``SinkClass(name=<name>, **options)``, so the
    constructor takes the sink name plus keyword options and stores them; unknown options
    raise ``TypeError`` there, which fanout reports as a configuration error naming the sink.

    Lifecycle, all on the driver:

    1. ``__init__`` when :class:`fanout.FanOut` is built: store options only.
    2. :meth:`open` once, still inside the ``FanOut`` constructor, so bad options and
       unreachable targets fail before the stream starts. Raise
       :class:`fanout.ConfigurationError`.
    3. :meth:`write` once per micro-batch the ledger says the sink has not committed,
       possibly from a worker thread, in parallel with other sinks. Must be idempotent
       (or transactional) per ``(batch.txn_app_id, batch.batch_id)``: a crash between the
       write and the ledger mark makes fanout call it again with the same batch. An
       exception fails the batch for this sink only: it is retried when
       :meth:`is_transient` says so, else reported in :class:`fanout.FanOutError`.
    4. :meth:`close` when the ``FanOut`` is closed.
    """

    guarantee: ClassVar[Guarantee] = "idempotent"
    """The delivery guarantee this sink type gives; see :data:`Guarantee`."""

    options: ClassVar[tuple[SinkOption, ...]] = ()
    """The keyword options the constructor takes, with default and meaning
    (:class:`fanout.options.SinkOption`): shown by ``fanout plugins --options TYPE`` and
    used by the "did you mean" checks. Declare every option, or none."""

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def reads(self) -> Reads:
        """``"arrow"`` when :meth:`write` only uses :meth:`Batch.arrow`, so fanout can
        share one conversion between sinks and skip persisting the DataFrame for them."""
        return "dataframe"

    def open(self, context: SinkContext) -> None:
        """Validate options and the target; called once before the stream starts.

        Raise :class:`fanout.ConfigurationError` naming the option and what to do.
        """

    def write(self, batch: Batch) -> int | SinkResult:
        """Write one micro-batch; return the number of rows written or a
        :class:`SinkResult`. Called only for batches the ledger has no mark of."""
        raise NotImplementedError(f"{type(self).__name__}.write")

    def check_schema(self, schema: pa.Schema) -> None:
        """Raise :class:`fanout.SchemaMismatchError` (naming the columns) when batches of
        this Arrow ``schema`` (the routed source schema) cannot be written to the target.
        Called by ``fanout validate`` after :meth:`open`, so a pipeline file whose source
        declares its schema learns of the mismatch before the stream starts. Default:
        nothing to check."""

    def close(self) -> None:
        """Release what :meth:`open` acquired; called once when the FanOut closes."""

    def route_dead_letters(self) -> DeadLetterWriter | None:
        """Where the rows that fail this sink's route go, or ``None`` to fail the batch.

        A sink configured with ``where``/``select`` receives the rows those expressions
        produce. When an expression raises on a row (under Spark's ANSI mode, e.g.
        ``CAST(amount AS INT)`` on ``'abc'``), fanout asks this method, on the driver,
        once per batch and before any sink writes:

        - ``None`` (the default without a Delta ``dead_letter``): the batch fails for this
          sink with a :class:`fanout.RouteError` naming the sink, the batch and the
          expression, chained from Spark's error.
        - a :class:`DeadLetterWriter`: fanout isolates the failing rows (see
          :mod:`fanout.route_rejects`), hands :meth:`write` the other rows, and calls
          ``writer.write(batch, letters)`` just before :meth:`write`, in the same attempt
          (so it is retried with it). Each letter holds the reason, the failing column and
          value when known, and the row as it was before the route; the count is added to
          the sink's :attr:`SinkResult.dead_lettered`. The writer must be idempotent per
          ``(batch.txn_app_id, batch.batch_id)`` and must not collide with the sink's own
          dead-letter records of the same batch: a replay after a crash between the
          letters and the ledger mark calls it again with the same letters.

        The default returns a :class:`fanout.deadletter.DeltaDeadLetters` (transaction
        ``<txn_app_id>#route_dead_letters``) when the sink has a ``dead_letter`` attribute
        naming a Delta table (a path, or ``delta:<path>``), using its ``storage_options``
        attribute if any, and ``None`` otherwise. Override it to support other kinds.
        """
        target = getattr(self, "dead_letter", None)
        if not isinstance(target, str):
            return None
        from fanout.deadletter import ROUTE_LETTERS, DeltaDeadLetters, split_target

        try:
            _kind, location = split_target(target, self.name)
        except ConfigurationError:
            return None  # a kind this default cannot write: fail loudly instead
        options = getattr(self, "storage_options", None)
        return DeltaDeadLetters(location, options, suffix=ROUTE_LETTERS)

    def partitioned_by(self) -> Sequence[str] | Literal["*"] | None:
        """The batch columns whose values decide which of this sink's per-partition
        commits a row lands in, for sinks that skip, on a replay, the partitions that
        already committed the batch (Kafka, PostgreSQL append): ``"*"`` for the whole
        row. Called on the driver after :meth:`open`. fanout refuses a route (at
        ``FanOut(...)``) or a batch whose partitioning columns, or whose filter, is not
        deterministic (:mod:`fanout.partitioning`). Default ``None``: the sink commits a
        batch as a whole, or idempotently, and needs no stable membership."""
        return None

    def secret_values(self) -> Sequence[str]:
        """The secret values this sink holds (passwords, tokens), so fanout can scrub
        them from every error it logs, records in the ledger or raises. Default: none."""
        return ()

    def is_transient(self, error: BaseException) -> bool:
        """Whether ``error`` (raised by :meth:`write`) is worth retrying.

        The default retries :class:`fanout.TransientSinkError` only. Override it to
        classify the errors of your driver library (timeouts, lost connections, commit
        conflicts); never classify bad input as transient.
        """
        return isinstance(error, TransientSinkError)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
