"""A checkpoint rolled back past a batch the Delta sinks committed but the ledger never
marked: Spark plans the batch again with more input, the checkpoint guard sees nothing
(the ledger holds nothing at it), and each Delta sink refuses rather than skip it by its
app transaction and lose the new rows (docs/architecture.md §5, §8.1)."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest
from fanout_delta.spark_engine import delta_jvm_missing
from pyspark.errors import StreamingQueryException

from fanout import FanOut
from fanout.contract.plans import planned_at
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry
from tests.in_process_cli import Cli
from tests.integration.streams import committed_marks, delta_rows, run_stream, write_input
from tests.newest_lines import without_newest


class DiesBeforeMarking(DeltaLedger):
    """A ledger whose marks all fail: as if the driver died after the sinks wrote."""

    def mark_committed(self, entry: LedgerEntry) -> bool:
        """Fail every mark."""
        raise OSError("driver killed before the ledger mark")


def _sinks(spark: Any, tmp_path: Path) -> list[dict[str, Any]]:
    sinks: list[dict[str, Any]] = [
        {"type": "delta", "name": "bronze", "path": str(tmp_path / "bronze"),
         "write_from": "driver"},
        {"type": "delta", "name": "silver", "path": str(tmp_path / "silver"),
         "write_from": "executors"},
    ]  # fmt: skip
    if delta_jvm_missing(spark) is None:  # the delta-spark engine, where its jars load
        sinks.append({"type": "delta", "name": "gold", "path": str(tmp_path / "gold"),
                      "engine": "spark"})  # fmt: skip
    return sinks


def _run(spark: Any, tmp_path: Path, ledger: Any = None) -> None:
    """Every new input file in one batch."""
    fan = FanOut("replan", ledger or str(tmp_path / "ledger"), _sinks(spark, tmp_path), retries=0)
    run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint", files_per_batch=None)


def _order_ids(path: Path) -> list[int]:
    return sorted(r["order_id"] for r in delta_rows(path))


def test_a_batch_written_but_not_marked_then_planned_again_is_refused(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    names = [str(s["name"]) for s in _sinks(spark, tmp_path)]
    for n in range(3):
        write_input(tmp_path / "input", 1, 10, start_file=n)
        _run(spark, tmp_path)
    # batch 3 is written to every sink; the driver dies before the ledger marks it
    write_input(tmp_path / "input", 1, 10, start_file=3)
    with pytest.raises(StreamingQueryException, match="driver killed before the ledger mark"):
        _run(spark, tmp_path, DiesBeforeMarking(str(tmp_path / "ledger")))
    offsets = tmp_path / "checkpoint" / "offsets"
    first_plan = json.loads((offsets / "3").read_text().splitlines()[1])["batchTimestampMs"]
    for name in names:
        assert _order_ids(tmp_path / name) == list(range(40)), name
    # the checkpoint loses offsets/3 (restored from a backup taken before it was written)
    shutil.move(offsets / "3", tmp_path / "offsets-3")
    (offsets / ".3.crc").unlink(missing_ok=True)
    write_input(tmp_path / "input", 1, 10, start_file=4)

    with pytest.raises(StreamingQueryException) as refused:
        _run(spark, tmp_path)

    message = str(refused.value)
    query = json.loads((tmp_path / "checkpoint" / "metadata").read_text())["id"]
    for name in names:
        assert (
            f"  - {name}: CheckpointRollbackError: pipeline 'replan': checkpoint rolled back. "
            f"Spark handed batch 3 of query {query}, but the Delta table of sink {name!r} "
            f"({tmp_path / name}) already holds batch 3, committed under another plan"
        ) in message
    assert 'Spark re-planned batch 3: source offsets [{"logOffset": 4}], planned at ' in message
    assert (
        "the Delta table recorded batch 3 in version 3, at " in message
        and f'source offsets [{{"logOffset": 3}}], planned at {planned_at(first_plan)}\n' in message
    )
    # the recover command each refusal prints runs as printed: it names the ledger
    recover = [line for line in message.splitlines() if "`fanout recover " in line]
    assert len(set(recover)) == 1  # one ledger, named alike by every sink
    argv = shlex.split(recover[0].split("`")[1])
    assert argv == [
        "fanout", "recover", "--ledger", str(tmp_path / "ledger"), "--pipeline", "replan"
    ]  # fmt: skip
    ran = fanout_cli(*argv[1:])
    assert ran.returncode == 0, ran
    assert without_newest(ran.stdout)[0].splitlines()[:2] == [
        "pipeline 'replan': last committed batch per sink",
        f"  {sorted(names)[0]}: batch 2, query id {query}, source offsets "
        '[{"logOffset": 2}], planned at '
        + planned_at(json.loads((offsets / "2").read_text().splitlines()[1])["batchTimestampMs"]),
    ]
    # nothing skipped, nothing written: rows 40-49 wait for a way out
    for name in names:
        assert _order_ids(tmp_path / name) == list(range(40)), name
    assert committed_marks(tmp_path / "ledger", "replan") == {
        (s, b): 1 for s in names for b in range(3)
    }

    # the way out the message gives first: the newest checkpoint (its offsets/3) restored;
    # batch 3 replays as planned first and is skipped, batch 4 takes the new file
    shutil.copy(tmp_path / "offsets-3", offsets / "3")
    (offsets / ".3.crc").unlink(missing_ok=True)
    _run(spark, tmp_path)
    for name in names:
        assert _order_ids(tmp_path / name) == list(range(50)), name
    assert committed_marks(tmp_path / "ledger", "replan") == {
        (s, b): 1 for s in names for b in range(5)
    }
