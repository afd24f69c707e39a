"""A batch refused at a clean stop is recorded in the ledger as refused before any write
(docs/architecture.md §4, "Refused batches"), with the planning time Spark keeps for its
replay: real Spark, a real Delta ledger and sink, a real ``fanout run`` stopped by SIGTERM
as Spark hands a batch over (``signal_at_batch.py``, as ``test_stop_with_a_backlog.py``),
and the library's ``request_stop``. The replay at the next start writes the batch once and
records no refusal of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from fanout import FanOut
from fanout.app.cli import main
from fanout.steps.context import parse_offset_log
from tests.integration.streams import (
    backlog_pipeline,
    committed_marks,
    delta_rows,
    id_counts,
    run_stream,
    run_to_end,
    write_input,
)
from tests.newest_lines import readout

DRIVER = Path(__file__).with_name("signal_at_batch.py")
FILES, ROWS = 3, 3


def _sink(data: Path) -> dict[str, str]:
    return {"type": "delta", "name": "lake", "path": str(data / "lake")}


def _config(data: Path) -> Path:
    return backlog_pipeline(data, "stopped", _sink(data))


def _planned_at(checkpoint: Path, batch: int) -> int:
    """``batchTimestampMs`` of the checkpoint's ``offsets/<batch>``, as Spark wrote it."""
    planned = parse_offset_log((checkpoint / "offsets" / str(batch)).read_text())
    assert planned.batch_timestamp_ms is not None
    return planned.batch_timestamp_ms


def _refusal_rows(ledger: Path, pipeline: str) -> list[tuple[str, str, int, int, int, Any]]:
    """Every ``refused``/``admitted`` row of ``pipeline``: (status, sink, epoch, batch,
    attempt, planning time)."""
    return sorted(
        (r["status"], r["sink"], r["epoch"], r["batch_id"], r["attempt"], r["batch_timestamp_ms"])
        for r in delta_rows(ledger)
        if r["pipeline"] == pipeline and r["status"] in ("refused", "admitted")
    )


def test_fanout_run_stopped_as_spark_begins_a_batch_records_it_refused_once(
    spark: Any, tmp_path: Path, capsys: Any
) -> None:
    """``fanout run``: SIGTERM as Spark hands batch 1 over (batch 0 written): batch 1 is
    refused at the stop gate, the run stops cleanly (exit 0), and the ledger holds exactly
    one ``refused`` row, of batch 1, epoch 0, with ``offsets/1``'s planning time. The next
    start replays batch 1 with that planning time and writes it: every row once, one mark
    per batch, still the one row; ``fanout status`` shows the sink only."""
    rows = write_input(tmp_path / "input", FILES, ROWS)
    config = _config(tmp_path)
    done = subprocess.run(
        [sys.executable, str(DRIVER), str(config), "1", "entry"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = done.stdout + done.stderr[-6000:]
    assert "SIGNAL at entry of batch 1" in out, out
    assert done.returncode == 0, out
    assert "stopped before batch 1 began (it runs at the next start)" in out, out
    ledger = tmp_path / "ledger"
    assert committed_marks(ledger, "stopped") == Counter({("lake", 0): 1})
    planned = _planned_at(tmp_path / "checkpoint", 1)
    assert _refusal_rows(ledger, "stopped") == [("refused", "*", 0, 1, 1, planned)]

    fan = FanOut("stopped", str(ledger), [_sink(tmp_path)], backoff_s=0)
    assert run_to_end(spark, fan, tmp_path) == ""

    assert _planned_at(tmp_path / "checkpoint", 1) == planned  # the replay's, unchanged
    assert committed_marks(ledger, "stopped") == Counter({("lake", b): 1 for b in range(FILES)})
    assert id_counts(delta_rows(tmp_path / "lake")) == Counter(r["order_id"] for r in rows)
    assert [r for r in _refusal_rows(ledger, "stopped") if r[0] == "refused"] == [
        ("refused", "*", 0, 1, 1, planned)
    ]
    assert main(["status", "--ledger", str(ledger), "--pipeline", "stopped", "--json"]) == 0
    status = json.loads(readout(capsys).out)
    assert [(s["sink"], s["last_committed_batch"], s["failed_attempts"]) for s in status] == [
        ("lake", FILES - 1, 0)
    ]


def test_a_fan_out_asked_to_stop_records_the_batch_it_refused(spark: Any, tmp_path: Path) -> None:
    """The library: ``request_stop()`` before the query runs; its batch 0 (planned after
    the FanOut was built) is refused before anything: one ``refused`` row with
    ``offsets/0``'s planning time. A new FanOut replays it: written once, no row more."""
    rows = write_input(tmp_path / "input", 2, ROWS)
    ledger = tmp_path / "ledger"
    fan = FanOut("asked", str(ledger), [_sink(tmp_path)], backoff_s=0)
    assert fan.request_stop() is None
    try:
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")
    except Exception as exc:
        assert "StopRequestedError: pipeline 'asked', batch 0: refused" in str(exc)
    else:
        raise AssertionError("the refused batch did not fail the query")
    finally:
        fan.close()
    planned = _planned_at(tmp_path / "checkpoint", 0)
    assert _refusal_rows(ledger, "asked") == [("refused", "*", 0, 0, 1, planned)]
    assert committed_marks(ledger, "asked") == Counter()

    again = FanOut("asked", str(ledger), [_sink(tmp_path)], backoff_s=0)
    assert run_to_end(spark, again, tmp_path) == ""

    assert committed_marks(ledger, "asked") == Counter({("lake", 0): 1, ("lake", 1): 1})
    assert id_counts(delta_rows(tmp_path / "lake")) == Counter(r["order_id"] for r in rows)
    assert [r for r in _refusal_rows(ledger, "asked") if r[0] == "refused"] == [
        ("refused", "*", 0, 0, 1, planned)
    ]
