"""An append sink's refused rows, kept in the progress marks of the partitions that
committed them, reach a dead-letter target once: on the replay also when the sink's
``dead_letter`` changed between the killed attempt and the restart, and after ``fanout
recover`` asked the sink whether it holds the batch.

The driver dies after some partitions of batch 2 committed, each with rows the table
refused (a CHECK) kept in its progress mark for the Delta dead-letter table, which the
driver writes only once every partition committed: they are in no target yet. The
operator then moves the dead letters into the database (``postgres:rejects``), or, having
dropped the CHECK, removes the dead-letter target. Before, the replay skipped the committed
partitions and their refused rows went nowhere: in neither the table nor any dead-letter
target, the ledger mark counting them as dead-lettered. Now the first is written into the
table by the skip itself, and the second is refused until a target is set again.

The other way round, letters a partition wrote into ``postgres:rejects`` in its own
transaction were written once more to a Delta table named on the restart: twice.

The driver dies as it writes batch 2's refused rows to the Delta dead-letter table, every
partition committed. ``fanout recover --config`` asks the sink whether it holds the batch:
every partition committed, it said "all of it", and recover recorded the sink's lost mark;
the restart of the same checkpoint then skipped the sink for batch 2, and the refused rows
its marks kept were never written anywhere. The same with an upsert, whose
``upsert_routes`` rows counted no refused row (its replay refuses them again, keeping
none): now they count them (migration ``0007``), and ``holds_batch`` answers as append's.

One kill of a driver subprocess (``pg_driver.py``) per killed state: the two cases that
kill it with the same first target restart from copies of what that kill left
(:class:`killed_state.KilledState`); the restarts run in the test's process."""

from __future__ import annotations

import json
import signal
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fanout_postgres import EmbeddedPostgres, PostgresSink
from killed_state import KilledState
from pg_data import write_files
from pg_driver import PARTITIONS, PIPELINE, drive, restart
from pgcheck import execute, id_counts, query

from fanout.delta_tables.io import read_delta
from fanout.testing import open_sink
from tests.in_process_cli import Cli
from tests.integration.streams import committed_marks

FILES, ROWS = 4, 60
KILL_BATCH = 2
CHECK = "amount < 125"
DDL = (
    "CREATE TABLE events (id bigint, customer text, amount double precision, version bigint, "
    f"CONSTRAINT cheap CHECK ({CHECK}))"
)


def _delta_letter_ids(path: Path) -> Counter[int]:
    if not path.exists():
        return Counter()
    return Counter(json.loads(r["row"])["id"] for r in read_delta(str(path)).to_pylist())


def _pg_letter_ids(url: str) -> Counter[int]:
    if not query(url, "SELECT 1 FROM pg_tables WHERE tablename = 'rejects'"):
        return Counter()
    return Counter(int(i) for (i,) in query(url, "SELECT row->>'id' FROM rejects"))


def _lost(files: list[list[dict[str, Any]]], url: str, delta: Path) -> str:
    """The input rows in neither the table nor a dead-letter target."""
    everywhere = id_counts(url) + _delta_letter_ids(delta) + _pg_letter_ids(url)
    lost = sorted({r["id"] for chunk in files for r in chunk} - set(everywhere))
    return (
        f"{len(lost)} rows in neither the table nor a dead-letter target: {lost}"
        if lost
        else "nothing"
    )


Killed = tuple[KilledState, list[list[dict[str, Any]]]]


@pytest.fixture(scope="module")
def killed_with(
    pg_server: EmbeddedPostgres, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], Killed]]:
    """The state an append killed after some partitions of batch 2 committed leaves, its
    ``dead_letter`` the given first target (``delta``: Delta table ``dead`` in the work
    directory), and the input files: one kill per first target, for every case naming it."""
    states: dict[str, Killed] = {}

    def killed(first: str) -> Killed:
        if first not in states:
            name = "kept_first_" + first.replace(":", "_")
            state = KilledState(pg_server, name, tmp_path_factory.mktemp(name))
            states[first] = (state, _kill(state.workdir, state.url, first))
            state.keep()
        return states[first]

    yield killed
    for state, _ in states.values():
        state.drop()


def _kill(workdir: Path, url: str, first: str) -> list[list[dict[str, Any]]]:
    """Kill the driver during batch 2 (``first``: its ``dead_letter``), once some
    partitions committed; assert the window; return the input files."""
    execute(url, DDL)
    files = write_files(workdir / "input", files=FILES, rows=ROWS, step=ROWS)  # unique ids
    delta = workdir / "dead"
    first = str(delta) if first == "delta" else first
    killed = drive(workdir, url, "--kill", str(KILL_BATCH), "--dead-letter", first)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]

    # The window really happened: partitions of batch 2 committed, holding refused rows
    # in their marks, which no target holds yet.
    kept = query(
        url,
        "SELECT partition, jsonb_array_length(rejects) FROM fanout.progress "
        "WHERE pipeline = %s AND sink = 'events' AND batch_id = %s AND rejects IS NOT NULL",
        (PIPELINE, KILL_BATCH),
    )
    assert kept and all(n > 0 for _, n in kept), kept
    batch2 = {r["id"] for r in files[KILL_BATCH]}
    assert not set(_delta_letter_ids(delta)) & batch2
    assert ("events", KILL_BATCH) not in committed_marks(workdir / "ledger", PIPELINE)
    return files


@pytest.mark.parametrize(
    ("first", "now"),
    [("delta", "postgres:rejects"), ("delta", "removed"), ("postgres:rejects", "delta")],
)
def test_refused_rows_of_committed_partitions_reach_one_target_after_dead_letter_changed(
    spark: Any, killed_with: Callable[[str], Killed], first: str, now: str
) -> None:
    state, files = killed_with(first)  # the kill (asserted there), once per first target
    state.restore()  # what it left, this case's own copy
    tmp_path, pg_url = state.workdir, state.url
    refused = {r["id"] for chunk in files for r in chunk if not r["amount"] < 125}
    delta = tmp_path / "dead"
    first, now = (str(delta) if t == "delta" else t for t in (first, now))

    if now == "removed":  # the CHECK gone too: no new row is refused
        execute(pg_url, "ALTER TABLE events DROP CONSTRAINT cheap")
        held = id_counts(pg_url)
        refusal = restart(spark, tmp_path, pg_url, dead_letter=None)
        assert refusal, f"the restart without a target lost {_lost(files, pg_url, delta)}"
        assert "SinkWriteError" in refusal, refusal[-3000:]
        assert f"sink 'events', batch {KILL_BATCH}" in refusal, refusal[-3000:]
        assert "dead_letter" in refusal, refusal[-3000:]
        assert id_counts(pg_url) == held  # refused before any partition wrote
        # any target takes them
        restarted = restart(spark, tmp_path, pg_url, dead_letter=str(delta))
    else:
        restarted = restart(spark, tmp_path, pg_url, dead_letter=now)
    assert restarted == "", restarted[-3000:]

    letters = _delta_letter_ids(delta) + _pg_letter_ids(pg_url)
    everywhere = id_counts(pg_url) + letters
    assert _lost(files, pg_url, delta) == "nothing"
    assert [i for i, n in everywhere.items() if n > 1] == [], "rows twice"
    assert sum(everywhere.values()) == FILES * ROWS
    assert set(letters) <= refused
    if now != "removed":  # the CHECK still holds: every refused row is a letter
        assert set(letters) == refused
    assert committed_marks(tmp_path / "ledger", PIPELINE) == {
        ("events", b): 1 for b in range(FILES)
    }


def _config(tmp_path: Path, url: str, dead_letter: Path, mode: str = "append") -> str:
    file = tmp_path / "pipeline.toml"
    keys = 'keys = ["id"]\n' if mode == "upsert" else ""
    file.write_text(
        f'[pipeline]\nname = "{PIPELINE}"\nledger = "{tmp_path / "ledger"}"\n'
        f'checkpoint = "{tmp_path / "checkpoint"}"\n[source]\nformat = "rate"\n'
        f'[[sinks]]\ntype = "postgres"\nname = "events"\nurl = "{url}"\ntable = "events"\n'
        f'mode = "{mode}"\ncreate_table = true\npartitions = {PARTITIONS}\n'
        f'dead_letter = "{dead_letter}"\n{keys}'
    )
    return str(file)


def test_recover_records_no_lost_mark_while_the_refused_rows_wait_for_their_target(
    spark: Any, pg_url: str, tmp_path: Path, fanout_cli: Cli
) -> None:
    execute(pg_url, DDL)
    files = write_files(tmp_path / "input", files=FILES, rows=ROWS, step=ROWS)  # unique ids
    refused = {r["id"] for chunk in files for r in chunk if not r["amount"] < 125}
    delta = tmp_path / "dead"
    killed = drive(tmp_path, pg_url, "--kill-at-letters", str(KILL_BATCH), "--dead-letter",
                    str(delta))  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    marks = query(
        pg_url,
        "SELECT partition, jsonb_array_length(rejects) FROM fanout.progress "
        "WHERE pipeline = %s AND sink = 'events' AND batch_id = %s",
        (PIPELINE, KILL_BATCH),
    )
    assert len(marks) == PARTITIONS, marks  # every partition committed
    batch2 = {r["id"] for r in files[KILL_BATCH]}
    assert not set(_delta_letter_ids(delta)) & batch2  # its letters are in no target
    assert ("events", KILL_BATCH) not in committed_marks(tmp_path / "ledger", PIPELINE)

    ran = fanout_cli("recover", "--config", _config(tmp_path, pg_url, delta))
    assert ran.returncode == 0, ran
    out = ran.stdout
    assert (
        f"events: holds part of batch {KILL_BATCH} ({PARTITIONS} of {PARTITIONS} partitions "
        f"committed, {len(refused & batch2)} refused row(s) not in its dead-letter target yet), "
        "which the ledger had no mark of: no lost mark recorded"
    ) in out, out
    assert ("events", KILL_BATCH) not in committed_marks(tmp_path / "ledger", PIPELINE)
    restarted = restart(spark, tmp_path, pg_url, dead_letter=str(delta))
    assert restarted == "", restarted[-3000:]

    letters = _delta_letter_ids(delta)
    everywhere = id_counts(pg_url) + letters
    assert _lost(files, pg_url, delta) == "nothing", out
    assert [i for i, n in everywhere.items() if n > 1] == [], "rows twice"
    assert set(letters) == refused
    assert set(everywhere) == {r["id"] for chunk in files for r in chunk}
    # now that its letters are there, the sink holds the batch whole
    sink = PostgresSink("events", url=pg_url, table="events", mode="append", partitions=PARTITIONS,
                        dead_letter=str(delta))  # fmt: skip
    open_sink(sink, PIPELINE)
    try:
        assert sink.holds_batch(PIPELINE, 0, KILL_BATCH) is True
    finally:
        sink.close()


def test_an_upsert_killed_before_its_dead_letters_keeps_them_after_recover(
    spark: Any, pg_url: str, tmp_path: Path, fanout_cli: Cli
) -> None:
    execute(pg_url, DDL.replace("id bigint,", "id bigint PRIMARY KEY,"))
    files = write_files(tmp_path / "input", files=FILES, rows=ROWS, step=ROWS)  # unique ids
    refused = {r["id"] for chunk in files for r in chunk if not r["amount"] < 125}
    delta = tmp_path / "dead"
    killed = drive(tmp_path, pg_url, "--mode", "upsert", "--kill-at-letters", str(KILL_BATCH),
                    "--dead-letter", str(delta))  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    batch2 = {r["id"] for r in files[KILL_BATCH]}
    assert not set(_delta_letter_ids(delta)) & batch2  # its letters are in no target

    counted = query(
        pg_url,
        "SELECT sum(refused), count(kept_in), count(*) FROM fanout.upsert_routes "
        "WHERE pipeline = %s AND sink = 'events' AND batch_id = %s",
        (PIPELINE, KILL_BATCH),
    )
    assert counted == [(len(refused & batch2), 0, PARTITIONS)]  # every partition committed

    ran = fanout_cli("recover", "--config", _config(tmp_path, pg_url, delta, "upsert"))
    assert ran.returncode == 0, ran
    out = ran.stdout
    assert (
        f"events: holds part of batch {KILL_BATCH} ({PARTITIONS} of {PARTITIONS} partitions "
        f"committed, {len(refused & batch2)} refused row(s) not in its dead-letter target yet), "
        "which the ledger had no mark of: no lost mark recorded"
    ) in out, out
    assert ("events", KILL_BATCH) not in committed_marks(tmp_path / "ledger", PIPELINE)
    restarted = restart(spark, tmp_path, pg_url, dead_letter=str(delta), mode="upsert")
    assert restarted == "", restarted[-3000:]
    assert _lost(files, pg_url, delta) == "nothing", out
    letters = _delta_letter_ids(delta)
    assert set(letters) == refused
    assert [i for i, n in letters.items() if n > 1] == [], "letters twice"
    sink = PostgresSink("events", url=pg_url, table="events", mode="upsert", keys=["id"],
                        partitions=PARTITIONS, dead_letter=str(delta))  # fmt: skip
    open_sink(sink, PIPELINE)
    try:
        assert sink.holds_batch(PIPELINE, 0, KILL_BATCH) is True
    finally:
        sink.close()
