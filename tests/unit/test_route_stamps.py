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


UTC = (("spark.sql.ansi.enabled", "true"), ("spark.sql.session.timeZone", "UTC"))
NEW_YORK = (("spark.sql.ansi.enabled", "true"), ("spark.sql.session.timeZone", "America/New_York"))


def test_a_fingerprint_is_a_stable_hash_of_the_expressions_and_settings() -> None:
    # the expressions alone: what fanout recorded before it covered the settings
    assert OLD.expression_fingerprint == "f8ed7cae25f2396"  # every process and version
    assert OLD.stamp(UTC).fingerprint == "01f4e0931137ce7"
    assert Route(select=("id", "CAST(a AS INT) AS v")).stamp(UTC) == OLD.stamp(UTC)
    prints = {
        r.stamp(s).fingerprint
        for r in (OLD, NEW, Route(), Route(where="id > 1"), Route(where="id > 1", select=("id",)))
        for s in ((), UTC, NEW_YORK)
    }
    assert len(prints) == 15
    assert OLD.describe() == "select ['id', 'CAST(a AS INT) AS v']"
    assert Route(where="id > 1", select=("id",)).describe() == "where 'id > 1', select ['id']"
    assert OLD.stamp().text == OLD.describe()
    assert OLD.stamp(UTC).text == (
        "select ['id', 'CAST(a AS INT) AS v'] under spark.sql.ansi.enabled=true, "
        "spark.sql.session.timeZone=UTC"
    )
    assert OLD.stamp().earlier == ("f8ed7cae25f2396",)
    # with settings, also the stamp without them: what a sink without a dead-letter target
    # was handed before its route's stamp covered the settings
    assert OLD.stamp(UTC).earlier == ("f8ed7cae25f2396", OLD.stamp().fingerprint)


def test_the_settings_are_read_from_the_batchs_session() -> None:
    from fanout.routes.settings import ROUTE_SETTINGS, session_settings

    class Conf:
        def get(self, key: str) -> str:
            if key == "spark.sql.timestampType":
                raise KeyError(key)  # a Spark that does not know it: left out
            return f"<{key.rsplit('.', 1)[-1]}>"

    class Session:
        conf = Conf()

    class Frame:
        sparkSession = Session()

    assert session_settings(Frame()) == tuple(
        (k, f"<{k.rsplit('.', 1)[-1]}>") for k in ROUTE_SETTINGS if k != "spark.sql.timestampType"
    )
    assert session_settings(object()) == ()  # a stand-in without a session


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
    assert after.calls == [(0, OLD.stamp().fingerprint), (1, OLD.stamp().fingerprint)]


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
        f"(fingerprint {OLD.stamp().fingerprint}), but the sink's route is now select ['id', "
        f"'CAST(b AS INT) AS v'] (fingerprint {NEW.stamp().fingerprint}). Writing the batch "
        "with the new route would leave a row only it refuses in neither place and a row only "
        "the old one refuses in both. Restore the old route (its expressions and the Spark "
        "settings it names) until this batch completes, then change it"
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
        NEW.stamp().fingerprint,
        OLD.stamp().fingerprint,
    ]


def test_the_delta_target_refuses_a_batch_it_holds_under_other_spark_settings(
    tmp_path: Path,
) -> None:
    target = DeltaDeadLetters(str(tmp_path / "dead"))
    batch = make_batch([{}], batch_id=0)
    assert target.write(batch, [LETTER], source="route", route=OLD.stamp(UTC)) == 1
    assert target.write(batch, [LETTER], source="route", route=OLD.stamp(UTC)) == 1  # skipped
    with pytest.raises(RouteError) as refused:
        target.write(batch, [], source="route", route=OLD.stamp(NEW_YORK))
    assert str(refused.value) == (
        f"sink 'sink', batch 0: the route changed mid-batch: the Delta table {tmp_path / 'dead'} "
        "holds this batch's route dead letters chosen by select ['id', 'CAST(a AS INT) AS v'] "
        "under spark.sql.ansi.enabled=true, spark.sql.session.timeZone=UTC (fingerprint "
        f"{OLD.stamp(UTC).fingerprint}), but the sink's route is now select ['id', "
        "'CAST(a AS INT) AS v'] under spark.sql.ansi.enabled=true, "
        "spark.sql.session.timeZone=America/New_York (fingerprint "
        f"{OLD.stamp(NEW_YORK).fingerprint}). Writing the batch with the new route would "
        "leave a row only it refuses in neither place and a row only the old one refuses in "
        "both. Restore the old route (its expressions and the Spark settings it names) until "
        "this batch completes, then change it"
    )
    assert _ids(tmp_path / "dead") == [(0, '{"id": 3, "a": "x"}')]


def test_letters_an_older_fanout_kept_under_the_expressions_alone_are_kept_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An upgrade between a failed attempt and its replay: the letters carry the fingerprint
    of the expressions alone (the older format). The same expressions go on (their settings
    cannot be told); other expressions are still refused."""
    from fanout.contract.dead_letters import RouteStamp

    target = DeltaDeadLetters(str(tmp_path / "dead"))
    batch = make_batch([{}], batch_id=0)
    older = RouteStamp(OLD.expression_fingerprint, OLD.describe())  # as fanout recorded it
    assert target.write(batch, [LETTER], source="route", route=older) == 1
    with caplog.at_level(logging.WARNING, logger="fanout"):
        assert target.write(batch, [LETTER], source="route", route=OLD.stamp(UTC)) == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"pipeline test, batch 0, sink sink: the Delta table {tmp_path / 'dead'} holds this "
        "batch's route dead letters chosen by the same expressions under Spark settings an "
        "older fanout did not record: a replay under changed settings cannot be told; they "
        "are kept as they are"
    ]
    with pytest.raises(RouteError, match="the route changed mid-batch"):
        target.write(batch, [], source="route", route=NEW.stamp(UTC))
    assert _ids(tmp_path / "dead") == [(0, '{"id": 3, "a": "x"}')]
