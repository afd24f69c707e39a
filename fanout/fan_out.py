"""``FanOut``: the foreachBatch callable that routes each micro-batch to every sink.

``FanOut.process`` reads like ARCHITECTURE §1: context, guard, plan, persist, write,
record, settle — with one step between persist and write for routed sinks that have a
dead-letter target: their routes are evaluated before any sink writes
(:mod:`fanout.routes.rejects`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from typing import Any, Literal

from fanout.contract.batch import Batch, BatchInfo, SharedArrow, txn_app_id
from fanout.contract.names import check_name
from fanout.contract.sink import DeadLetterWriter, Sink, SinkContext, SinkResult
from fanout.deadletters.model import DeadLetter
from fanout.errors import (
    BatchFailedError,
    CheckpointResetError,
    ConfigurationError,
    FanoutError,
    RouteError,
)
from fanout.hooks.caller import HookCaller
from fanout.hooks.registry import load_registry
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import Ledger, LedgerEntry, now_utc
from fanout.observe.logs import batch_fields, register_secrets
from fanout.partitioned.determinism import check_route as check_route_membership
from fanout.routes.evaluate import explain_failure
from fanout.routes.rejects import CheckedRoute, check_route
from fanout.routes.route import Route, SinkSpec, split_core_options
from fanout.steps.context import ContextReader
from fanout.steps.guard import CheckpointGuard
from fanout.steps.retry import RetryPolicy
from fanout.steps.write import SinkRunner

log = logging.getLogger("fanout")


class FanOut:
    """Route every micro-batch of one streaming query to many sinks, exactly once.

    Use it as the foreachBatch function::

        fan = FanOut(pipeline="orders", ledger="/data/_fanout/ledger", sinks=[...])
        df.writeStream.foreachBatch(fan).option("checkpointLocation", ckpt).start()

    :param pipeline: a stable name; part of every sink's transaction id. Changing it makes
        every sink start afresh.
    :param ledger: the ledger's Delta table path (or a :class:`fanout.ledger.entry.Ledger`).
    :param sinks: sink configurations (``{"type": ..., "name": ..., **options}``),
        :class:`fanout.Sink` instances, or :class:`fanout.routes.route.SinkSpec`; names must be
        unique. A dict may also hold ``where`` (SQL predicate), ``select`` (columns or SQL
        expressions), ``retries`` and ``backoff_s``, which fanout applies around the sink.
        Rows failing a sink's ``where``/``select`` go to its dead-letter target, if it has
        one (:meth:`fanout.Sink.route_dead_letters`), else the sink fails the batch.
    :param parallelism: how many sinks are written at once (default: all pending).
    :param retries: further attempts for a sink's transient errors.
    :param backoff_s: the wait before the first retry, doubled each time (with jitter).
    :param plugins: extra plugin objects (observers) besides the installed ones.
    :param checkpoint_location: the query's checkpoint, if fanout cannot find it itself.
    :param spark: the SparkSession, handed to sinks' ``open`` (default: the active one).
    :param on_checkpoint_reset: ``"refuse"`` (default): a lost or replaced checkpoint
        raises :class:`fanout.CheckpointResetError`. ``"new_epoch"``: continue under a new
        epoch, whose transaction ids are new, so every batch of the new query is written
        even where it repeats input the sinks already hold. Choose it only when the new
        checkpoint starts where the old one ended (``fanout recover`` prints the offsets).
        A rolled-back checkpoint (same query id, batches planned again) is always refused
        with :class:`fanout.CheckpointRollbackError`.

    Building a ``FanOut`` loads the plugins, builds and opens every sink and creates the
    ledger, so configuration errors surface here, before the stream starts.
    """

    def __init__(
        self,
        pipeline: str,
        ledger: str | Ledger,
        sinks: Sequence[Mapping[str, Any] | Sink | SinkSpec],
        *,
        parallelism: int | None = None,
        retries: int = 2,
        backoff_s: float = 1.0,
        plugins: Iterable[object] = (),
        checkpoint_location: str | None = None,
        spark: Any = None,
        on_checkpoint_reset: Literal["refuse", "new_epoch"] = "refuse",
    ) -> None:
        self.pipeline = check_name(pipeline, "pipeline")
        if on_checkpoint_reset not in ("refuse", "new_epoch"):
            raise ConfigurationError(
                f"pipeline {pipeline!r}: on_checkpoint_reset must be 'refuse' or 'new_epoch', "
                f"not {on_checkpoint_reset!r}"
            )
        self.on_checkpoint_reset = on_checkpoint_reset
        if parallelism is not None and parallelism < 1:
            raise ConfigurationError(f"pipeline {pipeline!r}: parallelism must be >= 1")
        self.parallelism = parallelism
        self.retry = RetryPolicy(retries=retries, backoff_s=backoff_s)
        registry = load_registry(plugins)
        registry.raise_load_errors()
        self.hooks = HookCaller(registry.manager)
        self.specs = self._build_sinks(registry, sinks)
        self.sinks: dict[str, Sink] = {name: spec.sink for name, spec in self.specs.items()}
        self.ledger: Ledger = DeltaLedger(ledger) if isinstance(ledger, str) else ledger
        self._checkpoint_guard = CheckpointGuard(self.ledger)
        self._context = ContextReader(self.pipeline, checkpoint_location)
        self._open(spark)

    # -- setup ------------------------------------------------------------------------

    def _build_sinks(
        self, registry: Any, configs: Sequence[Mapping[str, Any] | Sink | SinkSpec]
    ) -> dict[str, SinkSpec]:
        if not configs:
            raise ConfigurationError(f"pipeline {self.pipeline!r}: no sinks configured")
        types = registry.sink_types() if any(isinstance(c, Mapping) for c in configs) else {}
        specs: dict[str, SinkSpec] = {}
        for config in configs:
            if isinstance(config, SinkSpec):
                spec = SinkSpec(registry.build_sink(config.sink, types), config.route, config.retry)
            elif isinstance(config, Mapping):
                own, route, retry = split_core_options(str(config.get("name")), config, self.retry)
                spec = SinkSpec(registry.build_sink(own, types), route, retry)
            else:
                spec = SinkSpec(registry.build_sink(config, types))
            if spec.name in specs:
                raise ConfigurationError(
                    f"pipeline {self.pipeline!r}: two sinks are named {spec.name!r}; "
                    "sink names must be unique (they key the ledger)"
                )
            specs[spec.name] = spec
        return specs

    def _open(self, spark: Any) -> None:
        if spark is None:
            spark = _active_spark()
        context = SinkContext(self.pipeline, spark)
        self.ledger.open()
        for spec in self.specs.values():
            spec.route.validate(spec.name, spark)
            sink = spec.sink
            register_secrets(sink.secret_values())  # masked in every redacting log handler
            try:
                sink.open(context)
            except FanoutError:
                raise
            except Exception as exc:
                raise ConfigurationError(
                    f"sink {sink.name!r}: cannot open: {type(exc).__name__}: {exc}"
                ) from exc
            check_route_membership(sink.name, spec.route, sink.partitioned_by(), spark)
            if sink.guarantee == "at_least_once":
                log.warning(
                    "pipeline %s: sink %r is at-least-once: if the driver dies between its "
                    "write and its ledger mark, the replay can write duplicates",
                    self.pipeline,
                    sink.name,
                    extra=batch_fields(self.pipeline, sink=sink.name),
                )

    def close(self) -> None:
        """Close every sink (call it when the query has stopped)."""
        for sink in self.sinks.values():
            try:
                sink.close()
            except Exception:
                log.exception(
                    "pipeline %s: closing sink %r failed",
                    self.pipeline,
                    sink.name,
                    extra=batch_fields(self.pipeline, sink=sink.name),
                )

    def __enter__(self) -> FanOut:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the foreachBatch entry point -------------------------------------------------

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        """Handle one micro-batch; Spark calls this with the batch DataFrame and its id."""
        self.process(batch_df, self._context.read(batch_df, batch_id))

    def process(self, df: Any, info: BatchInfo) -> dict[str, SinkResult]:
        """Fan one batch out; returns the result of every sink written in this call.

        Raises :class:`fanout.CheckpointResetError` when the checkpoint was reset,
        :class:`fanout.CheckpointRollbackError` when it was rolled back and
        :class:`fanout.BatchFailedError` when any sink failed after its retries.
        """
        view = self.ledger.lookup(self.pipeline, self.sinks)
        info = self._guard(replace(info, epoch=view.epoch), view.high_water)
        # 3. plan; a new epoch (an accepted reset) has no marks of its own to read yet
        pending, skipped = self.plan(info, view.marks if info.epoch == view.epoch else None)
        self.hooks.call("fanout_batch_start", info=info, pending=pending, skipped=skipped)
        if skipped:
            log.info(
                "pipeline %s, batch %s: skipping %s (already committed)",
                self.pipeline,
                info.batch_id,
                ", ".join(skipped),
                extra=batch_fields(self.pipeline, info.batch_id),
            )
        results: dict[str, SinkResult] = {}
        failures: dict[str, BaseException] = {}
        if pending:
            persisted = self._persist_if_shared(df, pending)  # 4. persist
            arrows: dict[Route, SharedArrow] = {}
            checked: dict[Route, CheckedRoute] = {}
            try:
                targets = self._check_routes(df, info, pending, checked)  # 4b. check routes
                results, failures = self._write_all(
                    df, info, pending, arrows, checked, targets
                )  # 5-6. write, record
            finally:
                for arrow in arrows.values():  # 7. settle
                    arrow.release()
                for route in checked.values():
                    route.release()
                if persisted:
                    df.unpersist()
        if failures:
            self.hooks.call("fanout_batch_failed", info=info, failures=failures, results=results)
            raise BatchFailedError(self.pipeline, info.batch_id, failures) from next(
                iter(failures.values())
            )
        self.hooks.call("fanout_batch_end", info=info, results=results)
        return results

    # -- the steps --------------------------------------------------------------------

    def _guard(self, info: BatchInfo, high_water: int | None) -> BatchInfo:
        """Step 2: refuse a checkpoint reset or rollback, or start a new epoch when told to
        accept a reset (a rollback is always refused: :class:`CheckpointRollbackError` is
        not a :class:`CheckpointResetError`)."""
        try:
            self._checkpoint_guard.check(info, high_water)
            return info
        except CheckpointResetError as reset:
            if self.on_checkpoint_reset != "new_epoch":
                raise
            epoch = info.epoch + 1
            log.warning(
                "pipeline %s: checkpoint reset accepted (on_checkpoint_reset='new_epoch'); "
                "query %s continues under epoch %s with new transaction ids from batch %s. "
                "What the ledger knew:\n%s",
                self.pipeline,
                info.query_id,
                epoch,
                info.batch_id,
                reset,
                extra=batch_fields(self.pipeline, info.batch_id),
            )
            offsets = None if info.source_offsets is None else json.dumps(info.source_offsets)
            self.ledger.start_epoch(
                LedgerEntry(
                    pipeline=self.pipeline,
                    sink="*",
                    batch_id=info.batch_id,
                    status="epoch",
                    query_id=info.query_id,
                    started_at=now_utc(),
                    source_offsets=offsets,
                    epoch=epoch,
                    batch_timestamp_ms=info.batch_timestamp_ms,
                )
            )
            return replace(info, epoch=epoch)

    def plan(
        self, info: BatchInfo, marks: Mapping[str, int | None] | None = None
    ) -> tuple[list[str], list[str]]:
        """The sinks still to write (ledger mark older than the batch) and those to skip;
        ``marks`` are the sinks' marks of ``info.epoch`` when already read."""
        if marks is None:
            marks = self.ledger.last_committed(self.pipeline, self.sinks, info.epoch)
        pending = [s for s, done in marks.items() if done is None or done < info.batch_id]
        skipped = [s for s in self.sinks if s not in pending]
        return pending, skipped

    def _persist_if_shared(self, df: Any, pending: Sequence[str]) -> bool:
        # Sinks reading Arrow share one conversion per route, so together they read the
        # DataFrame once per distinct route.
        readers = sum(self.sinks[s].reads == "dataframe" for s in pending)
        readers += len({self.specs[s].route for s in pending if self.sinks[s].reads == "arrow"})
        if readers > 1 and hasattr(df, "persist"):
            _persist_uncompressed(df)
            return True
        return False

    def _check_routes(
        self,
        df: Any,
        info: BatchInfo,
        pending: Sequence[str],
        checked: dict[Route, CheckedRoute],
    ) -> dict[str, DeadLetterWriter | Exception]:
        """Step 4b: evaluate, before any sink writes, each route of a pending sink that has
        a dead-letter target for the rows failing it; fills ``checked`` per route and
        returns each such sink's target (or the error asking for it raised)."""
        targets: dict[str, DeadLetterWriter | Exception] = {}
        for name in pending:
            if self.specs[name].route.is_identity:
                continue
            try:
                target = self.sinks[name].route_dead_letters()
            except Exception as exc:
                targets[name] = exc
                continue
            if target is not None:
                targets[name] = target
        for name in targets:
            route = self.specs[name].route
            if route in checked or isinstance(targets[name], Exception):
                continue
            try:  # an expression Spark cannot resolve fails this sink, named, unwritten
                route.resolve(df, sink=name, batch_id=info.batch_id)
            except RouteError as unresolved:
                targets[name] = unresolved
                continue
            readers = {self.sinks[s].reads for s in pending if self.specs[s].route == route}
            checked[route] = check_route(
                df,
                route,
                arrow="arrow" in readers,
                dataframe="dataframe" in readers,
                sink=name,
                batch_id=info.batch_id,
            )
        return targets

    def _write_all(
        self,
        df: Any,
        info: BatchInfo,
        pending: Sequence[str],
        arrows: dict[Route, SharedArrow],
        checked: Mapping[Route, CheckedRoute],
        targets: Mapping[str, DeadLetterWriter | Exception],
    ) -> tuple[dict[str, SinkResult], dict[str, BaseException]]:
        runners = [self._runner(name, df, info, arrows, checked, targets) for name in pending]
        if len(runners) == 1:
            outcomes = [runners[0].run()]
        else:
            workers = min(self.parallelism or len(runners), len(runners))
            with ThreadPoolExecutor(workers, thread_name_prefix=f"fanout-{self.pipeline}") as pool:
                tasks = [_in_spark_thread(r.run, df) for r in runners]  # wrap in this thread
                outcomes = list(pool.map(lambda task: task(), tasks))
        results = {o.sink: o.result for o in outcomes if o.result is not None}
        failures = {o.sink: o.error for o in outcomes if o.error is not None}
        return results, failures

    def _runner(
        self,
        name: str,
        df: Any,
        info: BatchInfo,
        arrows: dict[Route, SharedArrow],
        checked: Mapping[Route, CheckedRoute],
        targets: Mapping[str, DeadLetterWriter | Exception],
    ) -> SinkRunner:
        """One sink's runner: its routed batch, and for a checked route the rows that
        failed it (with a dead-letter target) or the error that fails it unwritten."""
        spec = self.specs[name]
        route = spec.route
        found = targets.get(name)
        target = None if isinstance(found, Exception) else found
        check = checked.get(route)
        blocked = found if isinstance(found, Exception) else None
        if blocked is None and check is not None:
            blocked = check.blocked(name, info.batch_id, dead_letters=target is not None)
        letters: tuple[DeadLetter, ...] = ()
        explain = None
        arrow: SharedArrow | None = None
        if blocked is not None:
            routed = df  # never written: the runner reports ``blocked``
        elif check is not None and check.df is not None:
            routed, arrow, letters = check.df, check.arrow, check.letters  # evaluated already
        elif route.is_identity:
            routed = df
            arrow = arrows.setdefault(route, SharedArrow(routed))
        else:
            try:
                routed = route.resolve(df, sink=name, batch_id=info.batch_id)
                arrow = arrows.setdefault(route, SharedArrow(routed))
                explain = partial(explain_failure, df, route, sink=name, batch_id=info.batch_id)
            except RouteError as unresolved:  # never written: the runner reports it
                blocked, routed = unresolved, df
        batch = Batch(routed, info, name, txn_app_id(info.pipeline, name, info.epoch), _arrow=arrow)
        return SinkRunner(
            spec.sink,
            batch,
            self.ledger,
            spec.retry or self.retry,
            self.hooks,
            letters=letters,
            dead_letters=target,
            blocked=blocked,
            explain=explain,
        )


def _active_spark() -> Any:
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        return None
    return SparkSession.getActiveSession()


CACHE_COMPRESSED = "spark.sql.inMemoryColumnarStorage.compressed"


def _persist_uncompressed(df: Any) -> None:
    """``df.persist()``, caching the batch's columns uncompressed unless the session sets
    ``spark.sql.inMemoryColumnarStorage.compressed`` itself.

    The cache lives for one batch and is read once per reader, so compressing it costs
    CPU and buys nothing but memory: in bench/bench_three_sinks.py (1M rows, 10 batches,
    3 sinks) building the compressed cache took ~1.4 of the ~8 task CPU seconds, and the
    Spark JVM used ~2.5 CPU s (~15%) more. The price is memory: an uncompressed cache is
    larger (MEMORY_AND_DISK spills what does not fit); a session that sets the option
    explicitly keeps its choice. Spark reads the option when ``persist()`` plans the
    cache, so it is set for that call only and unset right after (another query of the
    same session persisting in that instant would cache uncompressed too: harmless).
    """
    conf = getattr(getattr(df, "sparkSession", None), "conf", None)
    if conf is None or conf.get(CACHE_COMPRESSED, None) is not None:
        df.persist()
        return
    conf.set(CACHE_COMPRESSED, "false")
    try:
        df.persist()
    finally:
        conf.unset(CACHE_COMPRESSED)


def _in_spark_thread(fn: Any, df: Any) -> Any:
    """Wrap ``fn`` so Spark jobs it starts inherit this thread's local properties (job
    group, streaming query id), as jobs started by foreachBatch itself do."""
    session = getattr(df, "sparkSession", None)
    if session is None:
        return fn
    from pyspark.util import inheritable_thread_target

    return inheritable_thread_target(session)(fn)
