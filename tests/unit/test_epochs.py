"""on_checkpoint_reset="new_epoch": an explicit way to continue after a checkpoint reset."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pytest

from fanout import BatchInfo, CheckpointResetError, ConfigurationError, FanOut
from fanout.contract.batch import txn_app_id
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.memory import MemoryLedger
from fanout.testing import ArrowFrame, RecordingSink

OLD, NEW = "query-old", "query-new"


@pytest.fixture(params=["memory", "delta"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> MemoryLedger | DeltaLedger:
    return MemoryLedger() if request.param == "memory" else DeltaLedger(str(tmp_path / "l"))


def _run(fan: FanOut, batches: range, query: str) -> None:
    for batch in batches:
        fan.process(ArrowFrame(pa.table({"x": [batch]})), BatchInfo("p", batch, query))


def test_new_epoch_continues_with_new_transaction_ids(ledger: MemoryLedger | DeltaLedger) -> None:
    first = RecordingSink("s")
    _run(FanOut("p", ledger, [first]), range(3), OLD)

    refused = RecordingSink("s")
    with pytest.raises(CheckpointResetError):
        _run(FanOut("p", ledger, [refused]), range(1), NEW)
    assert refused.calls == []

    accepting = RecordingSink("s")
    fan = FanOut("p", ledger, [accepting], on_checkpoint_reset="new_epoch")
    _run(fan, range(2), NEW)
    assert accepting.calls == [(0, 1), (1, 1)]
    assert ledger.current_epoch("p") == 1
    assert ledger.last_committed("p", ["s"], epoch=1) == {"s": 1}
    assert ledger.last_committed("p", ["s"]) == {"s": 2}  # epoch 0 untouched

    # a restart of the new query (same query id) replays within epoch 1: no new epoch
    again = RecordingSink("s")
    _run(FanOut("p", ledger, [again], on_checkpoint_reset="new_epoch"), range(1, 3), NEW)
    assert again.calls == [(2, 1)]
    assert ledger.current_epoch("p") == 1


def test_batches_of_a_new_epoch_carry_epoch_scoped_ids(ledger: MemoryLedger | DeltaLedger) -> None:
    _run(FanOut("p", ledger, [RecordingSink("s")]), range(1), OLD)
    seen: list[str] = []

    class Spy(RecordingSink):
        def write(self, batch):  # type: ignore[no-untyped-def]
            seen.append(batch.txn_app_id)
            return super().write(batch)

    _run(FanOut("p", ledger, [Spy("s")], on_checkpoint_reset="new_epoch"), range(1), NEW)
    assert seen == [txn_app_id("p", "s", 1)] == ["fanout/p@e1/s"]


def test_bad_policy_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError) as bad:
        FanOut("p", MemoryLedger(), [RecordingSink("s")], on_checkpoint_reset="ignore")  # type: ignore[arg-type]
    assert "on_checkpoint_reset must be 'refuse' or 'new_epoch'" in str(bad.value)


def test_an_accepted_reset_logs_the_ledger_facts_not_the_refusal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`fanout run --new-epoch` logged, under "checkpoint reset accepted", the whole
    refusal it overrode: "fanout refuses to write, ..." and "How to proceed: ... run ...
    --new-epoch", the flag just given."""
    ledger = MemoryLedger()
    _run(FanOut("p", ledger, [RecordingSink("s")]), range(3), OLD)
    with caplog.at_level(logging.WARNING, logger="fanout"):
        _run(FanOut("p", ledger, [RecordingSink("s")], on_checkpoint_reset="new_epoch"),
             range(1), NEW)  # fmt: skip
    [accepted] = [r.getMessage() for r in caplog.records if "reset accepted" in r.getMessage()]
    assert accepted == (
        "pipeline p: checkpoint reset accepted (on_checkpoint_reset='new_epoch'); query "
        "query-new continues under epoch 1 with new transaction ids from batch 0.\n"
        "Last committed batch per sink (from the ledger):\n"
        "  - s: batch 2, query id query-old, source offsets not recorded"
    )
