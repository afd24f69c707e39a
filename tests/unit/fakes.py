"""Fakes shared by the unit tests (imported by conftest.py and the test modules).

They live in a module of their own, not in conftest.py, so that ``from tests.unit.fakes import ...``
cannot pick up another directory's ``conftest`` module.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeAlias

import pyarrow as pa
from deltalake import DeltaTable

from fanout import Batch, Sink, SinkResult
from fanout.delta_tables.io import read_arrow
from fanout.ledger.entry import LedgerEntry
from fanout.spool.data import BATCH_COLUMN, EPOCH_COLUMN, PIPELINE_COLUMN
from fanout.spool.index import BatchKey
from fanout.spool.table import Spool
from fanout.testing import ArrowFrame


class FakeFrame(ArrowFrame):
    """A :class:`fanout.testing.ArrowFrame` with a default three-row table."""

    def __init__(self, table: pa.Table | None = None) -> None:
        super().__init__(table if table is not None else pa.table({"id": [1, 2, 3]}))


class SchemaFrame(FakeFrame):
    """A FakeFrame with a Spark-like ``schema.json()`` (what the spool keeps)."""

    class _Schema:
        def json(self) -> str:
            return json.dumps({"type": "struct", "fields": [
                {"name": "id", "type": "long", "nullable": True, "metadata": {}}]})  # fmt: skip

    schema = _Schema()

    def __init__(self, ids: list[int]) -> None:
        super().__init__(pa.table({"id": pa.array(ids, pa.int64())}))


ScriptedError: TypeAlias = BaseException | type[BaseException] | Callable[[Batch], BaseException]
"""What :class:`ScriptedSink` raises at a failing attempt: an exception (a fresh copy of it is
raised each time), an exception class (instantiated without arguments) or a callable
``(batch) -> exception`` (called at each attempt)."""


def fresh_error(error: BaseException) -> BaseException:
    """A new exception like ``error``: its class, ``args``, attributes, ``__cause__`` and
    notes, with no traceback.

    Raising one object at every attempt, as a real sink never does, grows its
    ``__traceback__`` by each failed write's frames and keeps them (and whatever they hold:
    a catch-up, a writer) alive. ``copy.copy`` calls the class again with ``args``; where
    that fails or gives another message (fanout's :class:`~fanout.errors.SinkError` takes
    keyword-only ``sink=``, others format their message from several arguments), the copy
    is made without ``__init__``, as :func:`fanout.errors.error_with_text` does. Should
    that fail too (a ``__new__`` refusing ``args``), ``error`` itself is raised with its
    traceback cleared (the one case where identity, not a copy, is raised again).
    """
    kind = type(error)
    try:
        fresh = copy.copy(error)
    except Exception:
        fresh = None
    if (
        fresh is None
        or type(fresh) is not kind
        or fresh.args != error.args
        or str(fresh) != str(error)
    ):
        try:
            fresh = kind.__new__(kind, *error.args)
            fresh.args = error.args
            fresh.__dict__.update(vars(error))
        except Exception:
            return error.with_traceback(None)
    if isinstance(notes := getattr(error, "__notes__", None), list):
        fresh.__notes__ = list(notes)  # not shared: a note added to one stays off the others
    # `raise error from error` (a sink's bug fanout guards against) leaves it its own cause
    fresh.__cause__ = fresh if error.__cause__ is error else error.__cause__
    fresh.__suppress_context__ = error.__suppress_context__
    return fresh


def scripted_error(script: ScriptedError, batch: Batch) -> BaseException:
    """The exception ``script`` (a :data:`ScriptedError`) makes for ``batch``: a fresh
    object at each call."""
    if isinstance(script, BaseException):
        return fresh_error(script)
    if isinstance(script, type):
        return script()
    return script(batch)


def same_error(error: BaseException | None, scripted: BaseException) -> bool:
    """Whether ``error`` is what a :class:`ScriptedSink` raised for the exception
    ``scripted`` (a copy of it): the same class, ``args`` and message."""
    return (
        type(error) is type(scripted)
        and error is not None
        and error.args == scripted.args
        and str(error) == str(scripted)
    )


class ScriptedSink(Sink):
    """A sink that fails as scripted, recording every call of ``write`` as
    ``(batch_id, attempt)`` (:class:`fanout.testing.RecordingSink` records rows instead).

    :param fail: errors to raise, one per attempt, before succeeding (each a
        :data:`ScriptedError`: an exception instance, class, or callable
        ``(batch) -> exception``; an instance is raised as a fresh copy, like ``always_fail``'s).
    :param always_fail: raise this on every attempt (a :data:`ScriptedError`): a new exception
        each time (for an instance, a copy: same class, args and attributes), as a real sink
        raises; so compare what was raised by class and message, not identity.
    :param reads: ``"dataframe"`` or ``"arrow"``.
    :param returns: what ``write`` returns (default: the batch's row count).
    :param on_write: called with the batch inside ``write`` (for timing tests).
    """

    # stands for an idempotent sink (it keeps no rows to duplicate): the tests using it
    # are about fanout, and an undeclared type would get the at-least-once warning
    guarantees: ClassVar = ("idempotent",)

    def __init__(
        self,
        name: str,
        *,
        fail: list[ScriptedError] | None = None,
        always_fail: ScriptedError | None = None,
        reads: str = "dataframe",
        returns: Any = None,
        on_write: Callable[[Batch], None] | None = None,
        transient: tuple[type[BaseException], ...] | None = None,
    ) -> None:
        super().__init__(name)
        self.fail: list[ScriptedError] = list(fail or [])
        self.always_fail: ScriptedError | None = always_fail
        self._reads = reads
        self.returns = returns
        self.on_write = on_write
        self.transient = transient
        self.calls: list[tuple[int, int]] = []
        self.batches: list[Batch] = []
        self.arrow_tables: list[pa.Table] = []
        self.opened = 0
        self.closed = 0

    @property
    def reads(self) -> str:  # type: ignore[override]
        return self._reads

    def open(self, context: Any) -> None:
        self.opened += 1

    def close(self) -> None:
        self.closed += 1

    def is_transient(self, error: BaseException) -> bool:
        if self.transient is not None:
            return isinstance(error, self.transient)
        return super().is_transient(error)

    def write(self, batch: Batch) -> int | SinkResult:
        self.calls.append((batch.batch_id, batch.attempt))
        self.batches.append(batch)
        if self.on_write is not None:
            self.on_write(batch)
        if self.always_fail is not None:
            raise scripted_error(self.always_fail, batch)
        if self.fail:
            raise scripted_error(self.fail.pop(0), batch)
        if self._reads == "arrow":
            table = batch.arrow()
            self.arrow_tables.append(table)
            rows = table.num_rows
        else:
            rows = batch.df.count()
        return rows if self.returns is None else self.returns


class BackfillLake(ScriptedSink):
    """An append sink that gives back each batch it holds (as a Delta sink in append mode
    does through its table's history): a ``backfill_from`` source."""

    def __init__(self, name: str, **kw: Any) -> None:
        super().__init__(name, **kw)
        self.table: dict[tuple[int, int], pa.Table] = {}

    def write(self, batch: Batch) -> Any:
        rows = super().write(batch)
        self.table[(batch.info.epoch, batch.batch_id)] = batch.df.table  # type: ignore[attr-defined]
        return rows

    def backfill_source(self, pipeline: str) -> Any:
        lake = self

        class _Source:
            def batches(self, epochs: Any) -> list[tuple[int, int]]:
                return sorted(k for k in lake.table if k[0] in epochs)

            def read(self, key: tuple[int, int]) -> pa.Table:
                return lake.table[key]

        return _Source()


class ConcurrencyProbe:
    """Counts how many writes run at once (each write sleeps ``hold_s``)."""

    def __init__(self, hold_s: float = 0.1) -> None:
        self.hold_s = hold_s
        self.current = 0
        self.max_seen = 0
        self._lock = threading.Lock()

    def __call__(self, batch: Batch) -> None:
        with self._lock:
            self.current += 1
            self.max_seen = max(self.max_seen, self.current)
        try:
            time.sleep(self.hold_s)
        finally:
            with self._lock:
                self.current -= 1


def committed(
    pipeline: str, sink: str, batch_id: int, query_id: str | None = "q-1", **kw: Any
) -> LedgerEntry:
    """A committed ledger entry."""
    return LedgerEntry(
        pipeline=pipeline, sink=sink, batch_id=batch_id, status="committed", query_id=query_id, **kw
    )


def spooled_ids(spool: Spool, key: BatchKey) -> list[int]:
    """The ids the spool's data table holds for batch ``key`` (what the catch-up reads)."""
    if not Path(spool.data_path).exists():
        return []
    rows = read_arrow(
        DeltaTable(spool.data_path),
        columns=["id"],
        filters=[
            (PIPELINE_COLUMN, "=", spool.pipeline),
            (EPOCH_COLUMN, "=", key[0]),
            (BATCH_COLUMN, "=", key[1]),
        ],
    )
    return sorted(rows.column("id").to_pylist())


def rehook(lagging: Any, **hooks: Any) -> Any:
    """Replace some of the reopen hooks ``lagging`` (a :class:`fanout.steps.lag.Lagging`)
    was built with (``ask_target=...``: :class:`fanout.steps.lag_reopen.ReopenHooks`);
    returns those it had, to put back."""
    reopener = lagging._reopener
    was = reopener.hooks
    reopener.hooks = dataclasses.replace(was, **hooks)
    return was
