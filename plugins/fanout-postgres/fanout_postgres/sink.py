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
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from fanout.contract.batch import Batch, pipeline_scope
from fanout.contract.dead_letters import DeadLetterTarget, ReplacesLetters
from fanout.contract.partitions import BatchPartitioning, StableColumns
from fanout.contract.sink import (
    FENCE_LEFT,
    Guarantee,
    PartlyHeld,
    SinkContext,
    lift_by_hand,
    renamed_sink_advice,
)
from fanout.contract.sql import sql_literal
from fanout.deadletters.held import refused_rows_held
from fanout.deadletters.moved import (
    earlier_of,
    refused_elsewhere,
    replace_held,
    replace_letters,
    unchecked,
    write_letters,
)
from fanout.errors import (
    ConfigurationError,
    RenamedSinkError,
    SchemaMismatchError,
    SinkError,
    SinkUnreachableError,
    SinkWriteError,
    TransientSinkError,
    shell_word,
)
from fanout.observe.secrets import redact
from fanout.partitioned.membership import CommittedPartition, PartitionPlan, quoted
from fanout.partitioned.outcome import PartitionOutcome
from fanout.partitioned.replay_route import check_routes, route_mark
from fanout.partitioned.sink import PartitionedSink, PartitionInput
from fanout_postgres import url as pgurl
from fanout_postgres.connections import CLIENT_ENCODING, NOT_DURABLE, not_durable
from fanout_postgres.deadletter import (
    PostgresDeadLetters,
    as_letter,
    drop_stale,
    ensure_table,
    refused_held,
)
from fanout_postgres.declaration import OPTIONS
from fanout_postgres.direct import HELD, DirectCopyPolicy
from fanout_postgres.failures import batch_error
from fanout_postgres.gone import records_gone
from fanout_postgres.identifiers import TableName, quote
from fanout_postgres.keyhash import hashed
from fanout_postgres.membership import (
    REWRITES,
    VOLATILE_KEYS,
    MovedMarks,
    batch_names,
    committed_marks,
    committed_partitions,
    current_oid,
    forget_replaced_marks,
    letters_waiting,
    moved_marks,
    other_table_marks,
    partition_columns,
    relation_bytes,
    repoint_marks_sql,
    tables_now,
    target_oids,
    upsert_records,
    upsert_routes,
    upsert_routes_of,
    vanished_sink_marks,
)
from fanout_postgres.migrate import migration_problem, state_schema_problem
from fanout_postgres.options import as_list, check_options, schema_of
from fanout_postgres.plan import (
    PlanError,
    PlanOptions,
    TargetInfo,
    WritePlan,
    build_plan,
    check_target,
    create_table,
    created_target,
    map_columns,
    reflect,
    table_to_create,
)
from fanout_postgres.statements import (
    EPOCH_FENCE,
    EPOCH_FENCE_HOLDERS,
    EPOCH_FENCE_LOCKS,
    RESTORE_OR_RENAME,
    epoch_fence_lock,
    fence_earlier_epochs,
    forget_marks_advice,
    forget_routes_sql,
    lift_epoch_fence,
    lock_halves,
    restarted,
)
from fanout_postgres.task import PostgresPartitionWriter
from fanout_postgres.transaction import BatchMeta

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
        self._plans: dict[str, WritePlan] = {}
        self._shapes: dict[str, Any] = {}  # schema -> the table's columns it was planned on
        self._checked: dict[str, int] = {}  # schema -> the last batch its plan was checked at
        self._keys: list[str] | None = None  # resolved at open() (append: the hash keys)
        self._direct = DirectCopyPolicy()
        # upsert: (scope, batch) whose preflight found partitions an earlier attempt committed
        self._rewrites: set[tuple[str, int]] = set()
        # the epoch whose earlier epochs' scopes this process closed (0: none has any)
        self._fenced = 0
        self._unmade = False  # open() found the table missing; the first write creates it

    @property
    def guarantee(self) -> Guarantee:
        """``idempotent`` in upsert mode; ``transactional`` in append mode, where each
        partition commits with its progress mark, so a batch lands once and we can tell."""
        return "transactional" if self.mode == "append" else "idempotent"

    # -- lifecycle ----------------------------------------------------------------------

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
                self._would_migrate(engine, context)
            elif self.migrate:
                from fanout_postgres.migrate import upgrade

                try:
                    upgrade(engine, schema=self.state_schema)
                except ConfigurationError as exc:  # named for this sink, as the rest
                    raise self._error(str(exc)) from None
            else:  # append's progress marks, upsert's routes (fanout_postgres.membership)
                self._require_migrated(engine)
            with engine.connect() if checking else engine.begin() as conn:
                info = reflect(conn, self._table)  # type: ignore[arg-type]
                self._unmade = info is None and not checking
                self._check_target(info)
                if info is None and self.create_table:
                    self._check_may_create(conn)
                self._check_rules(conn)
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
            if self.batch_schema is not None and (checking or info is None):
                # a missing table is created at the first write, not here: see _plan
                self._check_plan(schema_of(self.batch_schema, context.spark))
            elif self.batch_schema is not None:
                self._plan(schema_of(self.batch_schema, context.spark), None)
        except (ConfigurationError, SchemaMismatchError):
            raise
        except Exception as exc:
            if self.is_transient(exc):  # unreachable, not misconfigured
                raise SinkUnreachableError(
                    f"cannot open: {self._clean(exc, one_line=True)}; {UNREACHABLE_HINT}",
                    sink=self.name,
                ) from None
            said = self._clean(exc, one_line=True)
            if _refused_login(exc):
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

    def _check_settings(self, conn: Any) -> None:
        """Apply each of ``settings`` for one transaction, rolled back: a name or value the
        server refuses fails :meth:`open`, not every partition of every batch. With a
        ``search_path`` among them, a table named without a schema (``table``, a
        ``postgres:`` dead-letter table) that it resolves elsewhere than the URL's search
        path does is logged (:meth:`_warn_search_path`)."""
        path_set = any(str(name).lower() == "search_path" for name in self.settings)
        before = self._schemas_named(conn) if path_set else {}
        for name, value in self.settings.items():
            if str(name).lower() == "synchronous_commit" and str(value).lower() in NOT_DURABLE:
                raise self._error(
                    f"option 'settings': synchronous_commit={value!r} lets a commit return "
                    "before it is durable, so a server crash could lose rows the ledger "
                    "records as written; leave it at the server's default (on)"
                )
            try:
                with conn.begin_nested():
                    conn.execute(
                        _sa().text("SELECT set_config(:name, :value, true)"),
                        {"name": str(name), "value": str(value)},
                    )
            except Exception as exc:
                if self.is_transient(exc):
                    raise
                raise self._error(
                    f"option 'settings': the server refuses {name}={value!r}: "
                    f"{self._clean(getattr(exc, 'orig', None) or exc)}"
                ) from None
        effective = conn.execute(_sa().text("SHOW synchronous_commit")).scalar()
        if str(effective).lower() in NOT_DURABLE:  # set for the server, database or role
            raise self._error(not_durable(effective))
        if path_set:
            self._warn_search_path(before, self._schemas_named(conn))
        conn.rollback()

    def _schemas_named(self, conn: Any) -> dict[str, str | None]:
        """The schema each table the sink names without one (``table``, a ``postgres:``
        dead-letter table) resolves to under ``conn``'s search path now: the one holding a
        table of that name first, else the one a ``CREATE TABLE`` would make it in. One
        query each, at :meth:`open` and only with a ``search_path`` in ``settings``."""
        dead = self._dead.table if isinstance(self._dead, PostgresDeadLetters) else None
        named = [t for t in (self._table, dead) if t is not None and t.schema is None]
        found: dict[str, str | None] = {}
        for table in named:
            found[table.quoted()] = conn.execute(
                _sa().text(
                    "SELECT COALESCE((SELECT n.nspname FROM pg_class c JOIN pg_namespace n "
                    "ON n.oid = c.relnamespace WHERE c.oid = to_regclass(:table)), "
                    "current_schema())"
                ),
                {"table": table.quoted()},
            ).scalar()
        return found

    def _warn_search_path(
        self, url_path: Mapping[str, str | None], settings_path: Mapping[str, str | None]
    ) -> None:
        """Log each table named without a schema that ``settings``' ``search_path`` would
        resolve elsewhere than the URL's: the sink writes where the URL's resolves (the
        driver's, qualified in every partition's statements); up to session 66 a
        ``postgres:`` dead-letter table found under ``settings``' path took the
        partitions' refused rows, and from then on the URL's table takes them."""
        for table, schema in url_path.items():
            other = settings_path.get(table)
            if schema is None or other is None or other == schema:
                continue
            logger.warning(
                "sink %r: option settings sets search_path, under which %s would be %s, but "
                "the sink writes %s (the URL's search path resolves it there; settings "
                "apply to the write connections only): name the schema in the option, or "
                "set the search path in the URL (?options=-csearch_path%%3D...)",
                self.name, table, TableName(_named(table), other),
                TableName(_named(table), schema),
            )  # fmt: skip

    # -- the partitioned-sink kit ---------------------------------------------------------

    def partition_input(self, batch: Batch) -> PartitionInput:
        """The batch under the table's column names, hashed by the plan's columns; append
        mode keeps partition membership (its progress marks are per partition)."""
        df = batch.df
        if not hasattr(df, "mapInArrow"):
            raise SinkWriteError(
                "the postgres sink needs a Spark DataFrame", sink=self.name, batch_id=batch.batch_id
            )
        plan = self._plan(df.schema, batch.batch_id)
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
        plan = self._plans.get(schema.json())
        if plan is None or plan.key_hashes:  # folded keys are hashed on no batch column
            return None
        sources = plan.sources
        return BatchPartitioning(self.partitions, tuple(sources[c] for c in plan.hash_columns))

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
                self._recheck(conn, batch.df.schema.json(), batch.batch_id)
        except Exception as exc:
            if not self.is_transient(exc):
                raise
            raise TransientSinkError(
                f"cannot reach the server: {self._clean(exc)}", sink=self.name,
                batch_id=batch.batch_id,
            ) from None  # fmt: skip

    def fence_earlier_epochs(self, pipeline: str, epoch: int) -> None:
        """Close the scopes of epochs ``0 .. epoch-1`` to this sink's partitions still in
        flight (:meth:`fanout.Sink.fence_earlier_epochs`): one :data:`EPOCH_FENCE` record
        of the sink in each, unless there is one (:meth:`_fence`). One transaction; append
        waits there for the partitions of those scopes still writing."""
        if epoch <= 0:
            return
        with self._engine().connect() as conn:
            self._fence(conn, pipeline, epoch)

    def lift_epoch_fence(self, pipeline: str, epoch: int) -> bool | None:
        """The start of ``epoch`` was refused after :meth:`fence_earlier_epochs`: delete the
        sink's :data:`EPOCH_FENCE` record in epoch ``epoch - 1``'s scope (the earlier
        epochs' stay closed), so that epoch's checkpoint may be started again to complete
        a batch (:meth:`fanout.Sink.lift_epoch_fence`). Whether there was one (the
        ``DELETE`` removed a row)."""
        if epoch <= 0:
            return False
        scope = pipeline_scope(pipeline, epoch - 1)
        with self._engine().begin() as conn:
            deleted = conn.execute(lift_epoch_fence(self.state_schema, self.mode),
                                   {"scope": scope, "sink": self.name})  # fmt: skip
        self._fenced = min(self._fenced, epoch - 1)
        return bool(deleted.rowcount)

    def _fence(self, conn: Any, pipeline: str, epoch: int) -> None:
        """Close the scopes of epochs ``0 .. epoch-1`` (:func:`~fanout_postgres.statements.
        fence_earlier_epochs`), in one transaction committed here: at a new epoch's start,
        before the sink is asked whether it holds the replaced epoch's last batch, and
        again at the sink's first batch of an epoch > 0 in a process (the preflight: a
        lagging sink's catch-up of an older epoch's spooled batches comes before it, §14.1,
        and is not refused). A task of a query the reset replaced (a task of an executor
        given up on, of a stopped query, still running) must then not commit.

        Upsert: it asks for a later batch of its own scope before it commits and finds the
        fence. Append: each partition transaction holds its scope's fence lock
        (:func:`~fanout_postgres.statements.epoch_fence_lock`) shared from its first
        statement to its end and looks the fence up under it; the fence takes the locks
        exclusively before its ``INSERT``, so it waits for every partition still open
        (whose commit the sink's ``holds_batch``, asked after, then sees), and every
        partition starting after waits for it and sees it. One transaction per epoch
        start and per process start in a new epoch; none in epoch 0 or per batch."""
        scopes = [pipeline_scope(pipeline, k) for k in range(epoch)]
        if self.mode == "append":
            locks = [epoch_fence_lock(scope, self.name) for scope in scopes]
            self._say_what_the_fence_waits_for(conn, pipeline, scopes, locks)
            conn.execute(_sa().text(EPOCH_FENCE_LOCKS), {"locks": locks})
        params = {"scopes": scopes, "sink": self.name, "target": str(self._table)}
        conn.execute(fence_earlier_epochs(self.state_schema, self.mode), params)
        conn.commit()
        self._fenced = max(self._fenced, epoch)

    def _say_what_the_fence_waits_for(
        self, conn: Any, pipeline: str, scopes: Sequence[str], locks: Sequence[int]
    ) -> None:
        """Append, before the fence waits for its locks: when partition transactions of the
        scopes it closes hold them (:data:`~fanout_postgres.statements.EPOCH_FENCE_HOLDERS`,
        a read of ``pg_locks``: tasks of the replaced query, perhaps hung with their
        connection alive, which hold the new epoch's start for as long: for ever with no
        ``write_timeout_s``), log once which scopes and which PostgreSQL backends it waits
        for, and what to do. Only at a fence: no cost per batch."""
        halves = {lock_halves(key): scope for scope, key in zip(scopes, locks, strict=True)}
        params = {"highs": [h for h, _ in halves], "lows": [lo for _, lo in halves]}
        found = conn.execute(_sa().text(EPOCH_FENCE_HOLDERS), params).all()
        if not found:
            return
        busy = sorted({halves[(high, low)] for high, low, *_ in found})
        holders = [
            f"{pid} ({state or 'state unknown'} since {since or 'unknown'})"
            for _, _, pid, state, since in found
        ]
        logger.warning(
            "pipeline %s, sink %s: the epoch fence waits for partition transaction(s) of "
            "epoch scope(s) %s still open: PostgreSQL backend(s) %s. They are tasks of the "
            "query a checkpoint reset replaced, still writing; the new epoch does not write "
            "until they end (bounded by the sink's write_timeout_s if set, else for as long "
            "as they stay open). If their tasks are gone (an executor lost, a hung task), "
            "end them: SELECT pg_terminate_backend(<pid>)",
            pipeline, self.name, ", ".join(busy), ", ".join(holders),
        )  # fmt: skip

    def committed_partitions(
        self, batch: Batch, plan: PartitionPlan
    ) -> Sequence[CommittedPartition]:
        """The batch's progress marks (append mode), each with the route it recorded, read
        in one query; the kit refuses a replay under another route
        (:func:`fanout.partitioned.replay_route.check_routes`) before any partition
        writes."""
        with self._engine().connect() as conn:
            found = committed_marks(
                conn, self.state_schema, _scope(batch), self.name, batch.batch_id
            )
            self._refuse_other_query(batch, found)
            if found:  # a replay: were they committed to the table the sink names now?
                found = self._refuse_moved(conn, batch, found)
            elif self._vanished_unasked:  # spent once passed: a refused batch is asked again
                self._refuse_vanished_sink(conn, batch, self._vanished_unasked)
                self._refuse_switched_mode(conn, batch)
                self._vanished_unasked = ()
            marks = [mark for mark, _ in found]
            if marks and self._dead is None:
                self._refuse_waiting_letters(conn, batch)
            return marks

    def _refuse_other_query(
        self, batch: Batch, found: Sequence[tuple[CommittedPartition, str | None]]
    ) -> None:
        """Append: refuse, before any partition writes, a batch whose marks another query
        committed (read in the marks' query): a query keeps its id with its checkpoint,
        so the pipeline started again under the same name with a new checkpoint
        (docs/architecture.md §8.2, "A straggler of an earlier batch"). Each partition
        would fail on its mark (:class:`~fanout_postgres.sqlstate.MarkConflict`), and
        one that the earlier run did not commit would write."""
        other = [
            (mark.partition, query_id)
            for mark, query_id in found
            if query_id and batch.query_id and query_id != batch.query_id
        ]
        if not other:
            return
        parts = sorted(partition for partition, _ in other)
        queries = ", ".join(sorted({query_id for _, query_id in other}))
        scope = _scope(batch)
        raise SinkWriteError(
            f"{self.state_schema}.progress marks partition(s) {parts} of batch "
            f"{batch.batch_id} of this sink as committed to {self._table} in pipeline "
            f"{scope!r} by query {queries}; this is query {batch.query_id}. "
            f"A query keeps its id with its checkpoint, so {restarted(ledger_too=False)}, or "
            f"another pipeline of that name writes this sink. Nothing was written. "
            f"{RESTORE_OR_RENAME}. "
            + forget_marks_advice(self.state_schema, scope, self.name, self._table),
            sink=self.name,
            batch_id=batch.batch_id,
        )

    def _refuse_vanished_sink(self, conn: Any, batch: Batch, sinks: tuple[str, ...]) -> None:
        """At the first batch of an :meth:`open` with no records of its own (append; upsert
        with a dead-letter target): refuse, before any partition writes, a batch the table
        holds (partitions of it, or a later batch) under the progress marks (append) or
        ``upsert_routes`` rows (upsert) of a sink of the pipeline it no longer configures,
        when this sink's name has no records in the scope at all: that sink renamed to
        this one (or removed) after it committed and before its ledger mark. Written under
        the new name, an append's partitions would be in the table twice, an upsert's
        refused rows in the dead-letter target twice (its rows converge)
        (:func:`~fanout_postgres.membership.vanished_sink_marks`)."""
        table = self._table
        assert table is not None  # open() resolved it
        found = vanished_sink_marks(conn, self.state_schema, _scope(batch), self.name, sinks,
                                    batch.batch_id, table.quoted(), self.mode)  # fmt: skip
        if found is None:
            return
        other, batch_id, partitions = found
        if self.mode == "append":
            records, harm = "progress marks", None
        else:
            records = "upsert_routes records"
            harm = (
                f"put the rows they refused in {self._dead.describe() if self._dead else ''} "
                "a second time (under this sink's name; the table's rows converge)"
            )
        raise RenamedSinkError(
            f"{self.state_schema}.{records} partition(s) {partitions} of batch "
            f"{batch_id} as committed to table {self._table} by sink {other!r} of this "
            f"pipeline, which the pipeline no longer configures, and sink {self.name!r} has "
            "no records. "
            + renamed_sink_advice(f"table {self._table}", self.name, other, batch_id, harm=harm),
            sink=self.name,
            batch_id=batch.batch_id,
        )

    def _refuse_switched_mode(self, conn: Any, batch: Batch) -> None:
        """Append, at the first batch of an :meth:`open` with no marks of its own: refuse,
        before any partition writes, a batch this sink committed into the table in upsert
        mode (its ``upsert_routes`` rows, of this batch or a later one): ``mode`` switched
        after that commit and before its ledger mark, and the append replay, which finds no
        progress mark, would append the batch again, each of its rows a unique violation
        then (a row in the table and in the dead letters) or a second copy
        (:func:`~fanout_postgres.membership.upsert_routes_of`)."""
        table = self._table
        assert table is not None  # open() resolved it
        found = upsert_routes_of(conn, self.state_schema, _scope(batch), self.name,
                                 batch.batch_id, table.quoted())  # fmt: skip
        if found is None:
            return
        scope = _scope(batch)
        _, later = upsert_routes(conn, self.state_schema, scope, self.name, batch.batch_id)
        if later is not None and later != EPOCH_FENCE:  # the refusal's path only
            # no switch mid-batch (the ledger marks each batch before the next): an earlier
            # run's records, under a pipeline started again under the same name
            raise SinkWriteError(
                f"{self.state_schema}.upsert_routes records batch {later} of this sink "
                f"committed to table {self._table} in upsert mode in pipeline {scope!r}, "
                f"after batch {batch.batch_id}, which Spark hands now to the sink in append "
                f"mode: {restarted(ledger_too=True)}, so this run would append from batch "
                f"{batch.batch_id} again what the earlier one wrote up to batch {later}. "
                "Nothing was written. "
                f"{RESTORE_OR_RENAME}, or delete the earlier run's records first: "
                f"{forget_routes_sql(self.state_schema, scope, self.name)}",
                sink=self.name,
                batch_id=batch.batch_id,
            )
        batch_id, partitions = found
        raise SinkWriteError(
            f"{self.state_schema}.upsert_routes records partition(s) {partitions} of batch "
            f"{batch_id} of this sink as committed to table {self._table} in upsert mode, "
            f"and the sink is in append mode now with no progress mark of the batch: its "
            f"mode switched after that commit and before the ledger mark, and appending "
            f"batch {batch_id} would write its rows a second time (or, under the upsert "
            "keys' unique index, put each in the dead letters beside the table's copy), so "
            "nothing was written. Set mode back to 'upsert' and restart: the replay "
            f"completes the batch; switch once batch {batch_id} is marked (append then "
            "starts after it)",
            sink=self.name,
            batch_id=batch.batch_id,
        )

    def _refuse_moved(
        self, conn: Any, batch: Batch, found: list[tuple[CommittedPartition, str | None]]
    ) -> list[tuple[CommittedPartition, str | None]]:
        """Append, on a replay (the batch has marks ``found``): refuse, before any partition
        writes, a batch whose marks recorded another table than the sink's now
        (:func:`~fanout_postgres.membership.other_table_marks`): ``table`` moved after they
        committed and before the ledger mark (another OID and another name), or the table
        of that name replaced (another OID, the same name: renamed away, or dropped, and
        another created or restored from a dump). The replay would skip their partitions,
        and the table named now would never get those rows. A replaced table, when the run
        accepts its loss (``accept_lost_targets``): those marks are deleted, and the replay
        writes their partitions into the table as it is (the marks left returned), those
        of each replaced table (the name replaced twice, once mid-batch), all of which a
        refusal names. One query, only on a replay (accepted: one more per replaced table
        forgotten)."""
        table = self._table
        assert table is not None  # open() resolved it
        scope = _scope(batch)
        moved, replaced = other_table_marks(conn, self.state_schema, scope, self.name,
                                            batch.batch_id, table.quoted())  # fmt: skip
        gone: set[int] = set()
        if moved is None and replaced:
            if not self._accept_lost:  # every replaced table at once, not one per run
                self._refuse_replaced(batch, replaced, tables_now(conn, [r.oid for r in replaced]))
            for each in replaced:  # the name replaced twice, once mid-batch: each OID
                self._forget_replaced(batch, each)
                gone.update(each.partitions)
        if gone and moved is None:
            return [(mark, query) for mark, query in found if mark.partition not in gone]
        if moved is None:
            return found
        now = "none: it does not exist" if moved.now is None else str(moved.now)
        forget = (
            f"DELETE FROM {quote(self.state_schema)}.progress WHERE pipeline = "
            f"{sql_literal(scope)} AND sink = {sql_literal(self.name)} AND batch_id = "
            f"{batch.batch_id}"
        )
        raise SinkWriteError(
            f"{self.state_schema}.progress marks partition(s) {moved.partitions} of batch "
            f"{batch.batch_id} of this sink as committed to table {moved.table} (OID "
            f"{moved.oid}), but its table is {table} now (OID {now}): option 'table' "
            f"changed after they committed and before the ledger mark. The replay skips "
            f"the partitions marked committed, so {table} would never get their rows, and "
            f"nothing was written. Set table back to {moved.table} and restart: the replay "
            f"completes batch {batch.batch_id} there; move the table once the batch is "
            f"marked (the next batch then starts in {table}). Or, to write all of batch "
            f"{batch.batch_id} into {table} (its committed part stays in {moved.table}), "
            f"delete its marks first: {forget}",
            sink=self.name,
            batch_id=batch.batch_id,
        )

    def _refuse_replaced(
        self, batch: Batch, replaced: Sequence[MovedMarks], now_named: Mapping[int, str]
    ) -> None:
        """Refuse a replay whose marks ``replaced`` recorded other tables under the sink's
        table name (:meth:`_refuse_moved`), naming every one of them, where each is now
        (``now_named``: :func:`~fanout_postgres.membership.tables_now`), and the ways on:
        one table still there, bringing it back or naming it in option ``table`` works;
        one dropped, or two or more (the name replaced once mid-batch), only accepting the
        loss or the ``UPDATE`` does, which the refusal says."""
        table, scope, batch_id = self._table, _scope(batch), batch.batch_id
        now_oid = replaced[0].now
        now = f"no table {table} exists now" if now_oid is None else (
            f"table {table} has OID {now_oid} now"
        )  # fmt: skip

        def where(oid: int) -> str:
            found = now_named.get(oid)
            return (
                f"OID {oid}, now {found}"
                if found
                else f"OID {oid}: no table of this database has that OID now"
            )

        oids = [each.oid for each in replaced]
        named = ", and ".join(
            f"partition(s) {each.partitions} of batch {batch_id} of this sink as committed "
            f"to table {table} ({where(each.oid)})"
            if n == 0 else f"partition(s) {each.partitions} to table {table} ({where(each.oid)})"
            for n, each in enumerate(replaced)
        )  # fmt: skip
        repoint = (
            "" if now_oid is None
            else " A dump taken after the crash may already hold them: then accepting would "
            "write them a second time; instead make the marks name the table as it is, and "
            "the replay skips their partitions (each row once): "
            + repoint_marks_sql(self.state_schema, scope, self.name, batch_id, oids, now_oid)
        )  # fmt: skip
        away = (
            "" if now_oid is None
            else f", once the table named {table} now is renamed away or dropped"
        )  # fmt: skip
        old = now_named.get(oids[0]) if len(replaced) == 1 else None
        if old is not None:
            back = (
                f"Bring the table of OID {oids[0]} ({old} now) back under the name {table} "
                f"(ALTER TABLE ... RENAME TO, or SET SCHEMA){away}, or set option table to "
                f"{old}, and restart: the replay completes batch {batch_id} there. If "
                f"{old} never moved, the name {table} resolves to another table than at the "
                "crash: the search path changed (the URL's options, or the role's or "
                "database's search_path); set it back and restart. Or accept"
            )
            stays = f"stays in the table of OID {oids[0]}"
        elif len(replaced) == 1:
            back = (
                f"No table of this database has OID {oids[0]} now (dropped, or the "
                "database restored from a dump), so none can take the batch back. Accept"
            )
            stays = "went with that table"
        else:  # no one table can take the batch back: both ways below still work
            back = (
                f"The batch's committed partitions are in {len(replaced)} tables (OIDs "
                f"{', '.join(str(oid) for oid in oids)}), so bringing one back under the "
                f"name {table} cannot complete it. Accept"
            )
            stays = "stays in the tables of those OIDs"
        raise SinkWriteError(
            f"{self.state_schema}.progress marks {named}, but {now}: "
            f"{REPLACED_UNDER_ITS_NAME} (or restored from a dump) after they committed and "
            f"before the ledger mark. The replay skips the partitions marked committed, so "
            f"{table} would lack their rows, and nothing was written. {back} the loss for "
            f"this run (`fanout run PIPELINE.toml --accept-lost-target "
            f"{shell_word(self.name)}`, FanOut(accept_lost_targets=[{self.name!r}])): it "
            f"writes all of batch {batch_id} into {table} as it is, once (its committed "
            f"part {stays}).{repoint}",
            sink=self.name,
            batch_id=batch_id,
        )

    def _forget_replaced(self, batch: Batch, replaced: MovedMarks) -> None:
        """The run accepts the loss of the table (``accept_lost_targets``): delete the
        batch's marks ``replaced`` recorded in the table replaced under its name, logged,
        so that the replay writes their partitions into the table as it is, once (marked
        anew there in their transactions; a driver dying before then leaves no mark of the
        old table, and the next replay writes them there too)."""
        with self._engine().begin() as conn:
            forget_replaced_marks(conn, self.state_schema, _scope(batch), self.name,
                                  batch.batch_id, replaced.oid)  # fmt: skip
        logger.warning(
            "sink %r, batch %d: accept_lost_targets: partition(s) %s committed the batch to "
            "table %s of OID %d, not the table of that name now (OID %s): their progress "
            "marks deleted, the replay writes all of the batch into it (the committed part "
            "stays in the table of OID %d, if it is kept)",
            self.name, batch.batch_id, replaced.partitions, self._table, replaced.oid,
            replaced.now, replaced.oid,
        )  # fmt: skip

    def _refuse_waiting_letters(self, conn: Any, batch: Batch) -> None:
        """Without a dead-letter target now, refuse a replay whose committed partitions keep
        refused rows no target holds yet: it would skip those partitions, and the rows
        would be in neither the table nor any dead-letter target. Those of a partition an
        earlier target holds (:attr:`fanout.Batch.earlier`: the driver wrote them there
        before the target was removed) are not waiting."""
        waiting = letters_waiting(conn, self.state_schema, _scope(batch), self.name,
                                  batch.batch_id)  # fmt: skip
        waiting = {p: n for p, n in waiting.items() if refused_elsewhere(batch, p) is None}
        if not waiting:
            return
        raise SinkWriteError(
            f"partitions {sorted(waiting)} of table {self._table} committed this batch with "
            f"{sum(waiting.values())} refused row(s) kept for the dead-letter target it had "
            "(the attempt may have ended before they were written there), and the sink has "
            "no dead_letter now: a replay skips those partitions, so the rows would be in "
            "neither the table nor any dead-letter target. Set dead_letter again until batch "
            f"{batch.batch_id} completes (the target it had: a letter it holds is not "
            "written twice)",
            sink=self.name, batch_id=batch.batch_id,
        )  # fmt: skip

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
        creates it at the first write, after this check (:meth:`_plan`), so a run refused
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
        none: :meth:`_uncounted_letters`."""
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

    def _holds(
        self, name: str, pipeline: str, epoch: int, batch_id: int
    ) -> bool | PartlyHeld | None:
        """Whether the table holds batch ``batch_id`` of ``epoch`` by the records of sink
        ``name`` (:meth:`holds_batch`, which is this with the sink's own name; another's
        are first matched to this table by OID, :meth:`holds_batch_of`)."""
        scope = pipeline_scope(pipeline, epoch)
        engine = self._engine()
        records = f"its records of batch {batch_id} of epoch {epoch}"
        with self._said_behind_migrations(engine, records), engine.connect() as conn:
            if self._target_gone(conn):
                return False
            if name != self.name:
                table = self._table
                assert table is not None  # _target_gone said it is there
                oids = set(target_oids(conn, self.state_schema, self.mode, scope, name,
                                       batch_id).values())  # fmt: skip
                if current_oid(conn, table.quoted()) not in oids:
                    return None if oids == {None} else False
            mode: str = self.mode
            if name == self.name and self._moved(conn, scope, batch_id):
                return None
            read = self._records(conn, mode, scope, name, batch_id)
            if not read[1] and name == self.name:  # none: written in the other mode?
                other = self._other_mode(conn, scope, batch_id, said=True)
                if other is not None:
                    mode, read = other, self._records(conn, other, scope, name, batch_id)
            counts, partitions, waiting, unknown = read
            count = counts.pop() if len(counts) == 1 else None
            held = _held(len(partitions), count)
            if held is not True:
                return held
            if mode == "append":
                waiting = sum(letters_waiting(conn, self.state_schema, scope, name,
                                              batch_id).values())  # fmt: skip
        if unknown:
            return self._uncounted_letters(pipeline, epoch, batch_id, name)
        if waiting and self._letters_kept(pipeline, epoch, batch_id, name) < waiting:
            return PartlyHeld(len(partitions), count, letters=waiting)
        return True

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
            if self._table is None or self._target_gone(conn):
                return None
            return records_gone(conn, self.state_schema, pipeline_scope(pipeline, epoch),
                                self.name, batch_id, self._table.quoted(),
                                str(self._table))  # fmt: skip

    def _records(
        self, conn: Any, mode: str, scope: str, name: str, batch_id: int
    ) -> tuple[set[int | None], set[int], int, bool]:
        """The partition counts and partitions sink ``name``'s records of ``mode`` (progress
        marks: append; ``upsert_routes`` rows: upsert) hold of the batch, with upsert's
        refused rows waiting for the dead-letter target and whether an older fanout's rows
        left some uncounted (append's waiting letters: read once the batch is held whole,
        :meth:`_holds`). One query."""
        if mode == "append":
            marks = committed_partitions(conn, self.state_schema, scope, name, batch_id)
            return {m.partitions for m in marks}, {m.partition for m in marks}, 0, False
        recorded = upsert_records(conn, self.state_schema, scope, name, batch_id)
        unknown = any(r.refused is None for r in recorded.values())
        if unknown and isinstance(self._dead, PostgresDeadLetters):
            unknown = not refused_held(conn, self._dead.table, scope, name, batch_id)
        waiting = sum(r.waiting for r in recorded.values())
        return {r.partitions for r in recorded.values()}, set(recorded), waiting, unknown

    def _other_mode(self, conn: Any, scope: str, batch_id: int, *, said: bool) -> str | None:
        """The other mode than the sink's ``mode`` now when its records (progress marks:
        append; ``upsert_routes`` rows: upsert) hold the sink's batch ``batch_id``, the
        sink's own mode's records holding none (its callers read those first): ``mode``
        switched between runs, after the batch was marked, and the batch's rows are in
        the table all the same; ``said``: logged, saying what the switch means for the
        batches after it. ``None``: they hold none of it either. One query, asked by
        :meth:`holds_batch` and :meth:`target_replaced` only when the mode's own records
        hold none of the batch. Up to this version those read the mode's own records only,
        and a switch between runs read as a table created again empty
        (docs/architecture.md §8.2, "A mode switched between runs")."""
        other = "upsert" if self.mode == "append" else "append"
        if not target_oids(conn, self.state_schema, other, scope, self.name, batch_id):
            return None
        if said:
            then = (
                "appends each row of its later batches: a key the table holds already is "
                "a second row, or under a unique index a refused row (kept in the "
                "dead-letter target; without one its batch fails, naming the row)"
                if self.mode == "append"
                else "upserts its later batches by key"
            )  # fmt: skip
            logger.warning(
                "sink %r: batch %d (%s) was written in %s mode, and the sink is in %s mode "
                "now: option 'mode' switched since; the table holds the batch by its %s "
                "records, and the sink %s",
                self.name, batch_id, scope, other, self.mode, other, then,
            )  # fmt: skip
        return other

    def _moved(self, conn: Any, scope: str, batch_id: int) -> bool:
        """In :meth:`holds_batch`: whether the sink's progress marks (upsert: its
        ``upsert_routes`` rows, from migration ``0008_upsert_routes_target``) of the batch
        recorded another table than the sink's now
        (:func:`~fanout_postgres.membership.moved_marks`: ``table`` moved since), logged.
        They say nothing of the table named now: "cannot tell" (``None``), so a checkpoint
        reset's start writes the batch into it (not refused, no lost mark recorded for a
        batch it lacks) and a run's lost-target check lets a moved table pass as before
        (:meth:`target_replaced` still names an empty one)."""
        table = self._table
        assert table is not None  # _target_gone said it is there
        moved = moved_marks(conn, self.state_schema, scope, self.name, batch_id, table.quoted(),
                            self.mode)  # fmt: skip
        if moved is None:
            return False
        logger.warning(
            "sink %r: its %s of batch %d (partition(s) %s) name table %s (OID %d), not %s, "
            "its table now: option 'table' moved since; they cannot tell whether %s holds "
            "the batch",
            self.name, "progress marks" if self.mode == "append" else "upsert_routes rows",
            batch_id, moved.partitions, moved.table, moved.oid, table, table,
        )  # fmt: skip
        return True

    def _uncounted_letters(
        self, pipeline: str, epoch: int, batch_id: int, name: str
    ) -> bool | None:
        """Upsert, every partition committed, some by an older fanout, whose rows count no
        refused row (before migration ``0007_upsert_routes_refused``): held whole without a
        dead-letter target (nothing can wait for one) or when the target holds refused rows
        of the batch (a Delta table's ``read_rows``: the driver writes a batch's in one
        write, after every partition; a ``postgres:`` table, read by :meth:`holds_batch`:
        the partitions wrote them in their transactions); else ``None``, logged: it cannot
        tell a batch that refused none from one whose refused rows never reached the
        target, so no lost mark is recorded for it (its replay would skip them) and a
        reset is not refused for it either."""
        if self._dead is None or self._letters_kept(pipeline, epoch, batch_id, name) > 0:
            return True
        text = (
            f"its upsert_routes rows of epoch {epoch} were written by an older fanout, which "
            f"counted no refused row, and {self._dead.describe()} holds none of the batch: "
            "cannot tell whether it refused none or the driver never wrote them there"
        )
        logger.warning(
            "sink %r, batch %d: %s", self.name, batch_id, redact(text, self.secret_values())
        )
        return None

    def _letters_kept(self, pipeline: str, epoch: int, batch_id: int, name: str) -> int:
        """How many refused rows of the batch the sink's dead-letter target holds
        (:func:`fanout.deadletters.held.refused_rows_held`: 0 when it cannot tell, or
        there is none, or the read fails, logged: the batch then counts as part held)."""
        return refused_rows_held(self._dead, pipeline, name, (epoch, batch_id),
                                 secrets=self.secret_values(), logger=logger)  # fmt: skip

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
        ``False``)."""
        table = self._table
        if table is None:
            return None
        engine = self._engine()
        oids = f"the table OIDs its records of batch {batch_id} of epoch {epoch} name"
        with self._said_behind_migrations(engine, oids), engine.connect() as conn:
            if reflect(conn, table) is None:
                return None
            return self._replaced(conn, table, pipeline_scope(pipeline, epoch), batch_id)

    def _replaced(self, conn: Any, table: TableName, scope: str, batch_id: int) -> str | None:
        """Why ``table`` is not the one the batch's records name (:meth:`target_replaced`),
        logged; ``None`` when it is, or cannot tell."""
        mode: str = self.mode
        oids = target_oids(conn, self.state_schema, mode, scope, self.name, batch_id)
        if not oids:  # none: written in the other mode? (switched between runs)
            mode = self._other_mode(conn, scope, batch_id, said=False) or mode
            oids = target_oids(conn, self.state_schema, mode, scope, self.name, batch_id)
        now = current_oid(conn, table.quoted())
        gone = {p for p, oid in oids.items() if oid is not None and oid != now}
        if not gone:
            return None
        # the recorded table still there under the same name in another schema: the name
        # resolves to another table than it did (the search path changed), not a copy
        gone_oids = {oid for p, oid in oids.items() if p in gone and oid is not None}
        elsewhere = sorted(
            found for found in tables_now(conn, gone_oids).values() if _named(found) == table.name
        )
        if relation_bytes(conn, table.quoted()) > 0:
            if elsewhere:
                logger.warning(
                    "sink %r: table %s (OID %s) is not the table batch %d was written to, "
                    "%s, which is still there: the name %s resolves to another table than "
                    "then (the search path changed: the URL's options, or the role's or "
                    "database's search_path?); the sink writes into %s now",
                    self.name, table, now, batch_id, ", ".join(elsewhere), table.name, table,
                )  # fmt: skip
                return None
            logger.info(
                "sink %r: table %s (OID %s) is not the table batch %d was written to (OID "
                "%s), but holds rows (restored from a dump?): its records answer",
                self.name, table, now, batch_id,
                ", ".join(sorted({str(oids[p]) for p in gone})),
            )  # fmt: skip
            return None
        # their records name the table: moved, not created again? (an upsert's from 0008)
        moved = moved_marks(conn, self.state_schema, scope, self.name, batch_id,
                            table.quoted(), mode)  # fmt: skip
        if moved is not None:
            logger.warning(
                "sink %r: table %s (OID %s), empty, is not table %s (OID %d), which "
                "partition(s) %s of batch %d were written to: option 'table' moved since",
                self.name, table, now, moved.table, moved.oid, moved.partitions, batch_id,
            )  # fmt: skip
            return (
                f"partition(s) {', '.join(str(p) for p in moved.partitions)} of batch "
                f"{batch_id} were written to table {moved.table} (OID {moved.oid}; their "
                f"records in state_schema), and the sink's option 'table' names {table} "
                f"now (OID {now}), which holds no row: the table was moved, not created "
                f"again, and the batches written before stay in {moved.table}"
            )
        logger.warning(
            "sink %r: table %s (OID %s), empty, is not the table partition(s) %s of batch "
            "%d were written to (OID %s): renamed away or dropped, and created again since",
            self.name, table, now, sorted(gone), batch_id,
            ", ".join(sorted({str(oids[p]) for p in gone})),
        )  # fmt: skip
        return (
            f"table {table} has OID {now} now, not "
            f"{', '.join(sorted({str(oids[p]) for p in gone}))}, which partition(s) "
            f"{', '.join(str(p) for p in sorted(gone))} of batch {batch_id} were written to "
            f"(their records in state_schema), and holds no row: {REPLACED_UNDER_ITS_NAME} "
            "since (accepted, a batch the old table took whose ledger mark was lost is "
            "written whole into this one at its replay)"
            + (
                f"; or the search path changed (the URL's options, or the role's or "
                f"database's search_path): the table written to is {', '.join(elsewhere)}, "
                f"still there; set the search path back, or option table to it, and restart"
                if elsewhere else ""
            )
        )  # fmt: skip

    def _target_gone(self, conn: Any) -> bool:
        """Whether the table is missing (nothing created it since: :meth:`open` does not)."""
        return self._table is not None and reflect(conn, self._table) is None

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

    def harmless_rewrite(self) -> str | None:
        """Upsert without a dead-letter target: an ``INSERT ... ON CONFLICT DO UPDATE``
        that updates unconditionally, so a key holds the row written last, whatever
        offsets the new epoch's batch covers. Append, or any dead-letter target (its
        letters would be kept twice): ``None``."""
        if self.mode != "upsert" or self.dead_letter is not None:
            return None
        return "it upserts by key, without a dead-letter target: each key keeps its last row"

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

    def _refuse_other_route(self, conn: Any, batch: Batch) -> None:
        """Upsert: the kit's :func:`~fanout.partitioned.replay_route.check_routes` on the
        routes the batch's committed partitions recorded (one query), saying
        :data:`~fanout_postgres.membership.REWRITES`; first, from the same query, a
        :class:`~fanout.errors.SinkWriteError` when ``upsert_routes`` holds a later batch of
        the sink in the scope: the pipeline started again with a new ledger and checkpoint
        under the same name (docs/architecture.md §8.2, "A straggler of an earlier batch"),
        whose batches up to that one would put keys back to older values; or, the row
        :data:`~fanout_postgres.statements.EPOCH_FENCE`, a later epoch began writing the
        sink and this batch is of the query a checkpoint reset replaced."""
        scope = _scope(batch)
        routes, later = upsert_routes(conn, self.state_schema, scope, self.name, batch.batch_id)
        if not routes and later is None and self._vanished_unasked:  # with a dead_letter
            self._refuse_vanished_sink(conn, batch, self._vanished_unasked)
            self._vanished_unasked = ()  # spent once passed: a refused batch is asked again
        if later == EPOCH_FENCE:
            raise SinkWriteError(
                f"{self.state_schema}.upsert_routes records that a later epoch of pipeline "
                f"{batch.pipeline!r} began writing this sink since (a checkpoint reset was "
                f"accepted as a new epoch): batch {batch.batch_id} of epoch "
                f"{batch.info.epoch}, which Spark hands now, is of the query the reset "
                "replaced, still running, and would put keys of "
                f"{self._table} back to older values. Nothing was written; stop that "
                f"query. {FENCE_LEFT}"
                + lift_by_hand(repr(batch.pipeline), batch.info.epoch + 1, "restart this query.")
                + f" If {restarted(ledger_too=True)}: {RESTORE_OR_RENAME}, or delete "
                "the earlier run's records first: "
                f"{forget_routes_sql(self.state_schema, scope, self.name)}",
                sink=self.name,
                batch_id=batch.batch_id,
            )
        if later is not None:
            raise SinkWriteError(
                f"{self.state_schema}.upsert_routes records batch {later} of this sink "
                f"committed to {self._table} in pipeline {scope!r}, after batch "
                f"{batch.batch_id}, which Spark hands now. The sink writes its batches in "
                f"order and the ledger marks each before the next, so "
                f"{restarted(ledger_too=True)}, or another pipeline of that name writes this "
                f"sink. Nothing was written: batch {batch.batch_id} would put the keys of the "
                f"batches up to {later} back to older values. {RESTORE_OR_RENAME}, or delete "
                "the earlier run's records first: "
                f"{forget_routes_sql(self.state_schema, scope, self.name)}",
                sink=self.name,
                batch_id=batch.batch_id,
            )
        check_routes(routes, batch, sink=self.name, why=REWRITES)
        if routes:  # a replay: its letters replace the earlier attempt's (after_partitions)
            self._rewrites.add((_scope(batch), batch.batch_id))

    def partition_writer(self, batch: Batch, plan: PartitionPlan | None) -> PostgresPartitionWriter:
        """The batch's partition writer: the resolved URL, the write plan, and the batch
        (progress marks are keyed by the epoch's scope, like every idempotency record)."""
        fingerprint = None if plan is None else plan.fingerprint
        meta = BatchMeta(
            _scope(batch), batch.batch_id, batch.query_id, fingerprint, route_mark(batch),
            _kept_elsewhere(batch),
        )  # fmt: skip
        write_plan = self._plan(batch.df.schema, batch.batch_id)
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
                drop_stale(conn, dead.table, _scope(batch), self.name, batch.batch_id, kept)
            # the letters of the partitions an earlier target holds (the partitions skipped
            # them; none on the common path) replace its own there when it can take them
            # back (a Delta table): fanout.deadletters.moved
            refused = [as_letter(r, str(self._table)) for r in letters]
            replace_held(dead, batch, refused, source="refused")
        rewrite = (_scope(batch), batch.batch_id) in self._rewrites
        self._rewrites.discard((_scope(batch), batch.batch_id))
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

    # -- executor side ------------------------------------------------------------------

    def connection_url(self) -> Any:
        """The resolved SQLAlchemy URL (called on the executors)."""
        return self._url or pgurl.resolve_url(self.url, sink=self.name)

    # -- internals ----------------------------------------------------------------------

    def _error(self, message: str) -> ConfigurationError:
        where = f" (table {self._table})" if self._table is not None else ""
        return ConfigurationError(f"postgres sink {self.name!r}{where}: {message}")

    def _clean(self, exc: BaseException, *, one_line: bool = False) -> str:
        text = f"{type(exc).__name__}: {str(exc).strip()}"
        text = text.split("\n(Background on this error")[0]
        if one_line:  # libpq's hint is a second line, which `fanout validate` leaves out
            text = " ".join(line.strip() for line in text.splitlines() if line.strip())
        return redact(text, self.secret_values())

    def _check_options(self) -> None:
        try:
            self._url = pgurl.resolve_url(self.url, sink=self.name)
            pgurl.refuse_at_in_host(self._url)  # not "unreachable": an '@' to escape
            self._table = check_options(self)
        except ConfigurationError:
            raise
        except ValueError as exc:
            raise self._error(str(exc)) from None

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

    def close(self) -> None:
        """Dispose of the driver's engine (it holds no connection between uses)."""
        _, engine = self.__dict__.pop("_driver_engine", (None, None))
        if engine is not None:
            engine.dispose()

    def __getstate__(self) -> dict[str, Any]:
        """Pickles without the driver's engine (made again where it is used)."""
        return {k: v for k, v in self.__dict__.items() if k != "_driver_engine"}

    def _would_migrate(self, engine: Any, context: SinkContext) -> None:
        """Tell ``context`` the migration :meth:`open` would run (``migrate: true``)."""
        from fanout_postgres.migrate import current_revision, head_revision

        with engine.connect() as conn:
            current = current_revision(conn, self.state_schema)
        if current != head_revision():
            context.would(
                f"migrate fanout's state tables in schema {self.state_schema!r} from revision "
                f"{current or '(none)'} to {head_revision()}"
            )

    def _check_plan(self, spark_schema: Any) -> None:
        """:meth:`_plan`'s checks at :meth:`open` (a :class:`ConfigurationError`), a missing
        table described as it would be created, and nothing kept or created."""
        try:
            with self._engine().connect() as conn:
                info = self._target(conn, spark_schema, create=False)
                build_plan(info, self._plan_options(conn), spark_schema)
        except PlanError as exc:
            raise self._configured(exc) from None
        except Exception as exc:
            raise self._unchecked(exc, None) from None

    def _configured(self, exc: PlanError) -> ConfigurationError:
        """A plan refused at :meth:`open`, from option ``batch_schema``: before any batch."""
        return self._error(f"at configuration (option batch_schema): {exc}")

    def _require_migrated(self, engine: Any) -> None:
        problem = migration_problem(engine, self.state_schema, pgurl.display(self._url))
        if problem is not None:
            raise self._error(problem)

    def _check_target(self, info: TargetInfo | None) -> None:
        try:
            keys = check_target(info, self.keys, self.order_by, self.columns, self.mode,
                                create_table=self.create_table)  # fmt: skip
        except PlanError as exc:
            raise self._error(str(exc)) from None
        if keys is not None:
            self._keys = list(keys)
            logger.debug("sink %r: keys %s", self.name, keys)

    def _check_may_create(self, conn: Any) -> None:
        """At :meth:`open`, for a missing table ``create_table`` creates at the first write:
        its schema exists and the role may create tables there (what creating it at
        ``open()`` used to find out)."""
        table: TableName = self._table  # type: ignore[assignment]
        schema, role, allowed = conn.execute(
            _sa().text(
                "SELECT s, current_user, CASE WHEN to_regnamespace(quote_ident(s)) IS NULL "
                "THEN NULL ELSE has_schema_privilege(s, 'CREATE') END "
                "FROM (SELECT coalesce(CAST(:schema AS text), current_schema()) AS s) AS t"
            ),
            {"schema": table.schema},
        ).one()
        if allowed is None:
            where = (
                "the search path names no schema that exists"
                if schema is None
                else f"schema {schema!r} does not exist"
            )
            raise self._error(
                f"create_table: {where}, so table {table} cannot be created at the first "
                "batch; create the schema, or the table"
            )
        if not allowed:
            raise self._error(
                f"create_table: role {role!r} may not create tables in schema {schema!r}, "
                f"so table {table} cannot be created at the first batch; grant it (GRANT "
                f"CREATE ON SCHEMA {quote(schema)} TO {quote(role)}), or create the table"
            )

    def _check_rules(self, conn: Any) -> None:
        """At :meth:`open`: a table with ``ON INSERT`` or ``ON UPDATE`` rules is refused
        (:func:`_rules_problem`)."""
        problem = _rules_problem(conn, self._table)  # type: ignore[arg-type]
        if problem is not None:
            raise self._error(problem)

    def _plan(self, spark_schema: Any, batch_id: int | None) -> WritePlan:
        """The write plan of batches of ``spark_schema`` (cached per schema), the table
        created first when it is missing and ``create_table`` is on. ``batch_id`` is
        ``None`` at :meth:`open` (option ``batch_schema``): a mismatch is then a
        :class:`ConfigurationError`, else a :class:`SchemaMismatchError` of the batch.

        :meth:`open` plans only a table that exists (a missing one is checked as it would
        be created, :meth:`_check_plan`): it runs before the run's lost-target check
        (:meth:`holds_batch`), and a table it created would make the retry of a refused
        run find one, which the progress marks (they outlive the table) then say holds
        the batches. So the first batch's plan creates it, and no later one: a table
        dropped while the run writes it (no check runs between batches) fails the batch,
        and the restart's check refuses it, instead of being created again empty."""
        cache_key = spark_schema.json()
        plan = self._plans.get(cache_key)
        if plan is not None and (batch_id is None or self._checked.get(cache_key) == batch_id):
            return plan
        engine = self._engine()
        try:
            if plan is not None:
                with engine.connect() as conn:
                    self._recheck(conn, cache_key, batch_id)  # type: ignore[arg-type]
                plan = self._plans.get(cache_key)
                if plan is not None:
                    return plan
            with engine.begin() as conn:
                info = self._target(conn, spark_schema, create=self._unmade, describe=False)
                plan = build_plan(info, self._plan_options(conn), spark_schema)
                ruled = _rules_problem(conn, self._table)  # type: ignore[arg-type]
                if ruled is not None:  # a rule made since open(): the shape changed
                    raise PlanError(ruled)
                shape = _shape(conn, self._table)  # type: ignore[arg-type]
                types = {row[0]: row[1] for row in shape}
                plan = dataclasses.replace(
                    plan, column_types=tuple(types.get(t, "") for _, t in plan.columns)
                )
        except PlanError as exc:
            if batch_id is None:
                raise self._configured(exc) from None
            raise self._mismatch(exc, batch_id) from None
        except Exception as exc:
            raise self._unchecked(exc, batch_id) from None
        self._unmade = False  # there now: dropped later, it is not created again
        self._plans[cache_key] = plan
        self._shapes[cache_key] = shape
        if batch_id is not None:
            self._checked[cache_key] = batch_id
        return plan

    def _recheck(self, conn: Any, cache_key: str, batch_id: int) -> None:
        """At each batch: the table's columns (one catalog query) against those its cached
        plan was made on. A column altered (``ALTER TABLE ... TYPE``), added or dropped
        since drops the plan, and the batch is planned anew against the table as it is:
        binary COPY encodes each field for the planned type. The partition input
        :meth:`check_replay` made on the dropped plan is dropped with it."""
        if cache_key not in self._plans:
            return
        if _shape(conn, self._table) != self._shapes.get(cache_key):  # type: ignore[arg-type]
            logger.info(
                "sink %r, batch %d: table %s changed since its write plan was made; "
                "planning anew", self.name, batch_id, self._table,
            )  # fmt: skip
            del self._plans[cache_key]
            self.forget_replay_read()
            return
        self._checked[cache_key] = batch_id

    def check_schema(self, schema: pa.Schema) -> None:
        """Batches of the Arrow ``schema`` must fit the table: the checks of a batch's
        first arrival (:meth:`_plan`: every column in the table, of a type it takes without
        PostgreSQL rounding it, the NOT NULL columns and the keys written), raising the
        same :class:`SchemaMismatchError` without a batch id. Nothing is written: a missing
        table that ``create_table`` would create is checked as it would be created, and
        stays missing. Called by ``fanout validate`` after :meth:`open`."""
        from pyspark.sql.pandas.types import from_arrow_schema

        spark_schema = from_arrow_schema(schema)
        if spark_schema.json() in self._plans:
            return  # planned already, against the table as it is
        if self._url is None or self._table is None:  # open() failed, or was not called
            self._check_options()
        try:
            with self._engine().connect() as conn:
                info = self._target(conn, spark_schema, create=False)
                build_plan(info, self._plan_options(conn), spark_schema)  # not kept
        except PlanError as exc:
            raise self._mismatch(exc, None) from None
        except Exception as exc:
            raise self._unchecked(exc, None) from None

    def _target(
        self, conn: Any, spark_schema: Any, *, create: bool, describe: bool = True
    ) -> TargetInfo:
        """The table, reflected. When it is missing and ``create_table`` is on: created
        from ``spark_schema`` (``create``), or only described as it would be created
        (``describe``), else refused: it was there, or created, since :meth:`open`."""
        table: TableName = self._table  # type: ignore[assignment]
        info = reflect(conn, table)
        if info is None and self.create_table and (create or describe):
            pairs = map_columns(spark_schema.fieldNames(), self.columns)
            keys = self.keys or []
            if create:
                create_table(conn, table, spark_schema, pairs, keys)
                logger.info("sink %r: created table %s", self.name, table)
                info = reflect(conn, table)
            else:
                info = created_target(table, table_to_create(table, spark_schema, pairs, keys))
        elif info is None and self.create_table:
            raise PlanError(
                f"table {table} does not exist: dropped while the run wrote it? "
                "create_table creates a missing table only at a run's first write, after the "
                "check that the target still holds what the ledger marks written there; "
                "start the run again"
            )
        if info is None:
            raise PlanError(f"table {table} does not exist")
        return info

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

    def _plan_options(self, conn: Any) -> PlanOptions:
        dead = self._dead
        # the schema the name resolves to: the statements name it, so a temporary table
        # of the same name (first on the search path, like the staging table) cannot
        # take the rows
        schema = _resolved_schema(conn, self._table)
        table = dead.table if isinstance(dead, PostgresDeadLetters) else None
        return PlanOptions(
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
            schema=schema,
            # the dead-letter table as the driver created and reads it: a search_path in
            # option settings (the write connections') would otherwise find none, or another
            dead_letter_schema=_resolved_schema(conn, table),
        )

    def partition_failure(
        self, batch: Batch, failed: Sequence[PartitionOutcome], outcomes: Sequence[PartitionOutcome]
    ) -> SinkError:
        """A refused row names table, column, value and row; any other failure its
        partition and the server's message. Transient when every failure is."""
        self._direct.record(outcomes)
        return batch_error(self._table, failed, self.secret_values(), self.name, batch.batch_id)


REPLACED_UNDER_ITS_NAME = (
    "the table was renamed away, or dropped, and another created under its name"
)
"""What another OID under the sink's table name means: in the run start's lost-target
reason (:meth:`PostgresSink.target_replaced`) and the replay's refusal
(:meth:`PostgresSink._refuse_replaced`)."""


def _named(qualified: str) -> str:
    """The table's own name in ``qualified`` (a :meth:`TableName.quoted` of two parts)."""
    from fanout_postgres.identifiers import parse_table

    return parse_table(qualified).name


def _resolved_schema(conn: Any, table: TableName | None) -> str | None:
    """The schema ``table``, named without one, resolves to on the driver's connection (its
    URL's search path); ``None`` for a name with a schema, no table, or none found. One
    query, at a plan only."""
    if table is None or table.schema is not None:
        return None
    found = conn.execute(
        _sa().text(
            "SELECT n.nspname FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE c.oid = to_regclass(:table)"
        ),
        {"table": table.quoted()},
    ).scalar()
    return None if found is None else str(found)


def _shape(conn: Any, table: TableName) -> list[tuple[Any, ...]]:
    """The table's columns as the catalog has them now: name, type, NOT NULL, and on each
    row the count of its ``ON INSERT``/``ON UPDATE`` rules (:func:`_rules_problem`) and its
    unique indexes (:data:`_UNIQUE_INDEXES`: upsert keys must keep one)."""
    rows = conn.execute(
        _sa().text(
            "SELECT attname, format_type(atttypid, atttypmod), attnotnull, "
            f"(SELECT count(*) FROM pg_rewrite WHERE {_WRITE_RULES}), {_UNIQUE_INDEXES} "
            "FROM pg_attribute WHERE attrelid = to_regclass(:table) AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum"
        ),
        {"table": table.quoted()},
    )
    return [tuple(row) for row in rows]


UNREACHABLE_HINT = (
    "check the host and port in option 'url', and that the server runs and accepts "
    "connections from this machine"
)
REFUSED_HINT = (
    "the server refused the connection: check the user, password and database in option "
    "'url' (a password from ${VAR} is read from the environment), and the server's "
    "pg_hba.conf"
)


def _refused_login(error: BaseException) -> bool:
    from fanout_postgres.sqlstate import refused_login

    cause = getattr(error, "orig", None) or error
    return refused_login(cause) and getattr(cause, "pgcode", None) is None


_UNIQUE_INDEXES = (
    "(SELECT string_agg(x.indkey::text || CASE WHEN x.indimmediate THEN '' ELSE ' deferrable' "
    "END || CASE WHEN x.indpred IS NULL AND x.indexprs IS NULL THEN '' ELSE ' partial' END, "
    "'; ' ORDER BY x.indkey::text) FROM pg_index x "
    "WHERE x.indrelid = to_regclass(:table) AND x.indisunique)"
)
"""The table's unique indexes (their column numbers): one dropped or added since a plan was
made makes the batch planned anew, so that upsert keys that lost theirs are refused."""
_WRITE_RULES = "ev_class = to_regclass(:table) AND ev_type IN ('2', '3')"
"""``pg_rewrite`` rows of the table's ``ON UPDATE`` (2) and ``ON INSERT`` (3) rules."""


def _rules_problem(conn: Any, table: TableName) -> str | None:
    """Why a table with ``ON INSERT`` or ``ON UPDATE`` rules cannot be written: ``COPY``
    fires no rule while the ``INSERT`` a partition falls back to does, so whether a rule
    ran would depend on which path its rows took. ``None`` without such rules."""
    rules = conn.execute(
        _sa().text(
            "SELECT rulename, CASE ev_type WHEN '2' THEN 'UPDATE' ELSE 'INSERT' END "
            f"FROM pg_rewrite WHERE {_WRITE_RULES} ORDER BY rulename"
        ),
        {"table": table.quoted()},
    ).all()
    if not rules:
        return None
    named = ", ".join(f"{quote(name)} (ON {event})" for name, event in rules)
    return (
        f"the table has rule(s) {named}: the sink writes with COPY, which fires no rule, "
        "and falls back to INSERT, which does, so whether a rule ran would depend on the "
        "rows; replace the rule(s) with a trigger, which COPY fires too"
    )


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


def _scope(batch: Batch) -> str:
    return pipeline_scope(batch.pipeline, batch.info.epoch)


def _sa() -> Any:
    import sqlalchemy

    return sqlalchemy


def _held(committed: int, partitions: int | None) -> bool | PartlyHeld:
    """:meth:`PostgresSink.holds_batch`'s answer for ``committed`` of ``partitions``
    partitions (``None``: the records disagree on the count, or record none, so the whole
    cannot be told)."""
    if committed == 0:
        return False
    if partitions is not None and committed >= partitions:
        return True
    return PartlyHeld(committed, partitions)
