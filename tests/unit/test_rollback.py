"""A rolled-back checkpoint (same query id, batches re-planned) is refused; a replay of
the batch Spark planned before is not (issue 13, hole 2 and the null query id of item 8).

Spark replays a batch after a crash from its ``offsets/N`` file, unchanged: the same
source offsets and the same planning time (``batchTimestampMs``). A checkpoint restored
from a backup, or missing its newest ``offsets/``/``commits/`` files, makes Spark plan
those batch ids again: new planning times, and often new offsets.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow as pa
import pytest

from fanout import BatchInfo, CheckpointResetError, CheckpointRollbackError, FanOut
from fanout.contract.batch import txn_app_id
from fanout.delta_tables.io import commit_properties
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import (
    Ledger,
    LedgerEntry,
    ledger_location,
    ledger_schema,
    pipeline_app_id,
)
from fanout.ledger.memory import MemoryLedger
from fanout.steps.guard import CheckpointGuard, compare_plan
from fanout.testing import ArrowFrame
from tests.unit.fakes import ScriptedSink, committed

PIPELINE = "orders"
QUERY = "11111111-aaaa-4bbb-8ccc-000000000001"
OTHER_QUERY = "22222222-aaaa-4bbb-8ccc-000000000002"
PLANNED_AT = 1_763_856_000_000  # 2025-11-23T00:00:00Z


def offsets(batch: int) -> list[object]:
    """The file source's offsets of batch ``batch`` as Spark first planned it."""
    return [{"logOffset": batch}]


def planned(batch: int, query: str | None = QUERY, **kw: object) -> BatchInfo:
    """Batch ``batch`` as Spark first planned it (and replays it after a crash)."""
    fields: dict[str, object] = {
        "source_offsets": offsets(batch),
        "batch_timestamp_ms": PLANNED_AT + 1000 * batch,
    }
    fields.update(kw)
    return BatchInfo(PIPELINE, batch, query, **fields)  # type: ignore[arg-type]


def mark(ledger: Ledger, sink: str, batch: int, query: str | None = QUERY, **kw: object) -> None:
    info = planned(batch, query)
    fields: dict[str, object] = {
        "source_offsets": json.dumps(info.source_offsets),
        "batch_timestamp_ms": info.batch_timestamp_ms,
    }
    fields.update(kw)
    ledger.mark_committed(committed(PIPELINE, sink, batch, query, **fields))


@pytest.fixture(params=["delta", "memory"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> DeltaLedger | MemoryLedger:
    """pg committed batches 0..4, kafka 0..3, both by QUERY, with their planned facts."""
    led: DeltaLedger | MemoryLedger = (
        MemoryLedger() if request.param == "memory" else DeltaLedger(str(tmp_path / "ledger"))
    )
    led.open()
    for batch in range(5):
        mark(led, "pg", batch)
        if batch < 4:
            mark(led, "kafka", batch)
    return led


def check(ledger: Ledger, info: BatchInfo, guard: CheckpointGuard | None = None) -> None:
    """The guard as FanOut runs it: with the high-water mark of the ledger's lookup."""
    (guard or CheckpointGuard(ledger)).check(info, ledger.lookup(PIPELINE, []).high_water)


# -- the comparison ----------------------------------------------------------------


def _entry(source_offsets: object = None, timestamp: int | None = None) -> LedgerEntry:
    recorded = None if source_offsets is None else json.dumps(source_offsets)
    return committed(PIPELINE, "pg", 4, source_offsets=recorded, batch_timestamp_ms=timestamp)


@pytest.mark.parametrize(
    ("entry", "info", "expected"),
    [
        # replayed from the same offsets/N: same offsets, same planning time
        (_entry(offsets(4), 7), planned(4, batch_timestamp_ms=7), True),
        # re-planned: the file source's offset can repeat, the planning time does not
        (_entry(offsets(4), 7), planned(4, batch_timestamp_ms=8), False),
        (_entry(offsets(4), 7), planned(4, source_offsets=offsets(5), batch_timestamp_ms=7), False),
        # Kafka offsets: key order does not matter, values do
        (
            _entry([{"t": {"0": 5, "1": 9}}], 7),
            planned(4, source_offsets=[{"t": {"1": 9, "0": 5}}], batch_timestamp_ms=7),
            True,
        ),
        (
            _entry([{"t": {"0": 5, "1": 9}}], 7),
            planned(4, source_offsets=[{"t": {"0": 5, "1": 10}}], batch_timestamp_ms=7),
            False,
        ),
        # a row written before fanout recorded the planning time: offsets only
        (_entry(offsets(4)), planned(4), True),
        (_entry(offsets(4)), planned(4, source_offsets=offsets(6)), False),
        # nothing to compare: cannot tell
        (_entry(), planned(4), None),
        (_entry(offsets(4), 7), planned(4, source_offsets=None, batch_timestamp_ms=None), None),
    ],
)
def test_compare_plan(entry: LedgerEntry, info: BatchInfo, expected: bool | None) -> None:
    assert compare_plan(entry, info) is expected


# -- the guard -----------------------------------------------------------------------


def test_replay_of_the_recorded_batch_passes(ledger: DeltaLedger | MemoryLedger) -> None:
    check(ledger, planned(4))  # pg skips it, kafka writes it: a partial replay


def test_replanned_batch_with_the_same_offsets_is_refused(
    ledger: DeltaLedger | MemoryLedger,
) -> None:
    """A checkpoint restored from a copy taken after batch 3: Spark plans batch 4 again
    from the end of batch 3; a file source's offset is again {"logOffset": 4}."""
    with pytest.raises(CheckpointRollbackError) as refused:
        check(ledger, planned(4, batch_timestamp_ms=PLANNED_AT + 99_000))
    lines = str(refused.value).splitlines()
    assert lines[0] == (
        f"pipeline 'orders': checkpoint rolled back. Spark handed batch 4 of query {QUERY}, "
        "but the ledger recorded that batch of this pipeline as planned differently: the "
        "checkpoint was restored from a backup or lost its newest offsets/ and commits/ "
        "files, so Spark planned the batch again from the end of the batch before it. The "
        "sinks holding the batch would skip it and lose the rows it holds now; fanout refuses "
        "to write."
    )
    assert lines[1:3] == [
        '  Spark re-planned batch 4: source offsets [{"logOffset": 4}], planned at '
        "1763856099000 (2025-11-23T00:01:39.000Z)",
        '  the ledger recorded batch 4: source offsets [{"logOffset": 4}], planned at '
        "1763856004000 (2025-11-23T00:00:04.000Z), committed by sink pg",
    ]
    assert lines[3] == "Last committed batch per sink (from the ledger):"
    assert lines[4:6] == [
        f'  - kafka: batch 3, query id {QUERY}, source offsets [{{"logOffset": 3}}], '
        "planned at 1763856003000 (2025-11-23T00:00:03.000Z)",
        f'  - pg: batch 4, query id {QUERY}, source offsets [{{"logOffset": 4}}], '
        "planned at 1763856004000 (2025-11-23T00:00:04.000Z)",
    ]
    message = "\n".join(lines)
    assert "  1. Restore the newest checkpoint" in message
    assert "offsets/4 holds the offsets and planning time the ledger recorded" in message
    assert 'on_checkpoint_reset="new_epoch"). It does not apply to this checkpoint' in message
    assert f"`fanout recover --ledger {ledger_location(ledger)} --pipeline orders`" in message


def test_replanned_batch_with_other_offsets_is_refused(ledger: DeltaLedger | MemoryLedger) -> None:
    """The newest offsets/4 and commits/4 deleted: the file source's own log still lists
    batch 4's files, so the re-planned batch 4 reads up to a new one, {"logOffset": 5}."""
    with pytest.raises(CheckpointRollbackError) as refused:
        check(ledger, planned(4, source_offsets=offsets(5), batch_timestamp_ms=PLANNED_AT + 9))
    assert (
        '  Spark re-planned batch 4: source offsets [{"logOffset": 5}], planned at 1763856000009'
        in str(refused.value)
    )


@pytest.mark.parametrize("info", [planned(2), planned(3, source_offsets=None)])
def test_batch_below_the_high_water_mark_is_refused(
    ledger: DeltaLedger | MemoryLedger, info: BatchInfo
) -> None:
    """Spark runs batch N+1 only after committing batch N, so a batch the ledger holds
    later batches of is never a crash replay: refused even when it matches, and even
    when the offsets are unknown."""
    with pytest.raises(CheckpointRollbackError) as refused:
        check(ledger, info)
    assert (
        f"  the ledger holds later batches of this pipeline: up to batch 4 (Spark plans batch "
        f"{info.batch_id + 1} only after committing batch {info.batch_id})"
    ) in str(refused.value)


def test_lagging_sink_is_not_written_when_the_batch_was_replanned(
    ledger: DeltaLedger | MemoryLedger,
) -> None:
    """A partially marked batch: pg holds batch 4, kafka does not. A re-planned batch 4
    is refused before kafka writes a row of it (its rows past the old end would be lost
    in pg)."""
    pg, kafka = ScriptedSink("pg"), ScriptedSink("kafka")
    fan = FanOut(PIPELINE, ledger, [pg, kafka], backoff_s=0)
    frame = ArrowFrame(pa.table({"x": [1]}))
    with pytest.raises(CheckpointRollbackError, match="committed by sink pg"):
        fan.process(frame, planned(4, batch_timestamp_ms=1))
    assert pg.calls == kafka.calls == []

    assert sorted(fan.process(frame, planned(4))) == ["kafka"]  # the real replay
    assert (pg.calls, kafka.calls) == ([], [(4, 1)])


def test_new_epoch_does_not_accept_a_rollback(ledger: DeltaLedger | MemoryLedger) -> None:
    fan = FanOut(PIPELINE, ledger, [ScriptedSink("pg")], on_checkpoint_reset="new_epoch")
    with pytest.raises(CheckpointRollbackError):
        fan.process(ArrowFrame(pa.table({"x": [1]})), planned(4, batch_timestamp_ms=1))
    assert ledger.current_epoch(PIPELINE) == 0


def test_unknown_offsets_cannot_be_compared_and_warn_once(
    ledger: DeltaLedger | MemoryLedger, caplog: pytest.LogCaptureFixture
) -> None:
    guard = CheckpointGuard(ledger)
    for _ in range(2):
        check(ledger, planned(4, source_offsets=None, batch_timestamp_ms=None), guard)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "pipeline orders, batch 4: the batch's source offsets are unknown, so fanout cannot "
        "tell a crash replay from a rolled-back checkpoint; sinks holding the batch skip it"
    ]


# -- rows with a null query id (item 8) ------------------------------------------------


def test_rows_without_query_id_do_not_refuse_a_replay(tmp_path: Path) -> None:
    """Rows recorded when the query id could not be read: not another query's."""
    led = DeltaLedger(str(tmp_path / "ledger"))
    led.open()
    for batch in range(3):
        mark(led, "pg", batch, query=None)
    mark(led, "kafka", 2, query=QUERY)
    check(led, planned(2))  # a replay of the last batch by the query that now has an id
    with pytest.raises(CheckpointRollbackError):
        check(led, planned(2, batch_timestamp_ms=5))  # ...but not a re-planned one
    with pytest.raises(CheckpointResetError) as reset:  # another known query id still is
        check(led, planned(2, OTHER_QUERY))
    assert not isinstance(reset.value, CheckpointRollbackError)


def test_rows_without_query_id_and_a_deleted_checkpoint_are_refused(tmp_path: Path) -> None:
    """Only rows without a query id: a new query's batch 0 is refused by its plan."""
    led = DeltaLedger(str(tmp_path / "ledger"))
    led.open()
    mark(led, "pg", 0, query=None)
    with pytest.raises(CheckpointRollbackError):
        check(led, planned(0, OTHER_QUERY, batch_timestamp_ms=PLANNED_AT + 60_000))


# -- epochs ---------------------------------------------------------------------------


def test_lagging_sink_replays_in_a_later_epoch(ledger: DeltaLedger | MemoryLedger) -> None:
    """Epoch 1 (a new query after a reset) numbers batches from 0 again; epoch 0's
    batches of the same ids were planned differently, and do not count."""
    new = f"{OTHER_QUERY[:-1]}9"
    a, b = ScriptedSink("pg"), ScriptedSink("kafka", fail=[RuntimeError("down")])
    fan = FanOut(PIPELINE, ledger, [a, b], retries=0, on_checkpoint_reset="new_epoch")
    frame = ArrowFrame(pa.table({"x": [1]}))
    first = planned(0, new, source_offsets=offsets(10), batch_timestamp_ms=PLANNED_AT + 10)
    with pytest.raises(Exception, match="down"):
        fan.process(frame, first)
    assert ledger.current_epoch(PIPELINE) == 1
    assert ledger.last_committed(PIPELINE, ["pg", "kafka"], epoch=1) == {"pg": 0, "kafka": None}
    fan.close()

    with FanOut(PIPELINE, ledger, [a, b], retries=0) as again:
        assert sorted(again.process(frame, first)) == ["kafka"]
    assert (a.calls, b.calls) == ([(0, 1)], [(0, 1), (0, 1)])
    with pytest.raises(CheckpointRollbackError):  # a rollback inside epoch 1 is refused too
        FanOut(PIPELINE, ledger, [a, b]).process(frame, planned(0, new, batch_timestamp_ms=3))


# -- a ledger written before fanout recorded planning times -------------------------


def test_ledger_without_the_planning_time_column(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger")
    old_schema = pa.schema([f for f in ledger_schema() if f.name != "batch_timestamp_ms"])
    from deltalake import DeltaTable, write_deltalake

    DeltaTable.create(path, schema=old_schema, partition_by=["pipeline"])
    rows = [
        {"pipeline": PIPELINE, "query_id": QUERY, "batch_id": 4, "sink": "pg",
         "status": "committed", "source_offsets": json.dumps(offsets(4)), "epoch": 0}
    ]  # fmt: skip
    write_deltalake(
        path,
        pa.Table.from_pylist(rows, schema=old_schema),
        mode="append",
        commit_properties=commit_properties(
            {txn_app_id(PIPELINE, "pg"): 4, pipeline_app_id(PIPELINE): 4}
        ),
    )
    led = DeltaLedger(path)
    led.open()
    [old] = led.committed_entries(PIPELINE)
    assert (old.batch_id, old.source_offsets, old.batch_timestamp_ms) == (
        4,
        '[{"logOffset": 4}]',
        None,
    )
    check(led, planned(4))  # offsets match; the planning time was not recorded
    with pytest.raises(CheckpointRollbackError):
        check(led, planned(4, source_offsets=offsets(5)))

    mark(led, "kafka", 4)  # the new column is added on append
    recorded = {e.sink: e.batch_timestamp_ms for e in led.committed_entries(PIPELINE)}
    assert recorded == {"pg": None, "kafka": PLANNED_AT + 4000}
    check(led, planned(4))
    with pytest.raises(CheckpointRollbackError):
        check(led, planned(4, batch_timestamp_ms=1))
