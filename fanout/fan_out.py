"""``FanOut``: the foreachBatch callable that routes each micro-batch to every sink.

:meth:`FanOut.process` reads as the steps of a batch (docs/architecture.md §2), each one
named piece in :mod:`fanout.steps` or :mod:`fanout.routes`, all sharing one
:class:`fanout.steps.state.BatchState`, once the batch passed the stop gate
(:mod:`fanout.steps.stop_gate`: a batch Spark begins after :meth:`FanOut.request_stop` is
refused before anything):

1. context (:mod:`fanout.steps.context`): query id, offsets, planning time; then, beside
   the steps below, the shuffle of the group that shared a job over the last batch is
   started (:mod:`fanout.steps.shared_frame`);
2. guard (:mod:`fanout.steps.admit`): refuse a reset or rolled-back checkpoint; 2b, once
   per run, the targets' checks (:mod:`fanout.dispatch.targets`);
3. plan (:mod:`fanout.steps.plan`): the sinks whose ledger mark is behind the batch; 3c,
   a replayed batch a sink cannot prove it holds refused (:mod:`fanout.dispatch.attempts`);
4. partition (:mod:`fanout.steps.partition`) once for the sinks hashing the batch alike,
   persist (:mod:`fanout.steps.persist`), then routes (:mod:`fanout.routes.batch_routes`):
   what each pending sink receives, rows failing a route set aside before any write;
5. write (:mod:`fanout.steps.write`): every pending sink, in parallel, with retries;
6. record (:mod:`fanout.steps.record`): each sink's ledger mark, right after its write;
7. settle (:mod:`fanout.dispatch.settle`): release the batch's caches, tell the observers,
   raise if a sink failed.

What ``FanOut`` does besides the batches lives in :mod:`fanout.dispatch`, one collaborator
per group (building and opening the sinks, closing them, the targets' checks, the catch-up
calls, a stop asked under Spark Connect); ``FanOut`` builds them and wires them together.
"""

from __future__ import annotations

import atexit
import logging
import os
import time
import weakref
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from functools import partial
from typing import Any, Literal

from fanout.contract.batch import BatchInfo
from fanout.contract.lag import SinkBehind, SinkLag
from fanout.contract.locations import command_location
from fanout.contract.names import check_name
from fanout.contract.sessions import is_connect
from fanout.contract.sink import Sink, SinkResult
from fanout.deadletters.delta import refuse_shared_tables, table_roles
from fanout.deadletters.moved import TargetMoves
from fanout.dispatch.arguments import check_accepted, check_arguments, check_reset_choice
from fanout.dispatch.attempts import Attempts
from fanout.dispatch.backlog import Backlog
from fanout.dispatch.closing import SinkCloser
from fanout.dispatch.letters import Letters
from fanout.dispatch.opening import SinkOpener, build_specs, resolve_dead_letters
from fanout.dispatch.secrets import gathered, ledger_secrets, sink_option_secrets
from fanout.dispatch.settle import announce, read_as_given, report, rows_in, settle
from fanout.dispatch.stopping import ask_server_to_stop, closed_here, trigger_ended
from fanout.dispatch.targets import TargetChecks
from fanout.errors import ConfigurationError
from fanout.hooks.caller import HookCaller
from fanout.hooks.registry import load_registry, resolve_plugins
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import Ledger, ledger_key, ledger_location
from fanout.observe.logs import batch_fields, register_secrets
from fanout.observe.secrets import location_secrets, redact_printed
from fanout.recipe import Recipe
from fanout.retry import RetryPolicy
from fanout.routes.batch_routes import BatchRoutes
from fanout.sink_spec import SinkSpec, check_exclusive_resources
from fanout.steps.admit import Admission
from fanout.steps.catchup import CatchUp
from fanout.steps.context import ContextReader
from fanout.steps.gaps import refuse_gaps
from fanout.steps.lag import Lagging
from fanout.steps.lag_reopen import LateHook, ReopenHooks
from fanout.steps.lag_state import Refusal
from fanout.steps.lag_steps import (
    backfill_sources,
    check_spool,
    check_spooled_sinks,
    hold_back,
    spool_for_lagging,
    start_spooling,
    warn_given_up,
    warn_left_out,
)
from fanout.steps.owners import claim as claim_sinks
from fanout.steps.persist import prepare_reads
from fanout.steps.plan import plan
from fanout.steps.record import Recorder
from fanout.steps.refused import PreWrite
from fanout.steps.replay import RunMemory, batch_call, warn_built_in_batch
from fanout.steps.replay_lag import SpooledReplays
from fanout.steps.shared_frame import RecentLayouts
from fanout.steps.source_fit import refuse_unfit
from fanout.steps.state import BatchState
from fanout.steps.stop_gate import StopGate, stop_asked_by_client
from fanout.steps.timeout import AbandonedWrites
from fanout.steps.worker_end import call_entered, call_left
from fanout.steps.worker_end import watch as close_when_spark_ends_process
from fanout.steps.write import write_all

log = logging.getLogger("fanout")


class FanOut:
    """Route every micro-batch of one streaming query to many sinks, exactly once.

    Use it as the foreachBatch function::

        fan = FanOut(pipeline="orders", ledger="/data/_fanout/ledger", sinks=[...])
        fan.check_source(df)  # each sink's route, keys and schema against df's columns
        df.writeStream.foreachBatch(fan).option("checkpointLocation", ckpt).start()

    :param pipeline: a stable name; part of every sink's transaction id. Changing it makes
        every sink start afresh.
    :param ledger: the ledger's Delta table path (a ``str`` or a ``pathlib.Path``), or a
        :class:`fanout.ledger.entry.Ledger`.
    :param sinks: sink configurations (``{"type": ..., "name": ..., **options}``),
        :class:`fanout.Sink` instances, or :class:`fanout.sink_spec.SinkSpec`; names must be
        unique. A dict may also hold ``where`` (SQL predicate), ``select`` (columns or SQL
        expressions), ``retries`` and ``backoff_s``, which fanout applies around the sink.
        Rows failing a sink's ``where``/``select`` go to its dead-letter target, if it has
        one (its ``dead_letter`` option: :mod:`fanout.deadletters.target`), else the sink
        fails the batch.
    :param parallelism: how many sinks are written at once (default: all pending).
    :param retries: further attempts for a sink's transient errors.
    :param backoff_s: the wait before the first retry, doubled each time (with jitter).
    :param plugins: extra plugins besides the installed ones (observers, modules of sink
        types not installed): each an object or module implementing fanout's hooks, or a
        module's importable name (``"my_sinks"``), imported here
        (:func:`fanout.hooks.registry.plugin_object`: from ``sys.path``, the working
        directory added; one that does not import raises
        :class:`fanout.errors.PluginLoadError` naming it and its import error).
    :param checkpoint_location: the query's checkpoint, if fanout cannot find it itself.
    :param spark: the SparkSession, handed to sinks' ``open`` (default: the active one).
    :param spool: where the batches a lagging sink still needs are kept (a directory for
        two Delta tables fanout owns); required as soon as a sink has
        ``on_failure="lag"`` or ``backfill_from`` (docs/architecture.md §14).
    :param probe_interval_s: how long a lagging sink waits between catch-up attempts
        while it keeps failing.
    :param share_tasks: sinks writing from the executors that fit together (sinks of the
        partitioned-sink kit hashing the batch alike, and a Delta append, which takes any
        partitioning) write their first attempt in one Spark job, each partition's task
        handing the rows to every such sink's writer (one read of the batch for all of
        them; docs/architecture.md §3.4). ``False``: each sink runs its own job.
    :param on_checkpoint_reset: ``"refuse"`` (default): a lost or replaced checkpoint
        raises :class:`fanout.CheckpointResetError`. ``"new_epoch"``: continue under a new
        epoch, whose transaction ids are new, so every batch of the new query is written
        even where it repeats input the sinks already hold. Choose it only when the new
        checkpoint starts where the old one ended (``fanout recover`` prints the offsets).
        A rolled-back checkpoint (same query id, batches planned again) is always refused
        with :class:`fanout.CheckpointRollbackError`.
    :param pipeline_file: the pipeline file this ``FanOut`` is built from (``fanout run``
        gives it): the ``fanout ledger skip`` a :class:`fanout.MissedBatchesError` names
        then carries ``--config`` with its absolute path, so the skip checks the sink's
        ``backfill_from`` source too. Without it (a ``FanOut`` built in Python) the command
        has no ``--config``.
    :param accept_lost_targets: sinks whose target may have lost batches the ledger marks
        written there (deleted or replaced, and created again): this run writes on into
        them instead of refusing its first batch with :class:`fanout.TargetLostError`
        (``fanout run --accept-lost-target SINK``; a sink with ``on_failure="lag"`` is not
        refused but lags with that error, its batches spooled: accepted, its catch-up
        writes them). This ``FanOut`` only.

    Building a ``FanOut`` loads the plugins, builds and opens every sink and creates the
    ledger, so configuration errors surface here, before the stream starts; one that fails
    closes the sinks it opened before raising. The mistakes only the source's columns
    show (a misspelt column in a route or in ``keys``) surface at :meth:`check_source`.
    A :class:`fanout.Sink` object serves one ``FanOut`` at a time: given one that another
    ``FanOut`` still holds (not closed), it raises :class:`fanout.ConfigurationError`
    before opening anything.

    A ``FanOut`` pickles as its configuration (:class:`fanout.recipe.Recipe`): under Spark
    Connect it is pickled on the client and built again, sinks opened again, on the first
    batch it receives beside the server, with that batch's session. There fanout cannot ask
    Spark for the query's checkpoint: pass ``checkpoint_location`` (docs/architecture.md §15).
    """

    def __init__(
        self,
        pipeline: str,
        ledger: str | os.PathLike[str] | Ledger,
        sinks: Sequence[Mapping[str, Any] | Sink | SinkSpec],
        *,
        parallelism: int | None = None,
        retries: int = 2,
        backoff_s: float = 1.0,
        plugins: Iterable[object] = (),
        checkpoint_location: str | None = None,
        spark: Any = None,
        on_checkpoint_reset: Literal["refuse", "new_epoch"] = "refuse",
        spool: str | os.PathLike[str] | None = None,
        probe_interval_s: float = 10.0,
        share_tasks: bool = True,
        pipeline_file: str | None = None,
        accept_lost_targets: Collection[str] = (),
    ) -> None:
        # first: a batch planned before this moment is a replay of an earlier run's; one
        # unpickled (Spark Connect) was born when the server's worker loaded it
        fresh = "_runs" not in self.__dict__
        if fresh:
            self._runs = RunMemory.now()
        ledger = os.fspath(ledger) if isinstance(ledger, os.PathLike) else ledger
        spool = os.fspath(spool) if isinstance(spool, os.PathLike) else spool
        # a password in a location is masked in every redacting log handler and error, as
        # a sink's are (the checkpoint's shows in guard and recover messages, the trace file)
        register_secrets(location_secrets([checkpoint_location, spool]) + ledger_secrets(ledger))
        self._recipe = Recipe.of(
            pipeline, ledger, sinks,
            dict(parallelism=parallelism, retries=retries, backoff_s=backoff_s,
                 plugins=tuple(plugins), checkpoint_location=checkpoint_location,
                 on_checkpoint_reset=on_checkpoint_reset, spool=spool,
                 probe_interval_s=probe_interval_s, share_tasks=share_tasks,
                 pipeline_file=pipeline_file,
                 accept_lost_targets=tuple(accept_lost_targets)),
        )  # fmt: skip
        plugins = self._recipe.options["plugins"]
        self.pipeline = check_name(pipeline, "pipeline")
        self.stop_gate = StopGate(self.pipeline)
        """Closed by :meth:`request_stop`: a batch Spark begins afterwards is refused."""
        self._other_runs_stops: set[str] = set()  # Connect: stop requests of other runs
        check_arguments(
            self.pipeline, ledger, parallelism=parallelism, retries=retries,
            backoff_s=backoff_s, probe_interval_s=probe_interval_s, share_tasks=share_tasks,
        )  # fmt: skip
        check_reset_choice(pipeline, on_checkpoint_reset)
        self.on_checkpoint_reset = on_checkpoint_reset
        self.parallelism = parallelism
        self.share_tasks = share_tasks
        self.pipeline_file = None if pipeline_file is None else command_location(pipeline_file)
        """The pipeline file, absolute, as the commands fanout prints name it."""
        self._layouts = RecentLayouts()  # each shared job's input, guessed for the next batch
        self.retry = RetryPolicy(retries=retries, backoff_s=backoff_s)
        self._plugins = resolve_plugins(plugins)  # a module's name imported
        registry = load_registry(self._plugins)
        registry.raise_load_errors()
        self.hooks = HookCaller(registry.manager)
        self.specs = build_specs(self.pipeline, registry, sinks, self.retry)
        check_accepted(pipeline, accept_lost_targets, self.specs)
        self._accept_lost = frozenset(accept_lost_targets)
        check_exclusive_resources(self.pipeline, (spec.sink for spec in self.specs.values()))
        self.sinks: dict[str, Sink] = {name: spec.sink for name, spec in self.specs.items()}
        kinds = registry.dead_letter_kinds()
        self._kinds = kinds
        # a password or token in a sink's location (its dead_letter, any other option) is
        # the pipeline's too, whatever the sink declares
        letters = sink_option_secrets(sinks, self.sinks.values())
        self._location_secrets = [*location_secrets([checkpoint_location, spool]),
                                  *ledger_secrets(ledger), *letters]  # fmt: skip
        register_secrets(letters)
        self.dead_letters = resolve_dead_letters(self.sinks, kinds, letters)
        self.ledger: Ledger = DeltaLedger(ledger) if isinstance(ledger, str) else ledger
        self._admission = Admission(
            self.ledger, on_checkpoint_reset, self._refuse_unmarked, self._lift_fences
        )
        # a batch refused before writing; born with the run memory (before a lazy FanOut's
        # forgets its birth below: still a bound of the batches this process planned)
        self._refusals = PreWrite(self.ledger, self.pipeline, self._runs.born_ms)
        self.secrets: tuple[str, ...] = gathered(self._location_secrets, self.sinks.values())
        """Every secret this pipeline knows (its locations' passwords and secret query
        values, a location among its sinks' options included, a ledger object's location
        and storage credentials, its sinks' :meth:`fanout.Sink.secret_values`):
        what it writes to the ledger and the errors it raises (an ``open``'s too) are masked
        of all of them, not of the failing sink's only. Gathered again once the sinks are
        opened (a sink's ``open`` may fetch a credential: a token, a vault's password), and
        when a sink that could not be opened at the start is.
        The process-wide registry (:func:`fanout.observe.logs.register_secrets`) serves the
        log handlers and the CLI, and holds other pipelines' secrets too."""
        register_secrets(self.secrets)  # a sink's open error may quote one opened after it
        self._context = ContextReader(self.pipeline, checkpoint_location)
        self.spool = check_spool(self.pipeline, self.specs, spool, ledger_location(self.ledger))
        refuse_shared_tables(
            self.pipeline,
            table_roles(
                getattr(self.ledger, "path", None),
                None if self.spool is None else self.spool.path,
                self.sinks,
                self.dead_letters,
            ),
        )
        # what the start found, handed to Lagging, which holds each sink's state from then on
        self._opener = SinkOpener(
            self.pipeline, self.specs, self.dead_letters, self.ledger, self._plugins,
            checkpoint_location=self._context.checkpoint_location, accept_lost=self._accept_lost,
            location_secrets=self._location_secrets, secrets=self.secrets,
        )  # fmt: skip
        self._closer = SinkCloser(self, self.pipeline, self.specs)
        self._closed = False
        claim_sinks(self, self.pipeline, list(self.sinks.values()))
        try:
            self._start(spark, probe_interval_s)
        except BaseException:
            self._release_start()
            raise
        if fresh and (inside := batch_call(self._spark)) is not None:
            self._runs.born_ms = None  # after its run planned the batch: its own attempts only
            warn_built_in_batch(self.pipeline, inside)

    def _start(self, spark: Any, probe_interval_s: float) -> None:
        """Open the ledger and the sinks, and start what runs beside the batches: the
        part of ``FanOut(...)`` that acquires what :meth:`_release_start` releases when it
        fails."""
        try:
            self._spark = self._opener.open(spark)
        finally:  # gathered again after each sink opened: a failed start's too
            self.secrets = self._opener.secrets
        self.secrets = gathered(self._location_secrets, self.sinks.values())
        register_secrets(self.secrets)
        self._record = Recorder(self.ledger, self.retry, self.secrets)
        # each sink's earlier dead-letter targets that may hold letters of a batch it has
        # not marked (fanout.deadletters.moved); a changed target recorded
        moves = TargetMoves.open(self.ledger, self.pipeline, self.sinks)
        self._letters = Letters(self.dead_letters, self.sinks, self._kinds, moves, self.ledger)
        # the target checks and the catch-up read the lag state, so are built after it:
        # their hooks are filled once they are, before the first reopen may call them (a
        # reopen still_opening starts below may end before the catch-up is built: it wakes
        # nothing then)
        ask_target = LateHook[[str], Refusal | None]("the target checks' ask_reopened")
        ask_again = LateHook[[str], bool]("the target checks' reopen_stale")
        wake = LateHook[[], None]("the catch-up's wake", before=lambda: None)
        self.lagging = Lagging(
            self.pipeline,
            self.specs,
            self.ledger,
            self.spool,
            backfill_sources(self.pipeline, self.specs),
            unopened=self._opener.unopened,
            secrets=self.secrets,
            reopen_hooks=ReopenHooks(
                ask_target=ask_target,
                ask_again=ask_again,
                regather=self._regather_secrets,
                on_released=self._closer.released_by_thread,
                on_reopened=wake,
            ),
        )
        self._targets = TargetChecks(
            self.pipeline, self.ledger, self.specs, self.sinks, self.spool, self.lagging,
            accepted=self._accept_lost, pipeline_file=self.pipeline_file,
        )  # fmt: skip
        ask_target.fill(self._targets.ask_reopened)
        ask_again.fill(self._targets.reopen_stale)
        for name, opening in self._opener.opening.items():
            self.lagging.still_opening(name, opening)
        if self.lagging.sinks:  # a backfill reads every epoch through the current one, also
            # when no batch runs (an available_now run finding no new data); a batch of an
            # older epoch Spark never committed is given up (Lagging.abandoned)
            self.lagging.saw_marks(self.ledger.lookup(self.pipeline, []).epoch, None)
        self._admission.guard.spooled = self.lagging.spooled_through
        if self.spool is not None:  # the refusals' `fanout recover` reads it too
            self._admission.guard.spool_location = command_location(self.spool.path)
        self._admission.guard.pipeline_file = self.pipeline_file
        self.abandoned = AbandonedWrites.of(self.pipeline, ledger_key(self.ledger))
        """Writes abandoned at their sink's ``write_timeout_s``, while they run (those of
        an earlier FanOut of the pipeline in this process too)."""
        self.catchup = CatchUp(
            self.lagging, self.specs, self._record, self.hooks, self._letters.target,
            self._spark, probe_interval_s, ledger_location(self.ledger),
            pipeline_file=self.pipeline_file, abandoned=self.abandoned,
            earlier_of=self._letters.earlier, replays=self._spooled_replays(),
        )  # fmt: skip
        self._attempts = Attempts(
            self.pipeline, self._runs, self._refusals, self.ledger, self.specs, self.lagging,
            self._record, self.spool, accepted=self._accept_lost,
            pipeline_file=self.pipeline_file,
        )  # fmt: skip
        self._backlog = Backlog(
            self.pipeline, self.lagging, self.catchup, self.specs, self.ledger, self.spool,
            retry=self.retry, context=self._context, spark=self._spark, targets=self._targets,
        )  # fmt: skip
        self.abandoned.on_done = self.catchup.wake
        wake.fill(self.catchup.wake)
        if self.spool is not None:
            self.spool.open()
            check_spooled_sinks(
                self.pipeline, self.specs, self.spool, self.lagging.needs,
                ledger_location(self.ledger),
            )  # fmt: skip
        # last of what can refuse the setup: a FanOut that fails to start leaves the one
        # before it running; first of what releases the spool, which the one before must
        # no longer do beside this one
        if self.lagging.sinks:
            self.catchup.take_over()
        if self.spool is not None:
            self.lagging.release_held()  # batches caught up by a run that died before
            self.lagging.release_orphans()
            kept = self.lagging.kept_given_up()
            given_up = {(sink, b.key) for (sink, _), batches in kept.items() for b in batches}
            where = ledger_location(self.ledger)
            warn_left_out(self.pipeline, self.specs, self.spool, where, given_up)
            warn_given_up(self.pipeline, kept, self.spool, where)

    def _spooled_replays(self) -> SpooledReplays:
        """What the catch-up asks a sink about a batch spooled for it from a replay
        (:mod:`fanout.steps.replay_lag`)."""
        spool = None if self.spool is None else command_location(self.spool.path)
        return SpooledReplays(
            self.specs,
            self.ledger,
            self._accept_lost,
            ledger_location(self.ledger),
            spool,
            self.pipeline_file,
        )

    def _release_start(self) -> None:
        """``FanOut(...)`` failed: release what it acquired before the error, which its
        caller raises unchanged (:meth:`SinkCloser.release_start
        <fanout.dispatch.closing.SinkCloser.release_start>`)."""
        self._closed = True
        self._closer.release_start(
            self.__dict__.get("catchup"),
            self.__dict__.get("lagging"),
            self._opener.opened,
            self._opener.opening,
            lambda: Lagging(
                self.pipeline, self.specs, self.ledger, self.spool,
                unopened=self._opener.unopened, secrets=self.secrets,
                reopen_hooks=ReopenHooks(on_released=self._closer.released_by_thread),
            ),
        )  # fmt: skip

    def _regather_secrets(self) -> None:
        """:attr:`secrets` gathered again once a sink that could not be opened at the start
        is (its ``open`` may have fetched a credential), for the ledger rows, lag errors and
        errors raised from now on (one reference replaced: a thread reading the old set
        reads it whole)."""
        secrets = gathered(self._location_secrets, self.sinks.values())
        if secrets == self.secrets:
            return
        register_secrets(secrets)
        self.secrets = self._record.secrets = self.lagging.secrets = secrets

    def check_source(self, df: Any) -> None:
        """Check every sink against the DataFrame it will be handed, before the stream
        starts: the checks ``fanout run`` makes before it starts its query, the same code
        (:func:`fanout.steps.source_fit.refuse_unfit`). Each opened sink's route
        (``where`` / ``select``) resolves against ``df``'s columns, its target takes the
        routed schema (:meth:`fanout.Sink.check_schema`: a ``keys`` column the rows lack, a
        type the target cannot hold), and the columns it needs stable
        (:meth:`fanout.Sink.deterministic_columns`) are not computed with ``rand()``,
        ``uuid()``... in ``df``'s plan. Call it between ``FanOut(...)`` and ``start()``::

            fan = FanOut(pipeline="orders", ledger=..., sinks=[...])
            fan.check_source(df)  # a misspelt column raises here, not at batch 0
            df.writeStream.foreachBatch(fan).option("checkpointLocation", ckpt).start()

        Without it such a mistake fails its sink at the first batch, after the query
        started, made its checkpoint, and the other sinks wrote the batch.

        Reads ``df``'s schema and analyzed plan only (nothing runs; under Spark Connect the
        client asks the server to analyze the plan) and writes nothing: no ledger entry, no sink
        written to, no sink opened but those ``FanOut(...)`` opened. A sink
        ``FanOut(...)`` could not open (``on_failure="lag"``, its target unreachable) is
        not checked: its first batch checks it once it opens. A sink type without
        ``check_schema`` is checked only for the columns Arrow cannot hold.

        :param df: the streaming DataFrame (or a static one of the same columns) whose
            batches this ``FanOut`` will receive.
        :raises ConfigurationError: listing every sink that cannot take ``df``'s rows,
            each line naming the sink, the expression or option, and the column; this
            ``FanOut`` stays open (close it, or build it again once the mistake is fixed).
        """
        try:
            refuse_unfit(self.specs, df, unopened=self.unopened, pipeline_file=self.pipeline_file)
        except ConfigurationError as exc:
            masked = redact_printed(str(exc), self.secrets)
            if masked == str(exc):
                raise
            raise ConfigurationError(masked) from None

    @property
    def unopened(self) -> tuple[str, ...]:
        """The sinks (``on_failure="lag"``) whose ``open()`` could not reach their target:
        they start behind, opened again by the catch-up."""
        return tuple(self.lagging.not_opened())

    def close(self) -> None:
        """Stop the catch-up and close every sink this ``FanOut`` opened (call it when the
        query has stopped).
        A write abandoned at its ``write_timeout_s`` and still running is waited for at
        most :data:`fanout.steps.timeout.CLOSE_WAIT_S` (its Spark jobs cancelled again),
        then named in the log: one whose Python code still runs is left running and its
        sink left open, closed by a daemon thread once the write has ended (the sink is
        owned by this FanOut until then); one that returned, its cancelled Spark tasks not
        ended yet, has its sink closed. A lag sink whose reopen (its ``open()`` and check)
        still runs in its thread is closed by that thread once it returns (closed here,
        before the open returned, it would be left open); one whose ``open()`` failed is
        not closed.
        Closes once: a second call does nothing. The sink objects may then serve another
        ``FanOut`` (one a reopen's thread or an abandoned write still holds once closed)."""
        if self.__dict__.get("_closed", True):  # closed, or unpickled and never built
            return
        self._closed = True
        self._closer.close(self.catchup, self.lagging, self.abandoned)

    def __enter__(self) -> FanOut:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- pickled as configuration ------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        """Only the recipe travels (no lock, pool, thread, connection or session)."""
        self._recipe.check_picklable()
        return {"_recipe": self._recipe}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """The recipe, built on the first batch with its session; born now (under Spark
        Connect the server's worker unpickles it at the query's setup, before the run
        plans a batch: :mod:`fanout.steps.replay`)."""
        self.__dict__.update(state)
        self._runs = RunMemory.now()

    def _build(self, spark: Any) -> None:
        recipe = self._recipe
        self.__init__(  # type: ignore[misc]
            recipe.pipeline, recipe.ledger, recipe.sinks, spark=spark, **recipe.options
        )
        # no one holds this FanOut to close it (the client's is another object): closed by
        # __call__ when a batch fails (the query ends; so does the Connect server's
        # foreachBatch process) and at a normal exit of that process (§15)
        self._built_here = True
        atexit.register(_close_at_exit, weakref.ref(self))
        close_when_spark_ends_process(self)  # Connect's worker: SIGTERM closes it (§15)

    # -- the foreachBatch entry point -------------------------------------------------

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        """Handle one micro-batch; Spark calls this with the batch DataFrame and its id.

        Once :meth:`request_stop` was called, raises :class:`fanout.StopRequestedError`
        before doing anything of the batch (Spark then runs it again at the next start).
        A ``FanOut`` built here from its pickle (under Spark Connect, beside the server)
        closes itself before an error leaves this call: its query ends with it."""
        try:
            call_entered()  # from here a SIGTERM unwinds this call, never closes (worker_end)
            if "_context" not in self.__dict__:  # unpickled: build the pipeline here
                self._build(getattr(batch_df, "sparkSession", None))
            info: BatchInfo | None = None
            first = False
            self._refusals.entering()
            try:
                if (
                    is_connect(batch_df)
                    and not self.stop_gate.closed
                    and stop_asked_by_client(
                        batch_df,
                        self.pipeline,
                        self._context.checkpoint_location,
                        self._other_runs_stops,
                    )
                ):  # a Connect client's request_stop(query): its gate is not this one
                    self.stop_gate.close()
                self.stop_gate.enter(batch_id)  # refused once a stop was requested
                try:
                    self._refuse_if_closed_here(batch_id)
                    info = self._context.read(batch_df, batch_id)  # 1. context
                    first = self._attempts.first(info)  # as it enters: a replay check marks it
                    self.process(batch_df, info)
                finally:
                    self.stop_gate.leave()
            except BaseException as error:
                self._left_refused(batch_df, batch_id, info, first, error)
                self._close_if_built_here(batch_id)
                raise
        finally:
            call_left()

    def _left_refused(
        self, batch_df: Any, batch_id: int, info: BatchInfo | None, first: bool,
        error: BaseException,
    ) -> None:  # fmt: skip
        """An attempt leaves :meth:`__call__` with ``error``: record it in the ledger when
        it was refused before any sink write (:mod:`fanout.ledger.refusals`), bounded in
        time (:meth:`PreWrite.left`). A batch refused before its context was read (the
        stop gate, a closed FanOut) reads its planning time then."""
        read: Callable[[], BatchInfo | None] | None = None
        if info is None:  # here: Spark's local properties are the batch thread's
            read = self._refusals.context(self._context, batch_df, batch_id)

        def attempt() -> tuple[BatchInfo | None, bool]:
            if read is None:
                return info, first
            found = read()
            return found, found is not None and self._attempts.first(found)

        self._refusals.left(batch_id, error, attempt)

    def _close_if_built_here(self, batch_id: int) -> None:
        """Close a ``FanOut`` built from its pickle (:meth:`_build`) whose batch failed or
        was refused: its query ends with the error, and nothing else would close it. A
        failing close is logged, not raised: the batch's own error goes back to the query
        (a refusal must still read as a stop)."""
        if self.__dict__.get("_built_here", False) and not self._closed:
            self._closed_at = batch_id
            try:
                self.close()
            except Exception:
                log.exception(
                    "pipeline %s, batch %s: this FanOut (built from its pickle) could not be "
                    "closed after the batch failed; the batch's own error goes back to the query",
                    self.pipeline, batch_id, extra=batch_fields(self.pipeline, batch_id),
                )  # fmt: skip

    def _refuse_if_closed_here(self, batch_id: int) -> None:
        """Refuse a batch handed to a ``FanOut`` built from its pickle that a failed batch
        closed (:func:`fanout.dispatch.stopping.closed_here`)."""
        failed = self.__dict__.get("_closed_at")
        if failed is not None:
            raise closed_here(self.pipeline, batch_id, failed)

    def request_stop(self, query: Any = None) -> int | None:
        """Ask this ``FanOut`` to run no further batch, before stopping its query
        (``fanout run`` does on SIGINT/SIGTERM): each batch Spark begins from now on is
        refused with :class:`fanout.StopRequestedError` before anything of it is done, so
        Spark's ``query.stop()``, which interrupts the batch it runs, never interrupts one
        of fanout's. Returns the batch inside the foreachBatch call now (``None``: none),
        which goes on: wait for it (``stop_gate.wait_empty``) before ``query.stop()``, or
        call :meth:`stop_query`, which does both. A ``FanOut`` never asked behaves as before.

        Under Spark Connect the batches run in the ``FanOut`` built beside the server, which
        this one's gate does not reach: pass the streaming ``query`` this ``FanOut`` runs
        in. The request then goes to the server's ``FanOut`` through a session option of the
        query's session (``fanout.stop.<pipeline>`` = the query's run id), read as each batch
        enters; it names this run only, so the next start runs. Returns ``None`` (the client
        cannot see the batch inside): :meth:`stop_query` waits for the query's trigger
        instead. Raises :class:`fanout.ConfigurationError` under Spark Connect without
        ``query``, rather than doing nothing, and when the option cannot be set (the query
        shows no session, or the server refuses the option), naming what to do instead."""
        inside = self.stop_gate.close()
        spark = self.__dict__.get("_spark")
        if not is_connect(query) and not (query is None and is_connect(spark)):
            return inside
        ask_server_to_stop(self.pipeline, query)
        return None

    def stop_query(self, query: Any, timeout_s: float = 300.0) -> bool:
        """Stop ``query``, the streaming query this ``FanOut`` runs in, without interrupting
        a batch of fanout's: :meth:`request_stop`, then wait up to ``timeout_s`` for the
        batch in flight to end, then ``query.stop()``. Classic mode and Spark Connect alike
        (under Connect it waits for the query's trigger to be inactive: a batch that had
        entered the call before the request keeps the trigger active until it ends).

        Returns ``True`` once the query is stopped so; ``False`` when a batch still ran at
        the deadline: the query is left running (``query.stop()`` now would interrupt that
        batch — under Connect, kill the process it runs in —; exactly-once holds, and the
        batch runs again at the next start). A batch Spark began after the request was
        refused: the query's exception is then :class:`fanout.StopRequestedError`'s, which
        is part of a clean stop (that batch runs at the next start), though
        ``query.awaitTermination()`` raises it: :func:`fanout.is_stop_refusal` tells it from
        a failure."""
        started = time.monotonic()
        self.request_stop(query)
        if is_connect(query):
            if not trigger_ended(query, started, timeout_s):
                return False
        elif not self.stop_gate.wait_empty(timeout_s):
            return False
        query.stop()
        return True

    def process(self, df: Any, info: BatchInfo) -> dict[str, SinkResult]:
        """Fan one batch out; returns the result of every sink written in this call.

        Raises :class:`fanout.CheckpointResetError` when the checkpoint was reset,
        :class:`fanout.CheckpointRollbackError` when it was rolled back and
        :class:`fanout.BatchFailedError` when any sink failed after its retries.
        """
        info = self._runs.told(info)  # replayed: fanout.steps.replay
        if self.share_tasks:  # the shared job's scan starts now, beside the steps below
            self._layouts.start_ahead(df)
        state: BatchState | None = None
        try:
            self._refusals.admitting()  # a refusal of the guard step: no refused row
            state = self._admission.admit(df, info, self.sinks)  # 2. guard
            self._refusals.admitted(state.info.epoch)
            return self._process(state)
        finally:
            self._layouts.end_batch(follow=read_as_given(state, df))

    def _process(self, state: BatchState) -> dict[str, SinkResult]:
        self._targets.check_targets(state)  # 2b. once per run
        plan(state, self.ledger, self.sinks)  # 3. plan
        admit = self._attempts.refuse_unproven_replay(state)  # 3c. on a replayed batch only
        self._runs.writing(state.info)
        if self.lagging.sinks:  # admitted: Spark committed every batch of its epoch before it
            self._backlog.saw_batch(state.info)
        refuse_gaps(
            state,
            self.lagging,
            self.specs,
            ledger_location(self.ledger),
            self.catchup,
            pipeline_file=self.pipeline_file,
        )  # 3a.
        hold_back(
            state, self.lagging, self.specs, self.catchup, self._record, self.abandoned
        )  # 3b. behind
        announce(state, self.hooks, self.pipeline)
        if admit:  # the last step before a sink may write
            self._attempts.admit_refused_replay(state.info)
        self._refusals.writing()  # from here a sink may write: a refusal is no more recorded
        if state.pending or state.lagging or state.lagged:  # lagged: could not be opened
            try:
                prepare_reads(
                    state, self.specs, share_tasks=self.share_tasks, parallelism=self.parallelism
                )  # 4. share, partition, persist
                if state.persisted:  # the same DataFrame, now cached: no pass reads it as given
                    self._layouts.cancel_ahead()
                spooling = None
                if state.pending:
                    epoch = state.info.epoch
                    state.routes = BatchRoutes.prepare(
                        state.df, state.info, self.specs, state.pending, self._letters.target,
                        lambda sink: not self._record.marked_here(sink, epoch),
                        self._letters.earlier,
                    )  # fmt: skip  # 4b. routes
                    spooling = start_spooling(state, self.lagging, self.specs)  # beside 5.
                    write_all(
                        state,
                        self.specs,
                        state.routes,
                        self._record,
                        self.hooks,
                        retry=self.retry,
                        parallelism=self.parallelism,
                        layouts=self._layouts,
                        abandoned=self.abandoned,
                    )  # 5. write and 6. record, sink by sink
                spool_for_lagging(state, self.lagging, self.specs, spooling)  # 6b. lagging
                if state.failures:  # while its Arrow and persisted copy are still held
                    state.rows_in = rows_in(state)
            finally:
                settle(state)  # 7. settle
        if self.lagging.sinks:
            self.catchup.start()
            self.catchup.wake()
        results = report(state, self.hooks, self.lagging, self.spool, self.pipeline)
        self._runs.completed(state.info)
        return results

    def _refuse_unmarked(self, info: BatchInfo) -> None:
        """Before a new epoch starts (:class:`fanout.steps.admit.Admission`), the targets'
        checks that can refuse its first batch, the ledger's own last
        (:meth:`TargetChecks.refuse_unmarked
        <fanout.dispatch.targets.TargetChecks.refuse_unmarked>`)."""
        self._targets.refuse_unmarked(info, partial(self._admission.check_start, info))

    def _lift_fences(self, info: BatchInfo) -> None:
        """The ledger refused the epoch start :meth:`_refuse_unmarked` passed: its fences
        lifted (:meth:`TargetChecks.lift_fences
        <fanout.dispatch.targets.TargetChecks.lift_fences>`)."""
        self._targets.lift_fences(info)

    # -- the lagging sinks' backlog, outside a batch ---------------------------------

    def start_catch_up(self, query: Any) -> str | None:
        """Start the catch-up thread now, beside the just started ``query``, instead of
        with its first batch: a restarted query that finds no new data runs no batch
        (Spark runs none without data, a ``processing_time`` trigger included), and its
        lagging sinks would otherwise wait for new data to catch up. Call it right after
        ``writeStream...start()`` returns; ``fanout run`` does.

        It starts only when the checkpoint guard would admit the batch Spark runs next
        (:func:`fanout.steps.resume.why_wait`): a run whose checkpoint was replaced or
        rolled back writes nothing before its first batch is refused; nor one with a sink
        whose target lost its last marked batch (the lost-target check, asked here before
        the catch-up's first write, which would create the target again: the first batch
        refuses the run). Returns why it did
        not start (``None``: started, or no sink can lag); the first batch starts it then,
        as it always does. Under Spark Connect it never starts here: the pipeline's
        ``FanOut`` is the one built beside the server, which starts it with its first
        batch."""
        return self._backlog.start(query)

    def catch_up(self, timeout_s: float = 300.0) -> dict[str, SinkLag]:
        """Write every lagging sink's missed batches now, in this thread (for tests,
        scripts, and a clean stop); returns each lag-capable sink's state afterwards. A
        sink that fails stops its own catch-up; ``timeout_s`` bounds the whole call."""
        return self._backlog.catch_up(timeout_s)

    def behind(self) -> list[SinkBehind]:
        """Every lag-capable sink still missing batches, with the first and last of them
        and its last error (empty: every sink holds every batch that ran)."""
        return self._backlog.behind()

    def final_catch_up(
        self,
        stop: Callable[[], bool] | None = None,
        *,
        stopped_by: Callable[[], str | None] | None = None,
    ) -> dict[str, SinkLag]:
        """Give every lagging sink a final catch-up once the query has ended (an
        ``availableNow`` or ``once`` trigger drained the source, ``awaitTermination()``
        returned): its missed batches are written now, in this thread, in batch order and
        under the same ledger rules as the catch-up thread, whatever its probe interval.
        A sink's write that fails is tried again with that sink's ``retries`` and
        ``backoff_s`` (the policy of its live writes); ``stop()`` (e.g. a signal's
        ``Event.is_set``) ends it after the write in progress. Returns each lag-capable
        sink's state (all live).

        Raises :class:`fanout.SinksBehindError` naming every sink still behind, the batches
        it misses and its last error: they stay in the spool for the next run, which writes
        them first; when ``stop()`` ended the catch-up, naming what stopped it
        (``stopped_by()``, e.g. the signal's name). Call it before :meth:`close`, and not
        while the query runs."""
        return self._backlog.final(stop or (lambda: False), stopped_by)

    def stopped(self, by: str) -> None:
        """The end of a run a stop ended (``by``: what stopped it, a signal's name such as
        ``SIGTERM``) once its query has stopped: the catch-up thread stops after the write
        in progress (as in :meth:`close`) and, unlike :meth:`final_catch_up`, nothing more
        is written: the operator asked the run to end. Raises
        :class:`fanout.SinksBehindError` naming every sink still behind, its batches and
        what the next run does (the final catch-up's message, saying the stop gave them
        none); returns when no sink is behind. Call it before :meth:`close`."""
        self._backlog.stopped(by)

    def plan(
        self, info: BatchInfo, marks: Mapping[str, int | None] | None = None
    ) -> tuple[list[str], list[str]]:
        """The sinks still to write (ledger mark older than the batch) and those to skip;
        ``marks`` are the sinks' marks of ``info.epoch`` when already read."""
        return plan(BatchState(None, info, marks), self.ledger, self.sinks)


def _close_at_exit(fan: weakref.ref[FanOut]) -> None:
    """Close a ``FanOut`` built from its pickle, if still alive, as its process exits."""
    built = fan()
    if built is not None:
        built.close()
