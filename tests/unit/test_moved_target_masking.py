"""A sink's ``dead_letter`` recorded in the ledger (:mod:`fanout.deadletters.moved`) is
compared masked: a target recorded with a secret as written (a SAS's ``?sig=`` by a version
that did not mask it, a password with an unescaped ``@`` masked to its first ``@`` only) or
with another ``sig=`` (a rotated SAS token) is the same target, not one it moved from."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from fanout import Sink
from fanout.contract.dead_letters import DELTA, split_target
from fanout.contract.locations import same_table_key
from fanout.deadletters.moved import TargetMoves, TargetRecord, recorded_text, target_digest
from fanout.ledger import delta as delta_ledger
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry
from fanout.ledger.memory import MemoryLedger

PIPELINE = "p"
SAS = "abfss://letters@acct.dfs.core.windows.net/dl?sv=2022-11-02&sp=racwdl&sig="
OLD_SIG, NEW_SIG = "0ldS1gnatureAAAA%2Bx%3D", "n3wS1gnatureBBBB%2By%3D"


class Named(Sink):
    def __init__(self, name: str, dead_letter: str | None = None) -> None:
        super().__init__(name)
        self.dead_letter = dead_letter


def _previous_digest(text: str | None) -> int:
    """``target_digest`` as the versions before masking query secrets computed it: of
    the recorded text as it is."""
    if text is None:
        return 0
    kind, location = split_target(text)
    key = f"{kind}:{same_table_key(location) if kind == DELTA else location}"
    digest = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") >> 2
    return digest or 1


def _mark(ledger: DeltaLedger | MemoryLedger, sink: str, batch: int) -> None:
    ledger.mark_committed(LedgerEntry(PIPELINE, sink, batch, "committed"))


# (recorded by an earlier version, the sink's dead_letter now)
UPGRADES = {
    "sas-as-written": (f"delta:{SAS}{OLD_SIG}", f"{SAS}{OLD_SIG}"),
    "sas-rotated": (f"delta:{SAS}{OLD_SIG}", f"{SAS}{NEW_SIG}"),
    "at-in-password": ("delta:s3://KEY:***@ss@bucket/dl", "s3://KEY:p@ss@bucket/dl"),
}


@pytest.mark.parametrize("recorded, now", UPGRADES.values(), ids=UPGRADES.keys())
def test_a_target_recorded_unmasked_before_an_upgrade_is_not_one_it_moved_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorded: str, now: str
) -> None:
    """The previous version attempted batch 3 with its letters in the target and was killed
    before the mark; the replay after the upgrade must not read the very same target as
    an earlier one (asked for its letters with a token that may have expired since, or a
    location that is no location: the batch refused with DeadLetterMovedError)."""
    ledger = DeltaLedger(str(tmp_path / "ledger"))
    ledger.open()
    with monkeypatch.context() as previous:  # the record and its digest as written then
        previous.setattr(delta_ledger, "target_digest", _previous_digest)
        ledger.record_dead_letters(PIPELINE, {"s": TargetRecord(1, recorded, None)})
    for batch in range(3):
        _mark(ledger, "s", batch)
    moves = TargetMoves.open(ledger, PIPELINE, {"s": Named("s", now)})
    assert moves.current == {"s": recorded_text(Named("s", now))}
    assert OLD_SIG not in str(moves.current) and NEW_SIG not in str(moves.current)
    assert moves.earlier("s", (0, 3)) == []
    # the record made now (its digest as computed now) ends the comparison on later starts
    records = ledger.dead_letter_records(PIPELINE, "s")
    assert [r.target for r in records] == [recorded, moves.current["s"]]
    assert [r.since for r in records] == [None, (0, 3)]
    again = TargetMoves.open(ledger, PIPELINE, {"s": Named("s", now)})
    assert len(ledger.dead_letter_records(PIPELINE, "s")) == 2
    assert again.earlier("s", (0, 3)) == []

    memory = MemoryLedger()  # a ledger keeping records, their digests computed when asked
    memory.record_dead_letters(PIPELINE, {"s": TargetRecord(1, recorded, None)})
    assert TargetMoves.open(memory, PIPELINE, {"s": Named("s", now)}).earlier("s", (0, 0)) == []
    assert len(memory.dead_letter_records(PIPELINE, "s")) == 1  # nothing changed: not recorded


def test_a_target_moved_elsewhere_is_still_one_whatever_its_token() -> None:
    assert target_digest(f"delta:{SAS}{OLD_SIG}") == target_digest(f"delta:{SAS}***")
    other = SAS.replace("/dl?", "/other?")
    assert target_digest(f"delta:{SAS}{OLD_SIG}") != target_digest(f"delta:{other}{OLD_SIG}")
    assert target_digest("delta:s3://KEY:a@bucket/dl") != target_digest("delta:s3://KEY:a@b2/dl")
    assert target_digest("delta:s3://K1:a@bucket/dl") != target_digest("delta:s3://K2:a@bucket/dl")
