"""``fanout run`` with ``trigger = { available_now = true }`` (or ``{ once = true }``) and a
PostgreSQL sink with ``on_failure = "lag"``: the run ends only once every sink holds every
batch, or says which sink does not and exits 3 (docs/architecture.md §14.4, "The end of a
run"). A run a SIGTERM stops cleanly gives no final catch-up, and says the same and exits 3
when a sink is behind.

The probe interval is long (600 s), so the catch-up thread never probes the sink during
the run: what reaches PostgreSQL after it failed is the run's final catch-up's work (the
SIGTERM test, whose second run has no batch, probes every second). The
source hands one file per batch (``maxFilesPerTrigger = 1``), so the batches are known.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from fanout.spool.table import Spool
from tests.chaos.lag_input import LAG_SCHEMA, final_state, postgres_rows, versions, write_lag_input
from tests.integration.hold_after_batch import ENV
from tests.integration.streams import committed_marks, delta_rows

if TYPE_CHECKING:
    from tests.in_process_cli import Ran

PIPELINE = """
[pipeline]
name = "avnow"
ledger = "{data}/ledger"
checkpoint = "{data}/checkpoint"
spool = "{data}/spool"
trigger = {{ {trigger} }}
probe_interval_s = {probe_interval_s}

[spark]
master = "local[2]"

[source]
format = "json"
path = "{data}/input"
schema = "{schema}"
options = {{ maxFilesPerTrigger = 1 }}

[[sinks]]
type = "delta"
name = "lake"
path = "{data}/lake"

[[sinks]]
type = "postgres"
name = "pg"
url = "{url}"
table = "avnow_orders"
keys = ["order_id"]
order_by = "amount"
create_table = true
partitions = 2
on_failure = "lag"
retries = {retries}
backoff_s = {backoff_s}
"""


HELD = 'plugins = ["tests.integration.hold_after_batch"]\n'
"""The tests' plugin that holds a run after a batch (its ``ENV`` says which, and its gate)."""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[Any, str]]:
    """An embedded PostgreSQL server, stopped (each test starts it when it wants it up),
    and its URL (the same once started again)."""
    from fanout_postgres.embedded import EmbeddedPostgres

    pg = EmbeddedPostgres(tmp_path / "pgdata", database="avnow", durable=False)
    url = pg.start()
    pg.stop()
    yield pg, url
    pg.stop()


def _config(
    data: Path,
    url: str,
    retries: int,
    backoff_s: float,
    trigger: str = "available_now = true",
    probe_interval_s: float = 600,
    plugins: str = "",
) -> Path:
    config = data / "pipeline.toml"
    config.write_text(
        plugins + PIPELINE.format(
            data=data, schema=LAG_SCHEMA, url=url, retries=retries, backoff_s=backoff_s,
            trigger=trigger, probe_interval_s=probe_interval_s,
        )
    )  # fmt: skip
    return config


def _start(config: Path, log: Path, **env: str) -> subprocess.Popen[bytes]:
    """``fanout run config`` in a process of its own (the repository on its path, for a
    plugin of the tests'), ``env`` added to its environment."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "fanout.app.cli", "run", str(config)],
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _finish(proc: subprocess.Popen[bytes], log: Path) -> tuple[int, str]:
    try:
        code = proc.wait(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    return code, log.read_text()


def _wait_for_lake(data: Path, batches: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Wait until the lake sink has marked ``batches`` batches (the run still going)."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        if (data / "ledger" / "_delta_log").exists():
            marks = committed_marks(data / "ledger", "avnow")
            if sum(1 for sink, _ in marks if sink == "lake") >= batches:
                return
        time.sleep(0.3)
    raise AssertionError(f"the lake sink did not mark {batches} batches:\n{log.read_text()}")


def _pg_marks_in_order(data: Path) -> list[int]:
    ledger = [r for r in delta_rows(data / "ledger") if r["status"] == "committed"]
    return [r["batch_id"] for r in sorted(ledger, key=lambda r: r["finished_at"])
            if r["sink"] == "pg"]  # fmt: skip


def _spool_size(data: Path) -> tuple[int, int, int]:
    spool = Spool(str(data / "spool"), "avnow")
    spool.open()
    return spool.size()


def _line(out: str, start: str) -> str:
    found = [line for line in out.splitlines() if line.startswith(start)]
    assert len(found) == 1, out
    return found[0]


def _pg_behind(out: str, tmp_path: Path, ended: str, backlog: str) -> list[str]:
    """The run's message that it ended (``ended``) with sink pg behind by ``backlog``
    (unreachable, its batches in the spool, the next run writing them first), checked; the
    lines after it."""
    lines = out.splitlines()
    first = lines.index(f"pipeline 'avnow': the run ended with 1 sink(s) behind {ended}:")
    said = lines[first + 1]
    assert said.startswith(f"  - pg: {backlog} in the spool); its last error: "), said
    assert "SinkUnreachableError: sink 'pg': cannot open: OperationalError" in said
    assert lines[first + 2] == (
        f"Nothing is lost: the spool at {tmp_path}/spool keeps those batches (a backfill "
        "source the ones it holds), and the next run of this pipeline writes them to "
        "each sink first, in batch order and exactly once, before its live batches. Fix the "
        f"sink(s), then run again; `fanout status --ledger {tmp_path}/ledger --pipeline avnow "
        f"--spool {tmp_path}/spool` shows how far behind they are."
    )
    return lines[first + 3 :]


def test_postgres_back_before_the_run_ends_gets_every_batch_and_exit_0(
    tmp_path: Path, server: tuple[Any, str]
) -> None:
    """The run is held after batch 1 (``hold_after_batch``) until PostgreSQL is up again:
    unheld, a server start slower than the run's eight remaining batches (a loaded
    machine) let the run reach its end first, its final catch-up's three retries spent
    within a second, exit 3: the test failed though nothing was wrong. Batch 2 starts the sink's
    reopen beside it; it is open from then on, and still behind: held back, every batch
    spooled for it, all written by the final catch-up."""
    pg, url = server
    files = 10
    rows = write_lag_input(tmp_path / "input", files)
    config = _config(tmp_path, url, 3, 0.1, plugins=HELD)  # three retries of batch 0, then lagging
    gate = tmp_path / "gate"
    run = _start(config, tmp_path / "run.log", **{ENV: f"1:{gate}"})
    try:
        _wait_for_lake(tmp_path, 2, run, tmp_path / "run.log")  # pg missed batches 0 and 1
        pg.start()
        assert run.poll() is None, "the run ended before PostgreSQL was back"
    finally:
        gate.touch()
        code, out = _finish(run, tmp_path / "run.log")

    assert code == 0, out[-4000:]
    assert postgres_rows(url, "avnow_orders") == final_state(rows)
    assert versions(delta_rows(tmp_path / "lake")) == versions(rows)
    assert committed_marks(tmp_path / "ledger", "avnow") == Counter(
        {(sink, b): 1 for sink in ("lake", "pg") for b in range(files)}
    )
    assert _pg_marks_in_order(tmp_path) == list(range(files))
    assert _spool_size(tmp_path) == (0, 0, 0)
    assert _line(out, "final catch-up: pg misses") == (
        "final catch-up: pg misses batches 0 to 9 (10 batch(es)); writing them before the run ends"
    )
    assert _line(out, "final catch-up: pg caught up") == (
        "final catch-up: pg caught up (batches 0 to 9)"
    )
    assert _line(out, "pipeline 'avnow' finished") == (
        "pipeline 'avnow' finished (last committed batch 9)"
    )


def test_postgres_down_to_the_end_exits_3_naming_the_batches_and_the_next_run_delivers(
    fanout_cli: Callable[..., Ran], tmp_path: Path, server: tuple[Any, str]
) -> None:
    """The first run's trigger is ``once``: one batch of every file (the rate limit does
    not apply), then the same end as ``available_now``. Both runs are ``fanout run`` in
    the test's process and session (nothing here is the process's: no signal, no kill;
    the exit code 3 through the real entry point is the SIGTERM test's)."""

    def run(config: Path) -> tuple[int, str]:
        done = fanout_cli("run", config)
        return done.returncode, done.stdout + done.stderr

    pg, url = server
    rows = write_lag_input(tmp_path / "input", 4)
    once = _config(tmp_path, url, 1, 0.2, trigger="once = true")
    code, out = run(once)

    assert code == 3, out[-4000:]
    assert _line(out, "final catch-up: pg misses") == (
        "final catch-up: pg misses batch 0 (1 batch(es)); writing them before the run ends"
    )
    _pg_behind(out, tmp_path, "after a final catch-up", "batch 0 (1 batch(es), 80 row(s)")
    assert "pipeline 'avnow' finished" not in out
    assert versions(delta_rows(tmp_path / "lake")) == versions(rows)
    marks = committed_marks(tmp_path / "ledger", "avnow")
    assert marks == Counter({("lake", 0): 1})  # pg: nothing yet
    assert _spool_size(tmp_path)[:2] == (1, 80)

    pg.start()  # back: the next run writes the spooled batch first, then batches 1 and 2
    rows += write_lag_input(tmp_path / "input", 2, start_file=4)
    config = _config(tmp_path, url, 1, 0.2)
    code, out = run(config)

    assert code == 0, out[-4000:]
    assert _line(out, "pipeline 'avnow' finished") == (
        "pipeline 'avnow' finished (last committed batch 2)"
    )
    assert postgres_rows(url, "avnow_orders") == final_state(rows)
    assert versions(delta_rows(tmp_path / "lake")) == versions(rows)
    assert committed_marks(tmp_path / "ledger", "avnow") == Counter(
        {(sink, b): 1 for sink in ("lake", "pg") for b in range(3)}
    )
    assert _pg_marks_in_order(tmp_path) == list(range(3))
    assert _spool_size(tmp_path) == (0, 0, 0)


def _stop(proc: subprocess.Popen[bytes], log: Path) -> tuple[int, str]:
    """SIGTERM to the run; its exit code and output once it ended."""
    proc.send_signal(signal.SIGTERM)
    return _finish(proc, log)


def _stop_line(out: str) -> str:
    return _line(out, "SIGTERM: ")


def _wait_for_batch_line(batch: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Wait until the run printed batch ``batch``'s line (the batch is over)."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        if re.search(rf"^batch {batch}: ", log.read_text(), re.M):
            return
        time.sleep(0.3)
    raise AssertionError(f"no line of batch {batch}:\n{log.read_text()}")


def test_a_sigterm_stop_with_postgres_behind_exits_3_and_a_restart_with_no_new_data_drains(
    tmp_path: Path, server: tuple[Any, str]
) -> None:
    """A query with no end (``processing_time``): three batches, PostgreSQL down for all of
    them, then SIGTERM. The stop writes nothing more (no final catch-up), names the sink,
    its batches and what the next run does, and exits 3. The next run, PostgreSQL back and
    no new file, runs no batch (Spark runs none without new data): its catch-up starts
    with the query, writes the three, in order, and its SIGTERM finds no sink behind:
    exit 0."""
    pg, url = server
    rows = write_lag_input(tmp_path / "input", 3)
    config = _config(
        tmp_path, url, 0, 0.1, trigger='processing_time = "1 second"', probe_interval_s=1
    )
    run = _start(config, tmp_path / "run1.log")
    try:
        _wait_for_batch_line(2, run, tmp_path / "run1.log")  # batch 2 over: the source drained
    finally:
        code, out = _stop(run, tmp_path / "run1.log")

    assert code == 3, out[-4000:]
    assert _stop_line(out) == "SIGTERM: stopped between batches; last committed batch 2"
    ended = "(stopped by SIGTERM: no final catch-up)"
    assert _pg_behind(out, tmp_path, ended, "batches 0 to 2 (3 batch(es), 60 row(s)") == []
    assert not [line for line in out.splitlines() if line.startswith("final catch-up: ")], out
    assert "pipeline 'avnow' finished" not in out
    assert committed_marks(tmp_path / "ledger", "avnow") == Counter(
        {("lake", b): 1 for b in range(3)}
    )  # pg: nothing, the stop wrote no batch
    assert _spool_size(tmp_path)[:2] == (3, 60)

    pg.start()
    run = _start(config, tmp_path / "run2.log")
    try:
        deadline = time.monotonic() + 120
        while _pg_marks_in_order(tmp_path) != [0, 1, 2] and time.monotonic() < deadline:
            assert run.poll() is None, (tmp_path / "run2.log").read_text()[-3000:]
            time.sleep(0.3)
        while _spool_size(tmp_path) != (0, 0, 0) and time.monotonic() < deadline:
            time.sleep(0.3)  # released after the last mark
    finally:
        code, out = _stop(run, tmp_path / "run2.log")

    assert code == 0, out[-4000:]
    assert _line(out, "catch-up: ") == (
        "catch-up: pg misses batches 0 to 2 (3 batch(es)); writing them beside the query"
    )
    assert not re.search(r"^batch \d+: ", out, re.M), out  # no batch ran
    assert _stop_line(out) == "SIGTERM: stopped between batches; no batch ran in this run"
    assert "sink(s) behind" not in out
    assert postgres_rows(url, "avnow_orders") == final_state(rows)
    assert committed_marks(tmp_path / "ledger", "avnow") == Counter(
        {(sink, b): 1 for sink in ("lake", "pg") for b in range(3)}
    )
    assert _pg_marks_in_order(tmp_path) == [0, 1, 2]
    assert _spool_size(tmp_path) == (0, 0, 0)
