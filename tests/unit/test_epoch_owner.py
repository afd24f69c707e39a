"""Each epoch belongs to one streaming query id: a batch of another query id is refused
wherever its batch id falls, and an old checkpoint restored after a new epoch is refused
even under ``on_checkpoint_reset="new_epoch"`` (ARCHITECTURE §5)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fanout import BatchInfo
from fanout.errors import CheckpointResetError, ZombieBatchError
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LOST_MARK, LedgerEntry
from fanout.ledger.memory import MemoryLedger
from fanout.steps.admit import Admission, OnReset
from fanout.steps.plan import plan
from fanout.steps.state import BatchState

Q1, Q2, Q3, Q9 = "query-1", "query-2", "query-3", "query-9"
SINKS = ["s"]


@pytest.fixture(params=["memory", "delta"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> MemoryLedger | DeltaLedger:
    """A ledger where query Q1 committed batches 0..5 of pipeline ``p`` in epoch 0."""
    led = new_ledger(request.param, tmp_path)
    for batch in range(6):
        mark(led, Q1, batch, 0, batch)
    return led


def new_ledger(kind: str, tmp_path: Path) -> MemoryLedger | DeltaLedger:
    """An opened, empty ledger of ``kind`` (``memory`` or ``delta``)."""
    led = MemoryLedger() if kind == "memory" else DeltaLedger(str(tmp_path / "l"))
    led.open()
    return led


def unmarked_owner_refusal(query: str, owner: str) -> str:
    """How the refusal of ``query``'s batch 0 begins when epoch 0 belongs to ``owner``,
    which marked nothing yet."""
    return (
        f"pipeline 'p': checkpoint reset detected. Spark handed batch 0 of query {query}, "
        f"but epoch 0 of this pipeline belongs to query {owner} (no batch of it is marked "
        "committed yet"
    )


def mark(led: MemoryLedger | DeltaLedger, query: str, batch: int, epoch: int, off: int) -> None:
    """Sink ``s`` committed ``batch`` of ``query`` in ``epoch``, with offsets ``off``."""
    led.mark_committed(
        LedgerEntry(
            "p",
            "s",
            batch,
            "committed",
            query_id=query,
            epoch=epoch,
            source_offsets=json.dumps([off]),
            batch_timestamp_ms=1000 + off,
        )
    )


def info(batch: int, query: str | None, off: int) -> BatchInfo:
    """Batch ``batch`` of ``query`` as Spark hands it."""
    return BatchInfo("p", batch, query, [off], batch_timestamp_ms=1000 + off)


def admit(adm: Admission, batch: int, query: str | None, off: int) -> BatchState:
    """The admission of one batch."""
    return adm.admit(None, info(batch, query, off), SINKS)


def pending(led: MemoryLedger | DeltaLedger, state: BatchState) -> list[str]:
    """The sinks the admitted batch would write."""
    return plan(state, led, SINKS)[0]


@pytest.mark.parametrize("on_reset", ["refuse", "new_epoch"])
def test_old_checkpoint_restored_after_a_new_epoch_is_refused(
    ledger: MemoryLedger | DeltaLedger, on_reset: OnReset
) -> None:
    """(a) Q2 continued under epoch 1; Q1's old checkpoint restored hands batch 6, which
    would repeat input Q2 already wrote. Refused, also by a FanOut started with
    ``new_epoch`` (the new epoch's query already wrote that input)."""
    state = admit(Admission(ledger, "new_epoch"), 0, Q2, 100)
    assert state.info.epoch == 1
    mark(ledger, Q2, 0, 1, 100)

    restarted = Admission(ledger, on_reset)  # a FanOut started on the old checkpoint
    with pytest.raises(CheckpointResetError) as refused:
        admit(restarted, 6, Q1, 6)
    message = str(refused.value)
    # either way the same text: the way on it offers is never a new epoch, which would
    # be refused as well
    assert message.startswith(
        "pipeline 'p': old checkpoint restored. Spark handed batch 6 of query query-1, "
        "whose batches are epoch 0 of this pipeline, but the pipeline continues under "
        f"epoch 1 (query {Q2})"
    )
    assert f"1. Restore the newest checkpoint (of query {Q2})" in message
    assert "new_epoch" not in message.split("How to proceed:")[1]
    # also a replay of Q1's last batch, and in the same running admission
    with pytest.raises(CheckpointResetError):
        admit(restarted, 5, Q1, 5)
    assert ledger.current_epoch("p") == 1
    assert ledger.last_committed("p", SINKS, epoch=1) == {"s": 0}


@pytest.mark.parametrize("batch", [6, 50])
def test_other_query_above_the_high_water_mark_is_refused(
    ledger: MemoryLedger | DeltaLedger, batch: int
) -> None:
    """(b) A replaced checkpoint whose batch ids are past the ledger's high-water mark."""
    with pytest.raises(CheckpointResetError) as refused:
        admit(Admission(ledger, "refuse"), batch, Q9, 999)
    assert str(refused.value).startswith(
        f"pipeline 'p': checkpoint reset detected. Spark handed batch {batch} of query "
        f"{Q9}, but epoch 0 of this pipeline belongs to query {Q1} (the ledger holds its "
        "batches up to batch 5)"
    )
    # accepted explicitly, it continues under a new epoch (nothing is skipped)
    state = admit(Admission(ledger, "new_epoch"), batch, Q9, 999)
    assert state.info.epoch == 1
    assert pending(ledger, state) == ["s"]


def test_checkpoint_replaced_again_before_the_new_epoch_marked_anything(
    ledger: MemoryLedger | DeltaLedger,
) -> None:
    """(c) Epoch 1 (query Q2) has no mark yet, though sinks may hold Q2's batch 0; the
    checkpoint is deleted again, and Q3's batch 0 would be skipped by those sinks' ids."""
    assert admit(Admission(ledger, "new_epoch"), 0, Q2, 100).info.epoch == 1
    assert ledger.high_water("p", 1) is None

    with pytest.raises(CheckpointResetError) as refused:
        admit(Admission(ledger, "refuse"), 0, Q3, 0)  # after a restart
    assert str(refused.value).startswith(
        "pipeline 'p': checkpoint reset detected. Spark handed batch 0 of query "
        f"{Q3}, but epoch 1 of this pipeline belongs to query {Q2} (no batch of it is "
        "marked committed yet"
    )
    assert ledger.current_epoch("p") == 1

    # accepted explicitly, Q3 gets an epoch of its own, with new transaction ids
    state = admit(Admission(ledger, "new_epoch"), 0, Q3, 0)
    assert (state.info.epoch, pending(ledger, state)) == (2, ["s"])
    assert ledger.current_epoch("p") == 2


def test_checkpoint_replaced_again_within_one_running_admission(
    ledger: MemoryLedger | DeltaLedger,
) -> None:
    """(c) in one process: the admission that started epoch 1 for Q2 refuses Q3 too."""
    adm = Admission(ledger, "refuse")
    adm.on_reset = "new_epoch"
    assert admit(adm, 0, Q2, 100).info.epoch == 1
    adm.on_reset = "refuse"
    with pytest.raises(CheckpointResetError, match=f"belongs to query {Q2}"):
        admit(adm, 0, Q3, 0)


def test_restart_of_the_same_query_is_admitted(ledger: MemoryLedger | DeltaLedger) -> None:
    """The same query id (a new runId) replays its uncommitted batch, then goes on; so
    does the query of a new epoch after its own restart."""
    adm = Admission(ledger, "refuse")
    replay = admit(adm, 5, Q1, 5)  # batch 5 is marked: a replay, nothing pending
    assert (replay.info.epoch, pending(ledger, replay)) == (0, [])
    nxt = admit(adm, 6, Q1, 6)
    assert (nxt.info.epoch, pending(ledger, nxt)) == (0, ["s"])

    assert admit(Admission(ledger, "new_epoch"), 0, Q2, 100).info.epoch == 1
    again = admit(Admission(ledger, "refuse"), 0, Q2, 100)  # Q2 restarted, nothing marked
    assert (again.info.epoch, pending(ledger, again)) == (1, ["s"])


def test_new_pipeline_and_unknown_query_ids_are_admitted() -> None:
    """A brand-new pipeline claims its epoch for its query; null query ids are no
    evidence of a reset, on either side."""
    led = MemoryLedger()
    led.open()
    adm = Admission(led, "refuse")
    assert pending(led, admit(adm, 0, Q1, 0)) == ["s"]
    mark(led, Q1, 0, 0, 0)
    assert pending(led, admit(adm, 1, None, 1)) == ["s"]

    nulls = MemoryLedger()
    nulls.open()
    nulls.mark_committed(LedgerEntry("p", "s", 0, "committed", query_id=None))
    assert pending(nulls, admit(Admission(nulls, "refuse"), 1, Q9, 1)) == ["s"]


class CountingLedger(MemoryLedger):
    """Counts the reads of the epochs' owners."""

    def __init__(self) -> None:
        super().__init__()
        self.owner_reads = 0

    def epoch_owners(self, pipeline: str) -> dict[int, str]:
        self.owner_reads += 1
        return super().epoch_owners(pipeline)


def test_owners_are_read_once_per_start() -> None:
    """The owners are one read per admission (a FanOut start), not one per batch."""
    led = CountingLedger()
    for batch in range(3):
        mark(led, Q1, batch, 0, batch)
    adm = Admission(led, "refuse")
    for batch in range(3, 20):
        admit(adm, batch, Q1, batch)
        mark(led, Q1, batch, 0, batch)
    assert led.owner_reads == 1


def test_failed_attempts_name_the_owner_of_an_epoch_without_marks(tmp_path: Path) -> None:
    """Q1's sinks failed every batch so far (lag sinks down since the start): no mark, but
    its failed attempts name it; Q2, a replaced checkpoint, is refused before it writes."""
    for led in (MemoryLedger(), DeltaLedger(str(tmp_path / "l"))):
        led.open()
        for batch in (0, 1):
            led.record_failure(LedgerEntry("p", "s", batch, "failed", query_id=Q1, error="down"))
        assert led.epoch_owners("p") == {0: Q1}
        with pytest.raises(CheckpointResetError) as refused:
            admit(Admission(led, "refuse"), 0, Q2, 0)
        assert str(refused.value).startswith(unmarked_owner_refusal(Q2, Q1))


def test_the_owners_are_read_from_the_few_rows_that_tell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not the pipeline's whole history: the epoch rows, and epoch 0's rows from its
    high-water mark on (here 3 of 2 x 40 + 1 + 2 x 20 rows)."""
    import fanout.ledger.delta_reads as delta_ledger

    led = DeltaLedger(str(tmp_path / "l"))
    led.open()
    for batch in range(40):
        for sink in ("s", "t"):
            led.mark_committed(LedgerEntry("p", sink, batch, "committed", query_id=Q1))
    led.start_epoch(LedgerEntry("p", "*", 0, "epoch", query_id=Q2, epoch=1))
    for batch in range(60, 80):  # later epochs' batch ids may pass epoch 0's
        led.mark_committed(LedgerEntry("p", "s", batch, "committed", query_id=Q2, epoch=1))
    read_rows: list[int] = []
    real = delta_ledger.read_arrow

    def counted(*args: object, **kwargs: object) -> object:
        rows = real(*args, **kwargs)  # type: ignore[arg-type]
        read_rows.append(rows.num_rows)
        return rows

    monkeypatch.setattr(delta_ledger, "read_arrow", counted)
    assert led.epoch_owners("p") == {0: Q1, 1: Q2}
    assert sum(read_rows) == 3  # the epoch row, and s and t at batch 39


def test_rows_from_before_the_epoch_column_count_for_epoch_0(tmp_path: Path) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    from fanout.ledger.entry import entries_to_arrow

    led = DeltaLedger(str(tmp_path / "l"))
    led.open()
    old = entries_to_arrow([LedgerEntry("p", "s", 3, "failed", query_id=Q1, error="x")])
    epoch_at = old.schema.get_field_index("epoch")
    old = old.set_column(
        epoch_at, old.schema.field(epoch_at), pa.nulls(1, old.schema.field(epoch_at).type)
    )
    write_deltalake(str(tmp_path / "l"), old, mode="append")
    assert led.epoch_owners("p") == {0: Q1}


def test_an_epoch_another_query_started_meanwhile_is_not_started_again(
    ledger: MemoryLedger | DeltaLedger,
) -> None:
    """Two replaced checkpoints of one pipeline, both past their lookup of epoch 0: the
    second start of epoch 1 is refused, not a second owner of epoch 1."""
    ledger.start_epoch(LedgerEntry("p", "*", 0, "epoch", query_id=Q2, epoch=1))
    with pytest.raises(CheckpointResetError) as refused:
        ledger.start_epoch(LedgerEntry("p", "*", 0, "epoch", query_id=Q3, epoch=1))
    assert str(refused.value) == (
        f"pipeline 'p': query {Q3} cannot start epoch 1: the pipeline is at epoch 1 already "
        "(another query accepted a checkpoint reset meanwhile). Two checkpoints of one "
        "pipeline are running: stop one; the other continues."
    )
    assert ledger.epoch_owners("p") == {0: Q1, 1: Q2}


def test_check_start_refuses_what_start_epoch_would_without_writing(
    ledger: MemoryLedger | DeltaLedger,
) -> None:
    """Asked by a new epoch's start before the sinks are fenced (``Admission.check_start``,
    through the ``Ledger`` protocol): both ledgers refuse, with ``start_epoch``'s own error,
    a start another query made first, and write nothing."""
    rows = _rows(ledger)
    ledger.check_start(LedgerEntry("p", "*", 6, "epoch", query_id=Q2, epoch=1))  # follows
    with pytest.raises(CheckpointResetError, match="cannot start epoch 2"):
        ledger.check_start(LedgerEntry("p", "*", 6, "epoch", query_id=Q2, epoch=2))
    with pytest.raises(ValueError, match="check_start takes an epoch entry"):
        ledger.check_start(LedgerEntry("p", "s", 6, "committed", query_id=Q2))
    assert _rows(ledger) == rows  # nothing written
    ledger.start_epoch(LedgerEntry("p", "*", 6, "epoch", query_id=Q2, epoch=1))
    with pytest.raises(CheckpointResetError) as refused:
        ledger.check_start(LedgerEntry("p", "*", 6, "epoch", query_id=Q3, epoch=1))
    assert str(refused.value) == (
        f"pipeline 'p': query {Q3} cannot start epoch 1: the pipeline is at epoch 1 already "
        "(another query accepted a checkpoint reset meanwhile). Two checkpoints of one "
        "pipeline are running: stop one; the other continues."
    )
    with pytest.raises(CheckpointResetError, match="at epoch 1 already"):  # the admission's
        Admission(ledger, "new_epoch").check_start(info(6, Q3, 6))
    assert len(_rows(ledger)) == len(rows) + 1  # Q2's start alone


def test_sink_names_are_those_of_marks_and_failures_of_any_epoch(
    ledger: MemoryLedger | DeltaLedger,
) -> None:
    """Both ledgers name the sinks of marks (lost ones too) and failed attempts, any epoch;
    not the epochs' own rows (``*``) nor another pipeline's sinks."""
    ledger.start_epoch(LedgerEntry("p", "*", 6, "epoch", query_id=Q2, epoch=1))
    ledger.record_failure(LedgerEntry("p", "failing", 6, "failed", query_id=Q2, epoch=1))
    lost = LedgerEntry("p", "lost", 6, "committed", query_id=Q2, epoch=1, error=LOST_MARK)
    ledger.mark_committed(lost)
    ledger.mark_committed(LedgerEntry("other", "elsewhere", 0, "committed", query_id=Q9))
    assert ledger.sink_names("p") == ["failing", "lost", "s"]
    assert ledger.sink_names("other") == ["elsewhere"]
    assert ledger.sink_names("none") == []


# -- epoch 0's claim ------------------------------------------------------------------


@pytest.fixture(params=["memory", "delta"])
def empty(request: pytest.FixtureRequest, tmp_path: Path) -> MemoryLedger | DeltaLedger:
    """A ledger that holds nothing of pipeline ``p``."""
    return new_ledger(request.param, tmp_path)


def test_a_first_query_that_marked_nothing_still_owns_epoch_0(
    empty: MemoryLedger | DeltaLedger,
) -> None:
    """Q1's first batch was admitted, its sinks may have written it, then the driver died
    before any mark or failed row. Q2 (a replaced checkpoint) would have its batch 0
    skipped by those sinks' ids: refused, because Q1 claimed epoch 0 at admission."""
    admit(Admission(empty, "refuse"), 0, Q1, 0)
    assert empty.epoch_owners("p") == {0: Q1}
    assert [(e.sink, e.batch_id, e.status, e.query_id, e.epoch) for e in _rows(empty)] == [
        ("*", 0, "epoch", Q1, 0)
    ]

    with pytest.raises(CheckpointResetError) as refused:
        admit(Admission(empty, "refuse"), 0, Q2, 50)
    assert str(refused.value).startswith(unmarked_owner_refusal(Q2, Q1))
    # accepted explicitly: an epoch of its own, whose transaction ids no sink holds
    state = admit(Admission(empty, "new_epoch"), 0, Q2, 50)
    assert (state.info.epoch, pending(empty, state)) == (1, ["s"])
    assert empty.epoch_owners("p") == {0: Q1, 1: Q2}
    # and Q1's own restart is the old checkpoint now
    with pytest.raises(CheckpointResetError, match="old checkpoint restored"):
        admit(Admission(empty, "new_epoch"), 0, Q1, 0)


def test_epoch_0_is_claimed_once(empty: MemoryLedger | DeltaLedger) -> None:
    """Later batches and restarts of the owner write no second claim."""
    adm = Admission(empty, "refuse")
    for batch in range(3):
        admit(adm, batch, Q1, batch)
        mark(empty, Q1, batch, 0, batch)
    admit(Admission(empty, "refuse"), 3, Q1, 3)  # a restart on the same checkpoint
    assert [(e.status, e.batch_id) for e in _rows(empty) if e.status == "epoch"] == [("epoch", 0)]


def test_an_unknown_query_id_claims_nothing(empty: MemoryLedger | DeltaLedger) -> None:
    """No query id, no evidence: the epoch stays open to the first known one."""
    admit(Admission(empty, "refuse"), 0, None, 0)
    assert empty.epoch_owners("p") == {}
    assert _rows(empty) == []
    admit(Admission(empty, "refuse"), 0, Q2, 0)
    assert empty.epoch_owners("p") == {0: Q2}


def test_a_ledger_from_before_the_claim_is_claimed_by_its_inferred_owner(
    ledger: MemoryLedger | DeltaLedger,
) -> None:
    """Q1's marks (no claim row: an older fanout wrote them) name it the owner; its next
    start records that, and another query is not let in to claim it."""
    with pytest.raises(CheckpointResetError):
        admit(Admission(ledger, "refuse"), 6, Q2, 6)
    assert [e for e in _rows(ledger) if e.status == "epoch"] == []
    admit(Admission(ledger, "refuse"), 6, Q1, 6)
    assert [(e.status, e.query_id, e.epoch) for e in _rows(ledger) if e.status == "epoch"] == [
        ("epoch", Q1, 0)
    ]


@pytest.mark.parametrize("on_reset", ["refuse", "new_epoch"])
def test_of_two_first_queries_racing_the_second_is_refused(
    empty: MemoryLedger | DeltaLedger, monkeypatch: pytest.MonkeyPatch, on_reset: OnReset
) -> None:
    """Q2's admission read no owner, then Q1 claimed epoch 0 before Q2 did: Q2's claim is
    refused by the ledger. Two checkpoints running at once are no reset to continue from:
    no new epoch either, and Q1 goes on."""
    real = empty.epoch_owners

    def read_then_lose_the_race(pipeline: str) -> dict[int, str]:
        owners = real(pipeline)
        monkeypatch.setattr(empty, "epoch_owners", real)
        admit(Admission(empty, "refuse"), 0, Q1, 0)  # Q1 claims meanwhile
        return owners

    monkeypatch.setattr(empty, "epoch_owners", read_then_lose_the_race)
    loser = Admission(empty, on_reset)
    with pytest.raises(CheckpointResetError) as refused:
        admit(loser, 0, Q2, 50)
    assert str(refused.value) == CLAIMED_MEANWHILE
    assert (empty.current_epoch("p"), empty.epoch_owners("p")) == (0, {0: Q1})
    assert admit(Admission(empty, "refuse"), 1, Q1, 1).info.epoch == 0  # Q1 goes on
    loser.on_reset = "refuse"  # the loser restarted in the same FanOut: it did not keep
    with pytest.raises(CheckpointResetError, match=f"belongs to query {Q1}"):  # Q2 as owner
        admit(loser, 0, Q2, 50)


CLAIMED_MEANWHILE = (
    f"pipeline 'p': query {Q2} cannot claim epoch 0: another query claimed it meanwhile "
    "(its first batch ran at the same time as this one). Two checkpoints of one pipeline are "
    "running: stop one; the other continues."
)


def _stale_once(ledger: DeltaLedger, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make ``ledger``'s next refresh return the snapshot it holds now (a lookup made
    before another driver's commit); the calls to refresh are counted in the list."""
    stale = ledger._table.loaded(refresh=False)
    real_fresh = ledger._table.fresh
    calls: list[int] = []

    def first_stale() -> object:
        calls.append(1)
        return stale if len(calls) == 1 else real_fresh()

    monkeypatch.setattr(ledger._table, "fresh", first_stale)
    return calls


def test_two_claims_from_one_snapshot_cannot_both_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two drivers both checked that no claim exists on the same ledger version: Delta's
    conflict check on the epoch's app transaction refuses the second commit, which is
    reported as the claim another query took."""
    path = str(tmp_path / "l")
    ours, theirs = DeltaLedger(path), DeltaLedger(path)
    ours.open()
    theirs.open()
    ours.lookup("p", SINKS)  # our snapshot: no claim
    theirs.start_epoch(LedgerEntry("p", "*", 0, "epoch", query_id=Q1, epoch=0))
    calls = _stale_once(ours, monkeypatch)
    with pytest.raises(CheckpointResetError) as refused:
        ours.start_epoch(LedgerEntry("p", "*", 0, "epoch", query_id=Q2, epoch=0))
    assert str(refused.value) == CLAIMED_MEANWHILE
    assert len(calls) == 2  # the commit was tried on the stale snapshot, and refused
    assert DeltaLedger(path).epoch_owners("p") == {0: Q1}


def test_a_new_epoch_whose_start_lost_to_the_claim_of_epoch_0_commits_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ledger from before claims: Q2 (a replaced checkpoint, ``new_epoch``) starts epoch 1
    while Q1, the owner, claims epoch 0 at its restart. Both commit the epoch transaction:
    Q2's loses the race, and epoch 1 is still free to start from the claimed epoch 0."""
    path = str(tmp_path / "l")
    ours, theirs = DeltaLedger(path), DeltaLedger(path)
    ours.open()
    mark(ours, Q1, 0, 0, 0)
    theirs.open()
    ours.lookup("p", SINKS)
    theirs.start_epoch(LedgerEntry("p", "*", 1, "epoch", query_id=Q1, epoch=0))
    calls = _stale_once(ours, monkeypatch)
    ours.start_epoch(LedgerEntry("p", "*", 0, "epoch", query_id=Q2, epoch=1))
    assert len(calls) == 2
    fresh = DeltaLedger(path)
    assert (fresh.current_epoch("p"), fresh.epoch_owners("p")) == (1, {0: Q1, 1: Q2})


def test_a_start_reported_failed_that_landed_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim's commit landed, but the write reported a commit conflict: the claim is
    the query's own, not another query's; one epoch row."""
    from deltalake.exceptions import CommitFailedError

    from fanout.errors import LedgerError

    led = DeltaLedger(str(tmp_path / "l"))
    led.open()
    real_append = led._table.append

    def landed_then_failed(*args: Any) -> None:
        real_append(*args)
        try:
            raise CommitFailedError("Concurrent transaction failed")
        except CommitFailedError as conflict:
            raise LedgerError("cannot write to the ledger") from conflict

    monkeypatch.setattr(led._table, "append", landed_then_failed)
    led.start_epoch(LedgerEntry("p", "*", 0, "epoch", query_id=Q1, epoch=0))
    assert [(e.status, e.query_id) for e in _rows(led)] == [("epoch", Q1)]
    assert led.epoch_owners("p") == {0: Q1}


def _rows(led: MemoryLedger | DeltaLedger) -> list[LedgerEntry]:
    """Every row the ledger holds of pipeline ``p``."""
    if isinstance(led, MemoryLedger):
        return list(led.entries)
    from fanout.ledger.entry import entries_from_arrow

    return entries_from_arrow(led.read("p"))


class ZombieLedger(MemoryLedger):
    """A ledger refusing every epoch start as the report's zombie check does."""

    def start_epoch(self, entry: LedgerEntry) -> None:
        if entry.epoch and entry.epoch > 0:
            raise ZombieBatchError("a batch of epoch 0 committed after the report")
        super().start_epoch(entry)


def test_a_start_the_ledger_refuses_for_a_zombie_batch_undoes_before_start() -> None:
    """The sinks fenced the replaced epoch before they were asked; the ledger then refuses
    the start (the old query committed a batch after the report, so it still writes):
    the fences are lifted (``start_refused``), else that query's next writes met them."""
    led = ZombieLedger()
    led.open()
    for batch in range(3):
        mark(led, Q1, batch, 0, batch)
    calls: list[tuple[str, int]] = []
    adm = Admission(led, "new_epoch", lambda i: calls.append(("before", i.epoch)),
                    lambda i: calls.append(("refused", i.epoch)))  # fmt: skip
    with pytest.raises(ZombieBatchError):
        admit(adm, 0, Q2, 100)
    assert calls == [("before", 0), ("refused", 0)]
