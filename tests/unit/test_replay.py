"""A batch Spark replays (fanout.steps.replay): told by its planning time against the
FanOut's birth or the attempts it entered, and refused to a pending sink that cannot tell
whether it holds it while its own records are gone, before anything is written; an empty
replay, an accepted sink, a batch that is not a replay pass (a memory ledger, fake sinks,
fake frames: no Spark)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pytest

from fanout import BatchInfo, FanOut, SinkRecordsGoneError
from fanout.errors import BatchFailedError, MissedBatchesError
from fanout.ledger.entry import LedgerEntry
from fanout.ledger.memory import MemoryLedger
from fanout.ledger.refusals import record_admitted, record_refused, refused_unwritten
from fanout.steps.replay import RunMemory, batch_call
from fanout.testing import RecordingSink
from tests.unit.fakes import FakeFrame, ScriptedSink

GONE = "no marker of epoch 0 is left (password s3cr3t)"


def _info(batch_id: int, planned: int | None, replayed: bool | None = None) -> BatchInfo:
    return BatchInfo("p", batch_id, "q-1", [{"src": {"0": batch_id + 1}}],
                     batch_timestamp_ms=planned, replayed=replayed)  # fmt: skip


# -- the signal ------------------------------------------------------------------------


def test_a_batch_planned_before_the_fanout_was_born_is_a_replay_one_planned_after_is_not() -> None:
    memory = RunMemory(born_ms=5_000)
    assert memory.replayed(_info(1, 4_999)) is True
    assert memory.replayed(_info(1, 5_000)) is False  # planned by this run: at or after
    assert memory.replayed(_info(1, 7_000)) is False
    assert memory.replayed(_info(1, None)) is None  # no planning time: cannot tell


def test_what_the_caller_says_is_kept() -> None:
    memory = RunMemory(born_ms=5_000)
    assert memory.replayed(_info(1, 7_000, replayed=True)) is True
    assert memory.replayed(_info(1, 1_000, replayed=False)) is False
    assert memory.replayed(_info(1, None, replayed=True)) is True
    told = _info(1, 7_000, replayed=True)
    assert memory.told(told) is told
    assert memory.told(_info(1, 1_000)).replayed is True
    assert memory.told(_info(1, 7_000)).replayed is False


def test_an_attempt_entered_and_not_completed_makes_its_replay_one() -> None:
    memory = RunMemory(born_ms=5_000)
    memory.writing(_info(3, 6_000))
    assert memory.replayed(_info(3, 6_000)) is True  # the same planning: Spark's replay
    assert memory.replayed(_info(3, 6_500)) is False  # planned again (a new checkpoint)
    assert memory.replayed(_info(4, 6_000)) is False
    memory.completed(_info(3, 6_000))
    assert memory.replayed(_info(3, 6_000)) is False
    assert memory.entered == {}


def test_a_fanout_built_inside_a_batch_call_tells_its_own_attempts_only() -> None:
    memory = RunMemory(born_ms=None)
    assert memory.replayed(_info(1, 1_000)) is False
    memory.writing(_info(1, 1_000))
    assert memory.replayed(_info(1, 1_000)) is True


class _Context:
    def __init__(self, query: str | None, fails: bool = False) -> None:
        self.query, self.fails = query, fails

    def getLocalProperty(self, key: str) -> str | None:
        assert key == "sql.streaming.queryId"
        if self.fails:
            raise RuntimeError("SparkContext stopped")
        return self.query


class _Spark:
    def __init__(self, query: str | None, fails: bool = False) -> None:
        self.sparkContext = _Context(query, fails)


def test_a_batch_call_is_told_by_the_query_id_spark_sets_in_its_thread() -> None:
    assert batch_call(_Spark("q-9")) == "query q-9"
    assert batch_call(_Spark(None)) is None
    assert batch_call(_Spark("q-9", fails=True)) is None
    assert batch_call(None) is None


def test_a_batch_call_of_the_spark_connect_worker_is_told_by_its_frame() -> None:
    worker = "/venv/pyspark/sql/connect/streaming/worker/foreach_batch_worker.py"
    space: dict[str, Any] = {}
    exec(compile("def process(call):\n    return call()\n", worker, "exec"), space)
    assert space["process"](lambda: batch_call(None)) == "a Spark Connect foreachBatch call"
    exec(compile("def other(call):\n    return call()\n", worker, "exec"), space)
    assert space["other"](lambda: batch_call(None)) is None


# -- the check in FanOut.process ---------------------------------------------------------


class Unsure(ScriptedSink):
    """Cannot tell whether it holds a batch (``holds_batch`` ``None``) and says its records
    are gone (``gone``); records what it was asked."""

    guarantees: ClassVar = ("idempotent",)

    def __init__(self, name: str, gone: str | None = GONE, **kw: Any) -> None:
        super().__init__(name, **kw)
        self.gone, self.path = gone, f"/data/{name}"
        self.asked: list[tuple[str, int, int]] = []

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool | None:
        self.asked.append(("holds", epoch, batch_id))
        return None

    def records_gone(self, pipeline: str, epoch: int, batch_id: int) -> str | None:
        self.asked.append(("gone", epoch, batch_id))
        return self.gone

    def secret_values(self) -> list[str]:
        return ["s3cr3t"]


def _marked(*sinks: str) -> MemoryLedger:
    """Batch 0 of epoch 0 marked for each of ``sinks``, with rows."""
    ledger = MemoryLedger()
    for sink in sinks:
        ledger.mark_committed(LedgerEntry("p", sink, 0, "committed", rows=3))
    return ledger


def _fan(ledger: MemoryLedger, *sinks: ScriptedSink, **kw: Any) -> FanOut:
    return FanOut("p", ledger, list(sinks), retries=0, backoff_s=0, **kw)


def test_a_replay_is_refused_to_a_sink_whose_records_are_gone_before_anything_is_written() -> None:
    k, other = Unsure("k"), ScriptedSink("other")
    fan = _fan(_marked("k", "other"), k, other)
    with pytest.raises(SinkRecordsGoneError) as refused:
        fan.process(FakeFrame(), _info(1, 1_000))
    fan.close()
    assert (refused.value.sink, refused.value.batch_id) == ("k", 1)
    text = str(refused.value)
    assert text.startswith(
        "sink 'k', batch 1: pipeline 'p', sink 'k': batch 1 of epoch 0 is a replay (planned "
        "at 1970-01-01T00:00:01.000Z (batchTimestampMs 1000), before this FanOut was built ("
    )
    assert (
        "the attempt before may have written it to path '/data/k' and died before its "
        "ledger mark, and the sink cannot tell whether its target holds it, its own records "
        "of the epoch being gone: no marker of epoch 0 is left (password ***). Written again, "
        "it could be there twice. Nothing of the batch was written by this attempt, to any "
        "sink. The batch's source offsets: [{'src': {'0': 2}}].\n"
    ) in text
    assert (
        "If it holds them, record the batch as done for the sink: `fanout ledger skip "
        f"--ledger MemoryLedger@{id(fan.ledger):x} --pipeline p --sink k --through 1 "
        "--epoch 0`, then start again (the sink skips it, the others write it)"
    ) in text
    assert (
        "`fanout run PIPELINE.toml --accept-lost-target k` (FanOut(accept_lost_targets=['k']))"
        in text
    )
    assert "s3cr3t" not in text
    assert k.calls == [] and other.calls == []  # nothing written, to any sink
    assert fan.ledger.failed_batches("p", 0, 0) == [1]  # the batch ran: a skip may name it
    # the run's lost-target check about its mark, then this check: about the batch, and
    # records_gone about its mark
    assert k.asked == [("holds", 0, 0), ("holds", 0, 1), ("gone", 0, 0)]


def test_a_batch_that_is_not_a_replay_asks_nothing_and_runs_no_job() -> None:
    k = Unsure("k")
    fan = _fan(_marked("k"), k)
    frame = FakeFrame()
    fan.process(frame, _info(1, int(time.time() * 1000) + 1))
    fan.process(FakeFrame(), _info(2, None))  # no planning time: cannot tell, as before
    fan.close()
    assert k.calls == [(1, 1), (2, 1)]
    assert k.asked == [("holds", 0, 0)]  # the run's lost-target check only
    assert frame.is_empty_calls == 0


def test_an_empty_replay_passes_with_one_emptiness_check() -> None:
    k = Unsure("k")
    fan = _fan(_marked("k"), k)
    frame = FakeFrame(pa.table({"id": pa.array([], pa.int64())}))
    fan.process(frame, _info(1, 1_000))
    fan.close()
    assert frame.is_empty_calls == 1
    assert k.calls == [(1, 1)]


@pytest.mark.parametrize(
    "sink",
    [
        Unsure("k", gone=None),  # its records are there, or it cannot say
        ScriptedSink("k"),  # does not answer records_gone: never asked
    ],
    ids=["records-not-gone", "no-records-gone-hook"],
)
def test_a_replay_passes_a_sink_whose_records_are_not_known_gone(sink: ScriptedSink) -> None:
    fan = _fan(_marked("k"), sink)
    frame = FakeFrame()
    fan.process(frame, _info(1, 1_000))
    fan.close()
    assert sink.calls == [(1, 1)] and frame.is_empty_calls == 0


def test_a_replay_passes_a_sink_without_a_mark_in_the_epoch() -> None:
    """A pipeline's first batch (a Kafka topic created beforehand has no marker: holds
    None) is not refused: nothing says the sink's records ever existed."""
    k = Unsure("k")
    fan = _fan(MemoryLedger(), k)
    fan.process(FakeFrame(), _info(0, 1_000))
    fan.close()
    assert k.calls == [(0, 1)] and k.asked == []


def test_an_accepted_sink_writes_the_replay_with_a_warning(caplog: Any) -> None:
    k = Unsure("k")
    fan = _fan(_marked("k"), k, accept_lost_targets=["k"])
    frame = FakeFrame()
    with caplog.at_level(logging.WARNING, logger="fanout"):
        fan.process(frame, _info(1, 1_000))
    fan.close()
    assert k.calls == [(1, 1)] and frame.is_empty_calls == 0
    assert any(
        "batch 1 of epoch 0 is a replay and the sink cannot tell whether its target holds it"
        in r.getMessage()
        and "accepted (accept_lost_targets)" in r.getMessage()
        for r in caplog.records
    )


class LosesOneMark(MemoryLedger):
    """A ledger whose first mark of ``sink`` at ``batch`` fails: the sink wrote, the
    batch fails (the query stops), the same FanOut runs it again in-process."""

    def __init__(self, sink: str, batch: int) -> None:
        super().__init__()
        self.sink, self.batch, self.lost = sink, batch, False

    def mark_committed(self, entry: LedgerEntry) -> bool:
        if (entry.sink, entry.batch_id, self.lost) == (self.sink, self.batch, False):
            self.lost = True
            raise OSError("the ledger's store went away")
        return super().mark_committed(entry)


def test_a_fanout_reused_in_process_refuses_the_replay_of_its_own_failed_attempt() -> None:
    ledger = LosesOneMark("k", 1)
    ledger.mark_committed(LedgerEntry("p", "k", 0, "committed", rows=3))
    k = Unsure("k")
    fan = _fan(ledger, k)
    planned = int(time.time() * 1000) + 1  # planned by this run: not before its birth
    with pytest.raises(BatchFailedError):
        fan.process(FakeFrame(), _info(1, planned))
    assert k.calls == [(1, 1)] and k.asked == [("holds", 0, 0)]
    with pytest.raises(SinkRecordsGoneError) as refused:
        fan.process(FakeFrame(), _info(1, planned))  # the query restarted in-process
    assert "this FanOut began writing it before, and that attempt did not end" in str(refused.value)
    fan.close()
    assert k.calls == [(1, 1)]  # not written a second time


def test_a_fanout_built_inside_a_batch_call_does_not_read_its_first_batch_as_a_replay(
    monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    monkeypatch.setattr("fanout.fan_out.batch_call", lambda spark: "query q-1")
    k = Unsure("k")
    with caplog.at_level(logging.WARNING, logger="fanout"):
        fan = _fan(_marked("k"), k)
    planned = int(time.time() * 1000) - 60_000  # planned before the lazy FanOut was built
    fan.process(FakeFrame(), _info(1, planned))
    fan.close()
    assert k.calls == [(1, 1)] and k.asked == [("holds", 0, 0)]
    assert any(
        "this FanOut was built inside a foreachBatch call (query q-1)" in r.getMessage()
        for r in caplog.records
    )


def test_an_unpickled_fanout_is_born_when_unpickled_not_when_built_at_its_first_batch(
    tmp_path: Path,
) -> None:
    """Under Spark Connect the server's worker unpickles the FanOut at the query's setup,
    before the run plans a batch, and builds it at the first batch, after."""
    from pyspark import cloudpickle

    fan = FanOut("p", str(tmp_path / "ledger"), [RecordingSink("k")], retries=0)
    fan.close()
    born = fan._runs.born_ms
    time.sleep(0.01)
    copy: FanOut = cloudpickle.loads(cloudpickle.dumps(fan))
    unpickled = copy._runs.born_ms
    time.sleep(0.01)
    copy(FakeFrame(), 0)  # built here, with this batch
    copy.close()
    assert born is not None and unpickled is not None and unpickled > born
    assert copy._runs.born_ms == unpickled


def test_a_lag_sink_lags_with_the_refusal_while_the_others_write(tmp_path: Path) -> None:
    from fanout.sink_spec import LagPolicy, SinkSpec
    from tests.unit.fakes import SchemaFrame

    k, good = Unsure("k"), ScriptedSink("good")
    fan = FanOut("p", _marked("k", "good"), [good, SinkSpec(k, lag=LagPolicy("lag"))],
                 retries=0, backoff_s=0, spool=str(tmp_path / "spool"),
                 probe_interval_s=3600)  # fmt: skip
    fan.catchup.stop()  # nothing to catch up: the sink is lost for the run
    try:
        fan.process(SchemaFrame([10, 11]), _info(1, 1_000))
        assert good.calls == [(1, 1)] and k.calls == []
        lag = fan.lagging.lags()["k"]
        assert "batch 1 of epoch 0 is a replay" in (lag.error or "")
        assert "with on_failure='lag' it lags, its batches wait in the spool" in (lag.error or "")
        assert fan.ledger.failed_batches("p", 0, 0) == [1]
    finally:
        fan.close()


def test_the_replay_of_a_batch_fanout_refused_before_writing_passes_once_admitted() -> None:
    ledger = _marked("k")
    record_refused(ledger, "p", 0, 1, 1_000)  # its first attempt: a clean stop's refusal
    fan = _fan(ledger, Unsure("k"))
    fan.process(FakeFrame(), _info(1, 1_000))  # the records are gone, yet nothing was written
    fan.close()
    assert [(r.status, r.batch_timestamp_ms) for r in ledger.refusal_rows("p", 0, 1)] == [
        ("refused", 1_000),
        ("admitted", 1_000),
    ]
    assert ledger.last_committed("p", ["k"], 0) == {"k": 1}
    # a later replay (this one killed after its write, before its mark) no longer passes
    assert refused_unwritten(ledger, "p", 0, 1, 1_000) is False


def test_a_replay_admitted_once_and_killed_is_refused_at_its_next_replay() -> None:
    ledger = _marked("k")
    record_refused(ledger, "p", 0, 1, 1_000)
    record_admitted(ledger, "p", 0, 1, 1_000)  # a replay went on to write, then died unmarked
    k = Unsure("k")
    fan = _fan(ledger, k)
    with pytest.raises(SinkRecordsGoneError):
        fan.process(FakeFrame(), _info(1, 1_000))
    fan.close()
    assert k.calls == []


class AppTxns(Unsure):
    """Keeps a record of each batch it wrote rows for (``kept``: those not expired), none
    of a batch that wrote none: ``records_gone`` about a batch without one says they are
    gone, as the Delta sink's app transactions do."""

    def __init__(self, name: str, kept: set[int]) -> None:
        super().__init__(name)
        self.kept = kept

    def records_gone(self, pipeline: str, epoch: int, batch_id: int) -> str | None:
        self.asked.append(("gone", epoch, batch_id))
        return None if batch_id in self.kept else GONE


@pytest.mark.parametrize(
    ("rows", "gone_asked"),
    [
        ([3, 0], [("gone", 0, 0)]),  # an empty batch after one that wrote: asked about that one
        ([0, 0], []),  # no batch of the epoch wrote a row: no record ever existed, not asked
    ],
    ids=["empty-after-written", "none-written"],
)
def test_a_replay_asks_records_gone_about_the_newest_mark_that_wrote_rows(
    rows: list[int], gone_asked: list[tuple[str, int, int]]
) -> None:
    """Batches 0 and 1 marked, batch 1 (or both) empty: the sink committed no record of an
    empty batch, so a question about batch 1's records would read "expired" (a false
    refusal); the replay of batch 2 is written."""
    ledger = MemoryLedger()
    for batch, count in enumerate(rows):
        ledger.mark_committed(LedgerEntry("p", "k", batch, "committed", rows=count))
    k = AppTxns("k", kept={0} if rows[0] else set())
    fan = _fan(ledger, k)
    fan.process(FakeFrame(), _info(2, 1_000))
    fan.close()
    assert k.calls == [(2, 1)]
    assert k.asked == [("holds", 0, 1), ("holds", 0, 2), *gone_asked]
    assert ledger.last_committed("p", ["k"], 0) == {"k": 2}


def test_a_replay_passed_by_its_refusal_row_then_refused_by_a_later_check_stays_unwritten() -> None:
    """Batch 2's first attempt was refused before writing (its row); its replay passes the
    replay check by that row, then the gap check refuses it (sink g missed batch 1) before
    any write: no ``admitted`` row, so the next replay still passes by the refusal."""
    ledger = MemoryLedger()
    for sink, marks in (("k", (0, 1)), ("g", (0,))):
        for batch in marks:
            ledger.mark_committed(LedgerEntry("p", sink, batch, "committed", rows=3))
    record_refused(ledger, "p", 0, 2, 1_000)
    k, g = Unsure("k"), ScriptedSink("g")
    fan = _fan(ledger, k, g)
    with pytest.raises(MissedBatchesError):
        fan.process(FakeFrame(), _info(2, 1_000))
    fan.close()
    assert k.calls == [] and g.calls == []
    assert ("gone", 0, 1) in k.asked  # the replay check ran, and passed by the row
    assert [(r.status, r.batch_timestamp_ms) for r in ledger.refusal_rows("p", 0, 2)] == [
        ("refused", 1_000)
    ]
    assert refused_unwritten(ledger, "p", 0, 2, 1_000) is True
