"""``fanout run`` and ``fanout validate``: a pipeline from a TOML file.

``run`` builds the SparkSession, the source, the sinks and the ledger, starts the query and
prints one line per batch and a summary at the end (:mod:`fanout.app.progress`), and stops
it on SIGINT or SIGTERM: between batches at once; during a batch it waits up to
``pipeline.stop_timeout_s`` for the batch to finish, then abandons it by exiting at once
(Spark replays it on restart and fanout skips the sinks that committed it), and says which
happened. A batch Spark begins once the stop was asked is refused before it writes anything
and runs at the next start (:func:`_stop`). A second signal ends the process at once. A run
its trigger ends (``available_now``, ``once``) gives lagging sinks a final catch-up and
exits 3 when one is still behind (:func:`_final_catch_up`); a clean stop gives them none,
and exits 3 too when one is behind (:func:`_stopped`). Lagging sinks' catch-up starts with
the query, not with its first batch, which a restart finding no new data never runs
(:func:`_start_catch_up`).
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TextIO

from fanout.app.config import PipelineConfig, check_checkpoint_writable, parse, plugin_names, read
from fanout.app.progress import ProgressObserver
from fanout.contract.batch import BatchInfo
from fanout.contract.options import self_expanded_options
from fanout.contract.sink import SinkResult, declares_guarantees, declaring_class
from fanout.errors import (
    OWN_ERROR,
    BatchFailedError,
    ConfigurationError,
    PluginLoadError,
    SinksBehindError,
    TransientSinkError,
    is_stop_refusal,
    shell_word,
)
from fanout.hooks.registry import (
    PerSinkType,
    Registry,
    load_registry,
    option_names,
    resolve_plugins,
    warn_of_refused_types,
)
from fanout.hooks.specs import hookimpl
from fanout.observe.logs import known_secrets
from fanout.observe.secrets import redact
from fanout.steps.stop_gate import StopGate

log = logging.getLogger("fanout")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP_GRACE_S = 5.0  # the least time Spark gets to stop a query no batch of fanout's runs in
EXIT_FAILED = 1
EXIT_BEHIND = 3
"""The run ended with a lagging sink still missing batches: after the final catch-up (the
trigger drained the source), or at a clean stop by a signal (no catch-up). They wait in the
spool for the next run."""
StopOutcome = Literal["between", "finished", "failed", "abandoned"]


class BatchTracker:
    """An observer that knows whether a batch is in flight, and the last one committed."""

    def __init__(self) -> None:
        self.in_flight: int | None = None
        self.last_committed: int | None = None
        self.failure: str | None = None  # fanout's own message for the batch that failed
        self.down: list[str] = []  # the failed sinks, when each failed only as transient
        self.idle = threading.Event()
        self.idle.set()

    def committed_text(self) -> str:
        """The run's last committed batch, as the end-of-run lines say it."""
        if self.last_committed is None:
            return "no batch ran in this run"
        return f"last committed batch {self.last_committed}"

    @hookimpl
    def fanout_batch_start(
        self, info: BatchInfo, pending: Sequence[str], skipped: Sequence[str]
    ) -> None:
        """A batch began."""
        self.in_flight = info.batch_id
        self.idle.clear()

    @hookimpl
    def fanout_batch_end(self, info: BatchInfo, results: Mapping[str, SinkResult]) -> None:
        """A batch committed in every sink."""
        self.last_committed, self.in_flight = info.batch_id, None
        self.idle.set()

    @hookimpl
    def fanout_batch_failed(
        self,
        info: BatchInfo,
        error: BatchFailedError,
    ) -> None:
        """A batch failed (the query is about to fail): keep fanout's own message, whole,
        for the run's summary (Spark hands the query's error back as a JVM trace)."""
        self.failure = str(error)
        down = all(isinstance(e, TransientSinkError) for e in error.failures.values())
        self.down = sorted(error.failures) if down else []
        self.in_flight = None
        self.idle.set()


def sink_option_names() -> dict[str, list[str]]:
    """Every installed sink type and its option names, for checking config files."""
    return _option_names(_installed_sinks())


def sink_self_expanded_options() -> dict[str, list[str]]:
    """Each installed sink type's options it expands ``${VAR}`` in itself."""
    return _self_expanded(load_registry())


def load_pipeline(path: str) -> PipelineConfig:
    """The pipeline file at ``path``, checked against the installed sink types and those of
    the modules its top-level ``plugins`` names (imported first: one that does not import
    is a :class:`fanout.ConfigurationError` naming it and its error), their plugins
    discovered once. A sink type the file uses that cannot load is a
    :class:`fanout.ConfigurationError` too: its plugin declares it wrong (said by the
    sink's key), or its ``"module:Class"`` module, of any plugin, does not import (the
    plugin's import error, with what to do); one it does not use is only logged."""
    file = Path(path)
    data = read(file)
    own = plugin_names(data)
    registry = file_registry(own, file)
    # each class imported when the file uses its type; a refused type the file uses is
    # its SinkTypeError, said once: only those it does not use are warned of
    types = registry.sink_types(warn_refused=False)
    try:
        config = parse(
            data,
            PerSinkType(types, option_names),
            file,
            PerSinkType(types, self_expanded_options),
            PerSinkType(types, lambda sink_class: sink_class),
        )
    except PluginLoadError as exc:
        # a sink module imported when the file uses its type: the file uses a type that
        # cannot load, as when its plugin declares it wrong; of the file's own plugin, as
        # much the file's module as the plugin module itself (file_registry)
        where = "plugins: " if exc.plugin_name in own else ""
        raise ConfigurationError(f"{file}: {where}{exc}") from exc
    warn_of_refused_types(types)
    return config


def file_registry(plugins: Sequence[str], file: str | Path | None = None) -> Registry:
    """The installed plugins, plus the modules a pipeline file's ``plugins`` names (``file``:
    the file, for the message): what every command building sinks from the file uses. A
    module that does not import is a :class:`fanout.ConfigurationError` naming the module
    and its import error; an installed plugin that does not, its
    :class:`fanout.errors.PluginLoadError`."""
    try:
        modules = resolve_plugins(plugins)
    except PluginLoadError as exc:
        where = f"{file}: " if file is not None else ""
        raise ConfigurationError(f"{where}plugins: {exc}") from exc
    registry = load_registry(modules)
    registry.raise_load_errors()
    return registry


def _installed_sinks() -> Registry:
    return file_registry(())


def _option_names(registry: Registry) -> dict[str, list[str]]:
    types = registry.sink_types().items()
    return {name: option_names(t.sink_class) for name, t in types if t.refused is None}


def _self_expanded(registry: Registry) -> dict[str, list[str]]:
    types = registry.sink_types().items()
    return {name: self_expanded_options(t.sink_class) for name, t in types if t.refused is None}


def build_session(config: PipelineConfig) -> Any:
    """The SparkSession the config asks for (executors use this interpreter)."""
    from fanout.spark import local_session

    spark = config.spark
    return local_session(
        spark.get("app_name", f"fanout-{config.name}"),
        master=spark.get("master"),
        conf={k: str(v) for k, v in dict(spark.get("conf", {})).items()},
    )


def build_source(spark: Any, config: PipelineConfig) -> Any:
    """The streaming DataFrame: format, options, optional schema and SQL transform."""
    source = config.source
    reader = spark.readStream.format(source["format"])
    if "schema" in source:
        reader = reader.schema(source["schema"])
    reader = reader.options(**{k: str(v) for k, v in dict(source.get("options", {})).items()})
    try:
        df = reader.load(source["path"]) if "path" in source else reader.load()
        if "transform" in source:
            df.createOrReplaceTempView("source")
            df = spark.sql(source["transform"])
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigurationError(f"source: {first}") from None
    return df


def build_fanout(
    spark: Any, config: PipelineConfig, plugins: Sequence[object] = (), *, serve: bool = True,
    new_epoch: bool = False, accept_lost_targets: Sequence[str] = (),
) -> Any:  # fmt: skip
    """The FanOut of the config (opens every sink and the ledger); ``serve`` starts the
    metrics endpoint when the config has a ``[metrics]`` section; ``new_epoch``: a
    checkpoint reset continues under a new epoch (``fanout run --new-epoch``);
    ``accept_lost_targets``: sinks whose lost target this run writes on into
    (``fanout run --accept-lost-target``, :class:`fanout.TargetLostError`)."""
    from fanout.fan_out import FanOut

    observers = [*config.plugins, *plugins]  # the file's modules, by name
    if config.metrics is not None and serve:
        from fanout.observe.metrics import MetricsObserver

        observers.append(
            MetricsObserver.serve(
                config.name,
                port=config.metrics.get("port", 9108),
                host=config.metrics.get("host", "0.0.0.0"),
            )
        )
    return FanOut(
        config.name,
        config.ledger,
        config.sinks,
        parallelism=config.parallelism,
        retries=config.retries,
        backoff_s=config.backoff_s,
        plugins=observers,
        checkpoint_location=config.checkpoint,
        spark=spark,
        spool=config.spool,
        probe_interval_s=config.probe_interval_s,
        share_tasks=config.share_tasks,
        pipeline_file=None if config.path is None else str(config.path),
        on_checkpoint_reset="new_epoch" if new_epoch else "refuse",
        accept_lost_targets=accept_lost_targets,
    )


def refuse_unfit_sinks(fan: Any, df: Any) -> None:
    """Before the stream starts, :meth:`fanout.FanOut.check_source`: the checks ``fanout
    validate`` makes of each opened sink against the source's schema (its route resolves,
    its target takes the routed schema), the same code a library user calls. Without them
    a misspelt column in ``where`` or ``keys`` failed its sink at batch 0, after the
    checkpoint was made and the other sinks had written the batch. Raises
    :class:`fanout.ConfigurationError` listing every failure, the ``FanOut`` closed."""
    try:
        fan.check_source(df)
    except BaseException:
        fan.close()
        raise


def _start(df: Any, fan: Any, config: PipelineConfig) -> Any:
    writer = df.writeStream.foreachBatch(fan).option("checkpointLocation", config.checkpoint)
    trigger = config.trigger
    if trigger.get("available_now"):
        writer = writer.trigger(availableNow=True)
    elif trigger.get("once"):
        writer = writer.trigger(once=True)
    elif "processing_time" in trigger:
        writer = writer.trigger(processingTime=trigger["processing_time"])
    return writer.queryName(config.name).start()


def validate(path: str, out: TextIO | None = None) -> int:
    """Check the file, the source and every sink's target, without starting the stream
    and without writing anything (:mod:`fanout.app.validate`)."""
    from fanout.app.validate import report, run_checks

    out = out or sys.stdout  # looked up now: tests and callers may have replaced it
    config = load_pipeline(path)
    check_checkpoint_writable(config)
    spark = build_session(config)
    out.write(f"{path}: checking pipeline {config.name!r}\n")
    checklist = run_checks(spark, config, build_source)
    report(checklist.checks, out)
    out.write(f"{path}: pipeline {config.name!r} is valid\n")
    for name, spec in checklist.specs.items():
        route = (
            ""
            if spec.route.is_identity
            else f" route: where={spec.route.where!r} select={spec.route.select!r}"
        )
        guarantee = spec.sink.guarantee
        if not declares_guarantees(declaring_class(spec.sink)):
            guarantee = f"{guarantee} (not declared)"  # the default: fanout cannot know
        out.write(f"  sink {name}: {type(spec.sink).__name__}, {guarantee}{route}\n")
    return 0


def refuse_unknown_accepted(config: PipelineConfig, accepted: Sequence[str], path: str) -> None:
    """Raise :class:`fanout.ConfigurationError` when an ``--accept-lost-target`` names no
    sink of the pipeline file at ``path``, in the flag's words and with the file's sinks,
    before anything starts (the ``FanOut``'s own check names its parameter,
    ``accept_lost_targets``, and runs once Spark and the source are up)."""
    names = sorted(str(sink["name"]) for sink in config.sinks)
    unknown = [name for name in dict.fromkeys(accepted) if name not in names]
    if not unknown:
        return
    lines = []
    for name in unknown:
        close = difflib.get_close_matches(name, names, n=1)
        lines.append(
            f"--accept-lost-target {name}: pipeline {config.name!r} ({path}) has no sink "
            f"{name!r}" + (f", did you mean {close[0]}?" if close else "")
        )
    raise ConfigurationError("\n".join(lines) + f"\nIts sinks: {', '.join(names)}")


def run(
    path: str,
    out: TextIO | None = None,
    *,
    new_epoch: bool = False,
    accept_lost_targets: Sequence[str] = (),
) -> int:
    """Run the pipeline until its trigger ends it, it fails, or SIGINT/SIGTERM stops it.

    ``new_epoch`` (``--new-epoch``): this run accepts a checkpoint reset, continuing under a
    new epoch; refused before anything starts when there is no reset to accept
    (:func:`fanout.app.new_epoch.check_new_epoch`). ``accept_lost_targets``
    (``--accept-lost-target SINK``): this run writes on into those sinks' targets even when
    they lost batches the ledger marks written there (:class:`fanout.TargetLostError`).

    :return: the exit code: 0 finished or stopped cleanly with every sink holding every
        batch (also when the stop refused a batch Spark began after the signal, which runs
        at the next start), 1 failed (also when a batch fails while a stop waits for it),
        :data:`EXIT_BEHIND` (3) when a lagging sink still misses batches: after its final
        catch-up once the trigger drained the source, or at a clean stop (which gives it no
        catch-up). A stop that abandons its batch does not return: the process exits at
        once with 128 + the signal's number (:func:`_leave`).
    """
    out = out or sys.stdout
    config = load_pipeline(path)
    check_checkpoint_writable(config)
    refuse_unknown_accepted(config, accept_lost_targets, path)
    accepted = None
    if new_epoch:
        from fanout.app.new_epoch import check_new_epoch

        accepted = check_new_epoch(config, path)
    spark = build_session(config)
    _quiet_query_errors(spark)
    df = build_source(spark, config)
    tracker = BatchTracker()
    progress = ProgressObserver()
    fan = build_fanout(
        spark, config, plugins=[tracker, progress], new_epoch=new_epoch,
        accept_lost_targets=accept_lost_targets,
    )  # fmt: skip
    refuse_unfit_sinks(fan, df)
    if accepted is not None:
        out.write(accepted + "\n")
    stop = threading.Event()
    received: list[signal.Signals] = []

    def request_stop(signum: int, _frame: Any) -> None:
        received.append(signal.Signals(signum))
        for sig in STOP_SIGNALS:  # a second signal ends the process at once
            signal.signal(sig, signal.SIG_DFL)
        stop.set()

    previous = {s: signal.signal(s, request_stop) for s in STOP_SIGNALS}
    try:
        query = _start(df, fan, config)
        out.write(f"pipeline {config.name!r} started (query {query.id}); Ctrl-C stops it cleanly\n")
        _start_catch_up(fan, query, out)
        out.flush()
        while query.isActive and not stop.is_set():
            progress.report(query.recentProgress, out)
            stop.wait(0.5)
        if stop.is_set():
            outcome = _stop(query, tracker, config, received[0].name, out, fan.stop_gate)
            _end_progress(progress, query, config, out)
            if outcome == "failed":
                return _failed(query, tracker, config, out)
            if outcome == "abandoned":
                _leave(128 + received[0].value)
            return _stopped(fan, received[0].name, out)
        _end_progress(progress, query, config, out)
        if query.exception() is not None:
            return _failed(query, tracker, config, out)
        if _final_catch_up(fan, stop, out, lambda: received[0].name if received else None):
            return EXIT_BEHIND
        out.write(f"pipeline {config.name!r} finished ({tracker.committed_text()})\n")
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        fan.close()


def _start_catch_up(fan: Any, query: Any, out: TextIO) -> None:
    """Start the catch-up with the query, not with its first batch, which may never come
    (no new data); say so when a sink is behind: what it misses, and whether its catch-up
    starts now or waits for the first batch (:meth:`fanout.FanOut.start_catch_up`)."""
    try:
        behind = fan.behind()
    except Exception as exc:  # the ledger unreadable: the first batch fails on it, whole
        log.warning("pipeline %s: cannot tell which sinks are behind: %s", fan.pipeline, exc)
        behind = []
    reason = fan.start_catch_up(query)
    for sink in behind:
        if reason is None:
            when = "writing them beside the query"
        else:
            when = f"its catch-up waits for the first batch ({redact(reason, known_secrets())})"
        out.write(
            f"catch-up: {sink.sink} misses {sink.batch_range()} ({sink.batches} batch(es)); "
            f"{when}\n"
        )


def _final_catch_up(
    fan: Any, stop: threading.Event, out: TextIO, signal_name: Callable[[], str | None]
) -> int:
    """The query ended by itself (``available_now`` or ``once`` drained the source): give
    each lagging sink its final catch-up (:meth:`fanout.FanOut.final_catch_up`) and say how
    it went; :data:`EXIT_BEHIND` when a sink is still behind (the message names it, its
    batches and what the next run does), else 0. A signal ends it after the write in
    progress (``signal_name()``: its name, which the message gives)."""
    behind = fan.behind()
    for sink in behind:
        out.write(
            f"final catch-up: {sink.sink} misses {sink.batch_range()} ({sink.batches} "
            "batch(es)); writing them before the run ends\n"
        )
    out.flush()
    try:
        fan.final_catch_up(stop=stop.is_set, stopped_by=signal_name)
    except SinksBehindError as exc:
        return _behind(exc, out)
    for sink in behind:
        out.write(f"final catch-up: {sink.sink} caught up ({sink.batch_range()})\n")
    return 0


def _stopped(fan: Any, signame: str, out: TextIO) -> int:
    """A clean stop (between batches, or its batch finished): no catch-up, since the
    operator asked the run to end (:meth:`fanout.FanOut.stopped`), but
    :data:`EXIT_BEHIND` when a sink is still behind, with the final catch-up's message
    (the sink, its batches, what the next run does), else 0. A scheduler can so tell a
    stop that left sinks behind from a complete one."""
    try:
        fan.stopped(signame)
    except SinksBehindError as exc:
        return _behind(exc, out)
    return 0


def _behind(error: SinksBehindError, out: TextIO) -> int:
    """Print the sinks a run left behind (secrets masked); :data:`EXIT_BEHIND`."""
    out.write(redact(str(error), known_secrets()) + "\n")
    out.flush()
    return EXIT_BEHIND


def _failed(query: Any, tracker: BatchTracker, config: PipelineConfig, out: TextIO) -> int:
    """Report the query's failure: fanout's own message, whole, and the file holding the
    traces; the failure's exit code."""
    error = query.exception()
    message = tracker.failure or (_summary(error) if error is not None else "the query failed")
    out.write(f"pipeline {config.name!r} failed: {message}\n")
    if tracker.failure is not None and tracker.down:
        out.write(_down_next(tracker.down, config) + "\n")
    if error is not None:
        out.write(f"(the full trace, Spark's included: {_save_trace(config.name, error)})\n")
    out.flush()
    return EXIT_FAILED


def _leave(code: int) -> None:
    """End the process now, without waiting for the batch Spark is running: flush what was
    written and logged, then ``os._exit`` (no ``finally``, no ``atexit``, no thread joined;
    the Spark JVM exits when its Python driver does). As safe as a crash: the batch was not
    marked, so Spark replays it and fanout skips the sinks that committed it."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    logging.shutdown()
    os._exit(code)


def _end_progress(
    progress: ProgressObserver, query: Any, config: PipelineConfig, out: TextIO
) -> None:
    """The lines of the batches not yet reported, then the run's summary."""
    progress.flush(query.recentProgress, out)
    out.write(progress.summary(config.name) + "\n")
    out.flush()


def _stop(
    query: Any,
    tracker: BatchTracker,
    config: PipelineConfig,
    signame: str,
    out: TextIO,
    gate: StopGate | None = None,
) -> StopOutcome:
    """Stop the query on a signal; say, and return, how it ended.

    The ``FanOut``'s ``gate`` closes first (:class:`fanout.steps.stop_gate.StopGate`): a
    batch Spark begins from then on is refused before fanout does anything of it
    (:class:`fanout.StopRequestedError`; Spark runs it at the next start), so Spark's
    ``query.stop()``, which interrupts the batch it runs, never interrupts one of fanout's
    (with a backlog, Spark begins the next batch as soon as one ends). A batch in flight
    (begun, or inside the foreachBatch call before fanout's tracker saw it) gets
    ``stop_timeout_s`` to finish; ``query.stop()`` is only called once no batch of fanout's
    is running, since it waits for the foreachBatch call in flight whatever its own timeout.
    A batch still running at the deadline is abandoned: the caller leaves without waiting
    for it. The refusal is a clean stop; any other error of the query, a failure."""
    inside = None if gate is None else gate.close()
    batch = tracker.in_flight if tracker.in_flight is not None else inside
    started = time.monotonic()
    if batch is not None:
        out.write(
            f"{signame}: batch {batch} in flight; waiting up to {config.stop_timeout_s:g} s "
            "for it to finish (a second Ctrl-C or SIGTERM ends the run at once)\n"
        )
        out.flush()
        if not _batch_over(tracker, gate, config.stop_timeout_s, started):
            return _abandoned(signame, batch, started, out)
        if tracker.failure is not None:
            _stop_query(query, STOP_GRACE_S)
            out.write(f"{signame}: batch {batch} failed while the stop waited for it\n")
            return "failed"
    remaining = config.stop_timeout_s - (time.monotonic() - started)
    if not _stop_query(query, max(remaining, STOP_GRACE_S)):  # Spark began another batch
        return _abandoned(signame, tracker.in_flight, started, out)
    refused = None if gate is None else gate.refused
    error = query.exception()
    if tracker.failure is not None or (error is not None and not _is_refusal(error, refused)):
        out.write(f"{signame}: the query failed while it stopped\n")
        return "failed"
    after = "" if refused is None else f"before batch {refused} began (it runs at the next start)"
    if batch is None:
        if refused is None:
            out.write(f"{signame}: stopped between batches; {tracker.committed_text()}\n")
        else:
            out.write(f"{signame}: stopped {after}; {tracker.committed_text()}\n")
        return "between"
    out.write(f"{signame}: batch {batch} finished; stopped cleanly{' ' + after if after else ''}\n")
    return "finished"


def _batch_over(
    tracker: BatchTracker, gate: StopGate | None, timeout_s: float, started: float
) -> bool:
    """Wait, until ``timeout_s`` after ``started``, for the batch in flight to end: its
    tracker idle and, with a ``gate``, no batch inside the foreachBatch call (one that
    entered it may not have told the tracker yet). Whether it ended."""
    if not tracker.idle.wait(timeout_s):
        return False
    return gate is None or gate.wait_empty(timeout_s - (time.monotonic() - started))


def _is_refusal(error: Any, refused: int | None) -> bool:
    """Whether the query's ``error`` is the gate's refusal of batch ``refused`` (the error
    fanout raised last in its trace is :class:`fanout.StopRequestedError`), not another
    failure."""
    return refused is not None and is_stop_refusal(error)


def _down_next(sinks: Sequence[str], config: PipelineConfig) -> str:
    """What to do after a batch failed only because ``sinks`` did not answer (each one's
    errors transient, its retries spent): nothing is wrong with the data or the file."""
    names = ", ".join(sinks)
    file = "PIPELINE.toml" if config.path is None else shell_word(str(config.path.absolute()))
    answer = "it answers" if len(sinks) == 1 else "they answer"
    return (
        f"Next: {names} did not answer (transient errors, retries spent). Once {answer}, "
        f"run `fanout run {file}` again: Spark replays the batch and only {names} writes "
        'it. To let the other sinks go on while a sink is down, give it on_failure = "lag".'
    )


def _abandoned(signame: str, batch: int | None, started: float, out: TextIO) -> StopOutcome:
    what = "the query" if batch is None else f"batch {batch}"
    out.write(
        f"{signame}: {what} still running after {time.monotonic() - started:.0f} s "
        "(stop_timeout_s); abandoned: fanout exits without waiting for it, Spark replays "
        "it on restart and fanout skips the sinks that committed it\n"
    )
    out.flush()
    return "abandoned"


def _stop_query(query: Any, timeout_s: float) -> bool:
    """``query.stop()`` waiting at most ``timeout_s``; whether the query stopped."""

    def stop() -> None:
        try:
            query.stop()
        except Exception as exc:  # a query that failed may raise its error again here
            log.debug("stopping the query: %s", exc)

    stopper = threading.Thread(target=stop, name="fanout-stop", daemon=True)
    stopper.start()
    stopper.join(timeout_s)
    return not stopper.is_alive()


def _quiet_query_errors(spark: Any) -> None:
    """Keep Spark's streaming engine from logging a failed query's traces to the console:
    ``run`` prints fanout's own message last and saves the traces to a file it names
    (at ``--log-level DEBUG`` Spark's log stays on)."""
    if log.isEnabledFor(logging.DEBUG):
        return
    try:
        jvm = spark.sparkContext._jvm
        off = jvm.org.apache.logging.log4j.Level.OFF
        configurator = jvm.org.apache.logging.log4j.core.config.Configurator
        configurator.setLevel("org.apache.spark.sql.execution.streaming", off)
    except Exception as exc:  # another logging backend: its output stays
        log.debug("cannot quiet Spark's streaming log: %s", exc)


# its message ends where Spark's part begins, or a chained exception's trace does
_AFTER_OWN_ERROR = re.compile(
    r"\n(?:=== Streaming Query ===|\tat |JVM stacktrace:|\n?During handling of the above "
    r"exception|\n?The above exception was the direct cause|\n?Traceback \(most recent call)"
)


def _summary(error: Any) -> str:
    """fanout's own error raised outside a batch's sinks (a checkpoint reset or rollback,
    missed batches: no ``fanout_batch_failed``), whole, as the Python trace Spark hands back
    ends with it; else the first line of a query error fanout did not raise (the source
    failed, Spark itself...): its own description, never a line of trace."""
    text = redact(str(getattr(error, "desc", None) or error), known_secrets()).strip()
    if found := list(OWN_ERROR.finditer(text)):
        own = text[found[-1].end() :]
        return _AFTER_OWN_ERROR.split(own, maxsplit=1)[0].strip()
    return text.splitlines()[0] if text else type(error).__name__


def _save_trace(pipeline: str, error: Any) -> str:
    """Write the query's whole error (Spark's and Python's traces) to a file, and log it at
    DEBUG; return the file's path for the summary to name."""
    raw = f"{getattr(error, 'desc', '') or ''}\n\n{getattr(error, 'stackTrace', '') or error}"
    text = redact(raw, known_secrets())  # masked here, whatever handlers the log has
    handle, path = tempfile.mkstemp(prefix=f"fanout-{pipeline}-error-", suffix=".log")
    with os.fdopen(handle, "w") as file:
        file.write(text)
    log.debug("pipeline %s failed:\n%s", pipeline, text)
    return path
