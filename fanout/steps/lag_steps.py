"""The steps of a batch for sinks that lag (docs/architecture.md §14): before the write,
hold back the sinks that are behind (3b); after it, let a lag-policy sink's failure lag
instead of failing the batch, and spool the batch for every sink that still needs it (6b).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING

from fanout.contract.batch import Batch, SharedArrow, txn_app_id
from fanout.contract.dead_letters import DELTA, split_target
from fanout.contract.sessions import in_spark_thread
from fanout.contract.sink import BackfillSource
from fanout.delta_tables.io import refuse_unusable_location
from fanout.errors import (
    CheckpointError,
    ConfigurationError,
    LagLimitError,
    RenamedSinkError,
    TargetLostError,
    batch_ranges,
)
from fanout.ledger.entry import now_utc
from fanout.ledger.gaps import release_command, status_command
from fanout.observe.logs import batch_fields
from fanout.observe.secrets import redact_printed
from fanout.sink_spec import SinkSpec
from fanout.spool.data import BATCH_COLUMN, EPOCH_COLUMN, PIPELINE_COLUMN, SPOOLING_COLUMN
from fanout.spool.index import BatchKey, SpooledBatch
from fanout.spool.table import Spool
from fanout.steps.catchup import CatchUp
from fanout.steps.lag import Backlog, Lagging, over_limit, sinks_in
from fanout.steps.record import Recorder
from fanout.steps.state import BatchState
from fanout.steps.timeout import AbandonedWrites

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("fanout")


def check_spool(
    pipeline: str, specs: Mapping[str, SinkSpec], path: str | None, ledger: str | None = None
) -> Spool | None:
    """The pipeline's spool; a :class:`fanout.ConfigurationError` when a sink lags or
    backfills and no spool is given."""
    users = [name for name, spec in specs.items() if spec.lag.uses_spool]
    if users and path is None:
        raise ConfigurationError(
            f"pipeline {pipeline!r}: sink(s) {', '.join(map(repr, users))} have "
            "on_failure='lag' or backfill_from, which keep missed batches in a spool: pass "
            "FanOut(spool=<path>) (in a pipeline file: pipeline.spool)"
        )
    if path is None:
        return None
    refuse_unusable_location(str(path), f"pipeline {pipeline!r}: spool {str(path)!r}")
    return Spool(str(path), pipeline, ledger=ledger)


def check_spooled_sinks(
    pipeline: str,
    specs: Mapping[str, SinkSpec],
    spool: Spool,
    needs: Callable[[str, BatchKey], bool],
    ledger: str,
) -> None:
    """Refuse to start when the spool holds batches for a sink that no longer lags and
    still ``needs`` them (its ledger mark is older): it would skip them. Index rows of
    batches its mark holds (caught up, or given up by ``fanout ledger skip``) are released
    at this start. The refusal names the ``fanout status`` that shows the sink behind (with
    the spool: without it, a lagging sink reads ``stopped``) and the release that gives
    the batches up; ``ledger``: the ledger as commands name it
    (:func:`fanout.ledger.entry.ledger_location`)."""
    needed: dict[str, list[BatchKey]] = {}
    for batch in spool.batches():
        for sink in sorted(batch.needed_by):
            if sink in specs and not specs[sink].lag.uses_spool and needs(sink, batch.key):
                needed.setdefault(sink, []).append(batch.key)
    for sink, keys in sorted(needed.items()):
        epoch = min(keys)[0]
        ids = sorted(b for e, b in keys if e == epoch)
        status = status_command(ledger, pipeline, spool.path)
        raise ConfigurationError(
            f"pipeline {pipeline!r}: sink {sink!r} still needs batches from the spool "
            f"at {spool.path} (the oldest: batch {ids[0]} of epoch {epoch}) but no longer has "
            "on_failure='lag'; it would skip them. Keep on_failure='lag' until it has "
            f"caught up: `{status}` lists it 'lagging' or 'catching up' until then (once "
            "every sink is live, the table has no state column). Or, if it must never get "
            "them, give them up (they are released from the spool, the sink's next batch "
            f"writes it): `{release_command(ledger, pipeline, sink, ids[-1], epoch, spool.path)}`"
            + ("." if len({e for e, _ in keys}) == 1 else " (then start again for later epochs).")
        )


def warn_left_out(
    pipeline: str,
    specs: Mapping[str, SinkSpec],
    spool: Spool,
    ledger: str,
    given_up: Collection[tuple[str, BatchKey]] = (),
) -> None:
    """Log the sinks the spool still holds batches for that are not configured: the
    batches are kept for them (put back, they catch up); a sink removed for good releases
    them with ``fanout ledger skip``. The ``given_up`` (sink, batch) pairs are left to
    :func:`warn_given_up`."""
    left_out: dict[tuple[str, int], list[int]] = {}  # a skip's --through is per epoch
    for batch in spool.batches():
        for sink in batch.needed_by - specs.keys():
            if (sink, batch.key) not in given_up:
                left_out.setdefault((sink, batch.epoch), []).append(batch.batch_id)
    for (sink, epoch), ids in sorted(left_out.items()):
        log.warning(
            "pipeline %s: the spool at %s keeps %s batch(es) of epoch %s (from batch %s) for "
            "sink %r, which is not configured: put back with on_failure='lag', it catches up "
            "from them; removed for good, release them with `%s`",
            pipeline, spool.path, len(ids), epoch, min(ids), sink,
            release_command(ledger, pipeline, sink, max(ids), epoch, spool.path),
        )  # fmt: skip


def warn_given_up(
    pipeline: str, kept: Mapping[tuple[str, int], Sequence[SpooledBatch]], spool: Spool, ledger: str
) -> None:
    """Log, per sink and epoch, the spooled batches a ``fanout ledger skip`` made without
    the spool gave up (:meth:`fanout.steps.lag.Lagging.kept_given_up`): they are kept,
    neither written (the sink's mark is past them) nor released, until the operator
    releases them."""
    for (sink, epoch), batches in sorted(kept.items()):
        ids = [b.batch_id for b in batches]
        log.warning(
            "pipeline %s: sink %r was recorded as never getting batch(es) %s of epoch %s by "
            "`fanout ledger skip` without --spool (or one with --release-spooled stopped before "
            "it released them), but the spool at %s still holds them "
            "(%s row(s)): they are kept, neither written to the sink (its mark is past them) "
            "nor released. If the sink must get them, read their rows from the spool's Delta "
            "table %s (where %s = %r, %s = %s and %s in those batch ids; a batch two drivers "
            "spooled at once is there twice, once per %s: take one; one the log said was "
            "written with its own types, a column the table keeps with another type, is in "
            "Parquet files of those types: read its files with its own schema, not as the "
            "table's) and write them to it yourself; then release them with `%s`",
            pipeline, sink, batch_ranges(ids), epoch, spool.path, sum(b.rows for b in batches),
            spool.data_path, PIPELINE_COLUMN, pipeline, EPOCH_COLUMN, epoch, BATCH_COLUMN,
            SPOOLING_COLUMN,
            release_command(ledger, pipeline, sink, max(ids), epoch, spool.path),
        )  # fmt: skip


def backfill_sources(pipeline: str, specs: Mapping[str, SinkSpec]) -> dict[str, BackfillSource]:
    """Each ``backfill_from`` sink's source, checked: another sink of the pipeline, with
    no route, whose target can give back its batches (an append-mode Delta sink), and
    whose dead letters, if any, are in a Delta table (the backfill reads them back)."""
    sources: dict[str, BackfillSource] = {}
    for name, spec in specs.items():
        origin = spec.lag.backfill_from
        if origin is None:
            continue
        where = f"pipeline {pipeline!r}, sink {name!r}: backfill_from={origin!r}"
        if origin == name or origin not in specs:
            others = ", ".join(n for n in specs if n != name)
            raise ConfigurationError(
                f"{where} must name another sink of the pipeline "
                + (f"(its other sinks: {others})" if others else "(it has no other sink)")
            )
        if not specs[origin].route.is_identity:
            raise ConfigurationError(f"{where}: that sink has a where/select route, so it "
                                     "does not hold every batch's rows")  # fmt: skip
        letters = getattr(specs[origin].sink, "dead_letter", None)
        if isinstance(letters, str) and split_target(letters.strip())[0] != DELTA:
            raise ConfigurationError(
                f"{where}: that sink sets rows aside in dead_letter={letters!r}, which a "
                "backfill cannot read back (only a Delta table's letters are given back "
                "to the new sink with the batch's other rows): make it a Delta table, or "
                "backfill from another sink"
            )
        source = specs[origin].sink.backfill_source(pipeline)
        if source is None:
            raise ConfigurationError(
                f"{where}: a {type(specs[origin].sink).__name__} cannot give back its batches "
                "(backfill needs an append-mode Delta sink)"
            )
        sources[name] = source
    return sources


def hold_back(
    state: BatchState,
    lagging: Lagging,
    specs: Mapping[str, SinkSpec],
    catchup: CatchUp,
    record: Recorder,
    abandoned: AbandonedWrites | None = None,
) -> None:
    """Step 3b: take out of ``state.pending`` every sink still behind (its batches come
    from the catch-up, in order); one past its ``max_lag`` is drained here first, and
    stops the query with :class:`fanout.LagLimitError` if it cannot catch up. A lag-policy
    sink that could not be opened yet is reopened (:meth:`fanout.steps.lag.Lagging.reopen`:
    its open and lost-target check in a thread of their own, waited for only up to its
    ``write_timeout_s``: a hung one must not stall the other sinks); until that has passed,
    it misses the batch, and so does one whose target lost its last
    marked batch (:meth:`fanout.steps.lag.Lagging.lose`; either, past its ``max_lag``,
    stops the query, as a sink that cannot catch up does), and one whose write of an earlier batch,
    abandoned at its ``write_timeout_s``, still runs (``abandoned``; that batch, spooled,
    keeps it behind, unless its spooling failed and it is replayed). So does one the
    catch-up is writing with its backlog emptied meanwhile (a ``fanout ledger skip`` in
    another process moved its mark past: :meth:`fanout.steps.catchup.CatchUp.writing`),
    and one opened since step 3c, which could not ask it about this replay
    (:attr:`fanout.steps.state.BatchState.unchecked`: its catch-up asks it,
    :mod:`fanout.steps.replay_lag`).
    First, a batch whose id the spool holds from another query or plan is refused
    (:meth:`fanout.spool.table.Spool.check`), before any sink writes it."""
    if not lagging.sinks:
        return
    if lagging.spool is not None:  # before any write: a batch of this id spooled is this one
        lagging.spool.check(state.info)
    lagging.saw_marks(state.info.epoch, state.marks)
    key = (state.info.epoch, state.batch_id)
    for name in sinks_in(list(state.pending), specs):
        spec, closed = specs[name], lagging.closed(name)
        if closed:  # its spool bounded by max_lag all the same
            _within_limit(state, lagging, spec, catchup, lagging.backlog(name), may_go_live=False)
        if closed and (error := lagging.reopen(name, wait=False)) is not None:
            state.pending.remove(name)
            state.lagged[name] = error
            batch = Batch(state.df, state.info, name, txn_app_id(state.info.pipeline, name, key[0]))
            record.failed(batch, 1, now_utc(), 0.0, error)
            continue
        if name in state.unchecked:  # opened since step 3c, which could not ask it about
            state.pending.remove(name)  # this replay: spooled, its catch-up asks it
            state.lagging[name] = Backlog(name, [key])
            continue
        backlog = lagging.backlog(name)
        if not backlog and abandoned is not None and (running := abandoned.running(name)):
            state.pending.remove(name)
            state.lagged[name] = running.still_running()
            continue
        if not backlog and catchup.writing(name):
            # its mark moved past the batch the catch-up is writing (a `fanout ledger skip`
            # in another process): this batch waits in the spool, written after that one
            state.pending.remove(name)
            state.lagging[name] = backlog
            continue
        backlog = _within_limit(state, lagging, spec, catchup, backlog, may_go_live=True)
        if backlog:
            state.pending.remove(name)
            state.lagging[name] = backlog


def _within_limit(
    state: BatchState,
    lagging: Lagging,
    spec: SinkSpec,
    catchup: CatchUp,
    backlog: Backlog,
    *,
    may_go_live: bool,
) -> Backlog:
    """``backlog``, drained first when it (plus this batch, if not in it yet) is past the
    sink's ``max_lag`` (:class:`fanout.LagLimitError` if it cannot catch up). A sink that
    ``may_go_live`` (open, asked, no write of it running on) with no backlog left is live
    again with this batch; a lost or unopened one only has its spool bounded."""
    adding = 0 if (state.info.epoch, state.batch_id) in backlog.keys else 1
    if (backlog or not may_go_live) and over_limit(spec, backlog, adding):
        backlog = _drain_to_limit(state, lagging, spec, catchup, adding)
    if may_go_live and not backlog:
        lagging.finished_backfill(spec.name)  # the source holds no newer batch
    return backlog


def _drain_to_limit(
    state: BatchState, lagging: Lagging, spec: SinkSpec, catchup: CatchUp, adding: int
) -> Backlog:
    name = spec.name
    log.warning(
        "pipeline %s, batch %s: sink %r reached its max_lag (%s); catching up before this batch",
        state.info.pipeline, state.batch_id, name, spec.lag.describe_limit(),
        extra=batch_fields(state.info.pipeline, state.batch_id, name),
    )  # fmt: skip

    def reached() -> bool:
        return not over_limit(spec, lagging.backlog(name), adding)

    error = catchup.drain(name, until=reached, live=True)
    backlog = lagging.backlog(name)
    reason = over_limit(spec, backlog, adding)
    if reason is None or backlog.keys == [(state.info.epoch, state.batch_id)]:
        # left: this very batch, replayed; not settled before it returns, so not drained
        return backlog
    since = "unknown" if backlog.since is None else f"{backlog.since:%Y-%m-%d %H:%M:%S} UTC"
    cause = "it has not recovered"
    if error is not None:  # the catch-up's read error may quote a store's location
        cause = redact_printed(f"{type(error).__name__}: {error}", lagging.secrets)
    raise LagLimitError(
        state.info.pipeline, name, len(backlog.keys), backlog.spooled_rows, since,
        f"{spec.lag.describe_limit()}; now {reason}", cause,
    )  # fmt: skip


def start_spooling(
    state: BatchState, lagging: Lagging, specs: Mapping[str, SinkSpec]
) -> Future[object] | None:
    """Step 6b, begun before the writes when sinks are behind already (the usual case in
    an outage): spool the batch in a thread beside the live sinks' writes, sharing their
    Arrow conversion. ``None`` when nothing is to be spooled yet."""
    needed = _needed(state, lagging, specs, before_write=True)
    if not needed or lagging.spool is None:
        return None
    spool, arrow = lagging.spool, _arrow_of(state)
    party = party_of_batch(state, lagging, specs)
    task = partial(
        spool.add, state.df, state.info, needed, now_utc(), arrow, party=party,
        replayed=may_hold(state, lagging, needed),
    )  # fmt: skip
    pool = ThreadPoolExecutor(1, thread_name_prefix=f"fanout-{state.info.pipeline}-spool")
    try:
        return pool.submit(in_spark_thread(task, state.df))
    finally:
        pool.shutdown(wait=False)


def spool_for_lagging(
    state: BatchState,
    lagging: Lagging,
    specs: Mapping[str, SinkSpec],
    started: Future[object] | None = None,
) -> None:
    """Step 6b: a lag-policy sink that failed lags instead of failing the batch; then the
    batch is spooled, once, for every sink that did not write it and needs it, before
    ``FanOut`` returns (so Spark commits it only once it is safe in the spool). ``started``
    is the spooling :func:`start_spooling` began; this waits for it (its error fails the
    batch) and adds the sinks that fell behind during the writes."""
    key = (state.info.epoch, state.batch_id)
    for name in state.results:
        lagging.committed(name, key)  # a backfill source's marks count too
    for name in [n for n in state.failures if specs[n].lag.lags]:
        if isinstance(state.failures[name], CheckpointError):
            continue  # the checkpoint does not match what the sink holds: stop the query
        state.lagged[name] = state.failures.pop(name)
    for name, error in state.lagged.items():
        lagging.failed(name, error)
        log.warning(
            "pipeline %s, batch %s: sink %r %s and lags (on_failure='lag'); the other sinks "
            "go on, and its batches wait in the spool until it catches up, in order",
            state.info.pipeline, state.batch_id, name, _why_behind(error),
            extra=batch_fields(state.info.pipeline, state.batch_id, name),
        )  # fmt: skip
    if started is not None:
        started.result()  # raises the spool's error: the batch fails, Spark replays it
        state.spooled = key
    needed = _needed(state, lagging, specs, before_write=False)
    spooled = lagging.spool.get(key) if lagging.spool is not None else None
    missing = needed - (spooled.needed_by if spooled is not None else frozenset())
    # not spooled in this call yet: a replay of a batch whose index rows a killed driver
    # wrote without its rows (add appends the rows a fresh snapshot lacks)
    if (missing or (needed and started is None)) and lagging.spool is not None:
        party = party_of_batch(state, lagging, specs)
        sinks = missing or needed
        lagging.spool.add(
            state.df, state.info, sinks, now_utc(), _arrow_of(state), party=party,
            replayed=may_hold(state, lagging, sinks),
        )  # fmt: skip
        state.spooled = key


def may_hold(state: BatchState, lagging: Lagging, sinks: Collection[str]) -> frozenset[str]:
    """The sinks of ``sinks`` (the batch is spooled for them) that the earlier attempt of a
    doubted replay (:attr:`fanout.steps.state.BatchState.doubted`) could have written it to,
    recorded as such in the spool (:attr:`fanout.spool.index.SpooledBatch.replayed`): each
    whose mark in the batch's epoch is at or past the batch before it, or that has none
    there (no order to go by). A sink marked below that was behind at that attempt too
    (marks never move back), and a sink that is behind gets its batches in order, never
    this one before the one before it (hold-back, gaps: docs/architecture.md §14.1), so its
    catch-up need not ask it (asked once its records are gone, it would be refused for a
    batch it cannot hold). Empty for a batch that is not a doubted replay."""
    if not state.doubted:
        return frozenset()
    epoch, before = state.info.epoch, state.batch_id - 1
    return frozenset(
        name for name in sinks if (mark := lagging.mark(name, epoch)) is None or mark >= before
    )


def _why_behind(error: BaseException) -> str:
    """Why a sink missed a batch, for its per-batch warning: a lost target's refusal is
    logged in full once, when found (its ways on are long), and not retried."""
    if isinstance(error, TargetLostError):
        return (
            "wrote nothing: its target lost batches the ledger marks written there "
            f"(TargetLostError at batch {error.batch_id}, logged in full when found; "
            "`fanout status` shows it and the ways on)"
        )
    if isinstance(error, RenamedSinkError):  # a reopen's check, or the sink's own write
        return (
            "wrote nothing: its target holds a batch of a sink it was renamed from "
            f"(RenamedSinkError at batch {error.batch_id}, logged in full when found; "
            "`fanout status` shows it and the ways on)"
        )
    return f"failed after its retries: {error}"


def party_of_batch(state: BatchState, lagging: Lagging, specs: Mapping[str, SinkSpec]) -> list[str]:
    """The sinks that take part in this batch, as the spool records them
    (:attr:`fanout.spool.index.SpooledBatch.party`): every configured sink but one held back
    while it backfills. Such a sink gets the batch from its backfill source, whose own mark
    (or, if the source fails it and lags, the spool, for both) says whether the batch
    returned; it will never have a mark of its own to show, so counted, it would make a
    batch Spark committed look given up to ``fanout recover`` and ``fanout status``, which
    do not know who backfills, while the catch-up writes it."""
    return [n for n in specs if not (n in state.lagging and lagging.backfilling(n))]


def _needed(
    state: BatchState, lagging: Lagging, specs: Mapping[str, SinkSpec], *, before_write: bool
) -> set[str]:
    """The sinks that need this batch from the spool: those behind it, and those that
    failed it and lag (before the writes: those that could not be opened); not a sink
    still backfilling whose source holds it (or, before the writes, is about to write it):
    once its backfill is finished, a sink's misses are spooled like any lagging sink's."""
    needed = set(state.lagging) | set(state.lagged)  # before the writes: the unopened
    holding = set(state.skipped) | (set(state.pending) if before_write else set(state.results))
    for name in list(needed):
        origin = specs[name].lag.backfill_from
        if name in state.lagging and lagging.backfilling(name) and origin in holding:
            needed.discard(name)  # its backfill source holds the batch and is read for it
    return needed


def _arrow_of(state: BatchState) -> Callable[[], pa.Table]:
    """The batch's Arrow conversion, shared with the identity route's Arrow readers."""
    shared = state.routes.batch_arrow() if state.routes is not None else SharedArrow(state.df)
    return shared.get
