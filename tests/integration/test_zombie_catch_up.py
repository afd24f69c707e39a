"""The catch-up of a lagging sink after a reset started from a ``fanout recover`` report made
without ``--spool`` (ARCHITECTURE §5, "A query still running during a reset", window 2).

The report counts the lagging sink at its mark, so the new checkpoint resumes there; the
catch-up then writes the sink its spooled batch of the old epoch, which the new epoch reads
again: the sink holds those rows twice (the report warned: "The spool was not read"). The
late mark fails once, naming the batch. Its next try, the batch already marked, passes: it
failed at every try, the sink's catch-up never got past that batch, and the new epoch's
batches never reached the sink. Real Spark, real Delta, ledger and spool, the embedded
PostgreSQL."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from fanout import FanOut
from tests.in_process_cli import Cli
from tests.integration.streams import committed_marks, run_stream, write_input
from tests.integration.test_reset_with_a_backfilling_sink import _fan as pipeline
from tests.integration.test_reset_with_a_backfilling_sink import _pg_ids


def _fan(tmp_path: Path, url: str, **kw: Any) -> FanOut:
    """``lake`` and ``pg`` (lagging when down), with a spool: the backfill test's pipeline
    without its backfilling sink."""
    return pipeline(tmp_path, url, copy=False, **kw)


def test_the_catch_up_of_a_batch_the_report_did_not_count_fails_once_then_goes_on(
    spark: Any,
    tmp_path: Path,
    server: tuple[Any, str],
    fanout_cli: Cli,
) -> None:
    pg, url = server
    inputs = tmp_path / "input"
    write_input(inputs, 1, 3)  # batch 0: rows 0-2, both sinks
    pg.start()
    first = _fan(tmp_path, url)
    try:
        run_stream(spark, inputs, first, tmp_path / "checkpoint")
    finally:
        first.close()
    pg.stop()
    write_input(inputs, 1, 3, start_file=1)  # batch 1: rows 3-5, lake; spooled for pg
    second = _fan(tmp_path, url)
    try:
        run_stream(spark, inputs, second, tmp_path / "checkpoint")
    finally:
        second.close()

    ledger = str(tmp_path / "ledger")
    ran = fanout_cli("recover", "--ledger", ledger, "--pipeline", "held")  # no --spool
    assert ran.returncode == 0, ran
    assert "Resume after batch 0 (sink 'pg' is furthest behind)" in ran.stdout

    after = tmp_path / "input-new"
    write_input(after, 2, 3, start_file=1)  # where the report said: rows 3-8
    pg.start()
    third = _fan(tmp_path, url, on_checkpoint_reset="new_epoch")
    try:
        run_stream(spark, after, third, tmp_path / "checkpoint-new")
        lags = third.catch_up(timeout_s=60)
        assert lags["pg"].state == "live"
        assert third.behind() == []
    finally:
        third.close()

    # rows 3-5 twice: the spooled batch 1 of epoch 0, and batch 0 of epoch 1
    assert _pg_ids(url) == Counter({0: 1, 1: 1, 2: 1, 3: 2, 4: 2, 5: 2, 6: 1, 7: 1, 8: 1})
    assert committed_marks(tmp_path / "ledger", "held") == Counter(
        {("lake", 0): 2, ("lake", 1): 2, ("pg", 0): 2, ("pg", 1): 2}
    )
