"""What a sink receives: one micro-batch (:class:`Batch`), its context (:class:`BatchInfo`)
and its identity for idempotent writes (:class:`IdempotencyKey`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

    from fanout.contract.earlier_letters import EarlierLetters
    from fanout.contract.route_stamp import RouteStamp


def pipeline_scope(pipeline: str, epoch: int = 0) -> str:
    """``<pipeline>`` in epoch 0, ``<pipeline>@e<epoch>`` after an accepted checkpoint
    reset (``@`` cannot occur in a name, so scopes never collide)."""
    return pipeline if epoch == 0 else f"{pipeline}@e{epoch}"


def txn_app_id(pipeline: str, sink: str, epoch: int = 0) -> str:
    """The stable transaction application id of one sink of one pipeline.

    It names the sink's idempotent-write transaction in Delta (``txnAppId``) and its
    marks in the ledger: ``fanout/<pipeline>/<sink>``; after a checkpoint reset accepted
    with ``on_checkpoint_reset="new_epoch"``, ``fanout/<pipeline>@e<epoch>/<sink>``.
    Sinks that keep their own idempotency records (progress tables, marker groups) key
    them by this id, so a new epoch starts them afresh too.
    """
    return f"fanout/{pipeline_scope(pipeline, epoch)}/{sink}"


@dataclass(frozen=True)
class IdempotencyKey:
    """The one identity of "this batch, for this sink, in this epoch": what a sink writes
    with its data so that a replay of the batch is recognised (or overwrites, never adds).

    The built-in sinks use it as Delta's app transaction ``(app_id, version)``, as the key
    of PostgreSQL's progress rows and as Kafka's marker; a sink of your own names files or
    records with :attr:`token`. It is new after a checkpoint reset accepted with
    ``on_checkpoint_reset="new_epoch"``, so a new epoch never overwrites the old one's data.

    :param app_id: ``fanout/<pipeline>/<sink>`` (``fanout/<pipeline>@e<epoch>/<sink>`` in
        later epochs): see :func:`txn_app_id`.
    :param version: the batch id.
    """

    app_id: str
    version: int

    @property
    def token(self) -> str:
        """The key as one string safe in file names, object keys and identifiers:
        ``<pipeline>[@e<epoch>]~<sink>~<batch id, 12 digits>``. Names never hold ``~``,
        so two keys never share a token; the zero-padded batch id sorts in batch order."""
        scope_and_sink = self.app_id.removeprefix("fanout/")
        return f"{scope_and_sink.replace('/', '~')}~{self.version:012d}"

    def derived(self, kind: str) -> IdempotencyKey:
        """The key of a second record of the same batch (e.g. its dead letters):
        ``<app_id>/<kind>`` at the same version."""
        return IdempotencyKey(f"{self.app_id}/{kind}", self.version)

    def __str__(self) -> str:
        return f"{self.app_id}@{self.version}"


@dataclass(frozen=True)
class BatchInfo:
    """The context of one micro-batch, shared by every sink and every hook.

    :param pipeline: the stable pipeline name given to :class:`fanout.FanOut`.
    :param batch_id: Spark's micro-batch id.
    :param query_id: the streaming query id (stable across restarts on one checkpoint).
    :param source_offsets: the end offsets of this batch, one JSON value per source, as
        read from the checkpoint's ``offsets/<batch_id>``; ``None`` when unreadable.
    :param epoch: 0, or the number of checkpoint resets accepted with
        ``on_checkpoint_reset="new_epoch"``; part of every transaction id.
    :param batch_timestamp_ms: when Spark planned the batch (``batchTimestampMs`` of
        ``offsets/<batch_id>``); a crash replay keeps it, a re-planned batch gets a new
        one. ``None`` when unreadable.
    :param replayed: whether Spark runs the batch again, an earlier attempt of it having
        begun and not completed (a run killed or stopped in it; another attempt may have
        written it to a sink and not marked it there): ``True``, ``False``, or ``None``
        when it cannot be told (no planning time). :meth:`fanout.FanOut.process` sets it
        (:mod:`fanout.steps.replay`: planned before the ``FanOut`` was built, or an
        attempt of it this ``FanOut`` entered did not complete); a caller who knows passes
        it, and it is kept. A replay is refused to a sink that cannot tell whether it holds
        it while its own records are gone (docs/architecture.md §5).
    """

    pipeline: str
    batch_id: int
    query_id: str | None = None
    source_offsets: list[Any] | None = None
    epoch: int = 0
    batch_timestamp_ms: int | None = None
    replayed: bool | None = None


class SharedArrow:
    """Converts a batch DataFrame to Arrow once, for every sink that reads Arrow.

    Thread-safe: sinks run in parallel threads and the first one to ask converts.
    """

    def __init__(self, df: Any) -> None:
        self._df = df
        self._lock = threading.Lock()
        self._table: pa.Table | None = None

    def get(self) -> pa.Table:
        """Return the batch as a ``pyarrow.Table``, converting it on first use."""
        with self._lock:
            if self._table is None:
                self._table = self._df.toArrow()
            return self._table

    def converted_rows(self) -> int | None:
        """The rows of the table once converted; ``None`` before (counting them would
        cost a Spark job)."""
        with self._lock:
            return None if self._table is None else self._table.num_rows

    def release(self) -> None:
        """Drop the converted table so its memory can be freed after the batch."""
        with self._lock:
            self._table = None


@dataclass
class Batch:
    """One micro-batch as one sink sees it.

    :param df: the batch DataFrame (persisted when several sinks read it).
    :param info: pipeline, batch id, query id and source offsets.
    :param sink_name: the name of the sink receiving this batch.
    :param txn_app_id: the sink's stable idempotency id (see :func:`txn_app_id`); with
        :attr:`batch_id` it forms :attr:`idempotency_key`, which sinks should use.
    :param attempt: 1 for the first attempt in this process, 2 for the first retry, ...
    :param route: the sink's route this batch went through (fingerprint and text; ``no
        route`` for the identity), set by fanout on every batch it hands a sink; ``None``
        when built elsewhere (a sink called directly, a test): read it as the identity's
        (``Route().stamp()``), which fanout hands an unrouted sink. A sink that commits a
        batch in pieces and skips committed pieces on a replay records its fingerprint with
        each piece, so a replay
        under another route (one that refuses rows the first attempt wrote) can be
        refused: the route's dead letters record their route only when there are some.
        See :meth:`fanout.Sink.check_replay`; a sink on the partitioned-sink kit records
        :func:`fanout.partitioned.replay_route.route_mark` and the kit refuses.
    :param task_budget: at most this many of the sink's Spark tasks should run at once;
        ``None``: no limit. fanout sets it for a sink with ``write_timeout_s``: its tasks,
        when it hangs, must leave cores to the other sinks' jobs and the live batches
        (docs/architecture.md §14.9). A sink writing from the executors honours it (the
        partitioned-sink kit runs its partitions in jobs of that many tasks at most).
    :param earlier: what the sink's earlier dead-letter targets hold of this batch's
        letters, set by fanout only on a batch an earlier process may have attempted under
        another ``dead_letter`` (docs/architecture.md §7): write letters through
        :func:`fanout.deadletters.moved.write_letters`, which writes none of those again.
    :param stopped: says whether the batch went on without this write (abandoned at the
        sink's ``write_timeout_s``); ``None``: it never does. fanout cancels the write's
        running Spark jobs then, not those it starts afterwards: a write running several
        jobs one after the other starts no further one once it says ``True`` (the kit
        starts no further wave).
    """

    df: Any
    info: BatchInfo
    sink_name: str
    txn_app_id: str
    attempt: int = 1
    route: RouteStamp | None = None
    task_budget: int | None = None
    earlier: EarlierLetters | None = None
    stopped: Callable[[], bool] | None = field(default=None, repr=False, compare=False)
    _arrow: SharedArrow | None = field(default=None, repr=False)

    @property
    def batch_id(self) -> int:
        """Spark's micro-batch id. To recognise a replay, key writes by
        :attr:`idempotency_key` (whose ``version`` it is), not by the batch id alone: a new
        epoch starts the ids again."""
        return self.info.batch_id

    @property
    def pipeline(self) -> str:
        """The pipeline name."""
        return self.info.pipeline

    @property
    def query_id(self) -> str | None:
        """The streaming query id."""
        return self.info.query_id

    @property
    def idempotency_key(self) -> IdempotencyKey:
        """This batch's identity for this sink: write it with the data (see
        :class:`IdempotencyKey`). Every built-in sink keys its writes by it."""
        return IdempotencyKey(self.txn_app_id, self.info.batch_id)

    def known_rows(self) -> int | None:
        """The batch's row count when known without a Spark job (a sink converted it to
        Arrow), else ``None``; fanout checks a sink's reported counts against it."""
        return None if self._arrow is None else self._arrow.converted_rows()

    def arrow(self) -> pa.Table:
        """The batch as a ``pyarrow.Table``, converted once and shared by all sinks."""
        if self._arrow is None:
            self._arrow = SharedArrow(self.df)
        return self._arrow.get()
