"""A lag sink reopened mid-run is asked the lost-target check before its first write
(docs/architecture.md §5, "A target lost behind fanout's back"). That check, and the open
before it, ran in the batch's thread under the lag state's lock: a ``holds_batch`` that
hangs (a sink without ``write_timeout_s``) stalled every batch of every sink. They now run
in a thread of their own: the other sink's batches go on, the sink lags meanwhile, and once
the check passed its catch-up writes it each missed batch once. Real Spark, Delta sinks,
ledger and spool.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from fanout_delta.sink import DeltaSink

from fanout import FanOut, SinkUnreachableError
from fanout.sink_spec import LagPolicy, SinkSpec
from tests.integration import two_sink_resets as resets
from tests.integration.streams import delta_rows
from tests.integration.two_sink_resets import ROWS

PIPELINE = "reopencheck"
QUERY = "query-1"
BOUND_S = 120.0
"""How long the batches may take while the check hangs (three Delta batches on 2 shared
cores take seconds; the old code never returned)."""


class GatedDelta(DeltaSink):
    """A Delta sink down at the start (its first ``open()`` fails, when ``down``) whose
    ``holds_batch`` hangs until ``gate`` is set."""

    def __init__(self, name: str, path: str, *, down: bool) -> None:
        super().__init__(name, path=path)
        self.down = down
        self.gate = threading.Event()
        self.asked = threading.Event()

    def open(self, context: Any) -> None:
        if self.down:
            self.down = False
            raise SinkUnreachableError("connection refused", sink=self.name)
        super().open(context)

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool | None:
        self.asked.set()
        assert self.gate.wait(BOUND_S + 60), "the test never released the check"
        return super().holds_batch(pipeline, epoch, batch_id)


def _fan(tmp_path: Path, slow: GatedDelta) -> FanOut:
    return FanOut(
        PIPELINE, str(tmp_path / "ledger"),
        [DeltaSink("lake", path=str(tmp_path / "lake")),
         SinkSpec(slow, lag=LagPolicy("lag"))],
        parallelism=1, retries=0, backoff_s=0, spool=str(tmp_path / "spool"),
        probe_interval_s=3600,
    )  # fmt: skip


def _rows(*batches: int) -> list[int]:
    return sorted(n for b in batches for n in range(b * ROWS, (b + 1) * ROWS))


def _marks(tmp_path: Path, sink: str) -> list[int]:
    return [b for _, s, b in resets.marks(tmp_path) if s == sink]


def test_a_reopened_sinks_hanging_check_does_not_stall_the_other_sinks(
    spark: Any, tmp_path: Path
) -> None:
    opened = GatedDelta("slow", str(tmp_path / "slow"), down=False)
    opened.gate.set()  # the batches' replay check asks it too (planned before): answered
    first = _fan(tmp_path, opened)
    try:
        for batch_id in (0, 1):  # a new epoch: nothing to ask yet
            resets.run(first, spark, QUERY, batch_id, batch_id * ROWS)
    finally:
        first.close()

    slow = GatedDelta("slow", str(tmp_path / "slow"), down=True)
    fan = _fan(tmp_path, slow)
    done: list[int] = []
    failed: list[BaseException] = []

    def batches() -> None:
        try:
            for batch_id in (2, 3, 4):
                resets.run(fan, spark, QUERY, batch_id, batch_id * ROWS)
                done.append(batch_id)
        except BaseException as exc:
            failed.append(exc)

    worker = threading.Thread(target=batches, daemon=True)
    try:
        assert fan.unopened == ("slow",)
        worker.start()
        worker.join(BOUND_S)
        assert not worker.is_alive(), f"batches stalled by the check; done: {done}"
        assert (done, failed) == ([2, 3, 4], [])
        assert slow.asked.wait(BOUND_S)  # the check runs, and hangs
        assert _marks(tmp_path, "lake") == [0, 1, 2, 3, 4]
        assert _marks(tmp_path, "slow") == [0, 1]  # nothing written before the answer
        assert fan.unopened == ("slow",)

        slow.gate.set()  # the check answers: held, so the sink opens and catches up
        state = fan.catch_up(timeout_s=BOUND_S)["slow"]
        assert state.state == "live", state
        resets.run(fan, spark, QUERY, 5, 5 * ROWS)  # live again
    finally:
        slow.gate.set()
        worker.join(60)
        fan.close()

    assert _marks(tmp_path, "lake") == [0, 1, 2, 3, 4, 5]
    assert _marks(tmp_path, "slow") == [0, 1, 2, 3, 4, 5]  # each once
    assert sorted(r["id"] for r in delta_rows(tmp_path / "slow")) == _rows(0, 1, 2, 3, 4, 5)
    assert sorted(r["id"] for r in delta_rows(tmp_path / "lake")) == _rows(0, 1, 2, 3, 4, 5)
