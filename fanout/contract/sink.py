"""The sink contract: what a plugin author implements and what a sink receives.

A sink type is a subclass of :class:`Sink`. Its instances are *configuration*: they are
built on the driver, validated by :meth:`Sink.open` before the stream starts, and may be
pickled to the executors (sinks that write from there). Connections, producers and clients
are therefore created inside :meth:`Sink.write` or inside the partition task, never in
``__init__``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from fanout.contract.batch import Batch
from fanout.contract.options import SinkOption
from fanout.contract.partitions import BatchPartitioning, StableColumns
from fanout.errors import TransientSinkError

if TYPE_CHECKING:
    import pyarrow as pa

    from fanout.contract.dead_letters import DeadLetterTarget

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


class BackfillSource(Protocol):
    """The batches a sink's target holds, readable one by one: what a sink configured with
    ``backfill_from=<this sink>`` receives before it goes live. A sink offers one from
    :meth:`Sink.backfill_source` when its target keeps every batch's rows as they came
    (an unrouted append)."""

    def batches(self, epochs: Sequence[int]) -> list[tuple[int, int]]:
        """``(epoch, batch_id)`` of every batch of ``epochs`` that wrote rows to the
        target, in order (the backfill itself goes by the sink's ledger marks)."""
        ...

    def read(self, key: tuple[int, int]) -> pa.Table:
        """The rows batch ``key`` wrote, as Arrow. ``key`` is a batch the sink committed
        (by its ledger mark); one that wrote no row to the target is an empty table (with
        the target's columns when it has any). As many rows as the sink's ``write()``
        reported (:attr:`SinkResult.rows`, recorded in the mark): the catch-up refuses a
        batch read back with another count."""
        ...


@dataclass(frozen=True)
class SinkResult:
    """What a sink's :meth:`Sink.write` reports.

    :param rows: rows of the batch written, not the rows the target changed (an upsert
        counts the rows it upserted, also those that changed nothing, and may count a key
        the batch holds twice once; the rows refused go in :attr:`dead_lettered`
        instead); for a replay the sink found
        already written: the rows of the batch, with :attr:`already_written` set. At most
        the rows routed to the sink less :attr:`dead_lettered` (fanout refuses more,
        when it knows the routed rows, and any count below zero, with
        :class:`fanout.errors.SinkResultError`: :mod:`fanout.steps.result_check`). The
        ledger mark records it, ``fanout run`` prints it, and a backfill from this sink
        (:meth:`Sink.backfill_source`) must read back as many rows.
    :param details: small, JSON-serialisable facts worth logging (files, partitions...).
    :param dead_lettered: rows the target rejected that went to the sink's dead-letter
        target instead (recorded in the ledger mark, shown by ``fanout status``).
    :param already_written: the target held the whole batch already (a replay after a
        crash between the write and the ledger mark); nothing was written again.
    """

    rows: int
    details: Mapping[str, Any] = field(default_factory=dict)
    dead_lettered: int = 0
    already_written: bool = False


@dataclass(frozen=True)
class SinkContext:
    """What :meth:`Sink.open` receives.

    :param pipeline: the pipeline name.
    :param spark: the active ``SparkSession`` on the driver, or ``None`` without one.
    :param dead_letters: where the rows this sink's target refuses go, resolved by fanout
        from the sink's ``dead_letter`` option (:mod:`fanout.deadletters.target`); ``None``
        without one: such a row fails the batch, named. fanout writes the rows failing the
        sink's route there itself. Handed over as a
        :class:`fanout.deadletters.moved.CheckedTarget` (its ``write`` writes no letter an
        earlier target of the sink holds; an instance of the target's class, with its
        attributes: :mod:`fanout.contract.dead_letters`).
    :param plugins: the plugin objects given to ``FanOut(plugins=...)``; a sink writing
        from the executors ships those implementing the per-partition commit hooks with
        its tasks (:mod:`fanout.partitioned.sink`).
    :param ledger: the pipeline's ledger as the commands fanout prints name it
        (:func:`fanout.ledger.entry.ledger_location`: an absolute path or a URI, quoted for
        a shell), for a refusal that prints ``fanout recover --ledger ...``; ``None``:
        unknown (a sink opened outside a :class:`fanout.FanOut`).
    :param checking: ``True`` when ``fanout validate`` opens the sink (only a sink type
        whose :attr:`Sink.read_only_check` is set): check the options and the target as
        for a run, but change nothing (create no table or topic, run no migration), and
        tell what the run's :meth:`Sink.open` or first batch would create or change with
        :meth:`would`. A missing object the run would create is not a failure; one it
        could not create is, as at a run.
    :param readiness: ``True`` when ``fanout validate`` opens the sink (with
        ``checking``): it may also check what a run needs beyond :meth:`Sink.open`'s own
        checks and would otherwise fail on only mid-stream (rights, transactions), by
        means a run's data never sees (the Kafka sink initialises a transactional id of
        its own). ``False`` for ``fanout recover --config``, which opens the sink with
        ``checking`` only to ask :meth:`Sink.holds_batch`, with rights perhaps to read
        only.
    :param changes: what :meth:`would` was told, in order (``fanout validate`` prints
        them).
    :param secrets: every secret of the pipeline (:attr:`fanout.FanOut.secrets`: its
        locations' passwords and all its sinks' :meth:`Sink.secret_values`), for what the
        sink writes itself beyond its errors, which fanout masks: a dead letter's reason
        quoting its server's message (:class:`fanout.observe.secrets.SinkSecrets`, which
        the partitioned-sink kit gives its writers); ``()`` outside a
        :class:`fanout.FanOut`. As known when the sink opens: a credential a sink opened
        after it fetches in its ``open`` is not among them.
    :param sinks: the names of every sink the pipeline configures (``()`` outside a
        :class:`fanout.FanOut`): a sink whose records of a batch are keyed by its name can
        tell another sink of the pipeline, still configured, writing its target from one
        that is gone (renamed after it wrote a batch and before its mark: the Delta sink
        refuses writing that batch again under the new name).
    :param accept_lost: ``True`` when this run accepts the loss of the sink's target
        (``FanOut(accept_lost_targets=[...])``, ``fanout run --accept-lost-target``
        naming it): besides the run's start check (:mod:`fanout.steps.lost_target`), a
        sink that finds, replaying a batch, its records of it made in a target replaced
        since may write the whole batch into the target as it is instead of refusing
        (the PostgreSQL sink: docs/architecture.md §8.2, "A table replaced mid-batch").
    :param last_mark: with :attr:`readiness` (``fanout validate``): the pipeline's current
        epoch and the sink's last mark in it, ``(epoch, batch_id)``, as the ledger holds
        them; ``None`` when it holds none there (or there is no ledger yet), and always
        outside ``fanout validate``. A sink whose own records are kept apart from the
        ledger and may go without it (the Kafka sink's marker groups, which the brokers
        expire) can check that they are still there and say so with :meth:`warn`.
    :param warnings: what :meth:`warn` was told, in order (``fanout validate`` prints each
        as a ``WARN`` line: the run is not refused for it).
    """

    pipeline: str
    spark: Any = None
    dead_letters: DeadLetterTarget | None = None
    plugins: Sequence[object] = ()
    checking: bool = False
    readiness: bool = False
    ledger: str | None = None
    changes: list[str] = field(default_factory=list)
    secrets: tuple[str, ...] = ()
    sinks: tuple[str, ...] = ()
    accept_lost: bool = False
    last_mark: tuple[int, int] | None = None
    warnings: list[tuple[str, str]] = field(default_factory=list)

    def would(self, change: str) -> None:
        """Record what the run would create or change that is not there yet, in words
        that complete "would ...", e.g. ``"create table public.orders"``; called by a
        sink's :meth:`Sink.open` when :attr:`checking`."""
        self.changes.append(change)

    def warn(self, what: str, problem: str) -> None:
        """Record a problem a run would go on with but an operator should fix (``what``:
        the check, e.g. ``"its marker groups hold its last marked batch"``; ``problem``:
        what is wrong and what to do); called by a sink's :meth:`Sink.open` when
        :attr:`readiness`."""
        self.warnings.append((what, problem))


@dataclass(frozen=True)
class PartlyHeld:
    """:meth:`Sink.holds_batch`'s answer for a batch the sink holds only part of: some of
    the transactions (partitions) it writes the batch in committed, not all; or all of
    them, but the rows they refused, which the sink hands to its dead-letter target after
    them, are not all there (``letters``).

    :param committed: how many partitions committed the batch.
    :param partitions: how many the batch was written in (``None``: the sink's records
        do not say).
    :param letters: refused rows the committed partitions kept for the sink's dead-letter
        target that it does not hold (or cannot be asked about): a replay of the batch
        writes them there, a lost mark would skip them.
    """

    committed: int
    partitions: int | None = None
    letters: int = 0

    def text(self) -> str:
        """The part, for messages: ``3 of 4 partitions``."""
        of = "?" if self.partitions is None else str(self.partitions)
        return f"{self.committed} of {of} partitions"

    def letters_text(self) -> str:
        """What the committed part lacks of the dead letters, for messages (empty when
        nothing): ``, 27 refused row(s) not in its dead-letter target yet``."""
        if not self.letters:
            return ""
        return f", {self.letters} refused row(s) not in its dead-letter target yet"

    @property
    def whole_rows(self) -> bool:
        """Every partition committed: only dead letters are missing."""
        return self.partitions is not None and self.committed >= self.partitions


class Sink:
    """Base class of every sink type.

    Subclass it, set :attr:`guarantees` (none set: ``at_least_once``), implement
    :meth:`write`, and validate options in :meth:`open`. Built from configuration as
    ``SinkClass(name=<name>, **options)``, so the constructor takes the sink name plus
    keyword options and stores them; unknown options raise ``TypeError`` there, which
    fanout reports as a configuration error naming the sink.

    Lifecycle, all on the driver:

    1. ``__init__`` when :class:`fanout.FanOut` is built: store options only.
    2. :meth:`open` once, still inside the ``FanOut`` constructor, so bad options and
       unreachable targets fail before the stream starts. Raise
       :class:`fanout.ConfigurationError`. From then on the ``FanOut`` owns the sink: one
       Sink object serves one live ``FanOut`` (a second given it while the first is not
       closed refuses to start with :class:`fanout.ConfigurationError`).
    3. :meth:`write` once per micro-batch the ledger says the sink has not committed,
       possibly from a worker thread (not the one :meth:`open` ran on: a client bound to
       its thread is made in ``write``), in parallel with other sinks. Must be idempotent
       (or transactional) per :attr:`Batch.idempotency_key` (``app_id``, ``version``;
       ``token`` for names), not the batch id alone: a crash between the write and the
       ledger mark makes fanout call it again with the same key, and a new epoch gets a
       new one. Rows the target refuses go to :attr:`SinkContext.dead_letters` after the
       commit that decides them (:mod:`fanout.contract.dead_letters`). An
       exception fails the batch for this sink only: it is retried when
       :meth:`is_transient` says so, else reported in :class:`fanout.BatchFailedError`.
    4. :meth:`close` once, when the ``FanOut`` that opened the sink is closed, or when
       the ``FanOut`` constructor fails after opening it; never for a sink whose
       :meth:`open` raised.
    """

    guarantees: ClassVar[tuple[Guarantee, ...]] = ("at_least_once",)
    """The delivery guarantees this sink type can give, by configuration (the first is
    the default's); ``fanout plugins`` lists them. See :data:`Guarantee`.

    A type that declares none (leaves it out, or sets ``()``) is ``("at_least_once",)``
    (:func:`declared_guarantees`): fanout cannot know that its
    :meth:`write` leaves the same state when a batch is written again, so it warns at start
    (with what to do) and ``fanout plugins`` shows ``at_least_once (not declared)``. Declare
    ``("idempotent",)`` or ``("transactional",)`` once it does (it skips a batch its records
    hold, by :attr:`Batch.idempotency_key`, or writes idempotently); the conformance kit
    (:mod:`fanout.testing.conformance`) checks it. See :func:`declares_guarantees`."""

    read_only_check: ClassVar[bool] = False
    """Whether :meth:`open` honours :attr:`SinkContext.checking`: opened so, it changes
    nothing and reports what a run would create with :meth:`SinkContext.would`.
    ``fanout validate`` opens, and checks the schema of, only sinks whose type sets it;
    for the others it prints ``SKIP`` for the target, since their :meth:`open` may create
    things (the default, safe for a sink type written before the flag existed)."""

    hook_conditions: ClassVar[Mapping[str, str]] = {}
    """For an optional hook (:data:`OPTIONAL_HOOKS`) this type overrides but that answers
    only under some of its options, returning the default otherwise: those options in a few
    words, which ``fanout plugins`` prints beside the hook's name, e.g.
    ``{"harmless_rewrite": "mode=upsert, no dead_letter"}``. A hook that answers whatever
    the options needs no entry; a key naming a hook the type does not implement is refused
    when the plugin loads (:class:`fanout.errors.PluginError`)."""

    batch_removable: ClassVar[bool] = True
    """Whether an operator can take a batch back out of this sink's target (a Delta table's
    RESTORE, deleting rows): the refusal of a sink renamed mid-batch
    (:class:`fanout.RenamedSinkError`) offers it as a way on only then. ``False`` for a
    target that keeps what it committed (a Kafka topic: only renaming the sink back is)."""

    options: ClassVar[tuple[SinkOption, ...]] = ()
    """The keyword options the constructor takes, with default and meaning
    (:class:`fanout.contract.options.SinkOption`): shown by ``fanout plugins --options TYPE`` and
    used by the "did you mean" checks. Declare every option, or none."""

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def guarantee(self) -> Guarantee:
        """What this configured sink promises on a replay; must be one of
        :attr:`guarantees`. Default: the type's first. Override it when an option decides
        (PostgreSQL: ``upsert`` is idempotent, ``append`` transactional)."""
        return declared_guarantees(type(self))[0]

    @property
    def reads(self) -> Reads:
        """``"arrow"`` when :meth:`write` only uses :meth:`Batch.arrow`, so fanout can
        share one conversion between sinks and skip persisting the DataFrame for them."""
        return "dataframe"

    def open(self, context: SinkContext) -> None:
        """Validate options and the target; called once before the stream starts, and by
        ``fanout validate`` with ``context.checking`` set when :attr:`read_only_check`
        says the sink honours it (then nothing may be created or changed).

        Create a missing target (a ``create_table`` option) at the first :meth:`write`,
        not here: ``open()`` runs before the run's lost-target check (:meth:`holds_batch`),
        so a target it created again after a deletion would be there for the retry of the
        refused run, whose records kept beside it (they outlive it) would then answer
        "held": the loss silent after one refusal. Check here what can be checked
        without creating (options, permissions, the types it would be created with).

        Raise :class:`fanout.ConfigurationError` naming the option and what to do. An
        ``open()`` that raises releases what it acquired before raising: :meth:`close` is
        not called for it (nor for a sink whose reopen's ``open()`` raised).
        """

    def write(self, batch: Batch) -> int | SinkResult:
        """Write one micro-batch; return the number of rows written or a
        :class:`SinkResult`. Called only for batches the ledger has no mark of."""
        raise NotImplementedError(f"{type(self).__name__}.write")

    def check_replay(self, batch: Batch) -> None:
        """Refuse an attempt before fanout writes anything of it. fanout writes the rows
        failing the sink's route to its dead-letter target at the start of each attempt,
        before :meth:`write`; when there are such letters it first calls this, so a sink
        that would refuse the batch anyway (a replay whose :attr:`Batch.route`, or an
        option deciding where rows go, differs from what the pieces it already committed
        recorded) refuses while nothing of the attempt is written: the letters would
        otherwise be written and the batch stuck (the target then refuses the old route
        back). Raise a :class:`fanout.SinkError` naming what changed and what to do.
        Not called when there are no route letters (then :meth:`write` checks first).
        Default: nothing to check."""

    def check_schema(self, schema: pa.Schema) -> None:
        """Raise :class:`fanout.SchemaMismatchError` (naming the columns, without a
        ``batch_id``: there is no batch here) when batches of this Arrow ``schema`` (the
        routed source schema) cannot be written to the target.
        Called by ``fanout validate`` after :meth:`open` with ``checking`` set, so a
        pipeline file whose source declares its schema learns of the mismatch before the
        stream starts; must write nothing either. Default: nothing to check."""

    def close(self) -> None:
        """Release what the sink keeps open (what :meth:`open` acquired, clients
        :meth:`write` or its driver-side checks made and kept for later batches). Called
        once for each ``open()`` that returned: when the ``FanOut`` closes (a second
        ``FanOut.close()`` does nothing), or when the ``FanOut`` constructor fails after
        this sink was opened (a later sink's ``open()``, or a check of the configuration,
        refused the start), or by a lag sink's reopen that may not keep the sink open (its
        target check failed). An error it raises is logged with the sink's name, never
        raised in place of the start's."""

    def partitioned_by(self) -> Sequence[str] | Literal["*"] | None:
        """The batch columns whose values decide which of this sink's per-partition
        commits a row lands in, for sinks that skip, on a replay, the partitions that
        already committed the batch (Kafka, PostgreSQL append): ``"*"`` for the whole
        row. Called on the driver after :meth:`open`. fanout refuses a route (at
        ``FanOut(...)``) or a batch whose partitioning columns, or whose filter, is not
        deterministic (:mod:`fanout.partitioned.membership`). Default ``None``: the sink commits a
        batch as a whole, or idempotently, and needs no stable membership."""
        return None

    def deterministic_columns(self) -> StableColumns | None:
        """The batch columns a replay must compute again with the same values, and why:
        fanout refuses a route (at ``FanOut(...)``) or a batch in which they, or a filter
        deciding which rows exist, are not deterministic
        (:mod:`fanout.partitioned.determinism`). Called on the driver after :meth:`open`.
        Default: :meth:`partitioned_by`'s columns. A sink upserting by keys whose replay
        writes the batch again (an idempotent upsert, no record of the batch) returns
        ``StableColumns(keys, "upserts by")`` (:mod:`fanout.contract.partitions`): a
        replay computing other keys would write every row again. A sink committing each
        batch whole with a record of it (a transaction that a replay finds and skips)
        needs none."""
        by = self.partitioned_by()
        return None if by is None else StableColumns(by)

    def batch_partitioning(self, schema: Any) -> BatchPartitioning | None:
        """How :meth:`write` will hash-partition a batch of ``schema`` (a Spark
        ``StructType``), in the batch's column names, when the sink can tell without any
        I/O; ``None`` (the default) when it does not partition or cannot tell yet.

        When two or more pending sinks give the same answer, fanout persists the batch
        partitioned that way, so each of their writes finds it partitioned already and
        Spark shuffles it once instead of once per sink. A wrong answer costs only that
        saving: a sink's own ``repartition`` still decides where its rows go."""
        return None

    def shares_tasks(self) -> bool:
        """Whether this sink's first attempt at a batch may be written in Spark tasks
        shared with other sinks (:mod:`fanout.contract.sharing`): it then implements
        :meth:`shared_write`, and :meth:`batch_partitioning` says which sinks it fits with
        (their partitioning, or :data:`~fanout.contract.sharing.ANY_PARTITIONING`).
        Default: no."""
        return False

    def shared_write(self, batch: Batch) -> Any:
        """On the driver, everything :meth:`write` does before its Spark job (checks that
        refuse the batch raise here, before anything is written), as a
        :class:`~fanout.contract.sharing.SharedWrite` a shared job runs with other sinks'
        (typed ``Any`` here: that module builds on this one).
        Called for the first attempt only, when :meth:`shares_tasks` says so."""
        raise NotImplementedError(f"{type(self).__name__}.shared_write")

    def backfill_source(self, pipeline: str) -> BackfillSource | None:
        """The batches this sink's target holds, for a new sink configured with
        ``backfill_from`` naming this one; ``None`` (the default) when the target cannot
        give back each batch's rows as they came. Called on the driver after
        :meth:`open`."""
        return None

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool | PartlyHeld | None:
        """Whether the target holds batch ``batch_id`` of ``epoch`` by the sink's own
        records (the idempotency records :meth:`write` keeps for
        :attr:`Batch.idempotency_key` of that batch: ``txn_app_id(pipeline, self.name,
        epoch)`` at version ``batch_id``, :func:`fanout.txn_app_id`; records named by
        :attr:`Batch.idempotency_key`'s ``token`` look up ``fanout.IdempotencyKey(
        txn_app_id(pipeline, self.name, epoch), batch_id).token``; a
        record of the same batch id in another epoch is another batch), whatever the
        ledger says: all of it, part of it, or none.

        Called on the driver after :meth:`open`, only when a checkpoint reset starts a new
        epoch (``on_checkpoint_reset="new_epoch"``) and by ``fanout recover --config``, once
        per sink with a mark ``m`` in the epoch being replaced, for ``batch_id = m + 1``: a
        sink that wrote that batch and lost its mark (the driver killed in between) would
        get its rows again from the new epoch, so fanout refuses the start
        (:class:`fanout.UnmarkedBatchError`). At an epoch start where some sink asked fences
        (:meth:`fence_earlier_epochs`), it is asked twice: once before the fences (the
        replaced epoch still open to writes in flight: a held batch refuses the start with
        nothing fenced) and again after them (the answer that counts). One read of the
        sink's records each time; never called on the per-batch path. Also once per run, at
        its first batch, for the sink's last mark ``m`` of the current epoch, or, with no
        mark there (the first run after a checkpoint reset, a sink lagging across one), of
        the newest earlier epoch that holds one, so it must answer from its records of that
        ``epoch`` (and, when that says ``False``, its last mark that wrote rows): ``False``
        there refuses the run with
        :class:`fanout.TargetLostError` (the target was deleted or replaced since), so
        records kept beside the target (a progress table, consumer groups) that outlive it
        must not answer alone for a target that is missing (``False``); whether the target
        there is the one they were written to is :meth:`target_replaced`'s question, asked
        after this one.

        ``True``: the *whole* batch was committed (fanout then records the sink's lost mark
        in the ledger, which counts the batch as written there); a :class:`PartlyHeld`:
        some of its partitions committed, not all (a sink writing a batch in several
        transactions, killed between them; nothing is recorded, since a mark would make a
        replay of the batch skip the partitions that never committed), or all of them but
        the rows they refused are not (known to be) in the dead-letter target the sink
        writes them to after its commits (``letters``: the replay writes them); ``False``: none
        (also when the target was never created, and, for a sink writing a batch as several
        files then a commit record, when the files are there without the record: an attempt
        that never committed, whose files its replay must replace (files named by the
        batch's ``token`` are); ``True`` would record a mark for
        rows no reader of committed data sees);
        ``None`` (the default): the sink cannot tell. A sink that cannot tell the whole
        from a part answers :class:`PartlyHeld` with ``partitions=None``. Raise nothing for
        "cannot tell": an exception is logged and counted as ``None``."""
        return None

    def holds_batch_of(
        self, sink_name: str, pipeline: str, epoch: int, batch_id: int
    ) -> bool | PartlyHeld | None:
        """:meth:`holds_batch` by the records another sink, named ``sink_name``, kept in
        *this* sink's target: whether this target holds batch ``batch_id`` of ``epoch``
        written under that name (``txn_app_id(pipeline, sink_name, epoch)``).

        What it is for: a sink's name keys its records. Killed after sink ``old`` committed
        batch ``N`` and before its ledger mark, then restarted with ``old`` renamed to
        ``new`` on the same target, ``new`` has no mark and no record, and would write
        ``N`` again (an append holds it twice). The ledger cannot tell that rename from a
        clean one; the target can. So at a run's first batch, only when a sink configured
        now has no mark in the epoch *and* the ledger names sinks no longer configured
        ("vanished"), fanout asks each such new sink about the run's first batch (the one it
        would write) under each vanished name (:mod:`fanout.steps.renamed`): held (``True`` or a
        :class:`PartlyHeld`) refuses the run before anything is written (unless
        :meth:`harmless_rewrite` says writing it again is harmless: a warning).

        ``False``: the target holds no such record, also when the records under that name
        are of another target (the vanished sink wrote elsewhere, or is of another type):
        the check does not know the vanished sink's type. ``None`` (the default): cannot
        tell, logged as a warning, not a refusal. Reads only; bounded by
        ``write_timeout_s`` as :meth:`holds_batch` is; never on the per-batch path. A
        built-in sink's :meth:`holds_batch` is this with its own name."""
        return None

    def fence_earlier_epochs(self, pipeline: str, epoch: int) -> None:
        """Close the sink's records of epochs ``0 .. epoch-1`` of ``pipeline`` to writes
        still in flight: once this returns, no write of a batch of those epochs that had
        not committed by then may commit (it must fail, or wait for the fence and then
        fail), and every write that did commit is one :meth:`holds_batch`, asked after, sees.

        A checkpoint reset accepted as a new epoch replaces a query that may still have a
        task running (of an executor Spark gave up on, of a failed job), and a sink that
        commits in its tasks (the partitioned-sink kit's PostgreSQL and Kafka partitions)
        would let it commit the replaced epoch's batch ``m + 1`` after the new epoch
        asked whether the sink holds it: the new epoch reads that batch's input again,
        under its own idempotency records, where the old task's record meets nothing, so
        an append holds the rows twice. A sink whose every commit is made on the driver
        needs it too when the replaced query's driver may still run (an operator who did
        not stop it): that driver may commit its batch ``m + 1`` after the question. The
        Delta sink fences with one commit carrying each earlier epoch's app transaction
        marked fenced (``fanout_delta.fence``): a commit from a snapshot before it loses
        the race to it, a write reading it refuses.

        Called on the driver after :meth:`open`, with the new epoch (``epoch`` > 0):

        - when that epoch starts (``on_checkpoint_reset="new_epoch"``), for each open sink
          about to be asked :meth:`holds_batch` about the replaced epoch's batch after its
          mark, *before* the question that counts: a writer committing between the question
          and the fence would be read again and written twice. The sinks are asked once
          before the fences too, and a start that question (or the ledger's own check of the
          start) refuses is refused without any fence. Not for a lagging sink whose spool
          holds that batch (its catch-up writes the replaced epoch's spooled batches after
          the reset: :meth:`write` with their epoch, before its first batch of the new one).
          Bounded by ``write_timeout_s`` as :meth:`holds_batch` is; an error or no answer
          refuses the start (nothing of the new epoch is written), and it is asked again at
          the next start.
        - when that start is then refused after the fences (by a sink's answer after
          them, or by the ledger with :class:`fanout.ZombieBatchError` at the start's
          commit: the replaced query still writes),
          :meth:`lift_epoch_fence` undoes it for epoch ``epoch - 1``: the refusal may say
          to restart that epoch's checkpoint to complete a batch. Not when the ledger
          records that another query started ``epoch`` meanwhile (or cannot tell): that
          query relies on the fence.

        A sink may also fence at its first :meth:`write` of an epoch > 0 in a process (the
        PostgreSQL sink does, in its preflight: a lagging sink is fenced after its
        catch-up); that write's own epoch is never closed. Idempotent: called again for
        an epoch already fenced, it changes nothing. Default: nothing (a sink with no
        writer a replaced query may leave running, or one that cannot close it: the
        batch in flight is then only detected, by the ledger's ``ZombieBatchError``)."""

    def lift_epoch_fence(self, pipeline: str, epoch: int) -> bool | None:
        """Undo :meth:`fence_earlier_epochs` for epoch ``epoch - 1`` only (the earlier
        epochs were closed by an earlier start that was not refused): called on the
        driver when the start of ``epoch`` was refused after the fence, so the replaced
        epoch's checkpoint may be started again (to complete a batch the sink holds part
        of). Also after :meth:`fence_earlier_epochs` raised (not after it did not answer
        within ``write_timeout_s``: it may still be fencing): it may have closed part of
        the sink's records, so a lift opens what is closed and leaves the rest. An error
        is logged, not raised (the refusal is); the writes it then refuses say how to lift
        it by hand (``fanout ledger lift-fence``, which prints what this returns). Returns
        whether there was a fence to lift: ``True`` lifted, ``False`` none there (nothing
        changed), ``None`` cannot tell (it opened the epoch again either way; the
        default, which does nothing, says so too)."""
        return None

    def target_replaced(self, pipeline: str, epoch: int, batch_id: int) -> str | None:
        """Whether the target is no longer the one this sink wrote batch ``batch_id`` of
        ``epoch`` to, but one dropped and created again empty since: why (a sentence the
        refusal quotes, e.g. "table public.orders has OID 16412 now, not 16398, which batch
        7 was written to, and holds no row"), or ``None`` (the default) when it is the same
        target, holds rows (restored from a backup or a mirror: :meth:`holds_batch`
        answers), or the sink cannot tell (no identity recorded, an older record, a
        service that gives none). A missing target is :meth:`holds_batch`'s ``False``,
        not this. An empty (or blank) reason still says replaced: the refusal quotes "the
        sink gave no reason" instead, so no replaced target is written for the lack of one.

        :meth:`holds_batch` answers from the sink's records, which outlive the target (a
        progress table, consumer groups): a target re-created by hand is there, empty, and
        they say "held". A sink that records an identity beside them (a PostgreSQL table's
        OID in each batch mark, a Kafka topic's id once per run) tells the two apart here.

        Called on the driver after :meth:`open`, with the batch :meth:`holds_batch` is asked
        about: at a run's first batch (the lost-target check, for the sink's last mark, and
        when that is refused for its last mark that wrote rows: at most twice, never per
        batch; and so once a lagging sink that could not be opened at the start opens,
        again at each try while that check fails) once :meth:`holds_batch` did not say
        ``False`` nor fail to answer within ``write_timeout_s`` (nothing to tell then;
        ``None`` and :class:`PartlyHeld` too: records that outlive a target re-created empty
        tell nothing of it), at a new epoch's start and by ``fanout recover`` (the batch
        after the mark) once it said held (``True`` or :class:`PartlyHeld`). A reason counts
        as ``False`` from :meth:`holds_batch` everywhere: the run is refused with
        :class:`fanout.TargetLostError` quoting it (or the sink lags with it,
        ``on_failure="lag"``; ``accept_lost_targets`` accepts it), and a new epoch's start
        neither refuses for the batch nor records its lost mark. Bounded by the sink's
        ``write_timeout_s`` as :meth:`holds_batch` is, in a thread of its own; one that
        raises or does not answer in time is logged and counts as ``None``. Without
        ``write_timeout_s`` it is waited for as :meth:`holds_batch` is: one that hangs holds
        the run's start. fanout masks the reason with :meth:`secret_values`. Reads only: it
        must create nothing (a refused run must leave the target as it found it)."""
        return None

    def records_gone(self, pipeline: str, epoch: int, batch_id: int) -> str | None:
        """Why the sink's own records of batch ``batch_id`` of ``epoch`` (those :meth:`holds_batch`
        reads: a progress table, marker records, app transactions) are gone while its target
        still holds rows: a sentence naming what is gone, or ``None`` (the default) when
        they are there, the target holds nothing, or the sink cannot tell.

        Called on the driver only at a run's lost-target check, once :meth:`holds_batch`
        said ``False`` about the sink's last marked batch that wrote rows (the ledger says
        the target got that batch), and at a new epoch's start, once it said ``False`` about
        the batch after the sink's mark, about its last mark of that epoch that wrote rows
        (a reason refuses the start, before anything is fenced): records kept beside the
        target can be deleted apart from it (an operator cleaning "internal" tables, a
        database restored from a dump taken without them, a log's retention), and then
        ``False`` would accuse the target of being created again empty, and, for a batch
        written after that mark and never marked, let its replay write it a second time.
        And at a batch Spark replays (its earlier attempt may have written it and died
        before the mark: :mod:`fanout.steps.replay`), about the sink's mark in the epoch,
        once :meth:`holds_batch` said ``None`` about the replayed batch: a reason there
        refuses that batch, since the sink cannot tell whether its target holds it (a sink
        whose records expire, and whose ``holds_batch`` answers ``None`` for an idle
        pipeline's restart, says here that they went). A
        reason refuses the run with :class:`fanout.SinkRecordsGoneError` quoting it (not
        "created again empty"; a sink with ``on_failure="lag"`` lags with it;
        ``accept_lost_targets`` accepts it and writes on; one whose
        :meth:`harmless_rewrite` gives a reason writes on, warned). Records the sink
        removes itself (pruning old ones) are not gone: answer ``None`` then. Bounded by
        ``write_timeout_s`` as :meth:`holds_batch` is; one that raises or does not answer
        in time counts as ``None``. Reads only; fanout masks the reason with
        :meth:`secret_values`."""
        return None

    def harmless_rewrite(self) -> str | None:
        """Why writing again a batch this sink holds, under a new epoch's idempotency keys,
        leaves its target as one write would (``None``, the default: it would not, e.g. an
        append holds the rows twice).

        Called on the driver only when :meth:`holds_batch` said ``True`` at a new epoch's
        start: instead of refusing the start (:class:`fanout.UnmarkedBatchError`), fanout
        records the lost mark and logs a warning naming the sink, the batch and this reason.
        Return a reason only when it holds for *any* input the new epoch may give that
        batch: the new epoch's batch may cover other source offsets (the operator resumes
        where ``fanout recover`` says) and other values of non-deterministic columns. An
        unconditional upsert by key does (each key ends with the row the new epoch wrote
        last); anything appended beside it does not (rows a dead-letter target keeps would be
        kept twice), nor does an update conditioned on the target's values."""
        return None

    def remove_batch_hint(self, pipeline: str, epoch: int, batch_id: int) -> str | None:
        """How an operator removes this sink's copy of a batch :meth:`holds_batch` said it
        holds, as one sentence (e.g. the Delta version to restore before), when that is
        simple; ``None`` (the default) when it is not. Called only for the refusal's
        message."""
        return None

    def standing_problems(self) -> Sequence[str]:
        """What is wrong with this sink's target that only a person can fix, each as a text
        naming the target, what is wrong and the fix (the Delta sink: a compaction of its
        table that left rows twice and cannot be taken back). Called by ``fanout status
        --config`` on a sink built from the pipeline file and not opened, at its first draw
        and, with ``--watch``, at most once a minute after
        (:class:`fanout.app.standing.SinkProblemsEvery`): reads only, changes nothing, and
        should cost little. Default: none."""
        return ()

    def exclusive_resources(self, pipeline: str) -> Sequence[str]:
        """What this sink must have to itself among the sinks of ``pipeline`` (Kafka: its
        transactional ids, which two producers would fence each other over), each as a text
        naming it and the option that sets it; fanout refuses a ``FanOut`` (and ``fanout
        validate`` reports) two sinks giving the same text. Called on the driver before
        :meth:`open`, from the options alone. Default: none."""
        return ()

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


OPTIONAL_HOOKS: tuple[str, ...] = (
    "check_replay",
    "check_schema",
    "partitioned_by",
    "deterministic_columns",
    "batch_partitioning",
    "shares_tasks",
    "backfill_source",
    "holds_batch",
    "holds_batch_of",
    "fence_earlier_epochs",
    "lift_epoch_fence",
    "target_replaced",
    "records_gone",
    "harmless_rewrite",
    "remove_batch_hint",
    "standing_problems",
    "exclusive_resources",
    "secret_values",
    "is_transient",
)
"""The optional methods of :class:`Sink` that change what fanout does with a sink (a
replay, a new epoch's start and its refusal, ``fanout validate``, a shared job), what it
shows of it (``fanout status``) or masks in what it says (its secrets), as ``fanout
plugins`` lists them."""


def implemented_hooks(sink_class: type[Sink], *, conditions: bool = False) -> list[str]:
    """The :data:`OPTIONAL_HOOKS` ``sink_class`` implements (overrides, itself or through a
    base such as the partitioned-sink kit), in that order, with ``read_only_check`` first
    when it sets it: what a user reads to judge what a reset or a replay does with it.

    :param conditions: name a hook that answers only under some options with them, as
        :attr:`Sink.hook_conditions` says: ``"harmless_rewrite (mode=upsert, ...)"``.
    """
    found = ["read_only_check"] if sink_class.read_only_check else []
    found += [h for h in OPTIONAL_HOOKS if getattr(sink_class, h) is not getattr(Sink, h)]
    if not conditions:
        return found
    when = sink_class.hook_conditions
    return [f"{h} ({when[h]})" if h in when else h for h in found]


def declares_guarantees(sink_class: type[Sink]) -> bool:
    """Whether ``sink_class``, or a base of it other than :class:`Sink`, sets
    :attr:`Sink.guarantees` to at least one. One that does not (or sets ``()``) is
    ``("at_least_once",)``: fanout cannot know that its write is idempotent, and says so
    with :func:`undeclared_guarantees_hint`."""
    declared = any("guarantees" in vars(c) for c in sink_class.__mro__ if c is not Sink)
    return declared and bool(sink_class.guarantees)


def declared_guarantees(sink_class: type[Sink]) -> tuple[Guarantee, ...]:
    """The guarantees ``sink_class`` can give, the default's first: its
    :attr:`Sink.guarantees`, or ``("at_least_once",)`` when it sets ``()``, as when it
    leaves them out (every reader of a type's guarantees asks here, the class is left as
    its author wrote it)."""
    return tuple(sink_class.guarantees) or ("at_least_once",)


def declaring_class(sink: Sink) -> type[Sink]:
    """The class whose :attr:`Sink.guarantees` speak for ``sink``: its own, or, for a
    wrapper that hands its calls to another sink and names it as ``wrapped_sink``
    (:class:`fanout.testing.FlakySink`), the wrapped sink's (a wrapper declares every
    guarantee, its ``guarantee`` being the wrapped one's, and so hid the start warning's
    hint for a wrapped type that declares none)."""
    seen: set[int] = set()
    while isinstance(getattr(sink, "wrapped_sink", None), Sink) and id(sink) not in seen:
        seen.add(id(sink))
        sink = sink.wrapped_sink  # type: ignore[attr-defined]
    return type(sink)


def at_least_once_risk(sink: Sink) -> str | None:
    """What an at-least-once sink risks, and, for a type declaring no guarantees, what to
    do (:func:`undeclared_guarantees_hint`): the warning ``fanout run`` logs at start and
    ``fanout validate`` prints as a ``WARN`` line, alike. ``None`` for any other sink."""
    if sink.guarantee != "at_least_once":
        return None
    declaring = declaring_class(sink)  # a FlakySink's: the wrapped type's
    hint = "" if declares_guarantees(declaring) else f"; {undeclared_guarantees_hint(declaring)}"
    return (
        f"sink {sink.name!r} is at-least-once: if the driver dies between its write and its "
        f"ledger mark, the replay can write duplicates{hint}"
    )


def undeclared_guarantees_hint(sink_class: type[Sink]) -> str:
    """What to do about a sink type that declares no :attr:`Sink.guarantees`, for the
    warning an at-least-once sink gets at start."""
    return (
        f"its type {sink_class.__name__} declares no guarantees, so fanout cannot know its "
        "write() is idempotent: once write() leaves the same state when a batch is written "
        "again (it skips a batch its records hold, by holds_batch and batch.idempotency_key, "
        'or writes idempotently), declare guarantees = ("idempotent",) (or '
        '("transactional",)) on the class; fanout.testing\'s conformance kit checks it '
        "(README, 'Writing a sink plugin')"
    )


FENCE_LEFT = (
    "If that new epoch's start was refused, or killed before the ledger recorded it, and "
    "this checkpoint must complete the batch, its fence was not lifted (a refused start "
    "lifts it when it can, a killed one cannot; to go on with the new epoch instead, "
    "start its new checkpoint again as that start was made, `fanout run` with "
    '--new-epoch or on_checkpoint_reset="new_epoch": it fences again and starts it): '
)
"""A fencing sink's refusal of the replaced epoch's write, before :func:`lift_by_hand`:
when the fence is left (a start refused, or killed between its fences and its start row)
and the ways on, said alike by every sink that fences."""


def lift_by_hand(pipeline: str, epoch: int | str, then: str) -> str:
    """How an operator lifts a sink's fence closing the epoch before ``epoch`` (a start
    that was refused, or a refusal naming it) when fanout could not: ``fanout ledger
    lift-fence`` (:mod:`fanout.app.lift_fence`), or, for a sink built in code, its own
    :meth:`Sink.lift_epoch_fence` from Python; then ``then``. Said alike by the core and
    every sink that fences."""
    return (
        f"lift it with `fanout ledger lift-fence --config PIPELINE.toml --epoch {epoch}` "
        "(PIPELINE.toml: the pipeline's file; every sink of it that fences, or --sink NAME "
        "for one), or, for a sink built in code, from Python, with the sink opened "
        f"(sink.open(fanout.SinkContext(pipeline))), by sink.lift_epoch_fence({pipeline}, "
        f"{epoch}); then {then}"
    )


def renamed_sink_advice(
    target: str,
    sink: str,
    other: str,
    batch: int,
    remove: str | None = None,
    *,
    harm: str | None = None,
) -> str:
    """The ways on from a refused sink renamed mid-batch (:class:`fanout.RenamedSinkError`),
    said alike by the core's start check and every sink's own: sink ``sink`` has no record of
    batch ``batch`` and ``target`` (its description) holds it under the name ``other``, a
    sink the pipeline no longer configures. Rename the sink back, or rename it once the batch
    is marked; and, only when given, ``remove`` (how to take the batch out of the target,
    e.g. a Delta restore; ``None`` where that is no way out, a Kafka topic). ``harm``: what
    writing would do, when not "put the batch's rows in ``target`` twice"."""
    ways = [
        f"rename the sink back to {other!r} and restart: the replay skips what {target} "
        "holds of the batch and the pipeline completes it",
        f"rename it once batch {batch} is marked (the new name then starts after it)",
    ]
    if remove is not None:
        ways.append(f"{remove} and restart")
    return (
        f"If {sink!r} is {other!r} renamed (or {other!r} was removed) after it committed batch "
        f"{batch} and before its ledger mark, writing would "
        + (harm or f"put the batch's rows in {target} twice")
        + ", so nothing was written. Either "
        + "; or ".join(ways)
    )
