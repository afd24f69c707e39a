"""A PostgreSQL sink's refused rows, its ``dead_letter`` moved between a kill and the
replay (docs/architecture.md §7, "A ``dead_letter`` moved").

Append: the driver (``pg_driver.py``, a subprocess) is killed once sink events wrote batch
2 (every partition committed, the rows the table's CHECK refuses kept in their progress
marks and written by the driver to Delta table ``letters_a``) and before its ledger mark.
The restart names another target: Delta table ``letters_b``, or ``postgres:rejects``. The
replay skipped every committed partition and handed the refused rows their marks kept to
the target it had (the driver's Delta write, or the skip's own transaction into
``rejects``): each was then kept twice.

Upsert: killed after some partitions of batch 2 committed, their refused rows in
``postgres:rejects`` (in their own transactions), or once the sink wrote the batch, its
refused rows in ``letters_a``; the restart names another target. The replay, which writes
every partition again and refuses the same rows again, wrote them all to the target it
had, beside those the earlier one holds.

Now the restart asks the earlier target (recorded in the ledger as the sink's until batch
2) what it holds of the batch, and writes none of those partitions' refused rows again.
An append restarted without a target (the CHECK dropped) was refused, its committed
partitions keeping refused rows no PostgreSQL table holds ("set dead_letter again"),
though the driver had written them to ``letters_a``: now it goes on, they are there once.

One kill of a driver subprocess per killed state: the cases of a test that kill the
driver at the same point with the same target share it, each restarting from a copy of
what it left (:class:`killed_state.KilledState`); the restarts run in the test's process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fanout_postgres import EmbeddedPostgres
from killed_state import KilledState
from pg_data import run_stream, write_files
from pg_driver import PARTITIONS, PIPELINE
from pgcheck import execute, query

from fanout import FanOut
from fanout.delta_tables.io import read_delta
from fanout.testing.faults import KILL_EXIT_CODE
from tests.integration.streams import committed_marks

DRIVER = Path(__file__).with_name("pg_driver.py")
REPO = Path(__file__).resolve().parents[3]
FILES, ROWS = 4, 40
KILL_BATCH = 2
CHECK = "amount < 125"


def _drive(workdir: Path, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    cmd = [sys.executable, str(DRIVER), str(workdir), url, *extra]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env=env, start_new_session=True
    )


def _restart(spark: Any, workdir: Path, url: str, dead_letter: str | None, mode: str) -> None:
    sink: dict[str, Any] = {"type": "postgres", "name": "events", "url": url,
                            "table": "events", "mode": mode, "partitions": PARTITIONS}  # fmt: skip
    if dead_letter is not None:
        sink["dead_letter"] = dead_letter
    if mode == "upsert":
        sink["keys"] = ["id"]
    with FanOut(PIPELINE, str(workdir / "ledger"), [sink]) as fan:
        run_stream(spark, workdir / "input", fan, workdir / "checkpoint")


def _delta_letters(path: Path) -> Counter[int]:
    if not (path / "_delta_log").exists():
        return Counter()
    return Counter(json.loads(r["row"])["id"] for r in read_delta(str(path)).to_pylist())


def _pg_letters(url: str) -> Counter[int]:
    if not query(url, "SELECT 1 FROM pg_tables WHERE tablename = 'rejects'"):
        return Counter()
    return Counter(int(i) for (i,) in query(url, "SELECT row->>'id' FROM rejects"))


def _letters(target: str, url: str) -> Counter[int]:
    return _pg_letters(url) if target == "postgres:rejects" else _delta_letters(Path(target))


def _check(files: list[list[dict[str, Any]]], url: str, first: str, now: str, ledger: Path) -> None:
    """Every refused row in exactly one of the two targets, the others once in the table,
    those of batch 3 (after the move) in the new target only, every batch marked once."""
    refused = {r["id"] for chunk in files for r in chunk if not r["amount"] < 125}
    before, after = _letters(first, url), _letters(now, url)
    assert [i for i, n in (before + after).items() if n > 1] == [], "letters twice"
    assert set(before + after) == refused
    assert set(after) >= {r["id"] for r in files[FILES - 1] if not r["amount"] < 125}
    table = Counter(int(i) for (i,) in query(url, "SELECT id FROM events"))
    assert table == Counter({r["id"]: 1 for chunk in files for r in chunk if r["amount"] < 125})
    assert committed_marks(ledger, PIPELINE) == {("events", b): 1 for b in range(FILES)}


@pytest.fixture(scope="module")
def append_killed_after_write(
    pg_server: EmbeddedPostgres, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[KilledState, list[list[dict[str, Any]]]]]:
    """An append killed once the sink wrote batch 2 (every partition committed, the
    batch's refused rows in Delta table ``letters_a``), before its ledger mark: the state
    every case of the append test restarts from, and the input files."""
    state = KilledState(pg_server, "moved_append_after_write", tmp_path_factory.mktemp("append"))
    workdir, url = state.workdir, state.url
    execute(url, f"CREATE TABLE events (id bigint, customer text, amount double precision, "
                 f"version bigint, CONSTRAINT cheap CHECK ({CHECK}))")  # fmt: skip
    files = write_files(workdir / "input", files=FILES, rows=ROWS, step=ROWS)  # unique ids
    first = str(workdir / "letters_a")
    killed = _drive(workdir, url, "--kill-after-write", str(KILL_BATCH), "--dead-letter", first)
    assert killed.returncode == KILL_EXIT_CODE, killed.stderr[-3000:]
    assert ("events", KILL_BATCH) not in committed_marks(workdir / "ledger", PIPELINE)
    # the window: every partition committed, the batch's refused rows in letters_a
    batch2 = {r["id"] for r in files[KILL_BATCH] if not r["amount"] < 125}
    assert batch2 and batch2 <= set(_delta_letters(Path(first)))
    state.keep()
    yield state, files
    state.drop()


@pytest.mark.parametrize("now", ["delta", "postgres:rejects", "removed"])
def test_an_append_replay_under_a_moved_target_writes_no_letter_the_first_holds(
    spark: Any,
    append_killed_after_write: tuple[KilledState, list[list[dict[str, Any]]]],
    now: str,
) -> None:
    state, files = append_killed_after_write
    state.restore()  # what the kill left, this case's own copy
    workdir, pg_url = state.workdir, state.url
    first = str(workdir / "letters_a")
    now = str(workdir / "letters_b") if now == "delta" else now
    batch2 = {r["id"] for r in files[KILL_BATCH] if not r["amount"] < 125}

    if now == "removed":  # the CHECK dropped too: no row refused from now on
        execute(pg_url, "ALTER TABLE events DROP CONSTRAINT cheap")
        _restart(spark, workdir, pg_url, None, "append")
        refused = {r["id"] for chunk in files[:KILL_BATCH + 1] for r in chunk
                   if not r["amount"] < 125}  # fmt: skip
        assert set(_delta_letters(Path(first))) == refused  # once each, none lost
        table = Counter(int(i) for (i,) in query(pg_url, "SELECT id FROM events"))
        assert table == Counter({r["id"]: 1 for chunk in files for r in chunk}) - Counter(
            {i: 1 for i in refused}
        )
        assert committed_marks(workdir / "ledger", PIPELINE) == {
            ("events", b): 1 for b in range(FILES)
        }
        return
    _restart(spark, workdir, pg_url, now, "append")

    assert batch2 <= set(_delta_letters(Path(first)))
    _check(files, pg_url, first, now, workdir / "ledger")


def test_an_upsert_replay_under_a_moved_target_writes_no_letter_the_first_holds(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    """Upsert from ``postgres:rejects`` to Delta table ``letters_b``, killed after some
    partitions of batch 2 committed. (From Delta to ``postgres:rejects``, killed once the
    sink wrote the batch: the ``postgres:rejects`` case of
    :func:`test_an_upsert_replay_under_a_moved_target_replaces_the_letters_the_first_holds`,
    which asserts what that case did here, and exactly.)"""
    execute(pg_url, f"CREATE TABLE events (id bigint PRIMARY KEY, customer text, amount double "
                    f"precision, version bigint, CONSTRAINT cheap CHECK ({CHECK}))")  # fmt: skip
    files = write_files(tmp_path / "input", files=FILES, rows=ROWS, step=ROWS)  # unique ids
    first, now = "postgres:rejects", str(tmp_path / "letters_b")
    batch2 = {r["id"] for r in files[KILL_BATCH] if not r["amount"] < 125}
    killed = _drive(tmp_path, pg_url, "--mode", "upsert", "--kill", str(KILL_BATCH),
                    "--dead-letter", first)  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    held = set(_pg_letters(pg_url)) & batch2
    assert held and held < batch2  # some partitions' refused rows, not all
    assert ("events", KILL_BATCH) not in committed_marks(tmp_path / "ledger", PIPELINE)

    _restart(spark, tmp_path, pg_url, now, "upsert")

    assert set(_letters(first, pg_url)) & batch2 == held  # kept where they were
    _check(files, pg_url, first, now, tmp_path / "ledger")


@pytest.fixture(scope="module")
def upsert_killed_after_write(
    pg_server: EmbeddedPostgres, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[KilledState, list[list[dict[str, Any]]]]]:
    """An upsert, its refused rows in Delta table ``letters_a``, killed once the sink
    wrote batch 2 (every partition, its letters too), before its mark; customer ``c3``
    missing: the state every case of
    :func:`test_an_upsert_replay_under_a_moved_target_replaces_the_letters_the_first_holds`
    restarts from, and the input files."""
    state = KilledState(pg_server, "moved_upsert_after_write", tmp_path_factory.mktemp("upsert"))
    workdir, url = state.workdir, state.url
    execute(
        url,
        "CREATE TABLE customers (name text PRIMARY KEY)",
        "INSERT INTO customers SELECT 'c' || n FROM generate_series(0, 10) AS n WHERE n <> 3",
        f"CREATE TABLE events (id bigint PRIMARY KEY, customer text REFERENCES customers "
        f"(name), amount double precision, version bigint, CONSTRAINT cheap CHECK ({CHECK}))",
    )  # fmt: skip
    files = write_files(workdir / "input", files=FILES, rows=ROWS, step=ROWS)  # unique ids
    first = workdir / "letters_a"
    assert {r["id"] for r in files[KILL_BATCH] if r["customer"] == "c3" and r["amount"] < 125}
    killed = _drive(workdir, url, "--mode", "upsert", "--kill-after-write", str(KILL_BATCH),
                    "--dead-letter", str(first))  # fmt: skip
    assert killed.returncode == KILL_EXIT_CODE, killed.stderr[-3000:]
    assert ("events", KILL_BATCH) not in committed_marks(workdir / "ledger", PIPELINE)
    either = {r["id"]: 1 for b in range(KILL_BATCH + 1) for r in files[b]
              if not r["amount"] < 125 or r["customer"] == "c3"}  # fmt: skip
    assert _delta_letters(first) == Counter(either)
    state.keep()
    yield state, files
    state.drop()


@pytest.mark.parametrize("now", ["delta", "postgres:rejects"])
def test_an_upsert_replay_under_a_moved_target_replaces_the_letters_the_first_holds(
    spark: Any,
    upsert_killed_after_write: tuple[KilledState, list[list[dict[str, Any]]]],
    now: str,
) -> None:
    """Upsert, its refused rows in Delta table ``letters_a``: killed once the sink wrote
    batch 2 (every partition, its letters too), before its mark. The rows of customer
    ``c3``, missing, were refused by the foreign key, those too dear by the CHECK. The
    operator adds ``c3`` and restarts naming Delta table ``letters_b`` or
    ``postgres:rejects``. The replay takes the ``c3`` rows now, but their letters stayed in
    ``letters_a`` (the replay wrote nothing to an earlier target): in the table and a dead
    letter. Now the replay's letters of the partitions ``letters_a`` holds replace those
    there: each row of batch 2 in the table or a letter in ``letters_a``, not both; batch
    3's letters in the new target. (The kill, once for both cases:
    :func:`upsert_killed_after_write`.)"""
    state, files = upsert_killed_after_write
    state.restore()  # what the kill left, this case's own copy
    tmp_path, pg_url = state.workdir, state.url
    first = tmp_path / "letters_a"
    now = str(tmp_path / "letters_b") if now == "delta" else now

    def ids(batches: range, refused: Any) -> Counter[int]:
        return Counter({r["id"]: 1 for b in batches for r in files[b] if refused(r)})

    def dear(r: dict[str, Any]) -> bool:
        return not r["amount"] < 125

    def either(r: dict[str, Any]) -> bool:
        return dear(r) or r["customer"] == "c3"

    execute(pg_url, "INSERT INTO customers VALUES ('c3')")  # the fix the letters ask for
    _restart(spark, tmp_path, pg_url, now, "upsert")

    assert _delta_letters(first) == ids(range(KILL_BATCH), either) + ids(
        range(KILL_BATCH, KILL_BATCH + 1), dear
    )
    assert _letters(now, pg_url) == ids(range(KILL_BATCH + 1, FILES), dear)
    table = Counter(int(i) for (i,) in query(pg_url, "SELECT id FROM events"))
    assert table == ids(range(KILL_BATCH), lambda r: not either(r)) + ids(
        range(KILL_BATCH, FILES), lambda r: not dear(r)
    )
    assert committed_marks(tmp_path / "ledger", PIPELINE) == {
        ("events", b): 1 for b in range(FILES)
    }
