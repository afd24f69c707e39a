"""A sink's reported counts are checked between its write and its ledger mark: a count
below zero, or more rows than were routed to it, alone or summed with the refused ones
(when that is known without a Spark job),
fails the batch for that sink, unmarked and not retried, naming sink, batch and counts."""

from __future__ import annotations

from typing import Any, ClassVar

import pyarrow as pa
import pytest

from fanout.contract.batch import Batch, BatchInfo, SharedArrow
from fanout.contract.sink import Sink, SinkResult
from fanout.errors import SinkResultError
from fanout.hooks.caller import HookCaller
from fanout.hooks.registry import new_plugin_manager
from fanout.ledger.memory import MemoryLedger
from fanout.retry import RetryPolicy
from fanout.routes.batch_routes import SinkInput
from fanout.steps.record import Recorder
from fanout.steps.result_check import check_counts
from fanout.steps.write import SinkRunner


class Frame:
    """A batch DataFrame of three rows, as far as ``toArrow`` goes."""

    def toArrow(self) -> pa.Table:
        return pa.table({"id": [1, 2, 3]})


class Reporting(Sink):
    """Reports what it is told to, after reading the batch as Arrow or not; every error is
    transient, so a retry would show."""

    guarantees: ClassVar = ("idempotent",)

    def __init__(self, name: str, *, result: SinkResult, reads_arrow: bool = True) -> None:
        super().__init__(name)
        self.result = result
        self.reads_arrow = reads_arrow
        self.writes = 0

    def write(self, batch: Batch) -> SinkResult:
        self.writes += 1
        if self.reads_arrow:
            batch.arrow()
        return self.result

    def is_transient(self, error: BaseException) -> bool:
        return True


def _run(sink: Reporting) -> tuple[Any, MemoryLedger]:
    frame, ledger, retry = Frame(), MemoryLedger(), RetryPolicy(retries=2, backoff_s=0)
    batch = Batch(frame, BatchInfo("p", 7), sink.name, "fanout/p/s", _arrow=SharedArrow(frame))
    runner = SinkRunner(
        sink, batch, SinkInput(frame), Recorder(ledger, retry), retry,
        HookCaller(new_plugin_manager()),
    )  # fmt: skip
    return runner.run(), ledger


def _marks(ledger: MemoryLedger) -> list[tuple[str, int, str, int]]:
    return [(e.sink, e.batch_id, e.status, e.attempt) for e in ledger.entries]


@pytest.mark.parametrize(
    ("result", "problem"),
    [
        (
            SinkResult(rows=5),
            "rows=5, dead_lettered=0, but only 3 rows were routed to it in this batch",
        ),
        (
            SinkResult(rows=0, dead_lettered=4),
            "rows=0, dead_lettered=4, but only 3 rows were routed to it in this batch",
        ),
        (SinkResult(rows=-1), "rows=-1, dead_lettered=0, but a count is below zero"),
        (
            SinkResult(rows=3, dead_lettered=1),  # a refused row counted in rows too
            "rows=3, dead_lettered=1, but their sum, 4, is more than the 3 rows routed to it "
            "in this batch (a refused row counts in dead_lettered only, not in rows too)",
        ),
    ],
)
def test_an_impossible_count_fails_the_sink_unmarked_and_not_retried(
    result: SinkResult, problem: str
) -> None:
    sink = Reporting("s", result=result)
    outcome, ledger = _run(sink)
    assert outcome.result is None
    assert isinstance(outcome.error, SinkResultError)
    assert str(outcome.error) == (
        f"sink 's', batch 7: write() reported {problem}. A sink reports the rows of the "
        "batch it wrote (at most the rows it received) and the rows it refused; this is a "
        "bug in the sink, fix what its write() returns. The batch is not marked for this "
        "sink: a replay writes it again"
    )
    assert sink.writes == 1
    assert _marks(ledger) == [("s", 7, "failed", 1)]


@pytest.mark.parametrize(
    "result",
    [
        SinkResult(rows=3),
        SinkResult(rows=1),  # an upsert collapsing keys, a replay skipping what it holds
        SinkResult(rows=0, already_written=True),
        SinkResult(rows=2, dead_lettered=1),
        SinkResult(rows=0, dead_lettered=3),
    ],
)
def test_a_possible_count_is_marked(result: SinkResult) -> None:
    outcome, ledger = _run(Reporting("s", result=result))
    assert (outcome.error, outcome.result) == (None, result)
    assert _marks(ledger) == [("s", 7, "committed", 1)]


def test_the_upper_bound_is_not_checked_when_counting_would_cost_a_spark_job() -> None:
    result = SinkResult(rows=100)
    outcome, ledger = _run(Reporting("s", result=result, reads_arrow=False))
    assert (outcome.error, outcome.result) == (None, result)
    assert _marks(ledger) == [("s", 7, "committed", 1)]


@pytest.mark.parametrize(
    ("rows", "dead", "routed", "refused"),
    [
        (True, 0, None, True),
        (2, 1.0, 5, True),
        (0, -2, None, True),
        (6, 0, 5, True),
        (5, 5, 5, True),
        (3, 2, 5, False),
        (5, 5, None, False),
        (10**9, 0, None, False),
    ],
)
def test_check_counts(rows: Any, dead: Any, routed: int | None, refused: bool) -> None:
    result = SinkResult(rows=rows, dead_lettered=dead)
    if refused:
        with pytest.raises(SinkResultError):
            check_counts(result, sink="s", batch_id=1, routed=routed)
    else:
        check_counts(result, sink="s", batch_id=1, routed=routed)


def test_a_count_numpy_or_pandas_gives_is_a_whole_number() -> None:
    """``series.sum()``, ``df.shape``... give NumPy integers: whole numbers, marked as such
    (the mark worked before the check; refusing them failed a correct sink's every batch)."""
    import numpy as np

    result = SinkResult(rows=np.int64(2), dead_lettered=np.int32(1))
    outcome, ledger = _run(Reporting("s", result=result))
    assert outcome.error is None
    assert _marks(ledger) == [("s", 7, "committed", 1)]
    assert [(e.rows, e.dead_lettered) for e in ledger.entries] == [(2, 1)]
    with pytest.raises(SinkResultError):
        check_counts(SinkResult(rows=np.int64(4)), sink="s", batch_id=1, routed=3)
    with pytest.raises(SinkResultError):
        check_counts(SinkResult(rows=np.bool_(True)), sink="s", batch_id=1, routed=3)
