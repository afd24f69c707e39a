"""Ordinary operator actions between runs (docs/architecture.md §14.3): each either starts
without a refusal and writes the right rows, or is refused with a way on that works when
run exactly as printed. Real Spark (the tests' session), real Delta tables, ledger and
spool, in process.

- A lagging sink removed for good: the start's warning prints the release; run as
  printed, it gives the spooled batches up, and the next start warns no more.
- A lagging sink switched to ``on_failure="stop"`` while the spool keeps batches for it:
  refused, rightly (it would skip them). The refusal said "keep on_failure='lag' until
  `fanout status` shows it live": that command runs without --ledger on no ledger, shows
  the sink ``stopped`` without --spool, and never the word ``live`` once every sink is
  live; nor did it name the way to give the batches up. It now prints both commands, and
  each works as printed.
- ``on_failure`` switched stop -> lag -> stop after clean stops, a second pipeline name
  fanning into the same Delta table, a checkpoint moved to a new path (the pipeline file
  updated): no refusal, every row once.
"""

from __future__ import annotations

import logging
import re
import shlex
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from fanout import BatchInfo, ConfigurationError, FanOut
from fanout.app.cli import main
from tests.in_process_cli import Cli
from tests.integration.streams import bronze_pipeline, delta_rows, id_counts, write_input


def _sinks(tmp_path: Path, copy: str | None = "lag") -> list[dict[str, Any]]:
    """Sink ``lake``, and sink ``copy`` with ``on_failure=copy`` (``None``: no ``copy``)."""
    lake = {"type": "delta", "name": "lake", "path": str(tmp_path / "lake")}
    if copy is None:
        return [lake]
    return [lake, {"type": "delta", "name": "copy", "path": str(tmp_path / "copy"),
                   "on_failure": copy, "retries": 0}]  # fmt: skip


def _fan(tmp_path: Path, sinks: list[dict[str, Any]], pipeline: str = "ops") -> FanOut:
    return FanOut(pipeline, str(tmp_path / "ledger"), sinks, retries=0, backoff_s=0,
                  spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip


def _run(spark: Any, fan: FanOut, *batches: int, pipeline: str = "ops") -> None:
    """Batches ``batches`` (batch b: ids 10b to 10b+2), then close ``fan``."""
    try:
        for b in batches:
            df = spark.range(b * 10, b * 10 + 3).withColumnRenamed("id", "order_id")
            fan.process(df, BatchInfo(pipeline, b, "q", {"s": b}))
    finally:
        fan.close()


def _ids(path: Path) -> Counter[int]:
    return Counter(r["order_id"] for r in delta_rows(path))


def _every(*batches: int) -> Counter[int]:
    """Each id of ``batches`` once per time named."""
    return Counter(b * 10 + i for b in batches for i in range(3))


def _copy_lags_on_1_and_2(spark: Any, tmp_path: Path) -> None:
    """``copy`` (on_failure='lag') writes batch 0, then lags on 1 and 2 (its path not a
    table), spooled for it; a clean stop; its table put back."""
    copy, aside = tmp_path / "copy", tmp_path / "aside"
    first = _fan(tmp_path, _sinks(tmp_path))
    first.catchup.stop()  # no probe: the batches stay spooled for copy
    try:
        _run(spark, first, 0)
        copy.rename(aside)
        copy.write_text("not a table")
        _run(spark, first, 1, 2)
        assert first.spool is not None
        assert [(b.batch_id, sorted(b.needed_by)) for b in first.spool.batches()] == [
            (1, ["copy"]), (2, ["copy"]),
        ]  # fmt: skip
    finally:
        first.close()
    copy.unlink()
    aside.rename(copy)


def _release(text: str) -> None:
    """Run the ``fanout ledger skip ... --release-spooled`` ``text`` prints, as printed."""
    command = re.search(r"`(fanout ledger skip [^`]*--release-spooled)`", text)
    assert command is not None, text
    assert main(shlex.split(command.group(1))[1:]) == 0


def test_a_lagging_sink_removed_for_good_is_released_as_the_warning_prints(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _copy_lags_on_1_and_2(spark, tmp_path)
    caplog.set_level(logging.WARNING, "fanout")
    caplog.clear()
    _run(spark, _fan(tmp_path, _sinks(tmp_path, None)), 3)  # copy removed: not refused
    [warning] = [r.getMessage() for r in caplog.records if "not configured" in r.getMessage()]
    assert warning.startswith(
        f"pipeline ops: the spool at {tmp_path}/spool keeps 2 batch(es) of epoch 0 (from batch "
        "1) for sink 'copy', which is not configured"
    )
    _release(warning)
    caplog.clear()
    again = _fan(tmp_path, _sinks(tmp_path, None))
    assert again.spool is not None and again.spool.batches() == []
    _run(spark, again, 4)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert _ids(tmp_path / "lake") == _every(0, 1, 2, 3, 4)
    assert _ids(tmp_path / "copy") == _every(0)


def test_a_lagging_sink_switched_to_stop_is_refused_with_ways_on_that_work_as_printed(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _copy_lags_on_1_and_2(spark, tmp_path)
    with pytest.raises(ConfigurationError) as refused:
        _fan(tmp_path, _sinks(tmp_path, "stop"))
    text = str(refused.value)
    status = f"fanout status --ledger {tmp_path}/ledger --pipeline ops --spool {tmp_path}/spool"
    release = (
        f"fanout ledger skip --ledger {tmp_path}/ledger --pipeline ops --sink copy "
        f"--through 2 --epoch 0 --spool {tmp_path}/spool --release-spooled"
    )
    assert text == (
        f"pipeline 'ops': sink 'copy' still needs batches from the spool at {tmp_path}/spool "
        "(the oldest: batch 1 of epoch 0) but no longer has on_failure='lag'; it would skip "
        f"them. Keep on_failure='lag' until it has caught up: `{status}` lists it 'lagging' "
        "or 'catching up' until then (once every sink is live, the table has no state "
        "column). Or, if it must never get them, give them up (they are released from the "
        f"spool, the sink's next batch writes it): `{release}`."
    )  # before: "... Keep on_failure='lag' until `fanout status` shows it live."
    capsys.readouterr()
    assert main(shlex.split(status)[1:]) == 0  # as printed
    rows = [line.split()[:4] for line in capsys.readouterr().out.splitlines()]
    assert [r for r in rows if r[:1] == ["ops"]] == [
        ["ops", "copy", "lagging", "2"],  # without --spool: 'stopped'
        ["ops", "lake", "live", "2"],
    ]
    assert _ids(tmp_path / "copy") == _every(0)

    _release(text)  # the other way, as printed
    _run(spark, _fan(tmp_path, _sinks(tmp_path, "stop")), 3)  # no refusal now
    assert _ids(tmp_path / "copy") == _every(0, 3)  # 1 and 2 given up, as chosen
    assert _ids(tmp_path / "lake") == _every(0, 1, 2, 3)


def test_on_failure_switched_after_clean_stops_and_a_second_pipeline_on_one_table(
    spark: Any, tmp_path: Path
) -> None:
    for b, on_failure in enumerate(("stop", "lag", "stop")):
        _run(spark, _fan(tmp_path, _sinks(tmp_path, on_failure)), b)
    assert _ids(tmp_path / "copy") == _ids(tmp_path / "lake") == _every(0, 1, 2)
    # pipeline "other" into the same table, its batch 0 too: its own rows, not a replay
    other = FanOut("other", str(tmp_path / "ledger"), _sinks(tmp_path, None), retries=0)
    _run(spark, other, 0, pipeline="other")
    assert _ids(tmp_path / "lake") == _every(0, 0, 1, 2)


def test_a_checkpoint_moved_to_a_new_path_with_the_pipeline_file(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    config = tmp_path / "pipeline.toml"
    config.write_text(bronze_pipeline(tmp_path))
    write_input(tmp_path / "input", 1, 3)
    assert fanout_cli("run", str(config)).returncode == 0
    (tmp_path / "checkpoint").rename(tmp_path / "moved")
    config.write_text(
        bronze_pipeline(tmp_path).replace(f"{tmp_path}/checkpoint", f"{tmp_path}/moved")
    )
    write_input(tmp_path / "input", 1, 3, start_file=1)
    ran = fanout_cli("run", str(config))
    assert ran.returncode == 0, ran.stdout
    assert "batch 1: 3 rows in" in ran.stdout
    assert id_counts(delta_rows(tmp_path / "bronze")) == {i: 1 for i in range(6)}
