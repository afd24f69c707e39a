"""``fanout ledger skip --spool S --release-spooled`` run by an operator while the pipeline
runs with the sink lagging (docs/architecture.md §14.4, "A skip while the catch-up runs").

The skip, in a process of its own, records the sink's mark past its spooled batches and
releases them from the spool at once (their rows deleted, the files vacuumed). The running
pipeline's view of the spool and of the sink's mark is its own: its catch-up went on
reading the released batches ("had N rows but its files are gone"), failed the sink at
each probe, and, with no live batch to refresh the mark (a source with no new data, the
final catch-up of an ``available_now`` run), named the sink as failing and behind for
batches the operator had given up. Now a catch-up that fails reads the sink's mark again
(one ledger lookup, on that path only) and drops what another process moved it past.
Delta ledger and spool (delta-rs), the real CLI in a subprocess."""

from __future__ import annotations

from pathlib import Path

from fanout import FanOut, SinkWriteError
from fanout.contract.batch import BatchInfo
from fanout.ledger.delta import DeltaLedger
from fanout.sink_spec import SinkSpec, lag_policy
from tests.cli_process import fanout_process
from tests.unit.fakes import SchemaFrame, ScriptedSink


def test_a_catch_up_drops_the_batches_a_skip_released_meanwhile(tmp_path: Path) -> None:
    ledger, spool = str(tmp_path / "ledger"), str(tmp_path / "spool")
    good = ScriptedSink("good")
    down = ScriptedSink("down", always_fail=SinkWriteError("refused", sink="down"))
    spec = SinkSpec(down, lag=lag_policy("down", {"on_failure": "lag"}))
    fan = FanOut("racing", ledger, [good, spec], backoff_s=0, spool=spool, probe_interval_s=3600)
    try:
        fan.catchup.stop()  # the test drives the catch-up: no thread beside it
        for batch in range(3):
            fan.process(SchemaFrame([batch * 10, batch * 10 + 1]), BatchInfo("racing", batch, "q"))
        assert [b.batch_id for b in fan.lagging.spool.batches()] == [0, 1, 2]  # type: ignore[union-attr]
        down.always_fail = None  # back, but the operator gives its backlog up

        done = fanout_process(
            "ledger", "skip", "--ledger", ledger, "--pipeline", "racing", "--sink", "down",
            "--through", "2", "--spool", spool, "--release-spooled",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "released batch(es) 0-2 from the spool" in done.stdout

        lags = fan.catch_up(timeout_s=30)
        assert (lags["down"].state, lags["down"].batches, lags["down"].error) == ("live", 0, None)
        assert down.calls == [(0, 1)]  # its one live attempt: nothing given up was written
        assert fan.behind() == []

        fan.process(SchemaFrame([30, 31]), BatchInfo("racing", 3, "q"))  # live again
        assert down.calls == [(0, 1), (3, 1)] and good.calls[-1] == (3, 1)
    finally:
        fan.close()
    failed = [
        (r["sink"], r["batch_id"])
        for r in DeltaLedger(ledger).rows("racing")
        if r["status"] == "failed"
    ]
    assert failed == [("down", 0)]  # the live failure only, no catch-up failure
    assert DeltaLedger(ledger).last_committed("racing", ["good", "down"]) == {"good": 3, "down": 3}
