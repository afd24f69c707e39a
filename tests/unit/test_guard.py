"""The checkpoint-reset guard (ARCHITECTURE §2.3), on both ledgers and through FanOut."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from fanout import BatchInfo, FanOut
from fanout.app.cli import main
from fanout.errors import CheckpointResetError, CheckpointRollbackError
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import Ledger, ledger_location
from fanout.ledger.memory import MemoryLedger
from fanout.steps.guard import check_checkpoint
from fanout.steps.guard_text import (
    LedgerFacts,
    owner_message,
    reset_message,
    rollback_message,
    superseded_message,
)
from tests.newest_lines import readout
from tests.unit.fakes import FakeFrame, ScriptedSink, committed

PIPELINE = "orders"
OLD_QUERY = "11111111-aaaa-4bbb-8ccc-000000000001"
NEW_QUERY = "22222222-aaaa-4bbb-8ccc-000000000002"


def guard(ledger: Ledger, info: BatchInfo) -> None:
    """The guard as FanOut runs it: with the high-water mark of the ledger's lookup."""
    check_checkpoint(ledger, info, ledger.lookup(info.pipeline, []).high_water)


@pytest.fixture(params=["delta", "memory"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> DeltaLedger | MemoryLedger:
    if request.param == "memory":
        led: DeltaLedger | MemoryLedger = MemoryLedger()
    else:
        led = DeltaLedger(str(tmp_path / "ledger"))
    led.open()
    # the old query committed batches 0..4 to pg and 0..3 to kafka, with offsets
    for batch in range(5):
        offsets = json.dumps([{"orders": {"0": 100 * (batch + 1)}}, None])
        led.mark_committed(committed(PIPELINE, "pg", batch, OLD_QUERY, source_offsets=offsets))
        if batch < 4:
            led.mark_committed(
                committed(PIPELINE, "kafka", batch, OLD_QUERY, source_offsets=offsets)
            )
    led.mark_committed(committed(PIPELINE, "files", 2, OLD_QUERY))  # offsets not recorded
    return led


def test_same_query_replaying_its_last_batch_passes(ledger: DeltaLedger | MemoryLedger) -> None:
    guard(ledger, BatchInfo(PIPELINE, 4, OLD_QUERY))


@pytest.mark.parametrize("batch_id", [0, 3])
def test_same_query_behind_its_last_batch_is_a_rollback(
    ledger: DeltaLedger | MemoryLedger, batch_id: int
) -> None:
    """Spark never replays a batch older than its last one: the checkpoint was rolled back
    (restored from a backup, or its newest offsets/ and commits/ files deleted)."""
    with pytest.raises(CheckpointRollbackError) as refused:
        guard(ledger, BatchInfo(PIPELINE, batch_id, OLD_QUERY))
    assert str(refused.value).startswith(
        f"pipeline 'orders': checkpoint rolled back. Spark handed batch {batch_id} of query "
        f"{OLD_QUERY}, but the ledger holds later batches of this pipeline"
    )


@pytest.mark.parametrize("batch_id", [5, 6, 100])
def test_batch_past_high_water_passes(ledger: DeltaLedger | MemoryLedger, batch_id: int) -> None:
    # the query the epoch belongs to; another query id is refused wherever its batch id
    # falls (tests/unit/test_epoch_owner.py)
    guard(ledger, BatchInfo(PIPELINE, batch_id, OLD_QUERY))


def test_other_pipeline_is_not_affected(ledger: DeltaLedger | MemoryLedger) -> None:
    guard(ledger, BatchInfo("payments", 0, NEW_QUERY))


def test_unknown_query_id_cannot_tell_and_passes_with_warning(
    ledger: DeltaLedger | MemoryLedger, caplog: pytest.LogCaptureFixture
) -> None:
    guard(ledger, BatchInfo(PIPELINE, 4, None))
    assert "query id unknown; cannot tell a replay from a checkpoint reset" in caplog.text


def test_unknown_query_id_behind_the_ledger_is_refused(ledger: DeltaLedger | MemoryLedger) -> None:
    """Whatever the query, Spark never hands a batch older than the ledger's last one on a
    replay: refused (before, it passed with a warning and every sink skipped it)."""
    with pytest.raises(CheckpointRollbackError, match="Spark handed batch 0 of query None"):
        guard(ledger, BatchInfo(PIPELINE, 0, None))


@pytest.mark.parametrize("batch_id", [0, 4])
def test_other_query_at_or_below_high_water_is_a_reset(
    ledger: DeltaLedger | MemoryLedger, batch_id: int
) -> None:
    with pytest.raises(CheckpointResetError) as raised:
        guard(ledger, BatchInfo(PIPELINE, batch_id, NEW_QUERY))
    message = str(raised.value)
    assert message.startswith(
        f"pipeline 'orders': checkpoint reset detected. Spark handed batch {batch_id} of query "
        f"{NEW_QUERY}, but the ledger holds batches of this pipeline committed at or after it "
        "by another query id"
    )
    lines = message.splitlines()
    assert "Last committed batch per sink (from the ledger):" in lines
    sink_lines = [line for line in lines if line.startswith("  - ")]
    # every sink's last batch, also of the sinks behind the incoming batch (kafka): a
    # recovery must start after the offsets of the sink furthest behind among those the
    # pipeline still writes; "files", two batches behind the high-water mark, was not
    # written in either of the last two batches: set apart, it does not decide
    old = f"query id {OLD_QUERY}, source offsets"
    assert sink_lines == [
        f'  - kafka: batch 3, {old} [{{"orders": {{"0": 400}}}}, null]',
        f'  - pg: batch 4, {old} [{{"orders": {{"0": 500}}}}, null]',
        f"  - files: not written since batch 2 (query id {OLD_QUERY}): removed from the "
        "pipeline? It does not decide where to resume",
    ]
    assert "How to proceed:" in lines
    assert (
        "  1. Restore the original checkpoint directory and restart the query; nothing is "
        "lost or duplicated." in lines
    )
    assert 'on_checkpoint_reset="new_epoch"' in message
    where = ledger_location(ledger)  # the Delta ledger's absolute path; the memory one's name
    assert f"`fanout recover --ledger {where} --pipeline orders` prints these facts again" in (
        message
    )


def test_reset_through_fanout_calls_no_sink(ledger: DeltaLedger | MemoryLedger) -> None:
    pg, kafka, new = ScriptedSink("pg"), ScriptedSink("kafka"), ScriptedSink("new")
    fan = FanOut(PIPELINE, ledger, [pg, kafka, new], backoff_s=0)
    frame = FakeFrame()
    with pytest.raises(CheckpointResetError, match="checkpoint reset detected"):
        fan.process(frame, BatchInfo(PIPELINE, 0, NEW_QUERY))
    assert pg.calls == kafka.calls == new.calls == []
    assert (frame.persist_calls, frame.to_arrow_calls) == (0, 0)
    assert ledger.last_committed(PIPELINE, ["pg", "kafka", "new"]) == {
        "pg": 4,
        "kafka": 3,
        "new": None,
    }

    # the original query replaying batch 4 writes only the sinks without a mark for it
    assert sorted(fan.process(frame, BatchInfo(PIPELINE, 4, OLD_QUERY))) == ["kafka", "new"]
    assert (pg.calls, kafka.calls, new.calls) == ([], [(4, 1)], [(4, 1)])


class CountingLedger(MemoryLedger):
    """Counts the scans (``committed_entries``) the guard makes."""

    def __init__(self) -> None:
        super().__init__()
        self.scans = 0

    def committed_entries(
        self, pipeline: str, min_batch_id: int = 0, epoch: int | None = None
    ) -> list:
        self.scans += 1
        return super().committed_entries(pipeline, min_batch_id, epoch)


def test_guard_does_not_scan_on_the_normal_path() -> None:
    """A batch past the high-water mark (every batch of a healthy stream) is one log
    lookup; only a batch at or below it costs a scan."""
    led = CountingLedger()
    guard(led, BatchInfo(PIPELINE, 0, OLD_QUERY))  # empty ledger
    for batch in range(3):
        led.mark_committed(committed(PIPELINE, "pg", batch, OLD_QUERY))
        guard(led, BatchInfo(PIPELINE, batch + 1, OLD_QUERY))
    assert led.scans == 0
    guard(led, BatchInfo(PIPELINE, 2, OLD_QUERY))  # a replay: scans once
    assert led.scans == 1


def _printed_recover(message: str) -> list[str]:
    """The ``fanout recover ...`` command a refusal prints, split as a POSIX shell would."""
    line = next(line for line in message.splitlines() if "`fanout recover " in line)
    return shlex.split(line.split("`")[1])


@pytest.mark.parametrize("kind", ["reset", "rollback"])
def test_the_printed_recover_command_runs_as_printed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    kind: str,
) -> None:
    """The refusal names the ledger as the command must (absolute, quoted for a shell), not
    ``<path>``, which a shell reads as a redirect; run from another directory, the printed
    command prints the recover facts."""
    monkeypatch.chdir(tmp_path)
    led = DeltaLedger("my lake/ledger")  # relative, with a space
    led.open()
    offsets = json.dumps([{"orders": {"0": 100}}])
    led.mark_committed(committed(PIPELINE, "pg", 0, OLD_QUERY, source_offsets=offsets))
    info = BatchInfo(PIPELINE, 0, NEW_QUERY if kind == "reset" else OLD_QUERY)
    if kind == "rollback":
        led.mark_committed(committed(PIPELINE, "pg", 1, OLD_QUERY, source_offsets=offsets))
    with pytest.raises(CheckpointResetError if kind == "reset" else CheckpointRollbackError) as e:
        guard(led, info)

    argv = _printed_recover(str(e.value))
    assert argv == [
        "fanout", "recover", "--ledger", str(tmp_path / "my lake" / "ledger"),
        "--pipeline", PIPELINE,
    ]  # fmt: skip
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    capsys.readouterr()
    assert main(argv[1:]) == 0
    out = readout(capsys).out.splitlines()
    batch = 0 if kind == "reset" else 1
    assert out[:3] == [
        "pipeline 'orders': last committed batch per sink",
        f'  pg: batch {batch}, query id {OLD_QUERY}, source offsets [{{"orders": {{"0": 100}}}}]',
        f"Resume after batch {batch}: every sink the pipeline still writes holds it, so "
        "nothing is written twice.",
    ]


def test_a_refusal_over_a_ledger_without_marks_lists_no_sinks() -> None:
    """Each of the four refusals goes from what happened straight to how to proceed when
    the ledger holds no mark of the epoch: the reset and rollback texts printed the header
    of the sink list with no sink under it (the owner and superseded texts did not)."""
    info = BatchInfo(PIPELINE, 3, NEW_QUERY)
    facts = LedgerFacts({}, "/lake/ledger")
    recover = (
        "  `fanout recover --ledger /lake/ledger --pipeline orders` prints these facts "
        "again, with Kafka startingOffsets."
    )
    texts = {
        "reset": (reset_message(info, facts), 1),
        "rollback": (rollback_message(info, 5, [], facts), 3),  # re-planned, later batches
        "owner": (owner_message(info, OLD_QUERY, None, facts), 1),
        "superseded": (superseded_message(info, 0, OLD_QUERY, facts), 1),
    }
    for kind, (text, what) in texts.items():
        lines = text.splitlines()
        assert (kind, lines[what], lines[-1]) == (kind, "How to proceed:", recover)
        assert not any(line.startswith("Last committed batch") for line in lines), kind
