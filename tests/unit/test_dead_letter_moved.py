"""A sink's ``dead_letter`` moved between an attempt and its replay
(:mod:`fanout.deadletters.moved`): which targets the ledger records, and when; which
earlier targets may hold a batch's letters; how a Delta table answers; what
``write_letters`` and ``replace_letters`` write, and the target as a sink gets it
(``CheckedTarget``); and the refusal when an earlier target cannot tell."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from fanout import DeadLetterMovedError, RouteError, Sink
from fanout.contract.batch import Batch
from fanout.contract.dead_letters import DeadLetter, ReplacesLetters, RouteStamp
from fanout.contract.earlier_letters import EarlierLetters, HeldLetters
from fanout.deadletters.delta import DeltaDeadLetters, delta_target
from fanout.deadletters.moved import (
    CheckedTarget,
    TargetMoves,
    TargetRecord,
    checked,
    earlier_letters,
    recorded_text,
    replace_letters,
    target_digest,
    unchecked,
    write_letters,
)
from fanout.delta_tables.io import read_delta
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry
from fanout.ledger.memory import MemoryLedger
from fanout.testing import make_batch

PIPELINE = "p"


class Named(Sink):
    def __init__(self, name: str, dead_letter: str | None = None) -> None:
        super().__init__(name)
        self.dead_letter = dead_letter


def _mark(ledger: Any, sink: str, batch: int, epoch: int = 0) -> None:
    ledger.mark_committed(LedgerEntry(PIPELINE, sink, batch, "committed", epoch=epoch))


def test_the_ledger_records_a_target_only_when_it_changes(tmp_path: Path) -> None:
    ledger = MemoryLedger()
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    TargetMoves.open(ledger, PIPELINE, {"s": Named("s", a), "plain": Named("plain")})
    assert ledger.dead_letters == {(PIPELINE, "s"): [TargetRecord(1, f"delta:{a}", None)]}
    for b_id in range(3):
        _mark(ledger, "s", b_id)
    TargetMoves.open(ledger, PIPELINE, {"s": Named("s", f"delta:{a}/")})  # the same table
    assert len(ledger.dead_letters[(PIPELINE, "s")]) == 1
    moves = TargetMoves.open(ledger, PIPELINE, {"s": Named("s", b)})
    assert ledger.dead_letters[(PIPELINE, "s")][-1] == TargetRecord(2, f"delta:{b}", (0, 3))
    # batch 3, the one after the mark, may have been attempted under a: a is asked
    assert moves.earlier("s", (0, 3)) == [f"delta:{a}"]
    assert moves.earlier("s", (0, 4)) == []  # written here only
    # restarted again before batch 3 was marked: a is still asked, nothing recorded
    again = TargetMoves.open(ledger, PIPELINE, {"s": Named("s", b)})
    assert len(ledger.dead_letters[(PIPELINE, "s")]) == 2
    assert again.earlier("s", (0, 3)) == [f"delta:{a}"]
    # batch 3 marked under b: the next start reads no record, asks nothing
    _mark(ledger, "s", 3)
    after = TargetMoves.open(ledger, PIPELINE, {"s": Named("s", b)})
    assert after.records == {}
    assert after.earlier("s", (0, 4)) == []


def test_back_to_the_first_target_asks_the_second_and_a_removed_target_is_recorded(
    tmp_path: Path,
) -> None:
    ledger = MemoryLedger()
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    TargetMoves.open(ledger, PIPELINE, {"s": Named("s", a)})
    _mark(ledger, "s", 0)
    TargetMoves.open(ledger, PIPELINE, {"s": Named("s", b)})
    back = TargetMoves.open(ledger, PIPELINE, {"s": Named("s", a)})
    assert back.earlier("s", (0, 1)) == [f"delta:{b}"]  # the target now is never asked
    removed = TargetMoves.open(ledger, PIPELINE, {"s": Named("s")})
    assert ledger.dead_letters[(PIPELINE, "s")][-1] == TargetRecord(4, None, (0, 1))
    assert removed.earlier("s", (0, 1)) == [f"delta:{a}", f"delta:{b}"]


def test_a_sink_without_a_mark_asks_its_earlier_target_whatever_the_batch(
    tmp_path: Path,
) -> None:
    ledger = MemoryLedger()
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    TargetMoves.open(ledger, PIPELINE, {"s": Named("s", a)})
    moves = TargetMoves.open(ledger, PIPELINE, {"s": Named("s", b)})
    assert moves.earlier("s", (0, 7)) == [f"delta:{a}"]
    assert moves.earlier("s", (2, 0)) == [f"delta:{a}"]


def test_a_location_s_password_is_recorded_masked_and_a_target_digest_ignores_spelling() -> None:
    secret = Named("s", "s3://user:hunter2@bucket/dead")
    assert recorded_text(secret) == "delta:s3://user:***@bucket/dead"
    assert target_digest("delta:/data/dead") == target_digest("delta:/data/dead/")
    assert target_digest("delta:/data/dead") != target_digest("postgres:dead")
    assert target_digest(None) == 0


def test_the_delta_ledger_records_and_reads_targets_from_its_log(tmp_path: Path) -> None:
    ledger = DeltaLedger(str(tmp_path / "ledger"))
    ledger.open()
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    TargetMoves.open(ledger, PIPELINE, {"s": Named("s", a), "t": Named("t")})
    _mark(ledger, "s", 0)
    version = ledger.read().num_rows
    TargetMoves.open(ledger, PIPELINE, {"s": Named("s", a), "t": Named("t")})
    assert ledger.read().num_rows == version  # unchanged: nothing written
    moves = TargetMoves.open(ledger, PIPELINE, {"s": Named("s", b), "t": Named("t")})
    assert ledger.dead_letter_records(PIPELINE, "s") == [
        TargetRecord(1, f"delta:{a}", None),
        TargetRecord(2, f"delta:{b}", (0, 1)),
    ]
    assert moves.earlier("s", (0, 1)) == [f"delta:{a}"]
    assert ledger.dead_letter_records(PIPELINE, "t") == []
    assert ledger.sink_names(PIPELINE) == ["s"]  # a target's row is no sink's progress


def _batch(batch_id: int = 2, earlier: EarlierLetters | None = None) -> Batch:
    batch = make_batch([{"id": 1}], batch_id=batch_id, pipeline=PIPELINE, sink_name="s")
    return dataclasses.replace(batch, earlier=earlier)


def _letters(*partitions: int | None) -> list[DeadLetter]:
    return [DeadLetter({"id": i}, "bad", partition=p) for i, p in enumerate(partitions)]


def _ids(path: Path) -> list[tuple[str, int | None, int]]:
    if not path.exists():
        return []
    return sorted(
        ((r["source"], r["partition"], json.loads(r["row"])["id"])
         for r in read_delta(str(path)).to_pylist()),
        key=lambda t: (t[0], -1 if t[1] is None else t[1], t[2]),
    )  # fmt: skip


def test_a_delta_table_says_which_letters_of_a_batch_it_holds(tmp_path: Path) -> None:
    target = DeltaDeadLetters(str(tmp_path / "a"))
    batch = _batch()
    assert target.letters_held(batch) == HeldLetters(target.describe())  # no table yet
    route = RouteStamp("0123456789abcde", "select ['x']")
    target.write(batch, _letters(None), source="route", route=route)
    target.write(batch, _letters(0, 2), source="refused")
    target.write(_batch(3), _letters(1), source="refused")  # another batch
    assert target.letters_held(batch) == HeldLetters(
        target.describe(), True, route.fingerprint, route.text, frozenset({0, 2})
    )


def test_write_letters_writes_none_an_earlier_target_holds(tmp_path: Path) -> None:
    now = DeltaDeadLetters(str(tmp_path / "b"))
    held = HeldLetters("Delta table a", True, "0123456789abcde", None, frozenset({0, 2}))
    batch = _batch(earlier=EarlierLetters(0, 2, (held,)))
    route = RouteStamp("0123456789abcde", "select ['x']")
    assert write_letters(now, batch, _letters(None, None), source="route", route=route) == 2
    assert write_letters(now, batch, _letters(0, 1, 2), source="refused") == 3
    assert write_letters(now, batch, _letters(2), source="refused", partition=2) == 1
    assert write_letters(now, batch, _letters(3), source="refused", partition=3) == 1
    assert _ids(tmp_path / "b") == [("refused", 1, 1), ("refused", 3, 0)]
    other = RouteStamp("fedcba987654321", "select ['y']")
    with pytest.raises(RouteError, match="the route changed mid-batch: the Delta table a"):
        write_letters(now, batch, _letters(None), source="route", route=other)
    # another batch than the one asked about: written as they are
    later = dataclasses.replace(_batch(3), earlier=batch.earlier)
    assert write_letters(now, later, _letters(0), source="refused") == 1
    assert ("refused", 0, 0) in _ids(tmp_path / "b")


class Blind:
    """A target of a kind that cannot say what it holds."""

    kind = "blind"

    def describe(self) -> str:
        return "blind box"

    def write(self, batch: Batch, letters: Any, **kwargs: Any) -> int:
        raise AssertionError("never written")


def test_an_earlier_target_that_cannot_tell_refuses_the_batch_naming_both_and_the_ways_on(
    tmp_path: Path,
) -> None:
    sink = Named("s", str(tmp_path / "b"))
    now = DeltaDeadLetters(str(tmp_path / "b"))
    kinds = {"delta": delta_target, "blind": lambda location, sink: Blind()}
    batch = _batch()
    with pytest.raises(DeadLetterMovedError) as refused:
        earlier_letters(batch, ["blind:box"], now, sink, kinds, "/l")
    assert str(refused.value) == (
        "sink 's', batch 2: its dead_letter changed since an attempt of this batch: it was "
        f"'blind:box' then, it is Delta table {tmp_path / 'b'} now, and 'blind:box' a blind "
        "target cannot say which letters of a batch it holds. Writing the batch's dead "
        f"letters to Delta table {tmp_path / 'b'} could keep a letter in both. Nothing was "
        "written. Restore dead_letter = 'blind:box' until batch 2 completes (its letters are "
        "then written once, where they are), or, to go on without it, record the batch for "
        "this sink with `fanout ledger skip --ledger /l --pipeline p --sink s --through 2 "
        "--epoch 0` (what it did not write is then missing from the sink and its dead letters)"
    )
    with pytest.raises(DeadLetterMovedError, match="recorded masked"):
        earlier_letters(batch, ["delta:s3://u:***@b/d"], now, sink, kinds, "/l")
    with pytest.raises(DeadLetterMovedError, match="no installed plugin provides kind 'gone'"):
        earlier_letters(batch, ["gone:x"], now, sink, kinds, "/l")
    a = DeltaDeadLetters(str(tmp_path / "a"))
    a.write(batch, _letters(1), source="refused")
    found = earlier_letters(batch, [f"delta:{tmp_path / 'a'}", f"delta:{tmp_path / 'c'}"], now,
                            sink, kinds, "/l")  # fmt: skip
    c = DeltaDeadLetters(str(tmp_path / "c"))  # no table: holds nothing
    assert found == EarlierLetters(
        0, 2, (HeldLetters(a.describe(), refused=frozenset({1})), HeldLetters(c.describe()))
    )
    # a Delta table holding refused rows can take them back: the answer carries it
    assert [h.replaces for h in found.held] == [a, None]


def test_a_target_changed_before_the_sink_s_first_mark_is_not_asked_once_it_has_marks(
    tmp_path: Path,
) -> None:
    """Targets recorded before the sink had a mark (no first batch) covered its first
    batches only: once it has marks, a start reads no record and asks none of them, and a
    later move asks only the target of the batch it was at."""
    ledger = MemoryLedger()
    a, b, c = (f"delta:{tmp_path / n}" for n in "abc")
    TargetMoves.open(ledger, PIPELINE, {"s": Named("s", a)})
    TargetMoves.open(ledger, PIPELINE, {"s": Named("s", b)})  # killed before any mark
    for b_id in range(3):
        _mark(ledger, "s", b_id)
    reads: list[str] = []
    records = ledger.dead_letter_records
    ledger.dead_letter_records = lambda p, s: reads.append(s) or records(p, s)  # type: ignore[method-assign]
    again = TargetMoves.open(ledger, PIPELINE, {"s": Named("s", b)})
    assert (reads, again.records, again.earlier("s", (0, 3))) == ([], {}, [])
    moved = TargetMoves.open(ledger, PIPELINE, {"s": Named("s", c)})
    assert ledger.dead_letters[(PIPELINE, "s")][-1] == TargetRecord(3, c, (0, 3))
    assert moved.earlier("s", (0, 3)) == [b]  # not a: it held letters of no batch after 0


def test_a_ledger_of_the_previous_version_gains_the_column_and_its_writes_go_on(
    tmp_path: Path,
) -> None:
    """Upgrade: a ledger made without the ``dead_letter`` column records a target (the
    column added by the first record), and rows written afterwards without the column (an
    older fanout still marking batches) leave the record readable."""
    from deltalake import write_deltalake

    from fanout.contract.batch import txn_app_id
    from fanout.delta_tables.io import commit_properties
    from fanout.ledger.entry import entries_to_arrow

    path = str(tmp_path / "ledger")

    def previous(batch: int) -> None:  # a mark as the previous version writes it
        row = entries_to_arrow([LedgerEntry(PIPELINE, "s", batch, "committed")])
        write_deltalake(
            path, row.drop_columns(["dead_letter"]), mode="append", schema_mode="merge",
            commit_properties=commit_properties({txn_app_id(PIPELINE, "s"): batch}),
        )  # fmt: skip

    previous(0)
    ledger = DeltaLedger(path)
    ledger.open()
    assert ledger.dead_letter_records(PIPELINE, "s") == []
    a = f"delta:{tmp_path / 'a'}"
    TargetMoves.open(ledger, PIPELINE, {"s": Named("s", a)})
    previous(1)
    again = DeltaLedger(path)
    again.open()
    assert again.dead_letter_records(PIPELINE, "s") == [TargetRecord(1, a, (0, 1))]
    assert again.last_committed(PIPELINE, ["s"]) == {"s": 1}
    assert sorted((r["batch_id"], r["status"], r["dead_letter"]) for r in again.rows(PIPELINE)) == [
        (0, "committed", None), (1, "committed", None), (1, "dead_letter", a)
    ]  # fmt: skip


def test_an_upsert_replay_replaces_only_the_letters_no_earlier_target_holds(
    tmp_path: Path,
) -> None:
    """An upsert replay's letters (``replace_letters``) under a moved target: those of the
    partitions an earlier target holds stay there and are not written again; the rest
    replace the batch's in the current target (a stale one of a row the replay took, here
    partition 1's id 9, is removed); without an earlier target they all replace it."""
    now = DeltaDeadLetters(str(tmp_path / "b"))
    assert isinstance(now, ReplacesLetters)
    assert not isinstance(Blind(), ReplacesLetters)
    stale = DeadLetter({"id": 9}, "bad", partition=1)
    now.write(_batch(), [stale], source="refused")
    held = HeldLetters("Delta table a", False, None, None, frozenset({0, 2}))
    batch = _batch(earlier=EarlierLetters(0, 2, (held,)))
    assert replace_letters(now, batch, _letters(0, 1, 2, 3), source="refused") == 4
    assert _ids(tmp_path / "b") == [("refused", 1, 1), ("refused", 3, 3)]
    assert replace_letters(now, _batch(), _letters(0, 1), source="refused") == 2
    assert _ids(tmp_path / "b") == [("refused", 0, 0), ("refused", 1, 1)]


def test_the_target_a_sink_gets_writes_none_an_earlier_target_holds_and_logs_them_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A sink calling ``context.dead_letters.write`` itself (not ``write_letters``) wrote
    every letter, those an earlier target holds too. The target fanout hands a sink
    (``checked``) filters its ``write`` as ``write_letters`` does, once when a sink hands it
    to ``write_letters``; it is a ``ReplacesLetters`` when the target is, forwards the
    target's own attributes, and pickles (it travels to the executors)."""
    import logging
    import pickle

    b = DeltaDeadLetters(str(tmp_path / "b"))
    now = checked(b)
    assert isinstance(now, CheckedTarget) and isinstance(now, ReplacesLetters)
    assert unchecked(now) is b and checked(now) is now and checked(None) is None
    assert not isinstance(checked(Blind()), ReplacesLetters)
    assert (now.kind, now.describe(), now.path) == ("delta", b.describe(), b.path)
    again = pickle.loads(pickle.dumps(now))
    assert isinstance(again, CheckedTarget) and unchecked(again) == b
    held = HeldLetters("Delta table a", False, None, None, frozenset({0, 2}))
    batch = _batch(earlier=EarlierLetters(0, 2, (held,)))
    with caplog.at_level(logging.INFO, logger="fanout"):
        assert now.write(batch, _letters(0, 1, 2), source="refused") == 3
        assert now.write(batch, _letters(2), source="refused", partition=2) == 1
        assert write_letters(now, batch, _letters(0, 3), source="refused") == 2
    # the batch's refused rows without a partition are there: the target keeps them once
    assert _ids(tmp_path / "b") == [("refused", 1, 1)]
    kept = [r.getMessage() for r in caplog.records if "are kept in Delta table a" in r.message]
    assert [m.split(": ")[1].split(" dead")[0] for m in kept] == [
        "2 refused", "1 partition 2's", "1 refused"
    ]  # fmt: skip
    assert now.write(_batch(3), _letters(0), source="refused") == 1  # another batch: as is
    assert ("refused", 0, 0) in _ids(tmp_path / "b")


def test_an_upsert_replay_replaces_the_letters_of_an_earlier_delta_target_s_partitions(
    tmp_path: Path,
) -> None:
    """An earlier target that can take letters back (a Delta table, ``HeldLetters.replaces``)
    kept what the attempt before the move wrote of the partitions it holds: a letter of a row
    the replay took stayed a dead letter there, and a row the replay refused in those
    partitions got none. Now the replay's letters of those partitions replace them there
    (none: removed); the rest replace the batch's in the current target."""
    a, b = DeltaDeadLetters(str(tmp_path / "a")), DeltaDeadLetters(str(tmp_path / "b"))
    a.write(_batch(), [DeadLetter({"id": 7}, "bad", partition=0),
                       DeadLetter({"id": 8}, "bad", partition=2)], source="refused")  # fmt: skip
    a.write(_batch(), _letters(None), source="route", route=RouteStamp("0123456789abcde", "r"))
    held = dataclasses.replace(a.letters_held(_batch()), replaces=a)
    assert held.refused == frozenset({0, 2})
    batch = _batch(earlier=EarlierLetters(0, 2, (held,)))
    # the replay took 7 and 8, refuses 0 (partition 0, held by a), 1 and 3 (not held)
    letters = [DeadLetter({"id": 0}, "bad", partition=0), *_letters(None, 1)[1:],
               DeadLetter({"id": 3}, "bad", partition=3)]  # fmt: skip
    assert replace_letters(checked(b), batch, letters, source="refused") == 3  # type: ignore[arg-type]
    assert _ids(tmp_path / "a") == [("refused", 0, 0), ("route", None, 0)]
    assert _ids(tmp_path / "b") == [("refused", 1, 1), ("refused", 3, 3)]
    # a replay refusing none of a's partitions now: a keeps none of the batch's refused rows
    held = dataclasses.replace(a.letters_held(_batch()), replaces=a)
    batch = _batch(earlier=EarlierLetters(0, 2, (held,)))
    assert checked(b).replace(batch, _letters(None, 1), source="refused") == 2  # type: ignore[union-attr]
    assert _ids(tmp_path / "a") == [("route", None, 0)]
    assert _ids(tmp_path / "b") == [("refused", None, 0), ("refused", 1, 1)]


def test_an_upsert_replay_killed_between_the_earlier_target_and_its_own_converges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replay replaces the earlier Delta target's letters first, then its own target's:
    a kill in between leaves the earlier target with the replay's letters of the
    partitions it held (a partition whose rows the replay took: none there now). The next
    replay asks again (fanout does, before anything of the batch): a partition the earlier
    target no longer holds is the target's now, and its letters go there; each refused row
    ends in exactly one target."""
    sink = Named("s", str(tmp_path / "b"))
    a, b = DeltaDeadLetters(str(tmp_path / "a")), DeltaDeadLetters(str(tmp_path / "b"))
    kinds = {"delta": delta_target}
    a.write(_batch(), [DeadLetter({"id": 7}, "bad", partition=0),
                       DeadLetter({"id": 8}, "bad", partition=2)], source="refused")  # fmt: skip

    def replay(letters: list[DeadLetter]) -> int:
        found = earlier_letters(_batch(), [f"delta:{tmp_path / 'a'}"], b, sink, kinds, "/l")
        return replace_letters(b, _batch(earlier=found), letters, source="refused")

    # the replay took 7 and 8 and refuses 9 (partition 2, held by a) and 1 (partition 1)
    letters = [DeadLetter({"id": 9}, "bad", partition=2), DeadLetter({"id": 1}, "bad", partition=1)]

    def killed(*args: Any, **kwargs: Any) -> int:
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(b, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        replay(letters)
    monkeypatch.undo()
    assert _ids(tmp_path / "a") == [("refused", 2, 9)]  # replaced, partition 0's removed
    assert _ids(tmp_path / "b") == []
    assert replay(letters) == 2  # the restart's replay
    assert _ids(tmp_path / "a") == [("refused", 2, 9)]
    assert _ids(tmp_path / "b") == [("refused", 1, 1)]
    # another replay now refusing 7 again (partition 0, no longer a's): b's, once
    seven = DeadLetter({"id": 7}, "bad", partition=0)
    assert replay([*letters, seven]) == 3
    assert _ids(tmp_path / "a") == [("refused", 2, 9)]
    assert _ids(tmp_path / "b") == [("refused", 0, 7), ("refused", 1, 1)]


def test_the_target_a_sink_gets_is_an_instance_of_the_target_s_class(tmp_path: Path) -> None:
    """A plugin providing a sink and a dead-letter kind of its own may test
    ``isinstance(context.dead_letters, ItsTarget)`` to write its letters inside its own
    transactions (as fanout-postgres does with its ``postgres:`` table): the target fanout
    hands over is one, as the target it wraps (its ``type()`` is the wrapper's). Pickled,
    copied or shipped by Spark's cloudpickle, it stays the wrapper."""
    import copy
    import pickle

    from pyspark import cloudpickle

    b = DeltaDeadLetters(str(tmp_path / "b"))
    now = checked(b)
    assert isinstance(now, DeltaDeadLetters) and isinstance(now, CheckedTarget)
    blind = checked(Blind())
    assert isinstance(blind, Blind) and not isinstance(blind, (DeltaDeadLetters, ReplacesLetters))
    for again in (pickle.loads(pickle.dumps(now)), cloudpickle.loads(cloudpickle.dumps(now)),
                  copy.copy(now), copy.deepcopy(now)):  # fmt: skip
        assert type(again) is type(now) and isinstance(again, DeltaDeadLetters)
        assert unchecked(again) == b

    class Kindless:  # a third party's target without the protocol's kind: handed over
        def describe(self) -> str:
            return "kindless"

    assert checked(Kindless()).describe() == "kindless"  # type: ignore[arg-type, union-attr]
