"""The hooks fanout calls, and the markers plugins use to implement them.

A plugin is a module (or object) registered under the ``fanout`` entry-point group, or
passed to ``FanOut(plugins=[...])``, that implements some of these hooks with
``@fanout.hookimpl``. Sink-type plugins implement :func:`fanout_sink_types`; observers
(metrics, alerting, fault injection in tests) implement the lifecycle hooks. A plugin may
also add ``fanout`` sub-commands (:func:`fanout_cli_commands`) and the embedded servers of
its sinks (:func:`fanout_embedded_services`). A hook fanout does not define is refused when
the plugin loads (pluggy's ``check_pending()``).

The per-batch sequence, for each micro-batch Spark hands to ``FanOut``:

1. fanout reads the context (batch id, query id, source offsets), runs the checkpoint-reset
   guard and asks the ledger which sinks have not committed the batch yet.
2. :func:`fanout_batch_start` with the pending and skipped sinks (also when none is pending).
   Then, still before any write, the routes of routed sinks that have a dead-letter target
   are evaluated, and rows failing them set aside (:mod:`fanout.routes.rejects`).
3. For every pending sink, in parallel threads:

   a. :func:`fanout_sink_start` before each attempt;
   b. the rows that failed the sink's route, if any, written to its dead-letter target
      (:func:`fanout_dead_letter_kinds`); then the sink's ``write(batch)``;
   c. on an exception, :func:`fanout_sink_error` (``will_retry`` tells whether another
      attempt follows);
   d. on success, :func:`fanout_sink_done` — *after* the write, *before* the ledger mark;
   e. the ledger mark of ``(sink, batch)``.

4. For pipelines with sinks that may lag (``on_failure="lag"``, ``backfill_from``):
   :func:`fanout_sink_lag` with every such sink's state, after the batch was spooled for
   the sinks behind it. The catch-up writes missed batches in a background thread through
   the same sink hooks (a, c, d), with the missed batch's ``info``.
5. :func:`fanout_batch_end` when every pending sink committed (all marks written, before
   Spark writes its commit log), or :func:`fanout_batch_failed` when one or more sinks
   failed for good; then ``BatchFailedError`` is raised to Spark.

Lifecycle hooks are observers: an exception they raise is logged with the plugin's name
and does not fail the batch. Hooks run on the driver, the sink hooks in the sink's thread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from fanout.contract.batch import BatchInfo
    from fanout.contract.lag import SinkLag, SpoolSize
    from fanout.contract.partitions import PartitionCommit
    from fanout.contract.sink import Sink, SinkResult
    from fanout.deadletters.target import DeadLetterKind
    from fanout.errors import BatchFailedError
    from fanout.hooks.commands import CliCommand
    from fanout.hooks.services import EmbeddedService

PROJECT_NAME = "fanout"
"""The pluggy project name, which is also the entry-point group plugins register under."""

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# -------------------------------------------------------------------------------------
# Sink types
# -------------------------------------------------------------------------------------


@hookspec
def fanout_sink_types() -> Mapping[str, type[Sink] | str]:
    """Return the sink types this plugin provides, as ``{type_name: SinkClass}`` or, lazily,
    ``{type_name: "package.module:SinkClass"}``.

    Called once when a ``FanOut`` (or ``fanout plugins``) builds its registry. A sink
    configured as ``{"type": type_name, "name": ..., **options}`` is built as
    ``SinkClass(name=..., **options)``.

    Every ``fanout`` command loads every installed plugin, so a plugin module importing its
    sink's driver libraries (a database client, pandas) makes every command pay for them.
    A reference ``"package.module:SinkClass"`` (the built-in sinks' form) is imported only
    when the type is used: a sink of it built or its options checked (``fanout run``,
    ``fanout validate``, ``FanOut``), or the type listed (``fanout plugins``). A module that
    then fails to import is the plugin's :class:`fanout.errors.PluginLoadError` (``fanout
    plugins`` lists it and exits 1); a class failing fanout's checks, a
    :class:`fanout.errors.PluginError`, as when the class is returned itself. Keep the
    plugin module (the entry point) and the package's ``__init__`` free of those imports.

    :return: a mapping of type names to :class:`fanout.Sink` subclasses or references to
        them. Every plugin's mapping is used; two plugins returning the same type name is
        an error naming both. ``{}`` registers nothing; ``None`` does too, as in pluggy,
        with a warning naming the plugin (a missing ``return``?); anything else is a
        :class:`fanout.errors.PluginError`.
    """
    raise NotImplementedError  # a specification: pluggy never calls this body


# -------------------------------------------------------------------------------------
# Commands and services (the ``fanout`` command-line tool)
# -------------------------------------------------------------------------------------


@hookspec
def fanout_cli_commands() -> Sequence[CliCommand]:
    """Return the ``fanout`` sub-commands this plugin provides.

    Called each time the ``fanout`` command builds its argument parser (before it parses
    the command line), so ``fanout --help`` lists a plugin's commands exactly when the plugin
    is installed. The fanout-postgres plugin provides ``fanout migrate`` this way.

    :return: :class:`fanout.hooks.commands.CliCommand` objects. Every plugin's commands are
        used; a name already taken by a core command or by another plugin is an error naming
        both (``fanout`` then exits with 1).
    """
    raise NotImplementedError  # a specification: pluggy never calls this body


@hookspec
def fanout_embedded_services() -> Sequence[EmbeddedService]:
    """Return the local servers this plugin can start for its sink types.

    Called by ``fanout demo`` (for each sink type the demo writes whose server was not given
    on the command line) and by ``fanout dev up`` (all of them, exporting each address as the
    service's ``env_var``). Nothing starts until the core enters ``service.start(root)``.

    :return: :class:`fanout.hooks.services.EmbeddedService` objects, named for the sink type
        they serve. Two plugins returning the same name is an error naming both.
    """
    raise NotImplementedError  # a specification: pluggy never calls this body


# -------------------------------------------------------------------------------------
# Dead-letter kinds
# -------------------------------------------------------------------------------------


@hookspec
def fanout_dead_letter_kinds() -> Mapping[str, DeadLetterKind]:
    """Return the dead-letter target kinds this plugin provides, as ``{kind: factory}``.

    Called once when a ``FanOut`` (or ``fanout validate``) builds its registry. A sink's
    ``dead_letter = "<kind>:<location>"`` is resolved, when the ``FanOut`` is built, by
    calling ``factory(location, sink)`` (:mod:`fanout.deadletters.target`); the factory
    returns a :class:`fanout.deadletters.target.DeadLetterTarget` (configuration only:
    it may be pickled to the executors) or raises :class:`fanout.ConfigurationError` when
    it cannot serve that sink. The core provides ``delta`` (any path or URI).

    :return: a mapping of kind names to factories. Two plugins returning the same kind is
        an error naming both.
    """
    raise NotImplementedError  # a specification: pluggy never calls this body


# -------------------------------------------------------------------------------------
# Partition commits (on the executors)
# -------------------------------------------------------------------------------------


@hookspec
def fanout_partition_commit(commit: PartitionCommit) -> None:
    """Called on the executor just before one partition of a sink built on the
    partitioned-sink kit (:mod:`fanout.partitioned.sink`: PostgreSQL, Kafka) commits its
    transaction, after its rows were written (and, for Kafka, delivered). The Delta
    sink's append from the executors calls it in each task once the task's files are
    written, before the driver commits every task's files at once.

    Only plugins given to ``FanOut(plugins=...)`` (pickled with each partition task, so
    they must be picklable and hold their state in files or services, not in memory)
    and installed entry-point plugins are called. Raising aborts the partition's
    transaction: a :class:`fanout.TransientSinkError` makes the batch replay, anything
    else fails it.

    :param commit: the pipeline, sink, batch, partition and its row counts.
    """
    raise NotImplementedError  # a specification: pluggy never calls this body


@hookspec
def fanout_partition_committed(commit: PartitionCommit) -> None:
    """Called on the executor right after one partition's transaction committed (not for
    partitions a replay skips): for metrics, audit, or tests that kill the driver between
    partitions. Called like :func:`fanout_partition_commit`; what it raises is printed
    and ignored (the partition is committed).

    :param commit: the pipeline, sink, batch, partition and its row counts.
    """
    raise NotImplementedError  # a specification: pluggy never calls this body


# -------------------------------------------------------------------------------------
# Batch lifecycle (observers)
# -------------------------------------------------------------------------------------


@hookspec
def fanout_batch_start(info: BatchInfo, pending: Sequence[str], skipped: Sequence[str]) -> None:
    """Called when a micro-batch arrives, after the guard and the plan, before any write.

    :param info: pipeline, batch id, query id and source offsets.
    :param pending: the sinks about to be written.
    :param skipped: the sinks the ledger says already committed this batch.
    """


@hookspec
def fanout_sink_start(info: BatchInfo, sink: str, attempt: int) -> None:
    """Called in the sink's thread just before each attempt of ``sink.write``.

    :param info: the batch: pipeline, batch id, query id and source offsets.
    :param sink: the sink name.
    :param attempt: 1 for the first attempt, 2 for the first retry, ...
    """


@hookspec
def fanout_sink_error(
    info: BatchInfo, sink: str, error: BaseException, attempt: int, will_retry: bool
) -> None:
    """Called in the sink's thread when an attempt of ``sink.write`` raised.

    :param info: the batch: pipeline, batch id, query id and source offsets.
    :param sink: the sink name.
    :param error: the exception the sink raised.
    :param attempt: the attempt that failed.
    :param will_retry: True when the error is transient and retries remain.
    """


@hookspec
def fanout_sink_done(info: BatchInfo, sink: str, result: SinkResult, duration_s: float) -> None:
    """Called in the sink's thread after ``sink.write`` succeeded, *before* the ledger
    mark is written.

    A crash here leaves the batch written but unmarked: the sink is called again on replay
    and must be idempotent. (Tests kill the process here to prove it is.)

    :param info: the batch: pipeline, batch id, query id and source offsets.
    :param sink: the sink name.
    :param result: what the sink reported (rows and details).
    :param duration_s: wall time of the successful attempt.
    """


@hookspec
def fanout_batch_end(info: BatchInfo, results: Mapping[str, SinkResult]) -> None:
    """Called when every pending sink wrote and marked the batch, before ``FanOut``
    returns to Spark (so before Spark writes ``commits/<batch_id>``).

    :param info: the batch: pipeline, batch id, query id and source offsets.
    :param results: the result of each sink written in this call (skipped sinks absent).
    """


@hookspec
def fanout_batch_failed(
    info: BatchInfo,
    failures: Mapping[str, BaseException],
    results: Mapping[str, SinkResult],
    error: BatchFailedError,
) -> None:
    """Called when one or more sinks failed the batch after their retries, just before
    ``error`` is raised to Spark.

    :param info: the batch: pipeline, batch id, query id and source offsets.
    :param failures: the final error of each failed sink.
    :param results: the sinks that did commit the batch in this call.
    :param error: the :class:`fanout.BatchFailedError` about to be raised (Spark hands it
        back wrapped in a JVM trace): its message names the failed sinks and those that
        hold the batch.
    """


@hookspec
def fanout_sink_lag(info: BatchInfo, lags: Mapping[str, SinkLag], spool: SpoolSize | None) -> None:
    """Called at the end of each batch of a pipeline with sinks that may lag
    (``on_failure="lag"`` or ``backfill_from``), with each such sink's state: live,
    lagging (its last attempt failed) or catching up, and how far behind it is.

    :param info: the live batch.
    :param lags: each lag-capable sink's :class:`fanout.contract.lag.SinkLag`.
    :param spool: what the spool holds (``None`` without a spool).
    """
