"""The SQLite sink example (examples/sqlite_sink.py) holds to the contract: the conformance
suite, run on it without installing it, and its refused rows across a lost mark."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fanout.testing.conformance import SinkConformance, SinkUnderTest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(autouse=True)
def _examples_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """``sqlite_sink`` importable here and in the kill check's driver."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    path = os.pathsep.join(filter(None, [str(EXAMPLES), os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", path)


def _rows(database: Path, table: str) -> list[dict[str, Any]]:
    if not database.exists():
        return []
    db = sqlite3.connect(database)
    db.row_factory = sqlite3.Row
    try:
        return [dict(row) for row in db.execute(f'SELECT * FROM "{table}"')]
    except sqlite3.OperationalError:  # the first batch creates the table
        return []
    finally:
        db.close()


def _dropping(database: Path) -> Callable[[], None]:
    """The suite's ``drop``: the target table dropped (the sink's progress rows beside it
    kept, as records outliving their target are)."""

    def drop() -> None:
        db = sqlite3.connect(database)
        try:
            db.execute('DROP TABLE "rows"')
            db.commit()
        finally:
            db.close()

    return drop


class TestSqliteAppendCreatingItsTable(SinkConformance):
    @pytest.fixture
    def under_test(self, tmp_path: Path) -> SinkUnderTest:
        database = tmp_path / "target.db"
        return SinkUnderTest(
            config={"type": "sqlite", "database": str(database), "table": "rows"},
            read=lambda: _rows(database, "rows"),
            dead_letter=str(tmp_path / "dead"),
            plugins=["sqlite_sink"],
            drop=_dropping(database),
        )


class TestSqliteUpsertWithConstraints(SinkConformance):
    @pytest.fixture
    def under_test(self, tmp_path: Path) -> SinkUnderTest:
        database = tmp_path / "target.db"
        with sqlite3.connect(database) as db:
            db.execute(
                "CREATE TABLE rows (id INTEGER NOT NULL PRIMARY KEY, v TEXT CHECK (v <> 'refused'))"
            )
        return SinkUnderTest(
            config={"type": "sqlite", "database": str(database), "table": "rows", "keys": ["id"]},
            read=lambda: _rows(database, "rows"),
            dead_letter=str(tmp_path / "dead"),
            keyed=True,
            plugins=["sqlite_sink"],
            refused_value="refused",
            drop=_dropping(database),
        )


class TestSqliteRefusalsWithoutTarget(SinkConformance):
    @pytest.fixture
    def under_test(self, tmp_path: Path) -> SinkUnderTest:
        database = tmp_path / "target.db"
        with sqlite3.connect(database) as db:
            db.execute("CREATE TABLE rows (id INTEGER, v TEXT CHECK (v <> 'refused'))")
        return SinkUnderTest(
            config={"type": "sqlite", "database": str(database), "table": "rows"},
            read=lambda: _rows(database, "rows"),
            plugins=["sqlite_sink"],
            refused_value="refused",
            drop=_dropping(database),
        )


def test_holds_batch_answers_from_the_progress_rows_and_the_table(tmp_path: Path) -> None:
    """The example answered ``None`` (cannot tell): a checkpoint reset could not learn of a
    batch it committed whose mark was lost, nor a run of a table dropped since."""
    from sqlite_sink import SqliteSink

    from fanout.testing import make_batch, open_sink

    database = tmp_path / "target.db"
    sink = open_sink(SqliteSink("s", database=str(database), table="rows"), "p")
    assert not database.exists()  # open() creates nothing (README's checklist): the write does
    assert sink.holds_batch("p", 0, 0) is False
    sink.write(make_batch([{"id": 1, "v": "a"}], pipeline="p", sink_name="s"))
    assert [sink.holds_batch("p", 0, 0), sink.holds_batch("p", 1, 0)] == [True, False]
    assert sink.holds_batch("p", 0, 1) is False
    with sqlite3.connect(database) as db:
        db.execute('DROP TABLE "rows"')
    assert sink.holds_batch("p", 0, 0) is False
    assert SqliteSink("gone", database=str(tmp_path / "none.db")).holds_batch("p", 0, 0) is False
    assert not (tmp_path / "none.db").exists()


@pytest.mark.parametrize("directory", ["a#b", "c%41", "d?e"])
def test_holds_batch_of_a_database_whose_path_a_uri_would_cut(
    tmp_path: Path, directory: str
) -> None:
    """The database was opened as ``file:<path>?mode=ro``: a ``#`` or ``?`` cut the path
    (the rest read as a missing database: ``False``, so a run refused the target as lost)
    and a ``%`` was decoded (the database not found: an error)."""
    from sqlite_sink import SqliteSink

    from fanout.testing import make_batch, open_sink

    (tmp_path / directory).mkdir()
    database = tmp_path / directory / "target.db"
    sink = open_sink(SqliteSink("s", database=str(database), table="rows"), "p")
    sink.write(make_batch([{"id": 1, "v": "a"}], pipeline="p", sink_name="s"))
    assert [sink.holds_batch("p", 0, 0), sink.holds_batch("p", 0, 1)] == [True, False]


def test_holds_batch_finds_a_table_named_in_another_case(tmp_path: Path) -> None:
    """SQLite's table names ignore case, so ``table = "Orders"`` writes into a table made
    as ``orders``; ``holds_batch`` compared the names exactly and said ``False``: each run's
    first batch refused the target as lost (``TargetLostError``)."""
    from sqlite_sink import SqliteSink

    from fanout.testing import make_batch, open_sink

    database = tmp_path / "target.db"
    with sqlite3.connect(database) as db:
        db.execute("CREATE TABLE orders (id INTEGER, v TEXT)")
    sink = open_sink(SqliteSink("s", database=str(database), table="Orders"), "p")
    sink.write(make_batch([{"id": 1, "v": "a"}], pipeline="p", sink_name="s"))
    assert _rows(database, "orders") == [{"id": 1, "v": "a"}]
    assert sink.holds_batch("p", 0, 0) is True


def test_a_replay_of_a_committed_batch_hands_over_no_letter_its_earlier_target_holds(
    tmp_path: Path,
) -> None:
    """The driver killed after the sink's commit and its letters' hand-over to ``a``, before
    the ledger mark; the restart names ``b``: fanout hands the replay what ``a`` holds of the
    batch (:attr:`fanout.Batch.earlier`), and the sink, finding the batch committed, hands
    none of its letters to ``b`` (docs/architecture.md §7, "A ``dead_letter`` moved")."""
    import dataclasses

    from sqlite_sink import SqliteSink

    from fanout.contract.earlier_letters import EarlierLetters
    from fanout.deadletters.delta import DeltaDeadLetters
    from fanout.testing import make_batch, open_sink

    database = tmp_path / "target.db"
    with sqlite3.connect(database) as db:
        db.execute("CREATE TABLE rows (id INTEGER, v TEXT CHECK (v <> 'refused'))")
    rows = [{"id": 1, "v": "ok"}, {"id": 2, "v": "refused"}, {"id": 3, "v": "refused"}]
    batch = make_batch(rows, batch_id=4, pipeline="p", sink_name="s")
    a, b = tmp_path / "a", tmp_path / "b"
    first = open_sink(SqliteSink("s", database=str(database), table="rows", dead_letter=str(a)))
    assert first.write(batch).dead_lettered == 2
    held = DeltaDeadLetters(str(a)).letters_held(batch)
    replay = dataclasses.replace(batch, earlier=EarlierLetters(0, 4, (held,)))
    again = open_sink(SqliteSink("s", database=str(database), table="rows", dead_letter=str(b)))
    result = again.write(replay)
    assert (result.rows, result.dead_lettered, result.already_written) == (1, 2, True)
    assert sorted(r["id"] for r in _rows(database, "rows")) == [1]
    letters = DeltaDeadLetters(str(a)).read_rows("p", "s", (0, 4)).column("row").to_pylist()
    assert sorted(json.loads(row)["id"] for row in letters) == [2, 3]
    assert not b.exists()  # none written twice
