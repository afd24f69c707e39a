"""The one error hierarchy of fanout.

Every error fanout raises on purpose derives from :class:`FanoutError`::

    FanoutError
    ├── ConfigurationError          bad options, found before the stream starts
    │   └── UnknownSinkTypeError    a sink ``type`` no installed plugin provides
    ├── PluginError                 a plugin cannot be used
    │   ├── PluginLoadError         a plugin raised while being imported
    │   │   └── DuplicatePluginError  two distributions register one entry-point name
    │   └── DuplicateSinkTypeError  two plugins claim one sink type name
    ├── SinkError                   one sink, one batch
    │   ├── SinkWriteError          a write failed (chained ``from`` the cause)
    │   │   ├── DeadLetterMovedError  an earlier dead-letter target cannot say what it holds
    │   │   └── RenamedSinkError  a new sink's target holds a batch of a sink renamed mid-batch
    │   ├── SinkTimeoutError        a lag sink's write passed its ``write_timeout_s``
    │   ├── SchemaMismatchError     the batch schema does not fit the target
    │   ├── RouteError              the sink's ``where``/``select`` failed on the batch's rows
    │   ├── PartitioningError       partition membership not stable, or changed mid-batch
    │   └── TransientSinkError      raise it (or subclass it) to ask for a retry
    │       └── SinkUnreachableError  open() cannot reach the target (also a
    │                                 ConfigurationError; a lag sink starts behind)
    ├── PartitionInputError         a partition task's input may be cut short (executor)
    ├── LedgerError                 the ledger cannot be read or written
    ├── SpoolError                  the spool cannot be read or written
    ├── LagLimitError               a lagging sink's backlog passed its ``max_lag``
    ├── SinksBehindError            a run ended with sinks still missing batches
    ├── MissedBatchesError          a sink would be written past batches it never received
    ├── CheckpointError             the checkpoint does not match the ledger
    │   ├── CheckpointResetError    the checkpoint was lost or replaced (another query id)
    │   └── CheckpointRollbackError the checkpoint was rolled back (batches re-planned)
    ├── BatchFailedError                 a micro-batch failed in one or more sinks
    └── StopRequestedError      a batch Spark began after a stop was requested, refused

Note the two spellings: ``FanoutError`` is the base class of everything, ``BatchFailedError``
is the error of a failed fan-out (named after the :class:`fanout.FanOut` that raises it).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar


class FanoutError(Exception):
    """Base class of every error fanout raises on purpose."""


class ConfigurationError(FanoutError):
    """Options or targets that cannot work; raised before the stream starts.

    The command line maps it to exit code 2.
    """


class UnknownSinkTypeError(ConfigurationError):
    """A sink was configured with a ``type`` that no installed plugin provides."""

    def __init__(self, sink_name: str, type_name: str, known: Sequence[str]) -> None:
        self.sink_name = sink_name
        self.type_name = type_name
        self.known = sorted(known)
        known_text = ", ".join(self.known) or "none (is any fanout plugin installed?)"
        super().__init__(
            f"sink {sink_name!r}: unknown sink type {type_name!r}; known types: {known_text}. "
            "A sink type comes from a plugin distribution registered under the 'fanout' "
            "entry-point group; `fanout plugins` lists what is installed. Install the "
            "distribution providing it (`pip install -e .` in its directory), or name a "
            "module of your own that is not installed (the module or its name) in "
            "`FanOut(plugins=[...])`, or in a pipeline file's `plugins = [...]`."
        )


class PluginError(FanoutError):
    """A plugin cannot be used."""


class PluginLoadError(PluginError):
    """A plugin raised while being imported or while answering a hook, or (subclass
    :class:`DuplicatePluginError`) cannot be loaded without guessing."""

    def __init__(
        self,
        plugin_name: str,
        distribution: str | None,
        cause: BaseException,
        *,
        what_to_do: str = "",
    ) -> None:
        """
        :param what_to_do: a sentence appended after the cause, when it does not say it.
        """
        self.plugin_name = plugin_name
        self.distribution = distribution
        self.cause: BaseException | None = cause  # None: nothing raised (a duplicate)
        origin = f" (distribution {distribution})" if distribution else ""
        then = f"; {what_to_do}" if what_to_do else ""
        super().__init__(
            f'Error importing plugin "{plugin_name}"{origin}: {type(cause).__name__}: {cause}'
            + then
        )


class SinkTypeError(PluginError, ConfigurationError):
    """A sink type its plugin declares wrong (its class, its ``guarantees``, its options),
    naming the plugin, the type and what to write. Only that type is refused: the
    plugin's other types load, and a configuration using none of it runs (with a
    warning); a sink of it is a configuration error (exit 2), before anything starts."""


class DuplicatePluginError(PluginLoadError):
    """Two distributions register one entry-point name in the ``fanout`` group; the second
    is not loaded (which one comes first depends on the install order)."""

    def __init__(
        self, plugin_name: str, first: str, second: str, distributions: Sequence[str | None]
    ) -> None:
        """
        :param plugin_name: the entry point's name.
        :param first: the registration loaded, described (distribution, version, module).
        :param second: the registration not loaded, described the same way.
        :param distributions: the two distributions' names, when known.
        """
        self.plugin_name = plugin_name
        self.distribution = distributions[1]
        self.providers = (first, second)
        self.cause = None
        named = [f"`pip uninstall {d}`" for d in distributions if d]
        how = f" ({' or '.join(named)})" if named else ""
        PluginError.__init__(
            self,
            f"plugin {plugin_name!r} (an entry point of the 'fanout' group) is registered by "
            f"two distributions: {first} and {second}; fanout will not pick one by install "
            f"order: uninstall one of them{how}, or rename the entry point in one",
        )


class DuplicateSinkTypeError(PluginError):
    """Two plugins claim the same sink type name."""

    def __init__(self, type_name: str, first: str, second: str) -> None:
        self.type_name = type_name
        self.providers = (first, second)
        super().__init__(
            f"sink type {type_name!r} is provided by two plugins: {first} and {second}; "
            "uninstall one of them (pip uninstall ...) or rename the type in one plugin"
        )


class SinkError(FanoutError):
    """An error of one sink while handling one batch."""

    def __init__(self, message: str, *, sink: str, batch_id: int | None = None) -> None:
        self.sink = sink
        self.batch_id = batch_id
        where = f"sink {sink!r}" + (f", batch {batch_id}" if batch_id is not None else "")
        super().__init__(f"{where}: {message}")


class SinkWriteError(SinkError):
    """A sink's write failed; the cause is chained with ``raise ... from``."""


class DeadLetterMovedError(SinkWriteError):
    """The sink's ``dead_letter`` changed since an attempt of this batch, and the target of
    that attempt cannot be opened or cannot say which of the batch's letters it holds:
    writing them to the target the sink has now could keep a letter twice, once in each
    (docs/architecture.md §7, "A ``dead_letter`` moved"). Raised before anything of the
    batch is written, naming both targets and the ways on."""


class RenamedSinkError(SinkWriteError):
    """A sink with no record of the batch it would write whose target holds that batch
    written under the name of a sink the pipeline no longer configures (renamed, or removed,
    after it committed the batch and before its ledger mark): writing would put the batch
    there twice, so nothing is written. Not transient. One class for every check that finds
    it: the run's start check (:mod:`fanout.steps.renamed`, through
    :meth:`fanout.Sink.holds_batch_of`) and a sink's own at its first write (the Delta sink,
    the PostgreSQL append sink); the message names the target, both sinks, the batch and the
    ways on (:func:`fanout.contract.sink.renamed_sink_advice`; docs/architecture.md §5, "A
    sink renamed mid-batch")."""


class SinkResultError(SinkError):
    """A sink's write reported counts no batch can give (rows below zero, more rows than
    were routed to it): a bug in the sink. The batch fails for that sink, unmarked."""


class TargetLostError(SinkError):
    """A sink's target no longer holds the last batch the ledger marks written there, by
    the sink's own records (:meth:`fanout.Sink.holds_batch` answered ``False``): deleted
    or replaced behind fanout's back, and created again empty. Raised at a run's first
    batch, before anything is written, naming the sink, its target and the batch; a sink
    with ``on_failure="lag"`` is not raised for but lags with it (never written, its
    batches spooled) while the others go on. A run given ``accept_lost_targets`` (``fanout
    run --accept-lost-target SINK``) accepts the loss and writes on."""


class SinkRecordsGoneError(TargetLostError):
    """A sink's own records of the last batch the ledger marks written there (those
    :meth:`fanout.Sink.holds_batch` reads: PostgreSQL's ``state_schema`` tables, Kafka's
    marker records, Delta's app transactions) are gone while its target still holds rows
    (:meth:`fanout.Sink.records_gone` says what): it cannot tell which batches the target
    holds, so a replay could write one a second time. Raised at a run's first batch, a
    new epoch's start, or a batch Spark replays that the sink cannot tell it holds
    (:mod:`fanout.steps.replay`), before anything is written, naming the sink, the batch, what is
    gone and the ways on (not for a sink whose :meth:`fanout.Sink.harmless_rewrite` gives a
    reason: it writes on, warned); handled as a :class:`TargetLostError`
    (``on_failure="lag"``, ``accept_lost_targets``)."""


class SinkTimeoutError(SinkError):
    """A sink with ``on_failure="lag"`` and ``write_timeout_s`` did not finish writing a
    batch in time: the batch went on without it (it lags), or its catch-up waits for that
    abandoned write to end (docs/architecture.md §14.9)."""


class SchemaMismatchError(SinkError):
    """The batch's columns or types cannot be written to the sink's target.

    ``batch_id`` is the batch's in :meth:`fanout.Sink.write`; :meth:`fanout.Sink.check_schema`
    has no batch and leaves it out.
    """

    def __init__(
        self, message: str, *, sink: str, batch_id: int | None = None, columns: Sequence[str]
    ) -> None:
        self.columns = list(columns)
        super().__init__(message, sink=sink, batch_id=batch_id)


class RouteError(SinkError):
    """A sink's route (its ``where`` or a ``select`` expression) failed on the batch's
    rows, e.g. a malformed value under ANSI mode (``CAST_INVALID_INPUT``).

    Raised, chained ``from`` Spark's error, when the sink has no dead-letter target, when
    more rows fail than fanout isolates (:data:`fanout.routes.rejects.REJECT_LIMIT`), or when
    the failing rows cannot be isolated. ``kind`` is ``"where"`` or ``"select"`` (``None``
    when the failing expression is not known) and ``expression`` its text.
    """

    def __init__(
        self,
        message: str,
        *,
        sink: str,
        batch_id: int | None,
        kind: str | None = None,
        expression: str | None = None,
    ) -> None:
        self.kind = kind
        self.expression = expression
        self.detail = message  # without the "sink ..., batch ...: " prefix
        super().__init__(message, sink=sink, batch_id=batch_id)


class PartitioningError(SinkError, ConfigurationError):
    """A sink with per-partition commits (Kafka, PostgreSQL append) cannot rely on a
    replay rebuilding the same partitions: a column it partitions by is not deterministic
    (``uuid()``, ``rand()``, ``current_timestamp()``...), or the partitioning or the
    rows of a partition that already committed the batch changed since. Also raised for an
    upsert sink whose keys are not deterministic (a replay would write every row again).

    Raised before anything of the batch is written; also a :class:`ConfigurationError`,
    since only a change of the route, the source or the options fixes it. ``batch_id`` is
    ``None`` when found at construction.
    """


class TransientSinkError(SinkError):
    """A failure worth retrying (a timeout, a lost connection, a commit conflict).

    Sinks raise it, or classify their own errors through :meth:`fanout.Sink.is_transient`;
    the dispatcher retries transient errors with backoff and fails at once on the others.
    """


class SinkUnreachableError(TransientSinkError, ConfigurationError):
    """``Sink.open`` cannot reach the target (a server down, a name that does not resolve),
    as opposed to a wrong option. It stops ``FanOut(...)`` like any configuration error,
    except for a sink with ``on_failure="lag"``, which starts behind and is opened again
    until it can be (docs/architecture.md §14.2)."""


class PartitionInputError(FanoutError):
    """On an executor: a partition task's input ended without proof that Spark ended it
    (the JVM abandoned the task while feeding it, so the rows received are only part of the
    partition). Raised by the input's iterator in place of its end, so the writer's
    transaction rolls back instead of committing part of the partition
    (:mod:`fanout.partitioned.input_end`)."""


class LedgerError(FanoutError):
    """The ledger cannot be read or written."""


class CompactionError(FanoutError):
    """A compaction of a Delta table (the ledger's or a sink's) raced another compaction of
    the same files, so rows were in the table twice, and taking it back failed: the
    message names the files to remove (:mod:`fanout.delta_tables.compaction`)."""


class HistoryUnsettledError(FanoutError):
    """A Delta table's history could not be numbered: other writers committed during each
    of its reads (:func:`fanout.delta_tables.io.numbered_history`).

    :param listed: the last listing's commit infos, newest first, as delta-rs numbered
        them: their order holds, their ``version`` numbers do not (what they show
        regardless of numbering, e.g. whether any is a RESTORE)."""

    def __init__(self, message: str, listed: Sequence[Mapping[str, Any]] = ()) -> None:
        super().__init__(message)
        self.listed = list(listed)


class SpoolError(FanoutError):
    """The spool (the batches lagging sinks still need) cannot be read or written; the
    batch fails, so Spark replays it."""


class BackfillError(FanoutError):
    """A sink's ``backfill_from`` source cannot give back a batch it committed as it was
    (its table or dead letters no longer hold what its ledger mark records): nothing of the
    batch is written to the backfilled sink, which waits at it, tried again each probe
    interval. The message names both sinks, the batch, what is missing and the ways on.

    :param sink: the sink being backfilled.
    :param batch_id: the batch it cannot be given.
    """

    def __init__(self, message: str, *, sink: str, batch_id: int) -> None:
        self.sink, self.batch_id = sink, batch_id
        super().__init__(f"sink {sink!r}, batch {batch_id}: {message}")


class LagLimitError(FanoutError):
    """A sink with ``on_failure="lag"`` fell further behind than its ``max_lag`` allows
    and could not catch up: the query stops rather than let the spool grow.

    :param sink: the lagging sink.
    :param batches: how many batches it still needs from the spool.
    :param rows: how many rows those batches hold.
    """

    def __init__(
        self, pipeline: str, sink: str, batches: int, rows: int, since: str, limit: str, cause: str
    ) -> None:
        self.pipeline, self.sink, self.batches, self.rows = pipeline, sink, batches, rows
        super().__init__(
            f"pipeline {pipeline!r}: sink {sink!r} is {batches} batch(es) / {rows} row(s) behind "
            f"(lagging since {since}), past its max_lag ({limit}), and it is still failing: "
            f"{cause}. The query stops so the spool does not grow without bound; nothing is "
            f"lost: fix the sink and restart, and {sink!r} catches up from the spool first."
        )


class _Behind(Protocol):
    @property
    def sink(self) -> str: ...

    @property
    def stuck(self) -> bool: ...

    def describe(self) -> str: ...


class SinksBehindError(FanoutError):
    """A run ended with sinks still missing batches: ``availableNow`` or ``once`` drained
    the source and their final catch-up (:meth:`fanout.FanOut.final_catch_up`) left them
    behind, or a stop (a signal) ended the run, which gives them no final catch-up
    (:meth:`fanout.FanOut.stopped`). Nothing is lost: the spool (or a backfill source)
    keeps the batches, and the next run writes them to each sink first, in batch order,
    exactly once.

    :param behind: each sink still behind (:class:`fanout.contract.lag.SinkBehind`): its
        name, the batches it misses from first to last, and its last error.
    :param spool: the spool's location.
    :param ledger: the ledger's location (for the status command the message gives).
    :param stopped_by: what stopped the run (a signal's name, ``SIGTERM``), when a stop
        ended it; ``None``: its trigger did, and a final catch-up ran.
    :param during_catch_up: the stop came during the final catch-up, which it ended after
        the write in progress (else before any: no final catch-up).
    """

    def __init__(
        self,
        pipeline: str,
        behind: Sequence[_Behind],
        spool: str | None,
        ledger: str,
        *,
        stopped_by: str | None = None,
        during_catch_up: bool = False,
    ) -> None:
        self.pipeline, self.behind, self.stopped_by = pipeline, list(behind), stopped_by
        lines = "".join(f"\n  - {b.describe()}" for b in self.behind)
        where = "" if spool is None else f" at {spool}"
        status = f"fanout status --ledger {ledger} --pipeline {shell_word(pipeline)}" + (
            "" if spool is None else f" --spool {spool}"
        )
        stuck = [b.sink for b in self.behind if b.stuck]
        if stuck:
            held = (
                f"Not written by the next run until you act: {', '.join(stuck)}, which "
                "cannot be given its next batch as things stand (its last error above names "
                "the batch and the ways on). The other batches wait "
                f"in the spool{where} (or a backfill source), and the next run"
            )
        else:
            held = (
                f"Nothing is lost: the spool{where} keeps those batches (a backfill source the "
                "ones it holds), and the next run"
            )
        fix = "" if len(stuck) == len(self.behind) else " Fix the sink(s), then run again;"
        if stopped_by is None:
            ended = "after a final catch-up"
        elif during_catch_up:
            ended = f"(stopped by {stopped_by} during the final catch-up)"
        else:
            ended = f"(stopped by {stopped_by}: no final catch-up)"
        super().__init__(
            f"pipeline {pipeline!r}: the run ended with {len(self.behind)} sink(s) behind "
            f"{ended}:{lines}\n{held} of this pipeline writes them to each "
            f"sink first, in batch order and exactly once, before its live batches.{fix} "
            f"`{status}` shows how far behind they are."
        )


class MissedBatchesError(FanoutError):
    """A sink would be written past batches it never received.

    Its ledger mark in the batch's epoch is older than the batch before, and neither the
    spool nor a backfill source holds the batches in between for it: its spool was lost or
    replaced, or it was left out of the configuration while they ran. fanout refuses
    before any sink writes the batch. The message names the sink, its mark, the batch and
    the missing batches, and the ways on: ``backfill_from``, or an explicit
    ``fanout ledger skip`` (:func:`fanout.ledger.gaps.skip_batches`).

    :param sink: the sink.
    :param mark: its last committed batch of ``epoch``.
    :param batch_id: the batch refused.
    :param missing: the batch ids it never received, in order.
    :param spooled: the batch ids between its mark and the batch that the spool (or the
        backfill source) still holds for it, before and after the gap: those before it
        could not be written to it now; the skip named stops at the gap's end, before the
        next of them (``fanout ledger skip --spool`` refuses to pass one the spool holds).
    :param spool: the spool's location, for the ``fanout ledger skip`` command named.
    :param backfill_from: the sink's backfill source, when it has one (which then holds
        none of the missing batches).
    :param caught_up: the refused batch is one the catch-up would have given the sink (the
        other sinks hold it), not a live batch.
    :param config: the pipeline file the pipeline runs from (``fanout run``), absolute: the
        skip named carries ``--config`` with it, so that it checks the sink's
        ``backfill_from`` source; ``None`` (a ``FanOut`` built in Python): no ``--config``.
    :param no_mark_since: the newest mark of any sink of the pipeline, when it is older than
        the batch before the refused one (no sink marked the batches missing): the message
        then names the likely cause, a ledger restored from an older copy.
    """

    def __init__(
        self,
        pipeline: str,
        sink: str,
        epoch: int,
        mark: int,
        batch_id: int,
        missing: Sequence[int],
        ledger: str,
        spooled: Sequence[int] = (),
        backfill_from: str | None = None,
        spool: str | None = None,
        caught_up: bool = False,
        config: str | None = None,
        no_mark_since: int | None = None,
    ) -> None:
        self.pipeline, self.sink, self.epoch = pipeline, sink, epoch
        self.no_mark_since = no_mark_since
        self.mark, self.batch_id, self.missing = mark, batch_id, list(missing)
        self.spooled = list(spooled)
        which = batch_ranges(self.missing)
        in_epoch = f" of epoch {epoch}" if epoch else ""
        give_back = (
            f"restore the spool (the backfill source {backfill_from!r} of {sink!r} holds "
            "none of them: it has no committed mark for them)"
            if backfill_from
            else f"configure backfill_from='<an append-mode Delta sink of the pipeline>' on "
            f"{sink!r} (it catches up from that sink's table) or restore the spool"
        )
        # a skip stops at the first gap's end: it gives up no batch still held after it
        through = min((b for b in self.spooled if b > self.missing[0]), default=batch_id) - 1
        skipped = batch_ranges([b for b in self.missing if b <= through])
        command = (
            f"`fanout ledger skip{f' --config {config}' if config else ''} --ledger {ledger} "
            f"--pipeline {shell_word(pipeline)} --sink {shell_word(sink)} "
            f"--through {through} --epoch {epoch}"
            f"{f' --spool {spool}' if spool else ''}` (in Python: "
            "fanout.ledger.gaps.skip_batches)"
        )
        held_back = (
            f"its catch-up does not write it to {sink!r} (the other sinks hold it)."
            if caught_up
            else "no sink writes this batch."
        )
        before = [b for b in self.spooled if b < self.missing[0]]
        if not self.spooled:
            accept = f"accept that {sink!r} never gets them: {command}, then restart."
        elif not before:
            again = (
                ", and refused again at the next batch it never received"
                if self.missing[-1] > through
                else ""
            )
            accept = (
                f"accept that {sink!r} never gets batch(es) {skipped}: {command}, then "
                f"restart: it is given batch(es) {batch_ranges(self.spooled)}, which the spool "
                f"or its backfill source still holds for it, next, in order{again}."
            )
        else:
            accept = (
                f"once {sink!r} holds batch(es) {batch_ranges(before)}, which the spool "
                "or its backfill source still holds for it and which could not be written to "
                "it now (they are written first, in order, at each start: fix the sink and "
                f"restart), accept that it never gets batch(es) {skipped}: {command}, then "
                "restart. A skip past batches the spool still holds is refused: "
                "--release-spooled gives them up too."
            )
        super().__init__(
            f"pipeline {pipeline!r}, batch {batch_id}: sink {sink!r} last committed batch "
            f"{mark}{in_epoch} and never received batch(es) {which}, which neither the spool "
            "nor a backfill source holds for it (the spool was lost or replaced, or the sink "
            "was left out of the configuration while they ran); writing it now would lose "
            f"them for it silently, so {held_back} Either give them back: "
            f"{give_back}; or {accept}{_no_mark_since(no_mark_since, batch_id)}"
        )


def _no_mark_since(newest: int | None, batch_id: int) -> str:
    """What :class:`MissedBatchesError` adds when no sink marked the batches missing."""
    if newest is None:
        return ""
    return (
        f" No sink of the pipeline has a mark after batch {newest}, yet Spark ran the "
        f"batches up to {batch_id - 1}: when the ledger was restored from an older copy (or "
        "replaced), those batches were written and only their marks are gone (each sink's "
        "own records tell: a Delta table's app transactions, PostgreSQL's progress table); "
        f"the skip above, made for each sink in turn (each restart names the next), records "
        "them without writing anything. If every sink lagged through them and the spool was "
        "lost, they are lost for every sink: the skip accepts that."
    )


def shell_word(text: str) -> str:
    """``text`` as one word of a command fanout prints (``fanout recover --config ...``),
    quoted for a POSIX shell only where it needs to be, so that the command runs as printed
    when pasted into a shell: ``/data/orders.toml`` stays as it is, ``/data/it's & co``
    is printed ``'/data/it'"'"'s & co'`` (:func:`shlex.quote`). Every value a printed
    command carries goes through this function, or through
    :func:`fanout.contract.locations.command_location` (a location, made absolute), which
    uses it. A pipeline or sink name passes it unchanged (its characters are letters,
    digits, ``_``, ``.`` and ``-``: :func:`fanout.contract.names.check_name`); it is quoted
    all the same, so that no command depends on that rule."""
    return shlex.quote(text)


def batch_ranges(ids: Sequence[int]) -> str:
    """``[1, 2, 3, 5]`` as ``"1-3, 5"``."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


_E = TypeVar("_E", bound=BaseException)


def error_with_text(kind: type[_E], text: str, **fields: object) -> _E:
    """An error of class ``kind`` whose message is ``text`` as it is, with ``fields`` (its
    ``sink``, ``batch_id``...) set as attributes: how an error is rebuilt around a message
    made elsewhere (a masked one, a checklist), keeping the class callers catch it by.

    ``kind.__init__`` is not called: it may want more than a text, or prefix one
    (:class:`SinkError`'s names its sink, which ``text`` already does).
    """
    error = kind.__new__(kind)
    Exception.__init__(error, text)
    for field, value in fields.items():
        setattr(error, field, value)
    return error


class CheckpointError(FanoutError):
    """The Spark checkpoint does not match what the ledger recorded; fanout refuses to
    write, because the sinks would skip rows or write them twice."""


class CheckpointResetError(CheckpointError):
    """The ledger knows newer batches of this pipeline than the checkpoint does.

    Raised when the Spark checkpoint was deleted or replaced: batch ids restarted, and
    writing would either be skipped silently by the sinks' idempotency checks or written
    twice. The message names, per sink, the last committed batch, its query id and its
    recorded source offsets, and says how to proceed.
    """


class ZombieBatchError(CheckpointResetError):
    """A query of the epoch a reset replaces committed a batch after the ``fanout recover``
    report the new epoch starts from: the new epoch reads that batch's input again, so
    its rows would be (or are) in the sinks twice.

    Raised when the new epoch starts (nothing written yet: stop the old query, run
    ``fanout recover`` again, start from its new offsets), and by the old query's mark
    of a batch it wrote after the new epoch started (the rows are in the sinks twice: the
    message names the sink and the batch).
    """


class _Part(Protocol):
    """A :class:`fanout.PartlyHeld`, as :class:`UnmarkedBatchError` holds it (this module
    imports nothing of fanout's)."""

    @property
    def committed(self) -> int: ...

    @property
    def partitions(self) -> int | None: ...


class UnmarkedBatchError(CheckpointResetError):
    """A sink holds, by its own records, the batch after its last ledger mark in the epoch
    a reset replaces, all of it or part of it (:class:`fanout.PartlyHeld`: some of its
    partitions committed): it wrote that batch, and the driver died (or the query stopped)
    before the mark. The new epoch would read that batch's input again under new
    idempotency keys, and the sink would hold its rows twice; the ledger cannot see it.

    Raised when the new epoch starts, before anything of it is written
    (:meth:`fanout.Sink.holds_batch`; a sink without a mark in that epoch is asked about
    its first batch), unless the sink's rewrite of the batch is harmless
    (:meth:`fanout.Sink.harmless_rewrite`; never for part of a batch: the old checkpoint's
    replay completes it). ``on_checkpoint_reset="new_epoch"`` does not
    take it. The message names the sink, the batch, its source offsets when the ledger knows
    them, the sinks that lack the batch, and the operator's choices.

    Also raised when a sink that would be asked could not be opened (``on_failure="lag"``:
    it was not asked), and when the query refused for a batch held unmarked is started
    again on its checkpoint while a sink would get that batch a second time.

    What the refusal is about, for a caller to read instead of the message (each ``None``
    where the raise site does not know it, or where the sinks it names differ in it):

    :ivar sinks: every sink the refusal names, in the message's order: at a start, those
        holding the batch after their mark, or those that could not be asked; for the
        refused query started again, those that lost their mark of the batch and, asked
        again, still hold it, or (when another sink wrote and marked the batch since, not
        asked) those that lost it. Empty when the raise site names none.
    :ivar sink: the one sink of ``sinks``, when it names one (``None`` for several).
    :ivar batch_id: the batch the refusal is about (held without its mark, or the one an
        unopened sink would have been asked about), when it is one batch for all of
        ``sinks`` (``None``: they differ, or an unopened sink has no mark in the epoch, so
        it would have been asked about several in turn).
    :ivar epoch: that batch's epoch, the one the new epoch would replace.
    :ivar holds: what the sinks answered about it, as :meth:`fanout.Sink.holds_batch`
        answers: ``True`` the whole batch, a :class:`fanout.PartlyHeld` part of it (no lost
        mark recorded), ``None`` not asked (a sink not opened; a refused query started
        again after another sink wrote the batch) or answers that differ. Never ``False``.
    """

    def __init__(
        self,
        message: str,
        *,
        sinks: Sequence[str] = (),
        batch_id: int | None = None,
        epoch: int | None = None,
        holds: bool | _Part | None = None,
    ) -> None:
        self.sinks = tuple(sinks)
        self.sink = self.sinks[0] if len(self.sinks) == 1 else None
        self.batch_id, self.epoch, self.holds = batch_id, epoch, holds
        super().__init__(message)


class CheckpointRollbackError(CheckpointError):
    """The checkpoint was rolled back: Spark handed a batch that it planned again.

    Raised when the query (same query id, or one fanout cannot tell apart) hands a batch
    that the ledger recorded with other source offsets or another planning time
    (``batchTimestampMs`` of ``offsets/<N>``), or a batch older than batches the ledger
    already holds: the checkpoint was restored from a backup or lost its newest
    ``offsets/`` and ``commits/`` files. The re-planned batch can hold rows the sinks never
    received, which every sink holding the batch id would skip. ``on_checkpoint_reset``
    does not apply: the re-planned batches overlap batches the sinks hold. The message
    names the batch, both plans and each sink's last batch, and says how to proceed.
    """


class BatchFailedError(FanoutError):
    """A micro-batch failed in one or more sinks, after their retries.

    ``failures`` maps each failed sink name to its error; ``committed`` names the sinks
    that hold the batch (``None``: not known); ``rows_in`` is the batch's input rows
    (``None``: not known), which Spark's progress, missing for a failed batch, cannot give
    ``fanout run``'s summary. On restart Spark replays the batch and only the sinks that do
    not hold it are written.
    """

    def __init__(
        self,
        pipeline: str,
        batch_id: int,
        failures: Mapping[str, BaseException],
        committed: Iterable[str] | None = None,
        *,
        rows_in: int | None = None,
    ):
        self.pipeline = pipeline
        self.batch_id = batch_id
        self.rows_in = rows_in
        self.failures = dict(failures)
        self.committed = None if committed is None else sorted(committed)
        replay = "when the query restarts and Spark replays it"
        if self.committed is None:
            outcome = f"any other sink that committed the batch is skipped {replay}"
        elif self.committed:
            outcome = (
                f"{', '.join(self.committed)} committed the batch and will be skipped {replay}"
            )
        else:
            outcome = f"no sink committed the batch: each one writes it {replay}"
        lines = [
            f"pipeline {pipeline!r}, batch {batch_id}: {len(self.failures)} sink(s) failed "
            f"({', '.join(sorted(self.failures))}); {outcome}:"
        ]
        for name in sorted(self.failures):
            error = self.failures[name]
            lines.append(f"  - {name}: {type(error).__name__}: {error}")
        super().__init__("\n".join(lines))


class StopRequestedError(FanoutError):
    """A batch Spark began after a stop was requested (:meth:`fanout.FanOut.request_stop`,
    which ``fanout run`` calls on SIGINT/SIGTERM and :meth:`fanout.FanOut.stop_query`
    calls, under Spark Connect too), refused before fanout did anything of it: nothing was
    written or marked. The query fails with it, so Spark does not commit
    the batch and runs it again at the next start. ``fanout run`` reads it as a clean stop.
    """

    def __init__(self, pipeline: str, batch_id: int) -> None:
        self.pipeline = pipeline
        self.batch_id = batch_id
        super().__init__(
            f"pipeline {pipeline!r}, batch {batch_id}: refused, a stop was requested before "
            "the batch began; nothing of it was written, and Spark runs it again when the "
            "query starts next (nothing to do)"
        )

    def __reduce__(self) -> tuple[type[StopRequestedError], tuple[str, int]]:
        return (type(self), (self.pipeline, self.batch_id))


OWN_ERROR = re.compile(r"^fanout\.errors\.(\w+): ", re.MULTILINE)
"""A line of a query's error where one of fanout's errors begins: the Python trace Spark
hands back (classic mode and Spark Connect alike) names each error by its full name."""


def is_stop_refusal(error: BaseException | None) -> bool:
    """Whether ``error``, a streaming query's error (what ``query.awaitTermination()``
    raised, or ``query.exception()``), is fanout's refusal of a batch Spark began after a
    stop was requested (:class:`StopRequestedError`): a clean stop, not a failure. After
    :meth:`fanout.FanOut.stop_query` (or ``request_stop``) with a backlog, the query usually
    ends with that refusal; nothing of the refused batch was written, and it runs at the
    next start. ``False`` for ``None`` and for any other error, including a failure fanout
    raised after the refusal in the same trace (the last of fanout's errors decides)::

        try:
            query.awaitTermination()
        except StreamingQueryException as exc:
            if not fanout.is_stop_refusal(exc):
                raise
    """
    if error is None:
        return False
    if isinstance(error, StopRequestedError):
        return True
    text = str(getattr(error, "desc", None) or error)
    own = list(OWN_ERROR.finditer(text))
    return bool(own) and own[-1].group(1) == StopRequestedError.__name__
