"""What a pipeline writes to its ledger and shows as a sink's lag is masked of every
secret the pipeline knows: its locations' passwords and all its sinks' secrets."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from fanout import FanOut
from fanout.contract.batch import BatchInfo
from fanout.ledger.memory import MemoryLedger
from fanout.retry import RetryPolicy
from fanout.sink_spec import SinkSpec, lag_policy
from fanout.steps.record import Recorder
from fanout.testing import make_batch
from tests.unit.fakes import SchemaFrame, ScriptedSink

CHECKPOINT_PASSWORD = "Ckpt-pw-5813"
OTHER_PASSWORD = "Other-sink-pw-2207"
LEAK = RuntimeError(f"at s3://ck:{CHECKPOINT_PASSWORD}@b/c, beside {OTHER_PASSWORD}")


class _Guarded(ScriptedSink):
    def secret_values(self) -> list[str]:
        return [OTHER_PASSWORD]


def test_the_recorder_masks_a_failed_rows_error_of_every_secret_it_is_given() -> None:
    ledger = MemoryLedger()
    recorder = Recorder(ledger, RetryPolicy(0, 0.0), (CHECKPOINT_PASSWORD, OTHER_PASSWORD))
    recorder.failed(make_batch([{"x": 1}]), 1, datetime.now(UTC), 0.1, LEAK)
    assert [e.error for e in ledger.entries] == ["RuntimeError: at s3://ck:***@b/c, beside ***"]


def test_a_lagging_sinks_error_and_ledger_row_hide_the_pipelines_other_secrets(
    tmp_path: Path,
) -> None:
    down = ScriptedSink("down", always_fail=LEAK)
    ledger = MemoryLedger()
    fan = FanOut(
        "masked", ledger,
        [SinkSpec(down, lag=lag_policy("down", {"on_failure": "lag"})), _Guarded("guarded")],
        retries=0, spool=str(tmp_path / "spool"), probe_interval_s=3600,
        checkpoint_location=f"nofs://ck:{CHECKPOINT_PASSWORD}@b/c",
    )  # fmt: skip
    try:
        fan.process(SchemaFrame([1, 2]), BatchInfo("masked", 0, "q"))
        said = "RuntimeError: at s3://ck:***@b/c, beside ***"
        assert fan.lagging.lags()["down"].error == f"SinkWriteError: sink 'down', batch 0: {said}"
        failed = [e.error for e in ledger.entries if e.status == "failed"]
        assert failed == [f"SinkWriteError: sink 'down', batch 0: {said}"]
    finally:
        fan.close()


class _Asked(ScriptedSink):
    """Holds every batch, or cannot tell, saying its password either way."""

    def __init__(self, name: str, *, fails: bool) -> None:
        super().__init__(name)
        self.fails = fails

    def secret_values(self) -> list[str]:
        return [OTHER_PASSWORD]

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool:
        if self.fails:
            raise RuntimeError(f"login with {OTHER_PASSWORD} refused")
        return True

    def harmless_rewrite(self) -> str | None:
        return f"it upserts into pg://u:{OTHER_PASSWORD}@h/db by key"


def test_what_a_sink_says_when_asked_for_a_batch_it_may_hold_is_masked_of_its_secrets() -> None:
    from fanout.steps.unmarked import ask, lost_mark

    cannot_tell = ask(_Asked("s", fails=True), "p", 0, 3)
    assert cannot_tell.why == "RuntimeError: login with *** refused"
    held = ask(_Asked("s", fails=False), "p", 0, 3)
    assert held.harmless == "it upserts into pg://u:***@h/db by key"
    entry = lost_mark("p", 0, held, "q", None, "recorded")
    assert entry.error is not None and OTHER_PASSWORD not in entry.error
