"""Helpers for testing sinks and pipelines, shipped for plugin authors.

- :class:`ArrowFrame` and :func:`make_batch`: hand a sink a batch without starting Spark.
- :func:`open_sink`: open a sink as ``FanOut`` does (its dead-letter target resolved).
- :class:`RecordingSink`: an in-memory sink that records what it was given.
- :class:`FlakySink`: wraps a sink and fails chosen batches a chosen number of times,
  counting across processes when given a state file (a restart "remembers" the outage).
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.sink import (
    GUARANTEES,
    Guarantee,
    Reads,
    Sink,
    SinkContext,
    SinkResult,
)
from fanout.errors import SinkWriteError, TransientSinkError

S = TypeVar("S", bound=Sink)

if "pytest" in sys.modules:  # under pytest: a failed check of the conformance suite shows
    # its values (pytest rewrites the asserts of test modules only, unless told)
    sys.modules["pytest"].register_assert_rewrite("fanout.testing.conformance")


class ArrowFrame:
    """A stand-in for a Spark DataFrame holding an Arrow table (``toArrow``, ``persist``,
    ``unpersist``, ``count``, ``isEmpty``), counting calls thread-safely (sinks run in
    parallel)."""

    def __init__(self, table: Any) -> None:
        self.table = table
        self.to_arrow_calls = 0
        self.persist_calls = 0
        self.unpersist_calls = 0
        self.is_empty_calls = 0
        self._lock = threading.Lock()

    def toArrow(self) -> Any:
        """The Arrow table."""
        with self._lock:
            self.to_arrow_calls += 1
        return self.table

    def persist(self) -> ArrowFrame:
        """Count the call; nothing to cache."""
        with self._lock:
            self.persist_calls += 1
        return self

    def unpersist(self) -> ArrowFrame:
        """Count the call."""
        with self._lock:
            self.unpersist_calls += 1
        return self

    def count(self) -> int:
        """The number of rows."""
        return int(self.table.num_rows)

    def isEmpty(self) -> bool:
        """Whether it holds no row (counted in ``is_empty_calls``)."""
        with self._lock:
            self.is_empty_calls += 1
        return self.count() == 0


def open_sink(
    sink: S,
    pipeline: str = "test",
    *,
    spark: Any = None,
    plugins: Iterable[object] = (),
    ledger: str | None = None,
) -> S:
    """Open ``sink`` as :class:`fanout.FanOut` does, without a pipeline: its ``dead_letter``
    target resolved through the installed dead-letter kinds (plus ``plugins``) and handed
    over in :attr:`fanout.SinkContext.dead_letters` (a
    :class:`fanout.deadletters.moved.CheckedTarget`). Returns the sink.

    :param ledger: the location of the pipeline's ledger, when there is one, for the
        commands the sink's errors print (named absolute, as a ``FanOut`` names it); without
        it they name ``--ledger LEDGER`` and say what it stands for
        (:func:`fanout.ledger.gaps.ledger_note`)."""
    from fanout.contract.locations import command_location
    from fanout.deadletters.moved import checked
    from fanout.deadletters.target import resolve_target
    from fanout.hooks.registry import load_registry

    kinds = load_registry(plugins).dead_letter_kinds()
    target = checked(resolve_target(sink, kinds))
    named = None if ledger is None else command_location(ledger)
    sink.open(SinkContext(pipeline, spark, target, tuple(plugins), ledger=named))
    return sink


def make_batch(
    rows: Sequence[Mapping[str, Any]] | Any,
    *,
    batch_id: int = 0,
    pipeline: str = "test",
    sink_name: str = "sink",
    query_id: str | None = "test-query",
    epoch: int = 0,
) -> Batch:
    """A :class:`Batch` for a sink's unit tests, from dict rows or a ``pyarrow.Table``.

    ``epoch``: the batch as a query after a checkpoint reset (accepted with
    ``on_checkpoint_reset="new_epoch"``) sees it, whose ``idempotency_key`` is new: a sink
    must write it beside the same batch id of epoch 0, not skip or overwrite it.
    ``pipeline`` and ``sink_name`` make the key (``txn_app_id(pipeline, sink_name, epoch)``):
    give your sink's name when the test then asks its ``holds_batch``."""
    import pyarrow as pa

    table = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(list(rows))
    info = BatchInfo(pipeline, batch_id, query_id, epoch=epoch)
    return Batch(ArrowFrame(table), info, sink_name, txn_app_id(pipeline, sink_name, epoch))


class RecordingSink(Sink):
    """Keeps every batch's rows in memory, keyed by batch id (so a replay overwrites:
    idempotent), and the ordered list of ``(batch_id, attempt)`` calls."""

    guarantees: ClassVar[tuple[Guarantee, ...]] = ("idempotent", "transactional", "at_least_once")
    """Idempotent (a replay overwrites its batch), or what the ``guarantee`` option says."""

    def __init__(
        self, name: str, *, guarantee: Guarantee = "idempotent", reads: Reads = "arrow"
    ) -> None:
        super().__init__(name)
        self._guarantee: Guarantee = guarantee
        self._reads: Reads = reads
        self.batches: dict[int, list[dict[str, Any]]] = {}
        self.calls: list[tuple[int, int]] = []
        self._lock = threading.Lock()

    @property
    def guarantee(self) -> Guarantee:
        """As configured."""
        return self._guarantee

    @property
    def reads(self) -> Reads:
        """As configured."""
        return self._reads

    def __getstate__(self) -> dict[str, Any]:
        """Pickles without its lock (a sink is pickled with a ``FanOut`` under Spark
        Connect: keep configuration, create what is live where it runs)."""
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def write(self, batch: Batch) -> SinkResult:
        """Record the batch's rows."""
        rows = batch.arrow().to_pylist() if self._reads == "arrow" else _collect(batch.df)
        with self._lock:
            self.calls.append((batch.batch_id, batch.attempt))
            self.batches[batch.batch_id] = rows
        return SinkResult(rows=len(rows))

    def rows(self) -> list[dict[str, Any]]:
        """Every recorded row, in batch order."""
        return [row for batch_id in sorted(self.batches) for row in self.batches[batch_id]]


def _collect(df: Any) -> list[dict[str, Any]]:
    if hasattr(df, "collect"):
        return [row.asDict() for row in df.collect()]
    return df.toArrow().to_pylist()


class FlakySink(Sink):
    """Wraps ``inner`` and raises on the batches in ``fail_on`` before delegating.

    :param fail_on: batch ids to fail.
    :param times: how many attempts of each such batch fail before one succeeds.
    :param transient: raise :class:`TransientSinkError` (retried) instead of a final error.
    :param state_path: a JSON file counting failures, so a restarted process sees the
        failures of the one before (``None``: count in memory).
    """

    guarantees: ClassVar[tuple[Guarantee, ...]] = GUARANTEES
    """Any: its ``guarantee`` is the wrapped sink's, and what the wrapped sink's type
    declares speaks for it (:attr:`wrapped_sink`, :func:`fanout.contract.sink.declaring_class`:
    the start warning for a wrapped type that declares none says so)."""

    def __init__(
        self,
        inner: Sink,
        *,
        fail_on: Iterable[int],
        times: int = 1,
        transient: bool = False,
        state_path: str | Path | None = None,
        message: str = "simulated outage",
    ) -> None:
        super().__init__(inner.name)
        self.inner = inner
        self.fail_on = set(fail_on)
        self.times = times
        self.transient = transient
        self.state_path = Path(state_path) if state_path else None
        self.message = message
        self.calls: list[tuple[int, int]] = []
        self._failures: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def guarantee(self) -> Guarantee:
        """As the wrapped sink."""
        return self.inner.guarantee

    @property
    def wrapped_sink(self) -> Sink:
        """The wrapped sink, whose type's declared guarantees speak for this one
        (:func:`fanout.contract.sink.declaring_class`)."""
        return self.inner

    @property
    def reads(self) -> Reads:
        """As the wrapped sink."""
        return self.inner.reads

    def open(self, context: SinkContext) -> None:
        """Open the wrapped sink."""
        self.inner.open(context)

    def close(self) -> None:
        """Close the wrapped sink."""
        self.inner.close()

    def is_transient(self, error: BaseException) -> bool:
        """The wrapped sink's classification, plus our own transient errors."""
        return isinstance(error, TransientSinkError) or self.inner.is_transient(error)

    @property
    def dead_letter(self) -> Any:
        """The wrapped sink's ``dead_letter`` option (so its target serves the route)."""
        return getattr(self.inner, "dead_letter", None)

    @property
    def storage_options(self) -> Any:
        """The wrapped sink's ``storage_options``, if any."""
        return getattr(self.inner, "storage_options", None)

    def write(self, batch: Batch) -> int | SinkResult:
        """Fail when due, else write through the wrapped sink."""
        with self._lock:
            self.calls.append((batch.batch_id, batch.attempt))
            if batch.batch_id in self.fail_on and self._bump(batch.batch_id):
                error = TransientSinkError if self.transient else SinkWriteError
                raise error(self.message, sink=self.name, batch_id=batch.batch_id)
        return self.inner.write(batch)

    def _bump(self, batch_id: int) -> bool:
        """Count one failure of ``batch_id`` if it is still due; return whether it is."""
        counts = self._load()
        key = str(batch_id)
        if counts.get(key, 0) >= self.times:
            return False
        counts[key] = counts.get(key, 0) + 1
        self._save(counts)
        return True

    def _load(self) -> dict[str, int]:
        if self.state_path is None:
            return self._failures
        if not self.state_path.exists():
            return {}
        return dict(json.loads(self.state_path.read_text()))

    def _save(self, counts: dict[str, int]) -> None:
        if self.state_path is None:
            self._failures = counts
        else:
            self.state_path.write_text(json.dumps(counts))
