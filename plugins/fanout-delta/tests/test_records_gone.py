"""The Delta sink's own records (its app transactions in the table's log) expired while
the table still holds the batches (``delta.setTransactionRetentionDuration``): a replay
of a batch written and never marked is refused (fanout.steps.replay) instead of being
appended a second time; an empty replay, an accepted one and a reused FanOut's in-process
restart; and :meth:`DeltaSink.records_gone` itself, which says "gone" only where
``holds_batch`` cannot tell (so the lost-target check and a new epoch's start, which ask it
after a ``False``, refuse nothing more than before). The sink's ``min_txn_retention_hours``
(168 h by default) refuses a shorter retention at ``open()``; these tests set it to 0."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltacheck import ids
from deltalake import write_deltalake
from fanout_delta import DeltaSink

from fanout import BatchFailedError, BatchInfo, FanOut, SinkRecordsGoneError
from fanout.contract.sink import SinkContext
from fanout.delta_tables.retention import PROPERTY
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry
from fanout.testing.faults import DieAfterWrite, DieBeforeWrites, DriverKilled

pytestmark = pytest.mark.integration

RETAINED = {PROPERTY: "interval 2 seconds"}


def _sinks(tmp_path: Path) -> list[dict[str, Any]]:
    return [{"type": "delta", "name": "silver", "path": str(tmp_path / "silver"),
             "configuration": RETAINED, "min_txn_retention_hours": 0}]  # fmt: skip


def _write(fan: FanOut, spark: Any, batch_id: int, planned: int, rows: int = 3) -> None:
    """Batch ``batch_id`` of pipeline ``gonedelta``, planned at ``planned`` (a replay keeps
    its first attempt's): ids ``10 * batch_id`` + 0..rows-1."""
    info = BatchInfo("gonedelta", batch_id, "query-1", [{"src": {"0": batch_id + 1}}],
                     batch_timestamp_ms=planned)  # fmt: skip
    frame = spark.createDataFrame([(batch_id * 10 + n,) for n in range(rows)], "id LONG")
    fan.process(frame, info)


def _now() -> int:
    return int(time.time() * 1000)


def _killed_in_batch_1(tmp_path: Path, spark: Any, *plugins: object, rows: int = 3) -> int:
    """Batch 0 written and marked, batch 1's attempt killed by ``plugins`` (after the sink's
    write by default), then idle past the retention: batch 1's planning time."""
    fan = FanOut("gonedelta", str(tmp_path / "ledger"), _sinks(tmp_path), retries=0,
                 plugins=plugins or (DieAfterWrite("silver", 1),))  # fmt: skip
    _write(fan, spark, 0, _now())
    planned = _now()
    with pytest.raises(DriverKilled):
        _write(fan, spark, 1, planned, rows)
    fan.close()
    time.sleep(3)  # the transactions expire
    return planned


def _fan(tmp_path: Path, **options: Any) -> FanOut:
    return FanOut("gonedelta", str(tmp_path / "ledger"), _sinks(tmp_path), retries=0, **options)


def test_an_expired_transaction_of_an_unmarked_batch_refuses_its_replay(
    spark: Any, tmp_path: Path
) -> None:
    planned = _killed_in_batch_1(tmp_path, spark)
    assert ids(tmp_path / "silver") == [0, 1, 2, 10, 11, 12]

    replay = _fan(tmp_path)
    with pytest.raises(SinkRecordsGoneError) as refused:
        _write(replay, spark, 1, planned)
    replay.close()
    assert (refused.value.sink, refused.value.batch_id) == ("silver", 1)
    assert str(refused.value).startswith(
        "sink 'silver', batch 1: pipeline 'gonedelta', sink 'silver': batch 1 of epoch 0 is a "
        f"replay (planned at {_iso(planned)} (batchTimestampMs {planned}), before this FanOut "
        "was built ("
    )
    assert (
        f"its own records of the epoch being gone: the table's log keeps no app transaction "
        f"'fanout/gonedelta/silver' (its {PROPERTY} = 'interval 2 seconds' expired it after "
        "the epoch's last batch) while the table holds data files."
    ) in str(refused.value)
    assert ids(tmp_path / "silver") == [0, 1, 2, 10, 11, 12]


def _iso(ms: int) -> str:
    from datetime import UTC, datetime

    text = datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def test_an_empty_replay_passes(spark: Any, tmp_path: Path, caplog: Any) -> None:
    planned = _killed_in_batch_1(tmp_path, spark, rows=0)
    replay = _fan(tmp_path)
    with caplog.at_level(logging.INFO, logger="fanout"):
        _write(replay, spark, 1, planned, rows=0)
    assert any(
        "batch 1: a replay that silver cannot tell it holds, but it holds no row" in r.getMessage()
        for r in caplog.records
    )
    _write(replay, spark, 2, _now())
    replay.close()
    assert ids(tmp_path / "silver") == [0, 1, 2, 20, 21, 22]
    ledger = DeltaLedger(str(tmp_path / "ledger"))
    ledger.open()
    assert ledger.last_committed("gonedelta", ["silver"]) == {"silver": 2}


def test_an_accepted_sink_writes_the_replay_its_table_lacks(spark: Any, tmp_path: Path) -> None:
    """Killed before the write: the table lacks batch 1, which the sink cannot tell once
    its transactions expired (refused, a true ambiguity); the operator checked and
    accepts: written once."""
    planned = _killed_in_batch_1(tmp_path, spark, DieBeforeWrites(1))
    assert ids(tmp_path / "silver") == [0, 1, 2]
    refused = _fan(tmp_path)
    with pytest.raises(SinkRecordsGoneError):
        _write(refused, spark, 1, planned)
    refused.close()

    accepting = _fan(tmp_path, accept_lost_targets=["silver"])
    _write(accepting, spark, 1, planned)
    accepting.close()
    assert ids(tmp_path / "silver") == [0, 1, 2, 10, 11, 12]


class LosesOneMark(DeltaLedger):
    """A ledger whose first mark of batch 1 fails: the sink wrote it, the batch fails (the
    query stops), and the same FanOut runs it again in the same process."""

    lost = False

    def mark_committed(self, entry: LedgerEntry) -> bool:
        if entry.batch_id == 1 and not self.lost:
            self.lost = True
            raise OSError("the ledger's store went away")
        return super().mark_committed(entry)


def test_a_fanout_reused_in_process_refuses_the_replay_of_its_own_attempt(
    spark: Any, tmp_path: Path
) -> None:
    fan = FanOut("gonedelta", LosesOneMark(str(tmp_path / "ledger")), _sinks(tmp_path),
                 retries=0)  # fmt: skip
    _write(fan, spark, 0, _now())
    planned = _now()  # planned by this run, after the FanOut was built
    with pytest.raises(BatchFailedError):
        _write(fan, spark, 1, planned)
    assert ids(tmp_path / "silver") == [0, 1, 2, 10, 11, 12]
    time.sleep(3)

    with pytest.raises(SinkRecordsGoneError, match="this FanOut began writing it before"):
        _write(fan, spark, 1, planned)  # the query restarted in-process, the same FanOut
    fan.close()
    assert ids(tmp_path / "silver") == [0, 1, 2, 10, 11, 12]


# -- DeltaSink.records_gone ---------------------------------------------------------------


def _opened(path: Path, **options: Any) -> DeltaSink:
    sink = DeltaSink("silver", path=str(path), min_txn_retention_hours=0, **options)
    sink.open(SinkContext(pipeline="gonedelta"))
    return sink


def _table(path: Path, configuration: dict[str, str] | None = None) -> None:
    """A table holding rows and no transaction of the pipeline (another writer's)."""
    write_deltalake(str(path), pa.table({"id": pa.array([7], pa.int64())}),
                    configuration=configuration)  # fmt: skip


def test_records_gone_only_where_holds_batch_cannot_tell(tmp_path: Path) -> None:
    retained, kept = tmp_path / "retained", tmp_path / "kept"
    _table(retained, RETAINED)
    _table(kept)  # no retention: a transaction never expires, so none was written here
    sink = _opened(retained)
    assert sink.holds_batch("gonedelta", 0, 1) is None
    assert sink.records_gone("gonedelta", 0, 0) == (
        "the table's log keeps no app transaction 'fanout/gonedelta/silver' (its "
        f"{PROPERTY} = 'interval 2 seconds' expired it after the epoch's last batch) while "
        "the table holds data files"
    )
    assert _opened(kept).holds_batch("gonedelta", 0, 1) is False
    assert _opened(kept).records_gone("gonedelta", 0, 0) is None  # a lost target, as before
    assert _opened(tmp_path / "missing").records_gone("gonedelta", 0, 0) is None
    merge = _opened(retained, mode="merge", keys=["id"])
    assert merge.records_gone("gonedelta", 0, 0) is None  # a replay merges by key
