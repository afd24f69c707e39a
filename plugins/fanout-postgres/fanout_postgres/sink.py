"""The PostgreSQL sink: upsert (idempotent) or append (exactly-once by progress marks).

Design decisions:

- Written from the executors, one transaction per Spark partition. Rows are hash-partitioned
  by the keys (append without keys: by the whole row) into a fixed number of partitions, so
  a key lives in one partition: no lock fights, no deadlocks, a deterministic winner, and
  per-partition progress marks that mean the same rows on replay.
- The sink object is configuration only (it is pickled to the executors); connections are
  opened inside each partition task, and on the driver only for the duration of a check.
- A partition failing never takes the others down with it: each reports an outcome, and the
  driver raises one error naming the sink, the batch, the column and the value. Errors
  that are worth retrying (lost connection, serialization failure, deadlock) are raised as
  :class:`fanout.TransientSinkError`; a row's own fault never is.
- The batch schema is checked against the table before any row is written: at ``open()``
  when option ``batch_schema`` is given, else on the driver when a batch of a new schema
  arrives; :meth:`PostgresSink.check_schema` runs the same checks for ``fanout validate``
  without writing anything (a table ``create_table`` would make is not created).

:class:`PostgresSink` holds the hooks of the sink contract and the state between them; the
long checks they make live beside it, each given what it reads: :mod:`.open_checks`
(``open()``'s settings, search path, create and migration checks), :mod:`.catalog` (the
table's columns and rules, for the write plan; the plan itself: :mod:`.plan`; which plan a
batch is written by, cached per schema and checked at each batch: :mod:`.write_plans`),
:mod:`.replay_refusals` (what a replay or a first batch must not write),
:mod:`.holds` (``holds_batch``, ``target_replaced``) and :mod:`.fence` (the epoch fence).
The partitions' own writes are :mod:`.task` and :mod:`.transaction`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from fanout.contract.batch import Batch, pipeline_scope
from fanout.contract.dead_letters import DeadLetterTarget, ReplacesLetters
from fanout.contract.partitions import BatchPartitioning, StableColumns
from fanout.contract.sink import Guarantee, PartlyHeld, SinkContext
from fanout.deadletters.moved import (
    earlier_of,
    replace_held,
    replace_letters,
    unchecked,
    write_letters,
)
from fanout.errors import (
    ConfigurationError,
    SchemaMismatchError,
    SinkError,
    SinkUnreachableError,
    SinkWriteError,
    TransientSinkError,
)
from fanout.observe.secrets import redact
from fanout.partitioned.membership import CommittedPartition, PartitionPlan, quoted
from fanout.partitioned.outcome import PartitionOutcome
from fanout.partitioned.replay_route import check_routes, route_mark
from fanout.partitioned.sink import PartitionedSink, PartitionInput
from fanout_postgres import url as pgurl
from fanout_postgres.catalog import rules_problem
from fanout_postgres.connections import CLIENT_ENCODING
from fanout_postgres.deadletter import (
    PostgresDeadLetters,
    as_letter,
    drop_stale,
    ensure_table,
)
from fanout_postgres.declaration import OPTIONS
from fanout_postgres.direct import HELD, DirectCopyPolicy
from fanout_postgres.failures import batch_error
from fanout_postgres.fence import fence
from fanout_postgres.gone import records_gone
from fanout_postgres.holds import (
    AllCommitted,
    BatchLetters,
    letters_held,
    read_held,
    replaced,
    target_gone,
)
from fanout_postgres.identifiers import TableName
from fanout_postgres.keyhash import hashed
from fanout_postgres.membership import (
    REWRITES,
    VOLATILE_KEYS,
    SinkRecords,
    batch_names,
    batch_scope,
    committed_marks,
    partition_columns,
    upsert_routes,
)
from fanout_postgres.migrate import migration_problem, state_schema_problem
from fanout_postgres.open_checks import (
    REFUSED_HINT,
    UNREACHABLE_HINT,
    may_create_problem,
    refused_login,
    settings_problem,
    would_migrate,
)
from fanout_postgres.options import as_list, check_options, schema_of
from fanout_postgres.plan import (
    PlanError,
    PlanOptions,
    TargetInfo,
    check_target,
    reflect,
)
from fanout_postgres.replay_refusals import (
    refuse_later_batch,
    refuse_moved,
    refuse_other_query,
    refuse_switched_mode,
    refuse_vanished_sink,
    refuse_waiting_letters,
)
from fanout_postgres.statements import lift_epoch_fence
from fanout_postgres.task import PostgresPartitionWriter
from fanout_postgres.transaction import BatchMeta
from fanout_postgres.write_plans import Planning, WritePlans

if TYPE_CHECKING:
    import pyarrow as pa
    from sqlalchemy.engine import URL

logger = logging.getLogger(__name__)

Mode = Literal["upsert", "append"]
DEFAULT_SETTINGS: dict[str, str] = {"temp_buffers": "128MB", "work_mem": "64MB"}
"""Session settings of each write connection: the staging table stays in memory
(``temp_buffers``) and the ``DISTINCT ON`` sort does not spill (``work_mem``)."""


class PostgresSink(PartitionedSink):
    """Upserts (or appends) every micro-batch into a PostgreSQL table.

    :param name: the sink name.
    :param url: SQLAlchemy URL (``postgresql+psycopg2://user:${PG_PASSWORD}@host/db``), as
        text or a ``sqlalchemy.engine.URL``; any part may reference environment variables,
        expanded on the driver. (The option type check does not check it: ``URL`` is
        imported for type checkers only; :meth:`open` refuses a value of another type.)
    :param table: ``"name"``, ``"schema.name"`` or ``[schema, name]``, taken literally.
    :param keys: upsert keys (default: the table's primary key); must be exactly the
        columns of a primary key or unique constraint. In append mode they only choose the
        hash partitioning (default: the whole row).
    :param mode: ``"upsert"`` (default, idempotent) or ``"append"`` (transactional).
    :param order_by: upsert: the column(s) deciding which row of a key wins when one batch
        holds the key more than once (greatest wins, NULLs last; ties go to the greatest
        values of the other columns in table order, never to arrival order). Required when
        a batch can hold duplicates; without it such a batch fails with the duplicated key
        named.
    :param columns: which batch columns to write: a list (same names) or ``{batch: target}``.
    :param create_table: create a missing table from the batch schema, keys as primary key.
    :param partitions: the fixed number of write partitions (transactions) per batch.
    :param dead_letter: where refused rows go instead of failing the batch: a PostgreSQL
        table name or a Delta path (see :mod:`fanout_postgres.deadletter`).
    :param migrate: apply fanout's migrations at ``open()`` (else they must be at head when
        the mode needs them; run ``fanout migrate --url URL``).
    :param state_schema: the schema of the tables fanout owns (default ``fanout``).
    :param batch_schema: the batches' Spark schema (``StructType`` or DDL string), to check
        the table at ``open()`` rather than at the first batch (a missing one is checked as
        ``create_table`` will create it at the first write).
    :param settings: PostgreSQL session settings of the write connections (a number or
        a boolean is given to the server as text, as in ``postgresql.conf``), over
        :data:`DEFAULT_SETTINGS` (memory for the staging table and the dedupe sort: a
        setting of the same name replaces its default, the others stay); each is
        tried at :meth:`open`, and `synchronous_commit` off is refused (not durable), in
        this option or as the connections' effective value (set for the server, database
        or role).
    :param connection_idle_s: how long a Spark Python worker keeps a write connection at
        rest for its next partition of this sink (:mod:`fanout_postgres.connections`);
        ``0``: one connection per partition, closed at its end.
    """

    guarantees: ClassVar[tuple[Guarantee, ...]] = ("idempotent", "transactional")
    hook_conditions: ClassVar[Mapping[str, str]] = {
        "partitioned_by": "mode=append",
        "harmless_rewrite": "mode=upsert, no dead_letter",
    }
    read_only_check: ClassVar[bool] = True  # open(checking): no migration, no table made
    # deleting a batch's rows leaves the old name's progress marks / upsert_routes of it,
    # which the renamed-sink check reads: no way on (renamed_sink_advice offers none)
    batch_removable: ClassVar[bool] = False
    options = OPTIONS

    def __init__(
        self,
        name: str,
        *,
        url: str | URL | None = None,
        table: str | Sequence[str] | None = None,
        keys: str | Sequence[str] | None = None,
        mode: Mode = "upsert",
        order_by: str | Sequence[str] | None = None,
        columns: Sequence[str] | Mapping[str, str] | None = None,
        create_table: bool = False,
        partitions: int = 4,
        dead_letter: str | Mapping[str, str] | None = None,
        migrate: bool = True,
        state_schema: str = "fanout",
        batch_schema: Any = None,
        settings: Mapping[str, str | int | float | bool] | None = None,
        connection_idle_s: float = 60.0,
    ) -> None:
        super().__init__(name)
        self.url = url
        self.table = table
        self.keys = as_list(keys)
        self.mode = mode
        self.order_by = as_list(order_by) or []
        self.columns = dict(columns) if isinstance(columns, Mapping) else as_list(columns)
        self.create_table = create_table
        self.partitions = partitions
        self.dead_letter = dead_letter
        self.migrate = migrate
        self.state_schema = state_schema
        self.batch_schema = batch_schema
        if settings is not None and not isinstance(settings, Mapping):
            raise ConfigurationError(
                f"postgres sink {name!r}: option 'settings' must be a mapping of PostgreSQL "
                f"settings ({{'statement_timeout': '5min'}}), got {type(settings).__name__}"
            )
        self.settings = {**DEFAULT_SETTINGS, **(settings or {})}
        self.connection_idle_s = connection_idle_s
        self._url: Any = None
        self._table: TableName | None = None
        # the pipeline's sinks (open()), until the first batch without records of its own
        # passed the question whether a sink no longer configured committed it to the table
        # (append; an upsert with a dead-letter target), or this sink in the other mode
        # (append); a batch refused keeps it, so the same batch given again is asked again
        self._vanished_unasked: tuple[str, ...] = ()
        # this run accepts the loss of the table (accept_lost_targets): a replay whose marks
        # name a table replaced under the sink's table name writes the batch whole
        self._accept_lost = False
        self._dead: DeadLetterTarget | None = None  # resolved by fanout, given at open()
        # the write plans per batch schema, and whether the first write creates the table
        self._write_plans = WritePlans()
        self._keys: list[str] | None = None  # resolved at open() (append: the hash keys)
        self._direct = DirectCopyPolicy()
        # upsert: (scope, batch) whose preflight found partitions an earlier attempt committed
        self._rewrites: set[tuple[str, int]] = set()
        # the epoch whose earlier epochs' scopes this process closed (0: none has any)
        self._fenced = 0

    @property
    def guarantee(self) -> Guarantee:
        """``idempotent`` in upsert mode; ``transactional`` in append mode, where each
        partition commits with its progress mark, so a batch lands once and we can tell."""
        return "transactional" if self.mode == "append" else "idempotent"

    # -- lifecycle -------------------------------------------------------------------------

    def open(self, context: SinkContext) -> None:
        """Check options, connect, migrate, and check the table, keys and dead letters.
        With ``context.checking`` (``fanout validate``) nothing is migrated or created:
        what would be is told to ``context.would``."""
        super().open(context)
        self._check_options()
        # the target itself: its kind decides where letters go (every write of them is
        # through write_letters / replace_letters, which filter as fanout's wrapper does)
        self._dead = unchecked(context.dead_letters)
        checking = context.checking
        # an upsert without a dead-letter target rewrites a batch harmlessly (its letters
        # would be written twice: §8.2, "A sink renamed mid-batch")
        asks = self.mode == "append" or self._dead is not None
        self._vanished_unasked = tuple(context.sinks) if asks else ()
        self._accept_lost = context.accept_lost
        engine = self._engine()
        try:
            with engine.connect() as conn:
                conn.execute(_sa().text("SELECT 1"))
                self._check_settings(conn)
                # upgrade() runs the same check first, in the transaction it migrates in
                problem = None
                if checking or not self.migrate:
                    problem = state_schema_problem(conn, self.state_schema, creates=self.migrate)
                if problem is not None:
                    raise self._error(problem)
            if self.migrate and checking:
                would = would_migrate(engine, self.state_schema)
                if would is not None:
                    context.would(would)
            elif self.migrate:
                from fanout_postgres.migrate import upgrade

                try:
                    upgrade(engine, schema=self.state_schema)
                except ConfigurationError as exc:  # named for this sink, as the rest
                    raise self._error(str(exc)) from None
            else:  # append's progress marks, upsert's routes (fanout_postgres.membership)
                self._refuse(migration_problem(engine, self.state_schema,
                                               pgurl.display(self._url)))  # fmt: skip
            with engine.connect() if checking else engine.begin() as conn:
                info = reflect(conn, self._table)  # type: ignore[arg-type]
                self._write_plans.unmade = info is None and not checking
                self._check_target(info)
                if info is None and self.create_table:
                    self._refuse(may_create_problem(conn, self._table))  # type: ignore[arg-type]
                self._refuse(rules_problem(conn, self._table))  # type: ignore[arg-type]
                if isinstance(self._dead, PostgresDeadLetters):
                    missing = ensure_table(conn, self._dead.table, create=not checking)
                    if missing and checking:
                        context.would(f"create the dead-letter table {self._dead.table}")
            if checking and info is None:  # _check_target refused it unless create_table
                context.would(
                    f"create table {self._table} ("
                    + ("from option batch_schema" if self.batch_schema is not None
                       else "at the first batch, from its columns") + ")"
                )  # fmt: skip
            if self.batch_schema is not None:
                batch_schema = schema_of(self.batch_schema, context.spark)
                if checking or info is None:
                    # a missing table is created at the first write, not here: see
                    # WritePlans.plan
                    self._write_plans.check(self._planning(), batch_schema, at_open=True)
                else:
                    self._write_plans.plan(self._planning(), batch_schema, None)
        except (ConfigurationError, SchemaMismatchError):
            raise
        except Exception as exc:
            if self.is_transient(exc):  # unreachable, not misconfigured
                raise SinkUnreachableError(
                    f"cannot open: {self._clean(exc, one_line=True)}; {UNREACHABLE_HINT}",
                    sink=self.name,
                ) from None
            said = self._clean(exc, one_line=True)
            if refused_login(exc):
                said = f"{said}; {REFUSED_HINT}"
            raise self._error(f"cannot open: {said}") from None
        logger.info(
            "sink %r: PostgreSQL %s into %s at %s (%d partitions%s)",
            self.name,
            self.mode,
            self._table,
            pgurl.display(self._url),
            self.partitions,
            f", dead letters to {self._dead.describe()}" if self._dead else "",
        )

    def close(self) -> None:
        """Dispose of the driver's engine (it holds no connection between uses)."""
        _, engine = self.__dict__.pop("_driver_engine", (None, None))
        if engine is not None:
            engine.dispose()

    def __getstate__(self) -> dict[str, Any]:
        """Pickles without the driver's engine (made again where it is used)."""
        return {k: v for k, v in self.__dict__.items() if k != "_driver_engine"}

    def check_schema(self, schema: pa.Schema) -> None:
        """Batches of the Arrow ``schema`` must fit the table: the checks of a batch's
        first arrival (:meth:`~fanout_postgres.write_plans.WritePlans.plan`: every column in
        the table, of a type it takes without PostgreSQL rounding it, the NOT NULL columns
        and the keys written), raising the same :class:`SchemaMismatchError` without a
        batch id. Nothing is written: a missing table that ``create_table`` would create is
        checked as it would be created, and stays missing. Called by ``fanout validate``
        after :meth:`open`."""
        from pyspark.sql.pandas.types import from_arrow_schema

        spark_schema = from_arrow_schema(schema)
        if self._write_plans.planned(spark_schema) is not None:
            return  # planned already, against the table as it is
        if self._url is None or self._table is None:  # open() failed, or was not called
            self._check_options()
        self._write_plans.check(self._planning(), spark_schema, at_open=False)  # not kept

    # -- the partitioned-sink kit: one batch, on the driver --------------------------------

    def preflight(self, batch: Batch) -> None:
        """One connection on the driver and one query: a server that is down or
        unreachable fails the batch here (transient, so retried), not in every task. In
        upsert mode the query reads the routes the batch's committed partitions recorded,
        and a replay under another route is refused (:meth:`check_replay`); else it is
        ``SELECT 1``."""
        engine = self._engine()
        try:
            with engine.connect() as conn:
                if self.mode == "upsert":
                    self._refuse_other_route(conn, batch)
                else:
                    conn.execute(_sa().text("SELECT 1"))
                if batch.info.epoch > self._fenced:
                    self._fence(conn, batch.pipeline, batch.info.epoch)
                self._write_plans.recheck(self._planning(), conn, batch.df.schema.json(),
                                          batch.batch_id)  # fmt: skip
        except Exception as exc:
            if not self.is_transient(exc):
                raise
            raise TransientSinkError(
                f"cannot reach the server: {self._clean(exc)}", sink=self.name,
                batch_id=batch.batch_id,
            ) from None  # fmt: skip

    def check_replay(self, batch: Batch) -> None:
        """Before fanout writes the batch's route letters: refuse a replay whose committed
        partitions recorded another route. Append: the kit's (their progress marks, which
        the write of the same attempt then takes instead of reading again). Upsert, whose
        input keeps no membership, so the kit checks nothing: ``upsert_routes``, checked
        again by :meth:`preflight`. One query."""
        if self.mode == "append":
            super().check_replay(batch)
            return
        with self._engine().connect() as conn:
            self._refuse_other_route(conn, batch)

    def committed_partitions(
        self, batch: Batch, plan: PartitionPlan
    ) -> Sequence[CommittedPartition]:
        """The batch's progress marks (append mode), each with the route it recorded, read
        in one query, and the replay refusals (:mod:`fanout_postgres.replay_refusals`)
        before the kit's; the kit refuses a replay under another route
        (:func:`fanout.partitioned.replay_route.check_routes`) before any partition
        writes."""
        records = self._own_records()
        with self._engine().connect() as conn:
            found = committed_marks(
                conn, self.state_schema, batch_scope(batch), self.name, batch.batch_id
            )
            refuse_other_query(records, batch, found)
            if found:  # a replay: were they committed to the table the sink names now?
                found = refuse_moved(conn, self._engine(), records, batch, found,
                                     accept_lost=self._accept_lost)  # fmt: skip
            elif self._vanished_unasked:  # spent once passed: a refused batch is asked again
                refuse_vanished_sink(conn, records, batch, self._vanished_unasked, self._dead)
                refuse_switched_mode(conn, records, batch)
                self._vanished_unasked = ()
            marks = [mark for mark, _ in found]
            if marks and self._dead is None:
                refuse_waiting_letters(conn, records, batch)
            return marks

    def partition_input(self, batch: Batch) -> PartitionInput:
        """The batch under the table's column names, hashed by the plan's columns; append
        mode keeps partition membership (its progress marks are per partition)."""
        df = batch.df
        if not hasattr(df, "mapInArrow"):
            raise SinkWriteError(
                "the postgres sink needs a Spark DataFrame", sink=self.name, batch_id=batch.batch_id
            )
        plan = self._write_plans.plan(self._planning(), df.schema, batch.batch_id)
        projected = df
        by = list(plan.hash_columns)
        # keys PostgreSQL calls equal must share a partition (fanout_postgres.keyhash):
        # those are hashed on extra columns, which the tasks drop; not the batch's own
        # columns, so the sink writes alone rather than in tasks shared with other sinks
        sources = plan.sources
        folds = [
            f"{h.over(quoted(sources[h.column]))} AS {quoted(hashed(h.column))}"
            for h in plan.key_hashes
        ]
        if [(s, s) for s in df.columns] != list(plan.columns) or folds:
            # SQL text: one py4j call, ~3 ms instead of ~8 for two per column (and none for
            # the table's own columns in the batch's order: a step less before the job)
            renames = [f"{quoted(s)} AS {quoted(t)}" for s, t in plan.columns]
            projected = df.selectExpr(*renames, *folds)
        if folds:
            folded = {h.column for h in plan.key_hashes}
            by = [hashed(c) if c in folded else c for c in by]
        keyed = bool(plan.keys) and plan.hash_columns == plan.keys
        append = plan.mode == "append"
        return PartitionInput(
            projected, by, membership=append, keyed=keyed,
            renamed=None if folds else list(plan.columns),
        )  # fmt: skip

    def shares_tasks(self) -> bool:
        """Yes: :meth:`partition_input` is the batch's own columns (it says ``renamed``)."""
        return True

    def batch_partitioning(self, schema: Any) -> BatchPartitioning | None:
        """The plan's hash columns under their batch names, once a batch of ``schema`` was
        planned (planning reads the table: it happens in the sink's own write, not here)."""
        plan = self._write_plans.planned(schema)
        if plan is None or plan.key_hashes:  # folded keys are hashed on no batch column
            return None
        sources = plan.sources
        return BatchPartitioning(self.partitions, tuple(sources[c] for c in plan.hash_columns))

    def partition_writer(self, batch: Batch, plan: PartitionPlan | None) -> PostgresPartitionWriter:
        """The batch's partition writer: the resolved URL, the write plan, and the batch
        (progress marks are keyed by the epoch's scope, like every idempotency record)."""
        fingerprint = None if plan is None else plan.fingerprint
        meta = BatchMeta(
            batch_scope(batch), batch.batch_id, batch.query_id, fingerprint, route_mark(batch),
            _kept_elsewhere(batch),
        )  # fmt: skip
        write_plan = self._write_plans.plan(self._planning(), batch.df.schema, batch.batch_id)
        direct = write_plan.mode == "upsert" and self._direct.wanted()
        return PostgresPartitionWriter(
            self.connection_url(),
            write_plan,
            meta,
            direct,
            float(self.connection_idle_s),
            self.letter_secrets(),
        )

    def after_partitions(self, batch: Batch, outcomes: Sequence[PartitionOutcome]) -> None:
        """Refused rows bound for a target other than a PostgreSQL table (written in the
        partitions' own transactions) go there now, once per batch. With a PostgreSQL
        table in upsert mode, the batch's records of an earlier attempt's partitions that
        did not commit now (empty now, or beyond a lowered partition count) are deleted,
        and the refused rows of the partitions an earlier target holds (its
        ``dead_letter`` moved since an attempt) replace its own there when it can take
        them back (:func:`fanout.deadletters.moved.replace_held`)."""
        self._direct.record(outcomes)
        dead = self._dead
        letters = [letter for o in outcomes for letter in o.letters]
        if isinstance(dead, PostgresDeadLetters) and self.mode == "upsert":
            kept = [o.partition for o in outcomes if o.status in ("committed", "skipped")]
            with self._engine().begin() as conn:
                drop_stale(conn, dead.table, batch_scope(batch), self.name, batch.batch_id, kept)
            # the letters of the partitions an earlier target holds (the partitions skipped
            # them; none on the common path) replace its own there when it can take them
            # back (a Delta table): fanout.deadletters.moved
            refused = [as_letter(r, str(self._table)) for r in letters]
            replace_held(dead, batch, refused, source="refused")
        rewrite = (batch_scope(batch), batch.batch_id) in self._rewrites
        self._rewrites.discard((batch_scope(batch), batch.batch_id))
        if dead is not None and not isinstance(dead, PostgresDeadLetters):
            refused = [as_letter(r, str(self._table)) for r in letters]
            if rewrite and self.mode == "upsert" and isinstance(dead, ReplacesLetters):
                # an upsert replay rewrites every partition, and may take a row an earlier
                # attempt refused (its foreign key's row added since): its letters, none
                # included, replace those the earlier attempt wrote here (but for those an
                # earlier target holds: fanout.deadletters.moved)
                replace_letters(dead, batch, refused, source="refused")
            elif refused:
                # none an earlier target holds (the sink's dead_letter moved since an
                # attempt of the batch: fanout.deadletters.moved)
                write_letters(dead, batch, refused, source="refused")
        rejected = sum(o.dead_lettered for o in outcomes)
        if rejected and dead is not None:
            logger.warning(
                "sink %r, batch %d: %d row(s) refused by %s went to %s",
                self.name, batch.batch_id, rejected, self._table, dead.describe(),
            )  # fmt: skip

    def partition_failure(
        self, batch: Batch, failed: Sequence[PartitionOutcome], outcomes: Sequence[PartitionOutcome]
    ) -> SinkError:
        """A refused row names table, column, value and row; any other failure its
        partition and the server's message. Transient when every failure is."""
        self._direct.record(outcomes)
        return batch_error(self._table, failed, self.secret_values(), self.name, batch.batch_id)

    def result_details(self, outcomes: Sequence[PartitionOutcome]) -> Mapping[str, Any]:
        """The table, the partitions, the rows changed and refused, and the partitions
        copied straight into the table (:mod:`fanout_postgres.direct`)."""
        return {
            "table": str(self._table),
            "partitions": len(outcomes),
            "changed": sum(o.counters.get("changed", 0) for o in outcomes),
            "rejected": sum(o.dead_lettered for o in outcomes),
            "direct_copies": sum(o.counters.get(HELD, 0) for o in outcomes),
        }

    # -- the epoch fence -------------------------------------------------------------------

    def fence_earlier_epochs(self, pipeline: str, epoch: int) -> None:
        """Close the scopes of epochs ``0 .. epoch-1`` to this sink's partitions still in
        flight (:meth:`fanout.Sink.fence_earlier_epochs`): one
        :data:`~fanout_postgres.statements.EPOCH_FENCE` record of the sink in each, unless
        there is one (:meth:`_fence`). One transaction; append waits there for the
        partitions of those scopes still writing."""
        if epoch <= 0:
            return
        with self._engine().connect() as conn:
            self._fence(conn, pipeline, epoch)

    def lift_epoch_fence(self, pipeline: str, epoch: int) -> bool | None:
        """The start of ``epoch`` was refused after :meth:`fence_earlier_epochs`: delete the
        sink's :data:`~fanout_postgres.statements.EPOCH_FENCE` record in epoch ``epoch - 1``'s
        scope (the earlier epochs' stay closed), so that epoch's checkpoint may be started
        again to complete a batch (:meth:`fanout.Sink.lift_epoch_fence`). Whether there was one (the
        ``DELETE`` removed a row)."""
        if epoch <= 0:
            return False
        scope = pipeline_scope(pipeline, epoch - 1)
        with self._engine().begin() as conn:
            deleted = conn.execute(lift_epoch_fence(self.state_schema, self.mode),
                                   {"scope": scope, "sink": self.name})  # fmt: skip
        self._fenced = min(self._fenced, epoch - 1)
        return bool(deleted.rowcount)

    # -- what the table holds: a run's start and a new epoch's -----------------------------

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool | PartlyHeld | None:
        """Whether the batch's partitions committed, each writing its progress mark
        (append) or its ``upsert_routes`` row (upsert) in its own transaction: all of them
        (``True``), some (:class:`fanout.PartlyHeld`), none, against the partition count
        the batch was written in, as its marks or rows recorded it (never the ``partitions``
        option now: lowered since the write, part of a batch read as the whole). Rows of an
        older fanout record no count: never the whole. One query. (Whether an upsert's rows
        written again change nothing: :meth:`harmless_rewrite`.)

        A read that fails on fanout's tables behind the migrations it reads (a read-only
        ``fanout recover`` opened the sink without migrating, e.g. upsert's
        ``upsert_routes.partitions`` of ``0005``) raises a :class:`ConfigurationError`
        naming the ``fanout migrate`` command instead.

        The progress marks and routes live in ``state_schema`` and outlive the table: a
        table missing now holds nothing, whatever they say (``False``). ``create_table``
        creates it at the first write, after this check
        (:meth:`~fanout_postgres.write_plans.WritePlans.plan`), so a run refused
        for it leaves it missing and its retry is refused again. Whether the table there is
        the one they were written to: :meth:`target_replaced`.

        A batch whose every partition committed is held whole only once the rows they
        refused are in the dead-letter target too (the driver writes them there after the
        partitions; a ``postgres:`` table in their own transactions): when their marks
        (append: a second query) or rows (upsert: ``refused``, ``kept_in``, migration
        ``0007``, read in the same query) keep or count refused rows no PostgreSQL table
        holds, a target that can tell (``read_rows``: a Delta table) is asked how many it
        holds of the batch, and fewer, or a target that cannot tell or none, is a
        :class:`fanout.PartlyHeld` naming them. A lost mark recorded there would make the
        replay skip the sink, and them with it. An upsert's rows of an older fanout count
        none: :func:`fanout_postgres.holds.letters_held`."""
        return self._holds(self.name, pipeline, epoch, batch_id)

    def holds_batch_of(
        self, sink_name: str, pipeline: str, epoch: int, batch_id: int
    ) -> bool | PartlyHeld | None:
        """:meth:`holds_batch` by the progress marks (append) or ``upsert_routes`` rows
        (upsert) of sink ``sink_name`` (:meth:`fanout.Sink.holds_batch_of`: a sink renamed
        between a crash and its replay), counted only when they recorded this table's OID
        as it is now (migration ``0006_target_oid``): those of another table, or none,
        ``False`` (the sink wrote elsewhere, or is of another type); only records of an
        older fanout (no OID): ``None``, cannot tell which table they are of."""
        return self._holds(sink_name, pipeline, epoch, batch_id)

    def records_gone(self, pipeline: str, epoch: int, batch_id: int) -> str | None:
        """Why the sink's progress marks and ``upsert_routes`` rows of batch ``batch_id``
        of ``epoch`` are gone while its table is not empty
        (:func:`fanout_postgres.gone.records_gone`): deleted from ``state_schema``, or
        ``state_schema`` changed since. ``None``: a record of the batch or of a later one
        is there (pruned, not deleted), the table is missing or holds no row (a lost
        target). Asked only after :meth:`holds_batch`
        said ``False`` about a batch the ledger marks written there with rows."""
        engine = self._engine()
        with engine.connect() as conn:
            if self._table is None or target_gone(conn, self._table):
                return None
            return records_gone(conn, self.state_schema, pipeline_scope(pipeline, epoch),
                                self.name, batch_id, self._table.quoted(),
                                str(self._table))  # fmt: skip

    def target_replaced(self, pipeline: str, epoch: int, batch_id: int) -> str | None:
        """Why the table is not the one batch ``batch_id`` of ``epoch`` was written to: a
        partition's progress mark (append) or ``upsert_routes`` row (upsert) recorded
        another OID than the table's now (migration ``0006_target_oid``), and the table
        holds nothing (``pg_relation_size`` over it and its partitions): dropped and created
        again since, whatever the records say. One connection: whether the table exists,
        the recorded OIDs, the current one, its size when an OID differs. ``None``: the
        same OID; another on a table holding rows (restored from a dump, the refusal's own
        way on, or a database moved by ``pg_dump``: its records answer); records of an
        older fanout (no OID) or none of the batch; a missing table (:meth:`holds_batch`'s
        ``False``). The reason: :func:`fanout_postgres.holds.replaced`."""
        table = self._table
        if table is None:
            return None
        engine = self._engine()
        oids = f"the table OIDs its records of batch {batch_id} of epoch {epoch} name"
        with self._said_behind_migrations(engine, oids), engine.connect() as conn:
            if reflect(conn, table) is None:
                return None
            scope = pipeline_scope(pipeline, epoch)
            return replaced(conn, self._own_records(), table, scope, batch_id)

    def harmless_rewrite(self) -> str | None:
        """Upsert without a dead-letter target: an ``INSERT ... ON CONFLICT DO UPDATE``
        that updates unconditionally, so a key holds the row written last, whatever
        offsets the new epoch's batch covers. Append, or any dead-letter target (its
        letters would be kept twice): ``None``."""
        if self.mode != "upsert" or self.dead_letter is not None:
            return None
        return "it upserts by key, without a dead-letter target: each key keeps its last row"

    # -- what the sink declares ------------------------------------------------------------

    def partitioned_by(self) -> Sequence[str] | Literal["*"] | None:
        """Append mode: the keys (batch names), or the whole row; upsert: ``None`` (a key
        written twice is idempotent, whichever partition writes it)."""
        keys = self._keys if self._keys is not None else (self.keys or [])
        return partition_columns(self.mode, keys, self.columns)

    def deterministic_columns(self) -> StableColumns | None:
        """Append: :meth:`partitioned_by`'s columns; upsert: the keys (batch names), since a
        replay computing other keys would insert every row again."""
        if self.mode != "upsert":
            return super().deterministic_columns()
        keys = self._keys if self._keys is not None else (self.keys or [])
        if not keys:
            return None
        return StableColumns(batch_names(keys, self.columns), "upserts by", VOLATILE_KEYS)

    def secret_values(self) -> Sequence[str]:
        """The password of the URL (as given and URL-encoded)."""
        url = self._url
        if url is None and self.url:
            try:
                url = pgurl.resolve_url(self.url, sink=self.name)
            except Exception:
                return ()
        return pgurl.secrets_of(url)

    def is_transient(self, error: BaseException) -> bool:
        """Retry lost connections, serialization failures, deadlocks, lock and statement
        timeouts (SQLSTATEs in :data:`fanout_postgres.sqlstate.TRANSIENT_STATES`)."""
        if super().is_transient(error):
            return True
        from fanout_postgres.sqlstate import classify

        cause = getattr(error, "orig", None) or error
        try:
            return classify(cause) == "transient"
        except Exception:
            return False

    def __repr__(self) -> str:
        shown = pgurl.display(self._url) if self._url is not None else "unopened"
        return f"<{type(self).__name__} {self.name!r} {self.mode} {self.table!r} at {shown}>"

    # -- executor side ---------------------------------------------------------------------

    def connection_url(self) -> Any:
        """The resolved SQLAlchemy URL (called on the executors)."""
        return self._url or pgurl.resolve_url(self.url, sink=self.name)

    # -- internals: the checks, delegated --------------------------------------------------

    def _own_records(self) -> SinkRecords:
        """Whose records the driver-side checks read: this sink's, in its mode now, and its
        table (:mod:`fanout_postgres.replay_refusals`, :mod:`fanout_postgres.holds`,
        :mod:`fanout_postgres.fence`)."""
        return SinkRecords(self.name, self.mode, self.state_schema, self._table)

    def _refuse_other_route(self, conn: Any, batch: Batch) -> None:
        """Upsert: the kit's :func:`~fanout.partitioned.replay_route.check_routes` on the
        routes the batch's committed partitions recorded (one query), saying
        :data:`~fanout_postgres.membership.REWRITES`; first, from the same query, the
        refusal of a later batch of the sink in the scope
        (:func:`~fanout_postgres.replay_refusals.refuse_later_batch`: the pipeline started
        again under the same name, or a later epoch's fence) and, at the first batch of an
        :meth:`open` with a dead-letter target and no routes of its own, of a sink renamed
        (:func:`~fanout_postgres.replay_refusals.refuse_vanished_sink`)."""
        scope = batch_scope(batch)
        routes, later = upsert_routes(conn, self.state_schema, scope, self.name, batch.batch_id)
        if not routes and later is None and self._vanished_unasked:  # with a dead_letter
            refuse_vanished_sink(conn, self._own_records(), batch, self._vanished_unasked,
                                 self._dead)  # fmt: skip
            self._vanished_unasked = ()  # spent once passed: a refused batch is asked again
        refuse_later_batch(self._own_records(), batch, later)
        check_routes(routes, batch, sink=self.name, why=REWRITES)
        if routes:  # a replay: its letters replace the earlier attempt's (after_partitions)
            self._rewrites.add((batch_scope(batch), batch.batch_id))

    def _fence(self, conn: Any, pipeline: str, epoch: int) -> None:
        """Close the scopes of epochs ``0 .. epoch-1`` to this sink's partitions still in
        flight, committed (:func:`fanout_postgres.fence.fence`), and remember that this
        process did up to ``epoch`` (:meth:`preflight` fences once per epoch)."""
        fence(conn, self._own_records(), pipeline, epoch)
        self._fenced = max(self._fenced, epoch)

    def _holds(
        self, name: str, pipeline: str, epoch: int, batch_id: int
    ) -> bool | PartlyHeld | None:
        """Whether the table holds batch ``batch_id`` of ``epoch`` by the records of sink
        ``name`` (:meth:`holds_batch`, which is this with the sink's own name; another's
        are first matched to this table by OID, :meth:`holds_batch_of`): what the records
        say (:func:`fanout_postgres.holds.read_held`, one connection), then, every partition
        committed, whether their refused rows are held too
        (:func:`fanout_postgres.holds.letters_held`)."""
        scope = pipeline_scope(pipeline, epoch)
        engine = self._engine()
        records = f"its records of batch {batch_id} of epoch {epoch}"
        with self._said_behind_migrations(engine, records), engine.connect() as conn:
            read = read_held(conn, self._own_records(), self._dead, name, scope, batch_id)
        if not isinstance(read, AllCommitted):
            return read
        letters = BatchLetters(self._dead, pipeline, epoch, batch_id, name, self.name,
                               self.secret_values)  # fmt: skip
        return letters_held(read, letters)

    @contextmanager
    def _said_behind_migrations(self, engine: Any, what: str) -> Iterator[None]:
        """Run the body, which reads ``what`` from fanout's tables; an error it raises on
        tables behind their migrations becomes the :class:`ConfigurationError` saying so
        (``cannot read <what>: <the revision, what is missing and the fanout migrate
        command>``), chained to it."""
        try:
            yield
        except Exception as exc:
            behind = self._behind_migrations(engine)
            if behind is None:
                raise
            raise self._error(f"cannot read {what}: {behind}") from exc

    def _behind_migrations(self, engine: Any) -> str | None:
        """:func:`migration_problem` as a read-only check says it, ``None`` when the tables
        are at head or their revision cannot be read either."""
        try:
            return migration_problem(
                engine, self.state_schema, pgurl.display(self._url), read_only=True
            )
        except Exception:
            return None

    def _check_options(self) -> None:
        try:
            self._url = pgurl.resolve_url(self.url, sink=self.name)
            pgurl.refuse_at_in_host(self._url)  # not "unreachable": an '@' to escape
            self._table = check_options(self)
        except ConfigurationError:
            raise
        except ValueError as exc:
            raise self._error(str(exc)) from None

    def _check_settings(self, conn: Any) -> None:
        """Refuse option ``settings`` as the server would take them on the write connections
        (:func:`~fanout_postgres.open_checks.settings_problem`: each tried, rolled back; a
        ``search_path`` among them resolving the sink's tables elsewhere is logged)."""
        dead = self._dead.table if isinstance(self._dead, PostgresDeadLetters) else None
        self._refuse(settings_problem(conn, self.name, self.settings, (self._table, dead),
                                      transient=self.is_transient, clean=self._clean))  # fmt: skip

    def _check_target(self, info: TargetInfo | None) -> None:
        try:
            keys = check_target(info, self.keys, self.order_by, self.columns, self.mode,
                                create_table=self.create_table)  # fmt: skip
        except PlanError as exc:
            raise self._error(str(exc)) from None
        if keys is not None:
            self._keys = list(keys)
            logger.debug("sink %r: keys %s", self.name, keys)

    def _refuse(self, problem: str | None) -> None:
        """Raise a check's ``problem`` (:mod:`fanout_postgres.open_checks`,
        :mod:`fanout_postgres.catalog`) as the sink's configuration error, if there is one."""
        if problem is not None:
            raise self._error(problem)

    def _error(self, message: str) -> ConfigurationError:
        where = f" (table {self._table})" if self._table is not None else ""
        return ConfigurationError(f"postgres sink {self.name!r}{where}: {message}")

    def _clean(self, exc: BaseException, *, one_line: bool = False) -> str:
        text = f"{type(exc).__name__}: {str(exc).strip()}"
        text = text.split("\n(Background on this error")[0]
        if one_line:  # libpq's hint is a second line, which `fanout validate` leaves out
            text = " ".join(line.strip() for line in text.splitlines() if line.strip())
        return redact(text, self.secret_values())

    def _engine(self) -> Any:
        # One engine per sink on the driver, without a pool: every use opens a connection
        # of its own and closes it (a down server is seen at once), while the dialect's
        # first-connect queries run once, not in every batch's preflight.
        url, engine = self.__dict__.get("_driver_engine", (None, None))
        if engine is None or url != self._url:  # open() may resolve the URL anew
            self.close()
            sa = _sa()
            engine = sa.create_engine(
                self._url, poolclass=sa.NullPool, client_encoding=CLIENT_ENCODING
            )
            self._driver_engine = (self._url, engine)
        return engine

    # -- internals: the write plan (fanout_postgres.write_plans) ---------------------------

    def _planning(self) -> Planning:
        """What the sink's :class:`~fanout_postgres.write_plans.WritePlans` read of it at
        one call: its options as :meth:`open` resolved them, its driver engine, its errors."""
        dead = self._dead
        table = dead.table if isinstance(dead, PostgresDeadLetters) else None
        options = PlanOptions(
            sink=self.name,
            table=self._table,  # type: ignore[arg-type]
            mode=self.mode,
            keys=self.keys,
            order_by=self.order_by,
            columns=self.columns,
            partitions=self.partitions,
            state_schema=self.state_schema,
            dead_letter_table=table,
            dead_letter_kind=None if dead is None else "postgres" if table else "driver",
            settings=tuple((str(k), str(v)) for k, v in self.settings.items()),
        )
        return Planning(options, self.create_table, self._engine, self._configured,
                        self._mismatch, self._unchecked, self.forget_replay_read)  # fmt: skip

    def _configured(self, exc: PlanError) -> ConfigurationError:
        """A plan refused at :meth:`open`, from option ``batch_schema``: before any batch."""
        return self._error(f"at configuration (option batch_schema): {exc}")

    def _mismatch(self, exc: PlanError, batch_id: int | None) -> SchemaMismatchError:
        return SchemaMismatchError(
            redact(str(exc), self.secret_values()),
            sink=self.name,
            batch_id=batch_id,
            columns=exc.columns,
        )

    def _unchecked(self, exc: Exception, batch_id: int | None) -> ConfigurationError | SinkError:
        """The table could not be read (or created): at :meth:`open` or in
        :meth:`check_schema` (``batch_id`` ``None``) a configuration error, at a batch a
        write error, transient when the cause is."""
        message = f"cannot check table {self._table}: {self._clean(exc)}"
        if batch_id is None:
            return self._error(message)
        error_type = TransientSinkError if self.is_transient(exc) else SinkWriteError
        return error_type(message, sink=self.name, batch_id=batch_id)


def _kept_elsewhere(batch: Batch) -> tuple[tuple[int, str], ...]:
    """The partitions whose refused rows of ``batch`` an earlier dead-letter target of the
    sink holds, each with that target (:attr:`fanout.Batch.earlier`; none on the common
    path): :attr:`~fanout_postgres.transaction.BatchMeta.kept_elsewhere`."""
    earlier = earlier_of(batch)
    if earlier is None:
        return ()
    return tuple(
        (partition, held.target)
        for held in earlier.held
        for partition in sorted(p for p in held.refused if p is not None)
    )


def _sa() -> Any:
    import sqlalchemy

    return sqlalchemy
