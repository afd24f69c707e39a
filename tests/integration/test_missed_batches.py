"""A Delta sink left out of the pipeline for two batches and put back is refused before any
sink writes the next batch (``MissedBatchesError``), and ``backfill_from`` the pipeline's
other Delta sink, the way on the refusal names, gives it exactly the batches it missed:
real local Spark, a Delta ledger, two Delta sinks and a spool."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fanout import BatchInfo, FanOut, MissedBatchesError
from fanout.ledger.delta import DeltaLedger
from tests.integration.streams import delta_rows


def _ids(path: Path) -> list[int]:
    return sorted(r["id"] for r in delta_rows(path))


def test_a_delta_sink_put_back_is_refused_then_backfilled_from_the_other(
    spark: Any, tmp_path: Path
) -> None:
    ledger = str(tmp_path / "ledger")
    lake = {"type": "delta", "name": "lake", "path": str(tmp_path / "lake")}
    copy = {"type": "delta", "name": "copy", "path": str(tmp_path / "copy")}

    def run(sinks: list[dict[str, Any]], batches: range, **options: Any) -> FanOut:
        fan = FanOut("mb", ledger, sinks, backoff_s=0, **options)
        try:
            for b in batches:
                frame = spark.createDataFrame([(b * 10,), (b * 10 + 1,)], "id LONG")
                fan.process(frame, BatchInfo("mb", b, "q"))
        finally:
            fan.close()
        return fan

    run([lake, copy], range(2))
    run([lake], range(2, 4))  # "copy" left out for batches 2 and 3
    with pytest.raises(MissedBatchesError) as refused:
        run([lake, copy], range(4, 5))
    assert (refused.value.sink, refused.value.mark, refused.value.missing) == ("copy", 1, [2, 3])
    assert f"fanout ledger skip --ledger {ledger} --pipeline mb --sink copy" in str(refused.value)
    assert _ids(tmp_path / "lake") == [0, 1, 10, 11, 20, 21, 30, 31]  # batch 4 nowhere
    assert _ids(tmp_path / "copy") == [0, 1, 10, 11]

    backfilled = {**copy, "backfill_from": "lake"}
    fan = FanOut("mb", ledger, [lake, backfilled], backoff_s=0, spool=str(tmp_path / "spool"))
    try:
        fan.process(spark.createDataFrame([(40,), (41,)], "id LONG"), BatchInfo("mb", 4, "q"))
        assert fan.catch_up(timeout_s=120)["copy"].state == "live"
    finally:
        fan.close()
    every = [0, 1, 10, 11, 20, 21, 30, 31, 40, 41]
    assert (_ids(tmp_path / "lake"), _ids(tmp_path / "copy")) == (every, every)
    assert DeltaLedger(ledger).last_committed("mb", ["lake", "copy"]) == {"lake": 4, "copy": 4}


def test_a_backfill_whose_source_lost_dead_letters_writes_nothing_and_says_so(
    spark: Any, tmp_path: Path
) -> None:
    """The source's ledger mark of batch 0 counts one row it set aside as a dead letter;
    the letter is gone from its dead-letter table (deleted by hand): the batch read back
    would lack that row, so the backfill writes nothing of it and says why and what to do."""
    from deltalake import DeltaTable

    ledger, dead = str(tmp_path / "ledger"), str(tmp_path / "dead")
    lake = {"type": "delta", "name": "lake", "path": str(tmp_path / "lake"),
            "partition_by": ["k"], "dead_letter": dead}  # fmt: skip
    copy = {"type": "delta", "name": "copy", "path": str(tmp_path / "copy"),
            "backfill_from": "lake"}  # fmt: skip

    def frame(rows: list[tuple[int, str]]) -> Any:
        return spark.createDataFrame(rows, "id LONG, k STRING")

    first = FanOut("lost", ledger, [lake], backoff_s=0)
    try:
        first.process(frame([(1, "a"), (2, "")]), BatchInfo("lost", 0, "q"))  # 2: set aside
    finally:
        first.close()
    DeltaTable(dead).delete("batch_id = 0")

    fan = FanOut("lost", ledger, [lake, copy], backoff_s=0, spool=str(tmp_path / "spool"))
    try:
        fan.process(frame([(3, "b")]), BatchInfo("lost", 1, "q"))
        lag = fan.catch_up(timeout_s=120)["copy"]
    finally:
        fan.close()
    assert (lag.state, lag.batches) == ("lagging", 2)
    assert lag.error == (
        "BackfillError: sink 'copy', batch 0: cannot be backfilled from sink 'lake': its "
        "ledger mark says it set 1 row(s) of batch 0 (epoch 0) aside as dead letters, but "
        f"Delta table {dead} holds 0 of them (deleted, or the table replaced), so the batch "
        "read back would lack them; nothing of it is written to 'copy', which waits at this "
        f"batch. Put the letters back (restore {dead} to a version that holds them), or "
        f"accept that 'copy' never gets batch 0: `fanout ledger skip --ledger {ledger} "
        "--pipeline lost --sink copy --through 0 --epoch 0`, then restart"
    )
    assert not (tmp_path / "copy").exists()  # nothing written to the backfilled sink
    assert _ids(tmp_path / "lake") == [1, 3]
    assert DeltaLedger(ledger).last_committed("lost", ["lake", "copy"]) == {
        "lake": 1,
        "copy": None,
    }


def test_the_skip_a_put_back_sink_is_refused_with_works_as_printed(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The other way on of the refusal above: the ``fanout ledger skip`` command it prints,
    run exactly as printed (split as a shell would, through the CLI's ``main``), records
    batches 2-3 as given up for 'copy', and the restart writes batch 4 to both sinks with no
    refusal; 'copy' never gets 2-3, as the skip said."""
    import re
    import shlex

    from fanout.app.cli import main

    ledger = str(tmp_path / "ledger place")  # a space: the command must quote it
    lake = {"type": "delta", "name": "lake", "path": str(tmp_path / "lake")}
    copy = {"type": "delta", "name": "copy", "path": str(tmp_path / "copy")}

    def run(sinks: list[dict[str, Any]], batches: range) -> None:
        fan = FanOut("mb", ledger, sinks, backoff_s=0, spark=spark)
        try:
            for b in batches:
                fan.process(spark.range(b * 10, b * 10 + 2), BatchInfo("mb", b, "q"))
        finally:
            fan.close()

    run([lake, copy], range(2))
    run([lake], range(2, 4))  # "copy" removed for batches 2 and 3, then put back
    with pytest.raises(MissedBatchesError) as refused:
        run([lake, copy], range(4, 5))
    commands = re.findall(r"`(fanout ledger skip [^`]*)`", str(refused.value))
    assert len(commands) == 1, str(refused.value)
    assert main(shlex.split(commands[0])[1:]) == 0, capsys.readouterr()
    run([lake, copy], range(4, 5))  # restart: no refusal
    assert _ids(tmp_path / "lake") == [0, 1, 10, 11, 20, 21, 30, 31, 40, 41]
    assert _ids(tmp_path / "copy") == [0, 1, 10, 11, 40, 41]
    assert DeltaLedger(ledger).last_committed("mb", ["lake", "copy"]) == {"lake": 4, "copy": 4}
