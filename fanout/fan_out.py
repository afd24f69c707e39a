"""``FanOut``: the foreachBatch callable that routes each micro-batch to every sink.

:meth:`FanOut.process` reads as the steps of a batch (docs/architecture.md §2), each one
named piece in :mod:`fanout.steps` or :mod:`fanout.routes`, all sharing one
:class:`fanout.steps.state.BatchState`, once the batch passed the stop gate
(:mod:`fanout.steps.stop_gate`: a batch Spark begins after :meth:`FanOut.request_stop` is
refused before anything):

1. context (:mod:`fanout.steps.context`): query id, offsets, planning time; then, beside
   the steps below, the shuffle of the group that shared a job over the last batch is
   started (:mod:`fanout.steps.shared_frame`);
2. guard (:mod:`fanout.steps.admit`): refuse a reset or rolled-back checkpoint;
3. plan (:mod:`fanout.steps.plan`): the sinks whose ledger mark is behind the batch;
4. partition (:mod:`fanout.steps.partition`) once for the sinks hashing the batch alike,
   persist (:mod:`fanout.steps.persist`), then routes (:mod:`fanout.routes.batch_routes`):
   what each pending sink receives, rows failing a route set aside before any write;
5. write (:mod:`fanout.steps.write`): every pending sink, in parallel, with retries;
6. record (:mod:`fanout.steps.record`): each sink's ledger mark, right after its write;
7. settle: release the batch's caches, tell the observers, raise if a sink failed.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, Literal

from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.dead_letters import DeadLetterTarget
from fanout.contract.earlier_letters import EarlierLetters
from fanout.contract.lag import SinkBehind, SinkLag, SpoolSize
from fanout.contract.locations import command_location
from fanout.contract.names import check_name
from fanout.contract.sessions import is_connect
from fanout.contract.sink import (
    Sink,
    SinkContext,
    SinkResult,
    declares_guarantees,
    declaring_class,
    undeclared_guarantees_hint,
)
from fanout.deadletters.delta import refuse_shared_tables, table_roles
from fanout.deadletters.moved import TargetMoves, checked, earlier_letters
from fanout.deadletters.target import resolve_target
from fanout.errors import (
    BatchFailedError,
    ConfigurationError,
    FanoutError,
    RenamedSinkError,
    SinkRecordsGoneError,
    SinksBehindError,
    SinkUnreachableError,
    TargetLostError,
    error_with_text,
)
from fanout.hooks.caller import HookCaller
from fanout.hooks.registry import load_registry, resolve_plugins
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import Ledger, ledger_key, ledger_location, now_utc
from fanout.ledger.refusals import record_admitted, refused_unwritten
from fanout.observe.logs import batch_fields, register_secrets
from fanout.observe.secrets import (
    location_secrets,
    masked_error,
    redact_apart,
    redact_printed,
    secret_option_values,
)
from fanout.partitioned.determinism import check_route as check_route_membership
from fanout.recipe import Recipe
from fanout.retry import RetryPolicy
from fanout.routes.batch_routes import BatchRoutes
from fanout.sink_spec import (
    SinkSpec,
    check_exclusive_resources,
    check_write_timeout,
    split_core_options,
    write_timeout,
    write_timeouts,
)
from fanout.spool.table import BatchKey
from fanout.steps.admit import Admission
from fanout.steps.catchup import CatchUp
from fanout.steps.context import ContextReader
from fanout.steps.cores import check_cores
from fanout.steps.gaps import refuse_gaps
from fanout.steps.lag import Lagging, unreachable_masked
from fanout.steps.lag_state import Opening
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
from fanout.steps.lost_target import earlier_marks, refuse_lost_targets
from fanout.steps.owners import Held
from fanout.steps.owners import claim as claim_sinks
from fanout.steps.owners import release as release_sinks
from fanout.steps.persist import prepare_reads
from fanout.steps.plan import plan
from fanout.steps.record import Recorder
from fanout.steps.refused import PreWrite
from fanout.steps.renamed import Spooled, refuse_renamed, refuse_renamed_at_reset
from fanout.steps.replay import (
    ReplayCheck,
    RunMemory,
    batch_call,
    refuse_unproven_replay,
    warn_built_in_batch,
)
from fanout.steps.replay_lag import SpooledReplays, doubt
from fanout.steps.resume import query_checkpoint, why_wait
from fanout.steps.shared_frame import RecentLayouts
from fanout.steps.source_fit import refuse_unfit
from fanout.steps.state import BatchState
from fanout.steps.stop_gate import StopGate, client_stop_key, stop_asked_by_client
from fanout.steps.timeout import (
    CLOSE_WAIT_S,
    AbandonedWrite,
    AbandonedWrites,
    BoundedCall,
)
from fanout.steps.unmarked import answers_holds_batch, lift_fences, refuse_unmarked
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
        register_secrets(location_secrets([checkpoint_location, spool]) + _ledger_secrets(ledger))
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
        _check_arguments(
            self.pipeline, ledger, parallelism=parallelism, retries=retries,
            backoff_s=backoff_s, probe_interval_s=probe_interval_s, share_tasks=share_tasks,
        )  # fmt: skip
        if on_checkpoint_reset not in ("refuse", "new_epoch"):
            raise ConfigurationError(
                f"pipeline {pipeline!r}: on_checkpoint_reset must be 'refuse' or 'new_epoch', "
                f"not {on_checkpoint_reset!r}"
            )
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
        self.specs = self._build_sinks(registry, sinks)
        unknown = sorted(set(accept_lost_targets) - set(self.specs))
        if unknown:
            raise ConfigurationError(
                f"pipeline {pipeline!r}: accept_lost_targets names no sink of the pipeline: "
                f"{', '.join(unknown)} (sinks: {', '.join(sorted(self.specs))})"
            )
        self._accept_lost = frozenset(accept_lost_targets)
        self._targets_checked = False
        """Whether this run's first batch asked each sink's target for its last mark."""
        self._renamed_checked = False
        """Whether this run's first batch asked for a renamed sink (fanout.steps.renamed;
        a catch-up's check of the targets before it does not)."""
        self._renamed_first: tuple[int, int] | None = None
        """The run's first batch (epoch, batch id) when its renamed check ran: what a lag
        sink opened later, not asked then, is asked about (:meth:`_renamed_reopened`)."""
        self._reopen_asked: dict[str, tuple[int, int] | None] = {}
        """Each reopened sink's :attr:`_renamed_first` when its reopen's check began
        (:meth:`_reopen_stale`)."""
        check_exclusive_resources(self.pipeline, (spec.sink for spec in self.specs.values()))
        self.sinks: dict[str, Sink] = {name: spec.sink for name, spec in self.specs.items()}
        kinds = registry.dead_letter_kinds()
        self._kinds = kinds
        # a password or token in a sink's location (its dead_letter, any other option) is
        # the pipeline's too, whatever the sink declares
        letters = _sink_option_secrets(sinks, self.sinks.values())
        self._location_secrets = [*location_secrets([checkpoint_location, spool]),
                                  *_ledger_secrets(ledger), *letters]  # fmt: skip
        register_secrets(letters)
        self.dead_letters = self._resolve_dead_letters(kinds, letters)
        self.ledger: Ledger = DeltaLedger(ledger) if isinstance(ledger, str) else ledger
        self._admission = Admission(
            self.ledger, on_checkpoint_reset, self._refuse_unmarked, self._lift_fences
        )
        # a batch refused before writing; born with the run memory (before a lazy FanOut's
        # forgets its birth below: still a bound of the batches this process planned)
        self._refusals = PreWrite(self.ledger, self.pipeline, self._runs.born_ms)
        self._fenced: list[Sink] = []  # the sinks the last epoch start fenced
        self.secrets: tuple[str, ...] = self._gather_secrets()
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
        self._unopened_at_start: dict[str, tuple[SinkContext, BaseException]] = {}
        self._opening: dict[str, Opening] = {}  # first open()s past write_timeout_s
        self._opened: list[str] = []  # by _open, in order: what a failed start closes
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
        self._spark = self._open(spark)
        self.secrets = self._gather_secrets()
        register_secrets(self.secrets)
        self._record = Recorder(self.ledger, self.retry, self.secrets)
        self._moves = TargetMoves.open(self.ledger, self.pipeline, self.sinks)
        """Each sink's earlier dead-letter targets that may hold letters of a batch it has
        not marked (:mod:`fanout.deadletters.moved`); a changed target recorded."""
        self.lagging = Lagging(
            self.pipeline,
            self.specs,
            self.ledger,
            self.spool,
            backfill_sources(self.pipeline, self.specs),
            unopened=self._unopened_at_start,
            secrets=self.secrets,
        )
        self.lagging.ask_target = self._ask_reopened
        self.lagging.ask_again = self._reopen_stale
        self.lagging.regather = self._regather_secrets
        self.lagging.on_released = self._released_by_thread
        for name, opening in self._opening.items():
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
            self.lagging, self.specs, self._record, self.hooks, self._dead_letter_target,
            self._spark, probe_interval_s, ledger_location(self.ledger),
            pipeline_file=self.pipeline_file, abandoned=self.abandoned,
            earlier_of=self._earlier_letters, replays=self._spooled_replays(),
        )  # fmt: skip
        self.abandoned.on_done = self.catchup.wake
        self.lagging.on_reopened = self.catchup.wake
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
        caller raises unchanged (so a failure here is logged, never raised): the catch-up
        stopped, each sink it opened closed (in reverse order of opening), a first
        ``open()`` still running closed by its thread once it returns (as at
        :meth:`close`: :meth:`fanout.steps.lag.Lagging.close`), and its sinks free for
        another ``FanOut``."""
        self._closed = True
        owned: Sequence[str] = self._opened
        lagging: Lagging | None = self.__dict__.get("lagging")
        try:
            if "catchup" in self.__dict__:
                self.catchup.stop()
        except Exception:  # the sinks are closed all the same
            log.exception("pipeline %s: stopping the catch-up of its failed start failed",
                          self.pipeline, extra=batch_fields(self.pipeline))  # fmt: skip
        try:
            if lagging is not None:  # every sink reached; a first open() past its
                owned = lagging.close()  # timeout may have returned since: open too
            else:  # the running opens not handed to a Lagging yet: handed now, to close
                lagging = Lagging(
                    self.pipeline, self.specs, self.ledger, self.spool,
                    unopened=self._unopened_at_start, secrets=self.secrets,
                    on_released=self._released_by_thread,
                )  # fmt: skip
                lagging.close()  # first: each reopen thread closes what its open opened
                for name, opening in self._opening.items():
                    lagging.still_opening(name, opening)
        except Exception:
            log.exception("pipeline %s: stopping what its failed start began failed",
                          self.pipeline, extra=batch_fields(self.pipeline))  # fmt: skip
        later = [name for name in owned if name not in self._opened]  # opened after them
        for name in [*later, *reversed(self._opened)]:
            if name in owned:
                self._close_logged(self.specs[name])
        release_sinks(self, keep=self._held_by_threads(lagging))

    # -- setup ------------------------------------------------------------------------

    def _build_sinks(
        self, registry: Any, configs: Sequence[Mapping[str, Any] | Sink | SinkSpec]
    ) -> dict[str, SinkSpec]:
        if isinstance(configs, (Mapping, str, Sink, SinkSpec)):  # one sink, not a list
            raise ConfigurationError(
                f"pipeline {self.pipeline!r}: sinks must be a list of sinks (dicts or Sink "
                f"instances), got one {type(configs).__name__}: write sinks=[...]"
            )
        if not configs:
            raise ConfigurationError(f"pipeline {self.pipeline!r}: no sinks configured")
        types = registry.sink_types() if any(isinstance(c, Mapping) for c in configs) else {}
        specs: dict[str, SinkSpec] = {}
        for config in configs:
            if isinstance(config, SinkSpec):
                check_write_timeout(config.name, config.lag)
                spec = SinkSpec(
                    registry.build_sink(config.sink, types), config.route, config.retry, config.lag
                )
            elif isinstance(config, Mapping):
                name = str(config.get("name"))
                own, route, retry, lag = split_core_options(name, config, self.retry)
                spec = SinkSpec(registry.build_sink(own, types), route, retry, lag)
            else:
                spec = SinkSpec(registry.build_sink(config, types))
            if spec.name in specs:
                raise ConfigurationError(
                    f"pipeline {self.pipeline!r}: two sinks are named {spec.name!r}; "
                    "sink names must be unique (they key the ledger)"
                )
            specs[spec.name] = spec
        return specs

    def _open(self, spark: Any) -> Any:
        if spark is None:
            spark = _active_spark()
        if spark is not None and is_connect(spark) and self._context.checkpoint_location is None:
            raise ConfigurationError(
                f"pipeline {self.pipeline!r}: under Spark Connect fanout cannot ask Spark for "
                "the query's checkpoint: pass FanOut(checkpoint_location=...) the same path as "
                "the query's checkpointLocation option"
            )
        self.ledger.open()
        for spec in self.specs.values():
            context = SinkContext(
                self.pipeline,
                spark,
                checked(self.dead_letters[spec.name]),  # its write filtered as write_letters
                self._plugins,
                ledger=ledger_location(self.ledger),
                secrets=self.secrets,
                sinks=tuple(self.specs),
                accept_lost=spec.name in self._accept_lost,
            )
            spec.route.validate(spec.name, spark)
            sink = spec.sink
            register_secrets(sink.secret_values())  # masked in every redacting log handler
            try:
                self._open_sink(spec, context)
            except SinkUnreachableError as exc:
                error = unreachable_masked(spec.name, exc, sink.secret_values(), self.secrets)
                if not spec.lag.lags:
                    if error is exc:
                        raise
                    raise error from None
                self._unopened_at_start[spec.name] = (context, error)  # starts behind: Lagging
                log.warning(
                    "pipeline %s: sink %r cannot be reached (%s); with on_failure='lag' the "
                    "pipeline starts without it and it catches up once it can be opened",
                    self.pipeline, sink.name, error,
                    extra=batch_fields(self.pipeline, sink=sink.name),
                )  # fmt: skip
            except FanoutError as exc:
                # the ConfigurationError the contract asks open() for may quote a secret too
                secrets = sink.secret_values()
                rebuild = _same_kind(exc, secrets, self.secrets)
                masked = masked_error(exc, secrets, rebuild, str(exc), others=self.secrets)
                if masked is not None:
                    raise masked from None
                raise
            except Exception as exc:
                said = (
                    f"sink {sink.name!r}: cannot open: {type(exc).__name__}: {exc} (raised by "
                    f"{type(sink).__name__}.open(): check the sink's options, which "
                    "`fanout plugins --options TYPE` lists, and its target)"
                )
                masked = masked_error(
                    exc, sink.secret_values(), ConfigurationError, said, others=self.secrets
                )
                if masked is not None:  # no traceback may show the secret: the chain is cut
                    raise masked from None
                raise ConfigurationError(said) from exc
            else:
                self._opened.append(spec.name)
            self.secrets = self._gather_secrets()  # for the next sink's open error, context
            check_route_membership(sink.name, spec.route, sink.deterministic_columns(), spark)
            if sink.guarantee == "at_least_once":
                # a type declaring nothing is at-least-once by default: say how to declare
                declaring = declaring_class(sink)  # a FlakySink's: the wrapped type's
                hint = (
                    ""
                    if declares_guarantees(declaring)
                    else f"; {undeclared_guarantees_hint(declaring)}"
                )
                log.warning(
                    "pipeline %s: sink %r is at-least-once: if the driver dies between its "
                    "write and its ledger mark, the replay can write duplicates%s",
                    self.pipeline,
                    sink.name,
                    hint,
                    extra=batch_fields(self.pipeline, sink=sink.name),
                )
        check_cores(self.pipeline, self.specs, spark)
        return spark

    def _resolve_dead_letters(
        self, kinds: Mapping[str, Any], secrets: Sequence[str]
    ) -> dict[str, DeadLetterTarget | None]:
        """Each sink's dead-letter target (:func:`fanout.deadletters.target.resolve_target`).
        What refuses one (an unknown kind, a location no target can keep) quotes the
        ``dead_letter`` as written: raised with the passwords of its locations (``secrets``)
        masked and its chain cut, as the pipeline's other errors are."""
        targets: dict[str, DeadLetterTarget | None] = {}
        for name, sink in self.sinks.items():
            try:
                targets[name] = resolve_target(sink, kinds)
            except FanoutError as exc:
                masked = masked_error(exc, secrets, _same_kind(exc, secrets, ()), str(exc))
                if masked is not None:
                    raise masked from None
                raise
        return targets

    def _gather_secrets(self) -> tuple[str, ...]:
        """:attr:`secrets` as the locations and the sinks give them now."""
        sinks = (value for sink in self.sinks.values() for value in sink.secret_values())
        return tuple(dict.fromkeys([*self._location_secrets, *sinks]))

    def _regather_secrets(self) -> None:
        """:attr:`secrets` gathered again once a sink that could not be opened at the start
        is (its ``open`` may have fetched a credential), for the ledger rows, lag errors and
        errors raised from now on (one reference replaced: a thread reading the old set
        reads it whole)."""
        secrets = self._gather_secrets()
        if secrets == self.secrets:
            return
        register_secrets(secrets)
        self.secrets = self._record.secrets = self.lagging.secrets = secrets

    def _open_sink(self, spec: SinkSpec, context: SinkContext) -> None:
        """Open ``spec``'s sink; that of a sink with ``write_timeout_s`` in a daemon thread
        of its own, waited for that long (a server that accepts connections and never
        answers would hang the start): past it the sink starts unopened and lags, as one
        that cannot be reached, and the open running on is taken up by its reopen."""
        timeout = write_timeout(spec)
        if timeout is None:
            spec.sink.open(context)
            return
        opening = Opening.start(spec.sink, context, self.pipeline)
        if not opening.done.wait(timeout):
            self._opening[spec.name] = opening
            raise SinkUnreachableError(
                f"open() did not return within its write_timeout_s={timeout:g} s (still "
                "running: the sink is not opened again while it runs); find what holds the "
                "sink's target (a stalled connection, a server that does not answer)",
                sink=spec.name,
            )
        if opening.error is not None:
            raise opening.error

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
        running: list[AbandonedWrite] = []
        left: tuple[threading.Thread, dict[str, BatchKey]] | None = None
        try:
            self.catchup.stop()
            left = self._catch_up_left_writing()
            running = self._abandoned_at_close()
            still_writing = {w.sink for w in running} | set(left[1] if left else ())
            for name in self.lagging.close():
                if name not in still_writing:
                    self._close_logged(self.specs[name])
        finally:
            writing: list[tuple[Sink, Held]] = [(self.sinks[w.sink], "writing") for w in running]
            writing += [(self.sinks[name], "catching-up") for name in (left[1] if left else ())]
            release_sinks(self, keep=[*self._held_by_threads(self.lagging), *writing])
            for write in running:
                self._close_after(write)
            if left is not None:
                self._close_after_catch_up(left[0], list(left[1]))

    def _catch_up_left_writing(self) -> tuple[threading.Thread, dict[str, BatchKey]] | None:
        """The catch-up thread :meth:`close` did not wait out (30 s) and the sinks it still
        writes (of a sink without ``write_timeout_s``: nothing bounds it), each with its
        batch, logged: their sinks stay open under that write (docs/architecture.md §14.4)."""
        left = self.catchup.left_writing()
        for name, (epoch, batch) in (left[1] if left else {}).items():
            log.warning(
                "pipeline %s, batch %s, sink %s: its catch-up write of batch %s (epoch %s) "
                "was still running at close (it has no write_timeout_s to bound it): not "
                "waited for, the sink is left open and closed once that write ends; a "
                "catch-up of the sink in this process waits for it. Find what holds the "
                "sink's target (a lock, a stalled connection), or set write_timeout_s",
                self.pipeline, batch, name, batch, epoch,
                extra=batch_fields(self.pipeline, batch, name),
            )  # fmt: skip
        return left

    def _close_after_catch_up(self, thread: threading.Thread, sinks: Iterable[str]) -> None:
        """As :meth:`_close_after`, for the sinks a catch-up thread still writes at
        :meth:`close`: closed and released once that thread has ended."""

        def close_when_done() -> None:
            thread.join()
            try:
                for name in sinks:
                    self._close_logged(self.specs[name])
            finally:
                release_sinks(self, [self.sinks[name] for name in sinks])

        name = f"fanout-{self.pipeline}-catchup-close-after-write"
        threading.Thread(target=close_when_done, name=name, daemon=True).start()

    def _held_by_threads(self, lagging: Lagging | None) -> list[tuple[Sink, Held]]:
        """The sinks a reopen's thread (a first ``open()`` past its ``write_timeout_s``
        among them) still holds: not released with the others, another ``FanOut`` would
        open them while that thread may still close them; each is released by the thread
        once done (:meth:`_released_by_thread`)."""
        if lagging is None:
            return []
        return [(self.sinks[name], "opening") for name in lagging.reopening()]

    def _close_after(self, write: AbandonedWrite) -> None:
        """An abandoned write still running at :meth:`close` keeps its sink open and owned
        by this FanOut: a daemon thread waits for it to end (its Spark tasks too), then
        closes the sink and releases it (another ``FanOut`` opening it meanwhile would
        replace what the write uses under it)."""
        spec = self.specs[write.sink]

        def close_when_done() -> None:
            write.done.wait()
            try:
                self._close_logged(spec)
            finally:
                release_sinks(self, [spec.sink])

        name = f"fanout-{self.pipeline}-{write.sink}-close-after-write"
        threading.Thread(target=close_when_done, name=name, daemon=True).start()

    def _released_by_thread(self, sink: str) -> None:
        """``sink``'s reopen thread, after the pipeline stopped, holds it no more."""
        release_sinks(self, [self.sinks[sink]])

    def _close_logged(self, spec: SinkSpec) -> None:
        """:meth:`_close_sink`, its error logged (masked by the log handlers), not raised:
        the other sinks are closed too."""
        try:
            self._close_sink(spec)
        except Exception:
            log.exception(
                "pipeline %s: closing sink %r failed",
                self.pipeline,
                spec.name,
                extra=batch_fields(self.pipeline, sink=spec.name),
            )

    def _close_sink(self, spec: SinkSpec) -> None:
        """Close ``spec``'s sink; that of a sink with ``write_timeout_s`` is waited for
        that long, then left running in its daemon thread (logged): a hung target must
        not hang the query's stop."""
        timeout = write_timeout(spec)
        if timeout is None:
            spec.sink.close()
            return
        name = f"fanout-{self.pipeline}-{spec.name}-close"
        closing = BoundedCall.run(spec.sink.close, timeout, name)
        if closing.done.is_set():
            closing.outcome()
            return
        log.warning(
            "pipeline %s: sink %r: close() did not return within its write_timeout_s=%g s; "
            "left running, not waited for (find what holds the sink's target)",
            self.pipeline, spec.name, timeout,
            extra=batch_fields(self.pipeline, sink=spec.name),
        )  # fmt: skip

    def _abandoned_at_close(self) -> list[AbandonedWrite]:
        """The abandoned writes whose Python code still runs after close's wait (their
        sinks are left open), each logged; one that has returned and only waits for its
        cancelled Spark tasks to end is logged as such (its sink is closed)."""
        still = self.abandoned.wait(CLOSE_WAIT_S)
        running = [w for w in still if not w.returned.is_set()]
        for write in still:
            since = time.monotonic() - write.since
            fields = batch_fields(self.pipeline, write.key[1], write.sink)
            if write not in running:
                log.warning(
                    "pipeline %s, batch %s, sink %s: its write, abandoned after %g s "
                    "(write_timeout_s), has returned, but Spark tasks of its cancelled jobs "
                    "were still running at close (%.0f s since it started; Spark kills a "
                    "task stuck in Python spark.python.task.killTimeout after the cancel; "
                    "one stuck in the JVM may run on until its call returns): the sink is closed. "
                    "Nothing is lost: the batch is in the spool for the sink, the next run "
                    "writes it and the sink's idempotency absorbs what those tasks commit; "
                    "if they keep running, find what holds the sink's target (a lock, a "
                    "stalled connection)",
                    self.pipeline, write.key[1], write.sink, write.timeout_s, since,
                    extra=fields,
                )  # fmt: skip
                continue
            log.warning(
                "pipeline %s, batch %s, sink %s: its write, abandoned after %g s "
                "(write_timeout_s), is still running at close (%.0f s since it started), "
                "not waited for: the sink is left open. The batch is in the spool for the "
                "sink: the next run writes it, and the sink's idempotency absorbs what this "
                "write may still commit; find what holds the sink's target (a lock, a "
                "stalled connection)",
                self.pipeline, write.key[1], write.sink, write.timeout_s, since,
                extra=fields,
            )  # fmt: skip
        return running

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
                    first = self._first_attempt(info)  # as it enters: a replay check marks it
                    self.process(batch_df, info)
                finally:
                    self.stop_gate.leave()
            except BaseException as error:
                self._left_refused(batch_df, batch_id, info, first, error)
                self._close_if_built_here(batch_id)
                raise
        finally:
            call_left()

    def _first_attempt(self, info: BatchInfo) -> bool:
        """Whether ``info`` is certainly its batch's first attempt, not a replay (``False``
        when unsure): only then may its refusal before any write be recorded
        (:mod:`fanout.steps.refused`), and only when not are the batch's refusal rows read
        (:meth:`_refused_before_writing`). The one place to ask it; with the replay check
        (docs/proposals/replay-detection.md) this is "not replayed" by its run memory,
        and not raised before in this process (:meth:`PreWrite.first_attempt`)."""
        return self._runs.replayed(info) is False and self._refusals.first_attempt(info)

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
            return found, found is not None and self._first_attempt(found)

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
        closed (a runtime retrying the function in the same process): its sinks are closed
        and released, its catch-up stopped; only a new one, built by the query's restart,
        may write."""
        failed = self.__dict__.get("_closed_at")
        if failed is None:
            return
        raise FanoutError(
            f"pipeline {self.pipeline!r}, batch {batch_id}: refused, this FanOut (built from "
            f"its pickle, as under Spark Connect) was closed when batch {failed} failed, its "
            f"sinks with it; nothing of batch {batch_id} was written. Restart the query: the "
            f"restart builds a new FanOut from the pickle and runs batch {failed} again"
        )

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
        if query is None:
            raise ConfigurationError(
                f"pipeline {self.pipeline!r}: under Spark Connect the batches run in the "
                "FanOut beside the server, which this one's stop gate does not reach: pass "
                "the query, fan_out.request_stop(query), or stop it with "
                "fan_out.stop_query(query)"
            )
        key, run = client_stop_key(self.pipeline), str(query.runId)
        todo = (
            f"set it on the session that started the query, spark.conf.set({key!r}, "
            f"{run!r}), or stop the query with query.stop() (the batch in flight is then "
            "cut short and redone at the next start)"
        )
        session = getattr(query, "_session", None)  # the session that started the query
        if session is None:  # pyspark 4.2's Connect StreamingQuery keeps it there (private)
            raise ConfigurationError(
                f"pipeline {self.pipeline!r}: cannot reach the session of Spark Connect "
                f"query {query.id} (this pyspark's StreamingQuery has no _session) to ask "
                f"the FanOut beside the server to stop: {todo}"
            )
        try:
            session.conf.set(key, run)
        except Exception as exc:  # a server that allows only some options to be set
            raise ConfigurationError(
                f"pipeline {self.pipeline!r}: the Spark Connect session of query "
                f"{query.id} refused the option {key!r} through which the FanOut beside "
                f"the server is asked to stop ({type(exc).__name__}); {todo}"
            ) from exc
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

            def idle() -> bool:
                return not query.isActive or not query.status["isTriggerActive"]

            while not idle():
                if time.monotonic() - started >= timeout_s:
                    return False
                time.sleep(0.2)
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
            self._layouts.end_batch(follow=_read_as_given(state, df))

    def _refuse_unmarked(self, info: BatchInfo) -> None:
        """Before a new epoch starts, the checks that can refuse its first batch, all
        before the ledger's ``epoch`` row (the claim) and before any fence, so a refused
        reset changes nothing: refuse the start when a sink with no mark of the epoch holds
        the batch after a vanished sink's last mark under that sink's name (renamed between
        a crash and the reset: :func:`fanout.steps.renamed.refuse_renamed_at_reset`), when
        the spool holds the new epoch's batch of another query
        (:meth:`Spool.check <fanout.spool.table.Spool.check>`), when a sink's target lost
        its last marked batch of the epochs before (the run's lost-target check,
        :meth:`_refuse_lost`; a lag sink lags with it instead), when an open sink holds
        the batch after its last mark of the epoch replaced, or when the ledger would
        refuse the start
        (:meth:`Admission.check_start <fanout.steps.admit.Admission.check_start>`); else
        close that epoch to the sinks' writes still in flight and ask again
        (:mod:`fanout.steps.unmarked`)."""
        not_opened = self.lagging.not_opened()
        opened = {n: s for n, s in self.sinks.items() if n not in not_opened}
        spooled = None if self.spool is None else self.lagging.spooled_through
        timeouts = write_timeouts(self.specs, opened)
        unopened = {  # a sink type that cannot tell passes unasked, opened or not
            n: error for n, error in not_opened.items() if answers_holds_batch(self.sinks[n])
        }
        renamed = refuse_renamed_at_reset(
            self.pipeline, info.epoch, self.ledger, self.specs, opened, timeouts,
            self._spooled(info.epoch),
        )  # fmt: skip
        if renamed is not None:  # before any fence: nothing of the start is written
            raise renamed
        if self.spool is not None:  # the lag step's check of the new epoch's key: refused
            # after the claim, its way on (the original checkpoint) would be superseded
            self.spool.check(replace(info, epoch=info.epoch + 1))
        # the first batch's lost-target check, asked before the claim (the new epoch has no
        # marks: each sink about its last mark of the epochs before), so a reset it refuses
        # starts nothing: no epoch row, no fence, the replaced checkpoint still resumes
        self._refuse_lost(info.epoch + 1, {}, info.query_id, reset=True)
        self._fenced = refuse_unmarked(
            info, self.ledger, opened, spooled, timeouts, unopened,
            before_fence=partial(self._admission.check_start, info), accepted=self._accept_lost,
        )  # fmt: skip
        # only now: a start refused leaves the next batch this FanOut gets (the replaced
        # checkpoint resumed, or the reset again) to ask the targets again
        self._targets_checked = True

    def _lift_fences(self, info: BatchInfo) -> None:
        """The ledger refused the epoch start :meth:`_refuse_unmarked` passed (the old
        epoch's query committed a batch after the report the start was made from): lift
        the fences it made, since that query still writes the replaced epoch."""
        timeouts = write_timeouts(self.specs, self.sinks)
        lift_fences(info, self._fenced, timeouts, self.ledger)
        self._fenced = []
        self._targets_checked = False  # the start refused: the next batch asks them again

    def _check_targets(self, state: BatchState) -> None:
        """Once per run, before its first batch writes: refuse it when a sink's target no
        longer holds its last marked batch (:mod:`fanout.steps.lost_target`). A checkpoint
        reset's run asked that before its new epoch started (:meth:`_refuse_unmarked`)."""
        if not self._targets_checked:  # a new epoch has no marks: each sink's earlier ones
            self._refuse_lost(state.info.epoch, state.marks or {}, state.info.query_id)
            self._targets_checked = True
        if not self._renamed_checked:  # not by a catch-up's check before the first batch
            if state.marks is not None:  # before it reads which sinks are open
                self._renamed_first = (state.info.epoch, state.info.batch_id)
                self._refuse_renamed(state)
            self._renamed_checked = True

    def _refuse_renamed(self, state: BatchState) -> None:
        """Refuse the run when a sink with no mark in the epoch finds in its target the
        run's first batch written under the name of a sink the pipeline no longer
        configures: renamed between a crash and its replay
        (:mod:`fanout.steps.renamed`). One with batches spooled for it before the run's
        first is also asked about the first of them, the one it would write first (as
        :meth:`_renamed_reopened` asks it: a reopen's refusal is refused again at the next
        start; one more read of the ledger's sink names for each such sink)."""
        assert state.marks is not None
        unasked = self.lagging.unasked()  # a sink a reopen's check refused lags with that
        opened = {n: s for n, s in self.sinks.items() if n not in unasked}
        timeouts = write_timeouts(self.specs, opened)
        info = state.info
        spooled = self._spooled(info.epoch)
        refused = refuse_renamed(self.pipeline, info.epoch, info.batch_id, self.ledger,
                                 self.specs, opened, state.marks, timeouts, spooled)  # fmt: skip
        for name, sink in opened.items():  # one with batches spooled for it before B
            own = [] if spooled is None else sorted(spooled.batches.get(name, ()))
            if name in refused or state.marks.get(name) is not None or not own:
                continue
            if own[0] < info.batch_id:  # writes that one first: asked about it, as at reopen
                refused.update(refuse_renamed(
                    self.pipeline, info.epoch, own[0], self.ledger, self.specs, {name: sink},
                    state.marks, timeouts, spooled,
                ))  # fmt: skip
        if refused:
            for error in refused.values():
                log.error("%s", error)
            raise BatchFailedError(self.pipeline, info.batch_id, refused)

    def _spooled(self, epoch: int) -> Spooled | None:
        """What the spool keeps of ``epoch``, for each sink (``None``: no spool)."""
        if self.spool is None:
            return None
        kept: dict[str, list[int]] = {}
        for batch in self.spool.batches():
            if batch.epoch == epoch:
                for name in batch.needed_by:
                    kept.setdefault(name, []).append(batch.batch_id)
        return Spooled(self.spool.path, ledger_location(self.ledger), kept)

    def _renamed_reopened(
        self, name: str, epoch: int, marks: Mapping[str, int | None]
    ) -> RenamedSinkError | None:
        """The run's renamed check (:meth:`_refuse_renamed`) of ``name``, a lag sink that
        could not be opened at the run's first batch, so not asked then, once it is open
        and before its first write (:meth:`_ask_reopened`). Asked about the first batch it
        would write: the first the spool keeps of the ledger's current ``epoch`` for it,
        else the run's first batch; not before that batch's check (it asks the sink, open
        by then), nor for a sink with a mark in the epoch (``marks``)."""
        if marks.get(name) is not None:
            return None
        first = self._renamed_first
        first_id = first[1] if first is not None and first[0] == epoch else None
        spooled = self._spooled(epoch)
        own = sorted(spooled.batches.get(name, ())) if spooled is not None else []
        batch = own[0] if own else first_id
        if batch is None:
            return None
        if spooled is not None and first_id is not None and own:
            # the batches spooled for it from the run's first on are this run's, kept only
            # because it was not opened: they do not make its name one the spool knew
            kept = dict(spooled.batches)
            earlier = [b for b in own if b < first_id]
            if earlier:
                kept[name] = earlier
            else:
                del kept[name]
            spooled = Spooled(spooled.spool, spooled.ledger, kept)
        # no mark in the epoch and nothing spooled for it before the run's first batch: a
        # ledger row naming it may be this run's own failure row (written when it could not
        # be opened), which does not make its name one the ledger knew
        fresh = spooled is not None and first_id is not None and name not in spooled.batches
        refused = refuse_renamed(self.pipeline, epoch, batch, self.ledger, self.specs,
                                 {name: self.sinks[name]}, marks,
                                 write_timeouts(self.specs, (name,)) or None,
                                 spooled, (name,) if fresh else ()).get(name)  # fmt: skip
        if refused is not None:
            log.error(
                "%s. The sink lags with this error for the rest of the run (on_failure="
                "'lag'), nothing written to it; the other sinks go on", refused,
            )  # fmt: skip
        return refused

    def _check_targets_before_catch_up(self) -> None:
        """:meth:`_check_targets` for a catch-up that may write before the run's first
        batch (the catch-up started with the query, a final catch-up of a run that ran no
        batch): a catch-up is a write, and one into a target recreated empty would make
        the loss silent (its marks then held there). The marks of the ledger's current
        epoch, which the query owns (:func:`fanout.steps.resume.why_wait`)."""
        if self._targets_checked:
            return
        unasked = self.lagging.unasked()
        self._lose(self._lost_on_ledger([n for n in self.sinks if n not in unasked]))
        self._targets_checked = True

    def _refuse_lost(
        self,
        epoch: int,
        marks: Mapping[str, int | None],
        query_id: str | None = None,
        *,
        reset: bool = False,
    ) -> None:
        """Refuse the run when a sink's target lost its last marked batch; a sink with
        ``on_failure="lag"`` lags with that error instead (:meth:`Lagging.lose`): the
        others go on; one a reopen's check refused before lags with that refusal.
        ``reset``: asked before a checkpoint reset starts ``epoch``, which a refusal leaves
        unstarted (its message says so, and that the way on is the reset again)."""
        unasked = self.lagging.unasked()
        opened = {n: s for n, s in self.sinks.items() if n not in unasked}
        self._lose(self._lost_targets(opened, epoch, marks, query_id, reset=reset))

    def _lost_targets(
        self,
        sinks: Mapping[str, Sink],
        epoch: int,
        marks: Mapping[str, int | None],
        query_id: str | None = None,
        *,
        reset: bool = False,
    ) -> dict[str, TargetLostError]:
        """The lost-target check of ``sinks`` about their ``marks`` of ``epoch``; a sink
        with no mark there (a checkpoint reset's new epoch, or a sink lagging since before
        it) about its last mark of the newest epoch before that holds one
        (:func:`fanout.steps.lost_target.earlier_marks`). ``query_id``: the run's query,
        whose refused start of ``epoch`` wrote lost marks of the epoch before it.
        ``reset``: ``epoch`` is a checkpoint reset's, not started yet."""
        timeouts = write_timeouts(self.specs, sinks)
        lags = [n for n in sinks if self.specs[n].lag.lags]
        lost = refuse_lost_targets(
            self.pipeline, epoch, self.ledger, sinks, marks,
            self._accept_lost, timeouts, self.pipeline_file, lags,
        )  # fmt: skip
        unmarked = [n for n in sinks if marks.get(n) is None]
        for before, found in earlier_marks(self.ledger, self.pipeline, unmarked, epoch):
            lost |= refuse_lost_targets(
                self.pipeline, before, self.ledger, {n: sinks[n] for n in found}, found,
                self._accept_lost, timeouts, self.pipeline_file, lags,
                query_id if before == epoch - 1 else None, self.specs,
                reset_to=epoch if reset else None,
            )  # fmt: skip
        return lost

    def _lose(self, lost: Mapping[str, TargetLostError]) -> None:
        for name, error in lost.items():
            self.lagging.lose(name, error)

    def _ask_reopened(self, name: str) -> TargetLostError | RenamedSinkError | None:
        """The checks of a lagging sink that could not be opened at the run's start, asked
        once it is (:meth:`Lagging.reopen`), before its first write, as the run's first
        batch asks the others: the lost-target check about its marks of the ledger's
        current epoch, then the renamed check (:meth:`_renamed_reopened`). Its refusal
        does not stop the run: the sink lags with it (:meth:`Lagging.lose`)."""
        self._reopen_asked[name] = self._renamed_first  # read before the check
        view = self.ledger.lookup(self.pipeline, [name])
        lost = self._lost_targets({name: self.sinks[name]}, view.epoch, view.marks).get(name)
        if lost is not None:
            return lost
        return self._renamed_reopened(name, view.epoch, view.marks)

    def _reopen_stale(self, name: str) -> bool:
        """Whether ``name``'s reopen check (:meth:`_ask_reopened`), which let it write, began
        before the run's first batch's renamed check, which has run since: that check may
        have read ``name`` as not opened (``OPENING``) and not asked it, and this one had no
        first batch to ask about, so it is asked again. Called under the lag state's lock
        before ``name`` moves to ``OPEN``; the batch sets :attr:`_renamed_first` before it
        reads, under that lock, which sinks are open: one of the two sees the other."""
        return self._reopen_asked.get(name) != self._renamed_first

    def _lost_on_ledger(self, names: Sequence[str]) -> dict[str, TargetLostError]:
        """The lost-target check of the sinks ``names`` (open) about their marks of the
        ledger's current epoch, read now."""
        view = self.ledger.lookup(self.pipeline, list(names))
        return self._lost_targets({n: self.sinks[n] for n in names}, view.epoch, view.marks)

    def _process(self, state: BatchState) -> dict[str, SinkResult]:
        self._check_targets(state)  # 2b. once per run
        plan(state, self.ledger, self.sinks)  # 3. plan
        admit = self._refuse_unproven_replay(state)  # 3c. on a replayed batch only
        self._runs.writing(state.info)
        if self.lagging.sinks:  # admitted: Spark committed every batch of its epoch before it
            self._saw_batch(state.info)
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
        self._announce(state)
        if admit:  # the last step before a sink may write
            self._admit_refused_replay(state.info)
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
                        state.df, state.info, self.specs, state.pending, self._dead_letter_target,
                        lambda sink: not self._record.marked_here(sink, epoch),
                        self._earlier_letters,
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
                    state.rows_in = _rows_in(state)
            finally:
                settle(state)  # 7. settle
        if self.lagging.sinks:
            self.catchup.start()
            self.catchup.wake()
        results = self._report(state)
        self._runs.completed(state.info)
        return results

    def _refuse_unproven_replay(self, state: BatchState) -> bool:
        """Step 3c: refuse a replayed batch to a pending sink that cannot tell whether it
        holds it while its own records are gone (:mod:`fanout.steps.replay`); one with
        ``on_failure="lag"`` lags with the refusal instead (:meth:`Lagging.lose`: the
        hold-back takes it out of the batch, which is spooled for it). Returns whether
        :meth:`_process` records the attempt admitted before its first write: whenever it
        is not certainly the batch's first (:meth:`_first_attempt`), whatever the rows
        answered, so that a ``refused`` row of an earlier attempt landing late, from this
        process or one still ending beside this one, is outranked by it."""
        admit = not self._first_attempt(state.info)
        unwritten = self._refused_before_writing(state.info) if admit else False
        if not state.info.replayed:
            return admit
        unasked = self.lagging.unasked()
        opened = {n: s for n, s in self.sinks.items() if n not in unasked}
        timeouts = write_timeouts(self.specs, opened)
        check = ReplayCheck(
            self._runs,
            accepted=self._accept_lost,
            lags=[n for n in opened if self.specs[n].lag.lags],
            ledger=ledger_location(self.ledger),
            pipeline_file=self.pipeline_file,
            spool=None if self.spool is None else command_location(self.spool.path),
            refused_before_writing=unwritten is True,
        )
        try:
            lost = refuse_unproven_replay(state, opened, timeouts, check, ledger=self.ledger)
        except SinkRecordsGoneError as refused:  # the batch ran: its skip may name it
            name, epoch = str(refused.sink), state.info.epoch
            batch = Batch(state.df, state.info, name, txn_app_id(self.pipeline, name, epoch))
            self._record.failed(batch, 1, now_utc(), 0.0, refused)
            raise
        self._lose(lost)  # each lags, its failed attempt recorded at 3b (hold_back)
        doubt(state, opened, check)  # spooled so, its catch-up asks (steps/replay_lag)
        return admit

    def _refused_before_writing(self, info: BatchInfo) -> bool | None:
        """Whether fanout refused every earlier attempt of the batch before any sink wrote
        it (:func:`fanout.ledger.refusals.refused_unwritten`), asked only when this attempt
        is not certainly the batch's first (:meth:`_first_attempt`, asked by the caller): a
        replay by the run memory, or one it reads as new while an attempt of the batch
        raised before in this process (a ``FanOut`` reused across in-process restarts of its
        query, or built inside a foreachBatch call, refused that attempt before writing:
        planned after its birth, never begun writing). A first attempt reads nothing.

        ``None``: a ``refused`` row of the batch whose append this process gave up waiting
        for is still under way after a second wait (:meth:`PreWrite.settled`). Landing
        after this read, it would be the newest word about an attempt that wrote: so the
        rows exempt nothing now, and the attempt records itself admitted before writing
        all the same (numbered from a read after the late row's, it outranks it)."""
        if not self._refusals.settled(info.batch_id):
            return None
        return refused_unwritten(
            self.ledger, info.pipeline, info.epoch, info.batch_id, info.batch_timestamp_ms
        )

    def _admit_refused_replay(self, info: BatchInfo) -> None:
        """Record that this attempt of a batch, not certainly its first, goes on to write
        it (:func:`fanout.ledger.refusals.record_admitted`), past every
        check that may still refuse it without writing: from here it may write, and if it is
        killed mid-write, the next replay must not pass behind the old refusal. Raises what
        the append raises (the batch must not write then)."""
        if info.batch_timestamp_ms is not None:  # always known: a refusal row names it
            record_admitted(self.ledger, info.pipeline, info.epoch, info.batch_id,
                            info.batch_timestamp_ms)  # fmt: skip

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
        if not self.lagging.sinks:
            return None
        reason = self._why_wait(query)
        if reason is None:
            try:
                self._check_targets_before_catch_up()
            except TargetLostError as lost:  # the first batch refuses the run with it
                reason = str(lost)
            except Exception as exc:  # the ledger unreadable: the batch will say
                reason = f"cannot check the sinks' targets: {type(exc).__name__}: {exc}"
        if reason is None:
            checkpoint = self._context.checkpoint_location or query_checkpoint(query)
            if checkpoint is not None:  # the query owns the current epoch (why_wait)
                self.lagging.checkpoint = (self.lagging.epoch, checkpoint)
            self.catchup.start()
            self.catchup.wake()
        log.info(
            "pipeline %s: the catch-up %s",
            self.pipeline,
            "started with the query" if reason is None else f"waits for the first batch: {reason}",
            extra=batch_fields(self.pipeline),
        )
        return reason

    def _saw_batch(self, info: BatchInfo) -> None:
        """An admitted live batch: it settles the batches of its epoch before it, and its
        query's checkpoint says which of the epoch's batches Spark committed
        (:meth:`fanout.steps.lag.Lagging.settled`)."""
        self.lagging.saw_batch((info.epoch, info.batch_id))
        checkpoint = self._context.location(info.query_id)
        if checkpoint is not None and info.query_id is not None:
            self.lagging.checkpoint = (info.epoch, checkpoint)

    def _why_wait(self, query: Any) -> str | None:
        if self._spark is not None and is_connect(self._spark):
            return "under Spark Connect the FanOut beside the server runs the catch-up"
        checkpoint = self._context.checkpoint_location or query_checkpoint(query)
        query_id = getattr(query, "id", None)
        try:
            return why_wait(
                self.ledger,
                self.pipeline,
                None if query_id is None else str(query_id),
                checkpoint,
                self.spool,
            )
        except Exception as exc:  # the ledger or the spool unreadable: the batch will say
            return f"cannot check the checkpoint against the ledger: {type(exc).__name__}: {exc}"

    def catch_up(self, timeout_s: float = 300.0) -> dict[str, SinkLag]:
        """Write every lagging sink's missed batches now, in this thread (for tests,
        scripts, and a clean stop); returns each lag-capable sink's state afterwards. A
        sink that fails stops its own catch-up; ``timeout_s`` bounds the whole call."""
        deadline = time.monotonic() + timeout_s
        if self.lagging.sinks:
            self._check_targets_before_catch_up()
        for sink in self.lagging.sinks:
            self.catchup.drain(sink, until=lambda: time.monotonic() > deadline)
        self.lagging.release_held()
        return self.lagging.lags()

    def behind(self) -> list[SinkBehind]:
        """Every lag-capable sink still missing batches, with the first and last of them
        and its last error (empty: every sink holds every batch that ran)."""
        found = []
        for sink in self.lagging.sinks:
            backlog = self.lagging.backlog(sink)
            if backlog:
                found.append(
                    SinkBehind(
                        sink, backlog.keys[0], backlog.keys[-1], len(backlog.keys),
                        spooled=backlog.spooled, rows=backlog.spooled_rows,
                        backfill_from=self.specs[sink].lag.backfill_from,
                        error=self.lagging.lag_of(sink, backlog).error,
                        stuck=self.lagging.stuck(sink),
                    )
                )  # fmt: skip
        return found

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
        done = stop or (lambda: False)
        if any(self.lagging.backlog(sink) for sink in self.lagging.sinks):
            self._check_targets_before_catch_up()
        for sink in self.lagging.sinks:
            if self.lagging.backlog(sink):
                self.catchup.finish(sink, self.specs[sink].retry or self.retry, done)
        self.lagging.release_held()
        by = stopped_by() if stopped_by is not None and done() else None
        self._raise_behind(by, during_catch_up=by is not None)
        return self.lagging.lags()

    def stopped(self, by: str) -> None:
        """The end of a run a stop ended (``by``: what stopped it, a signal's name such as
        ``SIGTERM``) once its query has stopped: the catch-up thread stops after the write
        in progress (as in :meth:`close`) and, unlike :meth:`final_catch_up`, nothing more
        is written: the operator asked the run to end. Raises
        :class:`fanout.SinksBehindError` naming every sink still behind, its batches and
        what the next run does (the final catch-up's message, saying the stop gave them
        none); returns when no sink is behind. Call it before :meth:`close`."""
        self.catchup.stop()
        self._raise_behind(by)

    def _raise_behind(self, stopped_by: str | None, *, during_catch_up: bool = False) -> None:
        behind = self.behind()
        if behind:
            spool = None if self.spool is None else command_location(self.spool.path)
            raise SinksBehindError(
                self.pipeline, behind, spool, ledger_location(self.ledger),
                stopped_by=stopped_by, during_catch_up=during_catch_up,
            )  # fmt: skip

    def plan(
        self, info: BatchInfo, marks: Mapping[str, int | None] | None = None
    ) -> tuple[list[str], list[str]]:
        """The sinks still to write (ledger mark older than the batch) and those to skip;
        ``marks`` are the sinks' marks of ``info.epoch`` when already read."""
        return plan(BatchState(None, info, marks), self.ledger, self.sinks)

    # -- around the steps -------------------------------------------------------------

    def _announce(self, state: BatchState) -> None:
        info = state.info
        self.hooks.call(
            "fanout_batch_start", info=info, pending=state.pending, skipped=state.skipped
        )
        if state.skipped:
            log.info(
                "pipeline %s, batch %s: skipping %s (already committed)",
                self.pipeline,
                info.batch_id,
                ", ".join(state.skipped),
                extra=batch_fields(self.pipeline, info.batch_id),
            )

    def _dead_letter_target(self, name: str) -> DeadLetterTarget | None:
        """Where the rows failing sink ``name``'s route go (``None``: they fail it)."""
        return self.dead_letters[name]

    def _earlier_letters(self, name: str, info: BatchInfo) -> EarlierLetters | None:
        """What sink ``name``'s earlier dead-letter targets hold of batch ``info``, one
        an earlier process may have attempted (``None``: no earlier target may hold any,
        read nothing); raises :class:`fanout.DeadLetterMovedError` when one cannot tell
        (:mod:`fanout.deadletters.moved`)."""
        texts = self._moves.earlier(name, (info.epoch, info.batch_id))
        if not texts:
            return None
        batch = Batch(None, info, name, txn_app_id(info.pipeline, name, info.epoch))
        return earlier_letters(
            batch, texts, self.dead_letters[name], self.sinks[name], self._kinds,
            ledger_location(self.ledger),
        )  # fmt: skip

    def _report(self, state: BatchState) -> dict[str, SinkResult]:
        info = state.info
        if self.lagging.sinks:
            size = None
            if self.spool is not None:
                size = SpoolSize(*self.spool.size())
            self.hooks.call("fanout_sink_lag", info=info, lags=self.lagging.lags(), spool=size)
        if state.failures:
            committed = [*state.skipped, *state.results]
            error = BatchFailedError(self.pipeline, info.batch_id, state.failures, committed,
                                     rows_in=state.rows_in)  # fmt: skip
            self.hooks.call(
                "fanout_batch_failed",
                info=info,
                failures=state.failures,
                results=state.results,
                error=error,
            )
            if state.aborted is not None:  # an interrupt or exit goes on up as raised
                raise state.aborted
            raise error from next(iter(state.failures.values()))
        if state.aborted is not None:  # raised by a sink that lags (on_failure='lag')
            raise state.aborted
        self.hooks.call("fanout_batch_end", info=info, results=state.results)
        return state.results


def _read_as_given(state: BatchState | None, df: Any) -> tuple[str, ...] | None:
    """The group of sinks whose shared job read the batch as Spark handed it over (not a
    persisted or repartitioned copy): the next batch starts its input ahead."""
    # persist() returns the very DataFrame it caches: ``is`` alone cannot tell
    if state is None or state.df is not df or state.persisted or len(state.share_groups) != 1:
        return None
    return state.share_groups[0]


def _rows_in(state: BatchState) -> int | None:
    """A failed batch's input rows, for ``fanout run``'s summary: Spark reports no progress
    for a batch that failed, so its ``numInputRows`` never comes. The Arrow conversion a
    sink made gives them free; else one count of the batch (cached when persisted): a cost
    on this failure path only. ``None`` when the count fails too (an unreadable input).
    Called before step 7 releases the Arrow and unpersists the batch (after it, the count
    read the batch's source again)."""
    if state.aborted is not None:  # an interrupt: end now, count nothing
        return None
    if state.routes is not None:
        converted = state.routes.batch_arrow().converted_rows()
        if converted is not None:
            return converted
    try:
        return int(state.df.count())
    except Exception as exc:
        log.info("pipeline %s, batch %s: its rows not counted: %s", state.info.pipeline,
                 state.batch_id, exc)  # fmt: skip
        return None


def settle(state: BatchState) -> None:
    """Step 7: release what the batch held (shared Arrow tables, evaluated routes, the
    persisted DataFrame), whatever the outcome."""
    if state.routes is not None:
        state.routes.release()
    if state.persisted:
        state.df.unpersist()


def _active_spark() -> Any:
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        return None
    return SparkSession.getActiveSession()


def _sink_option_secrets(
    configs: Sequence[Mapping[str, Any] | Sink | SinkSpec], sinks: Iterable[Sink]
) -> list[str]:
    """The passwords and secret query values (``?sig=``) of every location among the sinks'
    options (:func:`fanout.observe.secrets.location_secrets`): each ``dead_letter``, the
    options of a sink given as a dict, and the text and mapping attributes of each sink
    built (a plugin sink's ``archive = "s3://KEY:SECRET@..."``, its ``storage_options``'
    URLs). Read once, at construction; a sink's other attributes (objects, lists) are not
    walked."""
    given: list[Any] = [c for c in configs if isinstance(c, Mapping)]
    given += [c.sink for c in configs if isinstance(c, SinkSpec) and isinstance(c.sink, Mapping)]
    for sink in sinks:
        given.append(getattr(sink, "dead_letter", None))
        own = getattr(sink, "__dict__", None) or {}
        given.extend(v for v in own.values() if isinstance(v, str | Mapping))
    return location_secrets(given)


def _ledger_secrets(ledger: str | Ledger) -> list[str]:
    """The secrets of ``ledger``, given as a location or as a ledger object (a
    :class:`fanout.ledger.delta.DeltaLedger` at ``s3://KEY:SECRET@bucket/...``, say): its
    location's password and the credentials among its ``storage_options``."""
    if isinstance(ledger, str):
        return location_secrets(ledger)
    path = getattr(ledger, "path", None)
    options = getattr(ledger, "storage_options", None)
    found = location_secrets(str(path)) if path is not None else []
    return found + secret_option_values(options if isinstance(options, Mapping) else None)


def _check_arguments(
    pipeline: str, ledger: object, *, parallelism: object, retries: object, backoff_s: object,
    probe_interval_s: object, share_tasks: object,
) -> None:  # fmt: skip
    """Refuse a keyword argument of :class:`FanOut` of the wrong type or out of its range,
    naming it, its value and what it takes (a ``TypeError`` from a comparison deep inside
    named none of them)."""
    where = f"pipeline {pipeline!r}"
    if isinstance(ledger, str) and not ledger.strip():
        raise ConfigurationError(f"{where}: ledger must not be empty: give the ledger's path")
    if not isinstance(ledger, str) and not hasattr(ledger, "mark_committed"):
        raise ConfigurationError(
            f"{where}: ledger must be the ledger's path or a fanout Ledger, got {ledger!r}"
        )
    if parallelism is not None:
        _check_number(where, "parallelism", parallelism, 1, integer=True)
    _check_number(where, "retries", retries, 0, integer=True)
    _check_number(where, "backoff_s", backoff_s, 0)
    _check_number(where, "probe_interval_s", probe_interval_s, 0, above=True)
    if not isinstance(share_tasks, bool):
        raise ConfigurationError(f"{where}: share_tasks must be True or False, got {share_tasks!r}")


def _check_number(
    where: str, name: str, value: object, least: float, *, integer: bool = False,
    above: bool = False,
) -> None:  # fmt: skip
    kinds: tuple[type, ...] = (int,) if integer else (int, float)
    wanted = "an integer" if integer else "a number"
    bound = f"> {least:g}" if above else f">= {least:g}"
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not isinstance(value, kinds)
    ):
        raise ConfigurationError(f"{where}: {name} must be {wanted} {bound}, got {value!r}")
    if not math.isfinite(value) or value < least or (above and value == least):
        raise ConfigurationError(f"{where}: {name} must be {wanted} {bound}, got {value!r}")


def _same_kind(
    error: FanoutError, secrets: Iterable[str], others: Iterable[str]
) -> Callable[[str], FanoutError]:
    """What rebuilds ``error`` from its masked text: an error of its own type (callers catch
    by type) with its fields (``sink``, ``batch_id``...) kept, their text masked too."""
    found, rest = list(secrets), list(others)

    def rebuild(text: str) -> FanoutError:
        fields = {
            field: redact_apart(value, found, rest) if isinstance(value, str) else value
            for field, value in vars(error).items()
        }
        return error_with_text(type(error), text, **fields)

    return rebuild


def _close_at_exit(fan: weakref.ref[FanOut]) -> None:
    """Close a ``FanOut`` built from its pickle, if still alive, as its process exits."""
    built = fan()
    if built is not None:
        built.close()
