"""The route recorded with a batch's route letters (core review finding 3): the route's
fingerprint, handing it to targets old and new, and the Delta target's refusal of a batch
whose letters it holds under another route (real delta-rs tables; no Spark)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from fanout import RouteError
from fanout.contract.dead_letters import DeadLetter
from fanout.deadletters.delta import DeltaDeadLetters
from fanout.deadletters.route_letters import write_route_letters
from fanout.delta_tables.io import read_delta
from fanout.routes.route import Route
from fanout.testing import make_batch

OLD = Route(select=("id", "CAST(a AS INT) AS v"))
NEW = Route(select=("id", "CAST(b AS INT) AS v"))
LETTER = DeadLetter(row={"id": 3, "a": "x"}, reason="CAST_INVALID_INPUT", column="v", value="x")


def test_a_fingerprint_is_a_stable_hash_of_the_expressions() -> None:
    assert OLD.fingerprint == "f8ed7cae25f2396"  # the same in every process and version
    assert Route(select=("id", "CAST(a AS INT) AS v")).fingerprint == OLD.fingerprint
    prints = {
        r.fingerprint
        for r in (OLD, NEW, Route(), Route(where="id > 1"), Route(where="id > 1", select=("id",)))
    }
    assert len(prints) == 5
    assert OLD.describe() == "select ['id', 'CAST(a AS INT) AS v']"
    assert Route(where="id > 1", select=("id",)).describe() == "where 'id > 1', select ['id']"
    assert OLD.stamp().text == OLD.describe() and OLD.stamp().fingerprint == OLD.fingerprint


class Before:
    """A target written before ``route`` existed."""

    kind = "before"

    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []

    def describe(self) -> str:
        return "letters in memory"

    def write(self, batch: Any, letters: Any, *, source: str, partition: Any = None) -> int:
        self.calls.append((len(letters), source))
        return len(letters)


class After(Before):
    def write(self, batch: Any, letters: Any, *, source: str, partition: Any = None,
              route: Any = None) -> int:  # fmt: skip
        self.calls.append((len(letters), route.fingerprint))
        return len(letters)


def test_a_target_without_route_gets_the_letters_as_before_and_one_with_it_always() -> None:
    batch = make_batch([{"id": 1}])
    before, after = Before(), After()
    assert write_route_letters(before, batch, [], OLD.stamp()) == 0  # type: ignore[arg-type]
    assert write_route_letters(before, batch, [LETTER], OLD.stamp()) == 1  # type: ignore[arg-type]
    assert before.calls == [(1, "route")]
    assert write_route_letters(after, batch, [], OLD.stamp()) == 0  # type: ignore[arg-type]
    assert write_route_letters(after, batch, [LETTER], OLD.stamp()) == 1  # type: ignore[arg-type]
    assert after.calls == [(0, OLD.fingerprint), (1, OLD.fingerprint)]


def _ids(path: Path) -> list[tuple[int, str]]:
    return sorted((r["batch_id"], r["row"]) for r in read_delta(str(path)).to_pylist())


def test_the_delta_target_refuses_a_batch_it_holds_under_another_route(tmp_path: Path) -> None:
    target = DeltaDeadLetters(str(tmp_path / "dead"))
    first, second = make_batch([{}], batch_id=0), make_batch([{}], batch_id=1)
    assert target.write(first, [LETTER], source="route", route=OLD.stamp()) == 1
    assert target.write(second, [LETTER], source="route", route=OLD.stamp()) == 1
    assert target.write(first, [LETTER], source="route", route=OLD.stamp()) == 1  # skipped
    assert DeltaTable(str(tmp_path / "dead")).version() == 1

    # batch 0 again, under another route (refusing no row), after batch 1's letters
    with pytest.raises(RouteError) as refused:
        target.write(first, [], source="route", route=NEW.stamp())
    assert (refused.value.sink, refused.value.batch_id) == ("sink", 0)
    assert str(refused.value) == (
        f"sink 'sink', batch 0: the route changed mid-batch: the Delta table {tmp_path / 'dead'} "
        "holds this batch's route dead letters chosen by select ['id', 'CAST(a AS INT) AS v'] "
        f"(fingerprint {OLD.fingerprint}), but the sink's route is now select ['id', "
        f"'CAST(b AS INT) AS v'] (fingerprint {NEW.fingerprint}). Writing the batch with the "
        "new route would leave a row only it refuses in neither place and a row only the old "
        "one refuses in both. Restore the old route until this batch completes, then change it"
    )
    assert DeltaTable(str(tmp_path / "dead")).version() == 1
    assert _ids(tmp_path / "dead") == [(0, '{"id": 3, "a": "x"}'), (1, '{"id": 3, "a": "x"}')]


def test_a_batch_without_letters_in_the_delta_target_is_not_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Batch 0 had no route letters, batch 1 had: a replay of batch 0 under another route
    has nothing to contradict (no refusal, no warning), and writes its letters."""
    target = DeltaDeadLetters(str(tmp_path / "dead"))
    assert target.write(make_batch([{}], batch_id=1), [LETTER], source="route", route=OLD.stamp())
    with caplog.at_level(logging.WARNING, logger="fanout"):
        assert (
            target.write(make_batch([{}], batch_id=0), [], source="route", route=NEW.stamp()) == 0
        )
        assert target.write(
            make_batch([{}], batch_id=2), [LETTER], source="route", route=NEW.stamp()
        )
    assert caplog.records == []
    history = DeltaTable(str(tmp_path / "dead")).history()
    assert [h.get("fanout.route.fingerprint") for h in history] == [
        NEW.fingerprint,
        OLD.fingerprint,
    ]
