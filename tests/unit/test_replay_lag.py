"""A batch Spark replays that reaches a lag sink from the spool (fanout.steps.replay_lag):
the spool's index keeps which sinks it was spooled for from a doubted replay, across
instances and beside an older index; a sink opened between the replay check and the
hold-back is held back and asked by its catch-up; the catch-up's refusal, its text, and
what passes (no row, accepted, not a replay). Fake sinks and frames, a memory ledger, a
real spool (delta-rs). The real Spark and Delta paths: plugins/fanout-delta/tests/
test_replay_lagging.py."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from fanout import BatchInfo, FanOut, SinkRecordsGoneError, SinkUnreachableError
from fanout.ledger.entry import LedgerEntry, now_utc
from fanout.ledger.memory import MemoryLedger
from fanout.sink_spec import SinkSpec, lag_policy
from fanout.spool.table import Spool
from fanout.steps.replay_lag import SpooledReplays
from tests.unit.fakes import SchemaFrame, ScriptedSink
from tests.unit.test_replay import GONE
from tests.unit.test_replay import Unsure as Unsure_


class Unsure(Unsure_):
    """:class:`tests.unit.test_replay.Unsure` (``holds_batch`` ``None``, its records
    ``gone``), unreachable while ``reachable`` is false."""

    reachable = True

    def open(self, context: Any) -> None:
        if not self.reachable:
            raise SinkUnreachableError("connection refused", sink=self.name)
        super().open(context)


def _info(batch_id: int, planned: int | None = 1_000) -> BatchInfo:
    return BatchInfo("p", batch_id, "q-1", [{"src": {"0": batch_id + 1}}],
                     batch_timestamp_ms=planned)  # fmt: skip


def _spool(tmp_path: Path) -> Spool:
    spool = Spool(str(tmp_path / "spool"), "p")
    spool.open()
    return spool


def _kept(spool: Spool) -> list[tuple[tuple[int, int], list[str], list[str]]]:
    return [(b.key, sorted(b.needed_by), sorted(b.replayed)) for b in spool.batches()]


# -- the index ---------------------------------------------------------------------------


def test_the_spool_keeps_the_sinks_a_batch_was_spooled_for_from_a_replay(tmp_path: Path) -> None:
    spool = _spool(tmp_path)
    spool.add(SchemaFrame([1, 2]), _info(0), {"a"}, now_utc())  # its first attempt
    spool.add(SchemaFrame([3]), _info(1), {"a", "b"}, now_utc(), replayed=True)
    spool.add(SchemaFrame([1, 2]), _info(0), {"a"}, now_utc(), replayed=True)  # 0's replay
    spool.add(SchemaFrame([1, 2]), _info(0), {"a"}, now_utc(), replayed=True)  # and again
    expected = [((0, 0), ["a"], ["a"]), ((0, 1), ["a", "b"], ["a", "b"])]
    assert _kept(spool) == expected

    again = _spool(tmp_path)  # the next run reads it from the index
    assert _kept(again) == expected
    from deltalake import DeltaTable

    rows = DeltaTable(spool.index_path).to_pyarrow_table().to_pylist()
    assert sorted((r["batch_id"], r["sink"], r["replayed"]) for r in rows) == [
        (0, "a", False), (0, "a", True), (1, "a", True), (1, "b", True),
    ]  # fmt: skip  # one more row only for the sink recorded without it

    again.remove({(0, 1): ["a"]})  # a caught up on batch 1: b's row, and its flag, stay
    assert _kept(_spool(tmp_path)) == [((0, 0), ["a"], ["a"]), ((0, 1), ["b"], ["b"])]


def test_an_older_versions_index_has_no_replay_and_takes_the_column(tmp_path: Path) -> None:
    from deltalake import DeltaTable, write_deltalake

    spool = _spool(tmp_path)
    spool.add(SchemaFrame([1, 2]), _info(0), {"a"}, now_utc())
    rows = DeltaTable(spool.index_path).to_pyarrow_table().drop_columns(["replayed"])
    write_deltalake(spool.index_path, rows, mode="overwrite", schema_mode="overwrite")

    old = _spool(tmp_path)
    assert _kept(old) == [((0, 0), ["a"], [])]
    old.add(SchemaFrame([3]), _info(1), {"a"}, now_utc(), replayed=True)
    assert _kept(_spool(tmp_path)) == [((0, 0), ["a"], []), ((0, 1), ["a"], ["a"])]


# -- the catch-up's question -------------------------------------------------------------


def _replays(k: Unsure, **kw: Any) -> SpooledReplays:
    spec = SinkSpec(k, lag=lag_policy("k", {"on_failure": "lag"}))
    store = MemoryLedger()  # the sink's mark 0 wrote rows: its records existed
    store.mark_committed(LedgerEntry("p", "k", 0, "committed", rows=3))
    return SpooledReplays({"k": spec}, store, ledger="/l", spool="/s", **kw)


def _spooled(tmp_path: Path, replayed: bool, ids: list[int] | None = None) -> Any:
    spool = _spool(tmp_path)
    frame = SchemaFrame([10, 11] if ids is None else ids)
    return spool.add(frame, _info(1), {"k"}, now_utc(), replayed=replayed)


def test_a_spooled_replay_the_sink_cannot_tell_it_holds_is_refused_naming_the_ways_on(
    tmp_path: Path,
) -> None:
    k = Unsure("k")
    refused = _replays(k).refusal("k", _spooled(tmp_path, True), 0)
    assert isinstance(refused, SinkRecordsGoneError)
    assert (refused.sink, refused.batch_id) == ("k", 1)
    assert str(refused) == (
        "sink 'k', batch 1: pipeline 'p', sink 'k': batch 1 of epoch 0 was spooled for the "
        "sink from a replay, or an earlier run's catch-up began writing it (an attempt that "
        "may have written it to path '/data/k' died before the sink's ledger mark: Spark ran "
        "the batch again after it, or the catch-up's process ended in it), and the sink "
        "cannot tell whether its target holds it, its own records of the epoch being gone: "
        "no marker of "
        "epoch 0 is left (password ***). Written from the spool, it could be there twice. "
        "Nothing of it is written: the sink stays behind (on_failure='lag'), its later "
        "batches waiting in the spool, and the other sinks go on. The batch's source "
        "offsets: [{'src': {'0': 2}}].\n"
        "Ways on: look in the target for the batch's rows (the source offsets above name its "
        "input). If it holds them, record the batch as done for the sink and release it from "
        "the spool: `fanout ledger skip --ledger /l --pipeline p --sink k --through 1 --epoch "
        "0 --spool /s --release-spooled`, then start again (the sink goes on with the batch "
        "after it). If it does not, accept it for the next run: `fanout run PIPELINE.toml "
        "--accept-lost-target k` (FanOut(accept_lost_targets=['k'])), whose catch-up writes "
        "batch 1 to it."
    )
    assert k.asked == [("holds", 0, 1), ("gone", 0, 0)]


@pytest.mark.parametrize(
    ("replayed", "ids", "mark", "gone", "asked"),
    [
        (False, None, 0, GONE, []),  # not from a doubted replay: nothing asked
        (True, [], 0, GONE, []),  # no row to write twice
        # no mark in the epoch: asked about the batch itself, its records there
        (True, None, None, None, [("holds", 0, 1), ("gone", 0, 1)]),
        (True, None, 0, None, [("holds", 0, 1), ("gone", 0, 0)]),  # its records are there
    ],
    ids=["not-a-replay", "empty", "no-mark-records-there", "records-there"],
)
def test_a_spooled_batch_passes_when_nothing_says_it_could_be_written_twice(
    tmp_path: Path,
    replayed: bool,
    ids: list[int] | None,
    mark: int | None,
    gone: str | None,
    asked: list[tuple[str, int, int]],
) -> None:
    k = Unsure("k", gone=gone)
    assert _replays(k).refusal("k", _spooled(tmp_path, replayed, ids), mark) is None
    assert k.asked == asked


def test_a_flagged_batch_of_a_sink_with_no_mark_in_its_epoch_is_refused_when_its_records_are_gone(
    tmp_path: Path,
) -> None:
    """No mark of the epoch that wrote rows, whose records could tell: the flag says a
    write of the batch may have begun, so the sink is asked about the batch itself (without
    the flag, nothing: every new epoch's first replayed batch would be refused)."""
    k = Unsure("k", gone=GONE)
    refused = _replays(k).refusal("k", _spooled(tmp_path, True), None)
    assert isinstance(refused, SinkRecordsGoneError)
    assert (refused.sink, refused.batch_id) == ("k", 1)
    assert k.asked == [("holds", 0, 1), ("gone", 0, 1)]
    assert "s3cr3t" not in str(refused)


def test_an_accepted_sink_gets_the_spooled_replay_with_a_warning(
    tmp_path: Path, caplog: Any
) -> None:
    k = Unsure("k", gone="no marker of epoch 0 is left")
    with caplog.at_level(logging.WARNING, logger="fanout"):
        assert _replays(k, accepted=["k"]).refusal("k", _spooled(tmp_path, True), 0) is None
    assert [r.getMessage() for r in caplog.records] == [
        "pipeline p, sink k: batch 1 of epoch 0, spooled for the sink from a replay or begun "
        "by an earlier run's catch-up, is one it cannot tell its target holds (no marker of "
        "epoch 0 is left); accepted (accept_lost_targets): the catch-up writes it, a second "
        "time if the attempt before wrote it"
    ]
    assert k.asked == [("holds", 0, 1), ("gone", 0, 0)]


# -- a sink opened between the check and the hold-back -----------------------------------


def test_a_sink_opened_after_the_replay_check_is_held_back_and_asked_by_its_catch_up(
    tmp_path: Path,
) -> None:
    """Unreachable at the start, so not asked at step 3c; its reopen at the hold-back
    (waited for up to its write_timeout_s) opens it: written live, the replay reached it
    unasked. Now it is held back, the batch spooled, and its catch-up refuses it."""
    ledger = MemoryLedger()
    for sink in ("k", "good"):
        ledger.mark_committed(LedgerEntry("p", sink, 0, "committed", rows=3))
    k, good = Unsure("k"), ScriptedSink("good")
    k.reachable = False
    spec = SinkSpec(k, lag=lag_policy("k", {"on_failure": "lag", "write_timeout_s": 30}))
    fan = FanOut("p", ledger, [good, spec], retries=0, backoff_s=0,
                 spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip
    fan.catchup.stop()  # the test drives the catch-up
    try:
        assert fan.unopened == ("k",)
        k.reachable = True
        assert list(fan.process(SchemaFrame([10, 11]), _info(1))) == ["good"]  # a replay
        assert good.calls == [(1, 1)] and k.calls == []
        assert fan.spool is not None
        assert _kept(fan.spool) == [((0, 1), ["k"], ["k"])]

        lags = fan.catch_up(timeout_s=30)
        assert k.calls == []  # refused, not written
        assert lags["k"].state == "lagging" and lags["k"].batches == 1
        assert (lags["k"].error or "").startswith(
            "SinkRecordsGoneError: sink 'k', batch 1: pipeline 'p', sink 'k': batch 1 of "
            "epoch 0 was spooled for the sink from a replay"
        )
        # its reopen's lost-target check about its mark, then the catch-up's question
        assert k.asked == [("holds", 0, 0), ("holds", 0, 1), ("gone", 0, 0)]
    finally:
        fan.close()
    failed = [(e.sink, e.batch_id, (e.error or "").split(":")[0]) for e in ledger.entries
              if e.status == "failed"]  # fmt: skip
    assert failed == [("k", 1, "SinkRecordsGoneError")]
    assert ledger.last_committed("p", ["k", "good"], 0) == {"k": 0, "good": 1}
