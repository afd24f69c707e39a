"""A batch refused at a clean stop is written by its replay although the sink's own
records of the epoch expired meanwhile (docs/architecture.md §4, "Refused batches"; §5):
``fanout run`` in a process of its own, SIGTERMed as Spark hands batch 1 over
(``signal_at_batch.py``), refuses batch 1 before any write and records it ``refused``;
the Delta sink's table keeps app transactions 2 seconds
(``delta.setTransactionRetentionDuration``, as ``replay_driver.py`` configures it), and
the pipeline stays stopped past that. At the restart, Spark replays batch 1 with its
original planning time and the sink cannot tell whether its table holds it (its records
gone, ``records_gone`` says why): without the refused row the replay check would refuse
it (``test_replay_crash.py``), but nothing of it was written, so it is admitted (an
``admitted`` row before the sink's write) and written: every id once. Real Spark, a real
Delta ledger and sink."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import replay_driver

from fanout import FanOut
from fanout.app.recover_sinks import built_sink
from fanout.contract.sink import SinkContext
from tests.integration.signal_at_batch import stopped_run
from tests.integration.streams import (
    backlog_pipeline,
    committed_marks,
    delta_rows,
    id_counts,
    run_to_end,
    write_input,
)
from tests.integration.test_stop_records_refusal import (
    FILES,
    ROWS,
    _planned_at,
    _refusal_rows,
)

pytestmark = pytest.mark.integration

PIPELINE = "expired"


def _records_gone(data: Path) -> str | None:
    """What the sink, opened as at a run, says of its records of epoch 0, once it cannot
    tell whether its table holds batch 1 (``holds_batch`` ``None``); else ``None``."""
    sink, _ = built_sink(replay_driver.sinks(data)[0])
    sink.open(SinkContext(PIPELINE))
    try:
        if sink.holds_batch(PIPELINE, 0, 1) is not None:
            return None
        return sink.records_gone(PIPELINE, 0, 0)
    finally:
        sink.close()


def test_a_batch_refused_at_a_clean_stop_is_written_once_after_its_records_expired(
    spark: Any, tmp_path: Path
) -> None:
    rows = write_input(tmp_path / "input", FILES, ROWS)
    [sink] = replay_driver.sinks(tmp_path)  # silver: app transactions kept 2 seconds
    config = backlog_pipeline(tmp_path, PIPELINE, sink)
    out = stopped_run(config, 1)
    assert "stopped before batch 1 began (it runs at the next start)" in out, out
    ledger = tmp_path / "ledger"
    assert committed_marks(ledger, PIPELINE) == Counter({("silver", 0): 1})
    assert id_counts(delta_rows(tmp_path / "silver")) == Counter(range(ROWS))
    planned = _planned_at(tmp_path / "checkpoint", 1)
    assert _refusal_rows(ledger, PIPELINE) == [("refused", "*", 0, 1, 1, planned)]

    time.sleep(3)  # the table forgets the app transactions 2 s after their commit
    gone = _records_gone(tmp_path)
    assert gone is not None and gone.startswith(
        f"the table's log keeps no app transaction 'fanout/{PIPELINE}/silver' "
    ), gone

    fan = FanOut(PIPELINE, str(ledger), [sink], backoff_s=0, retries=0)
    assert run_to_end(spark, fan, tmp_path) == ""

    assert _planned_at(tmp_path / "checkpoint", 1) == planned  # Spark replayed batch 1
    assert id_counts(delta_rows(tmp_path / "silver")) == Counter(r["order_id"] for r in rows)
    assert committed_marks(ledger, PIPELINE) == Counter({("silver", b): 1 for b in range(FILES)})
    assert _refusal_rows(ledger, PIPELINE) == [
        ("admitted", "*", 0, 1, 2, planned),
        ("refused", "*", 0, 1, 1, planned),
    ]
    ledger_rows = delta_rows(ledger)
    [admitted] = [r for r in ledger_rows if r["status"] == "admitted"]
    [mark] = [
        r
        for r in ledger_rows
        if (r["sink"], r["batch_id"], r["status"]) == ("silver", 1, "committed")
    ]
    assert admitted["finished_at"] <= mark["started_at"]  # admitted before the sink wrote
    assert (mark["rows"], mark["batch_timestamp_ms"]) == (ROWS, planned)
    assert [r for r in ledger_rows if r["status"] == "failed"] == []
