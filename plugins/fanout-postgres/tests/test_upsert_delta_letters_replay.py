"""A PostgreSQL upsert whose refused rows go to a Delta dead-letter table, killed after
its letters are written and before its ledger mark, replayed once the cause of the
refusal is fixed.

The driver (a subprocess) writes batch 0 (orders 0-6) into ``orders``, whose ``customer``
references ``customers``; customer ``c6`` is missing, so order 6 is refused by the
foreign key and its letter goes, from the driver after the partitions, to Delta table
``letters`` (its transaction recorded). The driver is killed at ``sink_done`` of batch 0,
before the sink's mark. The operator, seeing the letter, adds customer ``c6`` (the fix a
dead letter asks for) and restarts on the same checkpoint.

The replay upserts batch 0 again: order 6 is now taken by the table. The driver wrote
the replay's letters with the letters' transaction, which skipped them once the first
attempt's were recorded (and wrote none when the replay had none): order 6 was then held
twice, in the table and as a dead letter (``Counter({6: 1})``), which a replay of the
letters would apply again. An upsert replay (its preflight found partitions an earlier
attempt committed) now replaces the batch's letters with its own
(``DeltaDeadLetters.replace``), as the ``postgres`` kind's partitions replace their
records in their own transactions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from pgcheck import execute, query

from fanout import FanOut
from fanout.testing.faults import KILL_EXIT_CODE

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from tests.integration.driver import PIPELINE  # noqa: E402
from tests.integration.streams import (  # noqa: E402
    committed_marks,
    delta_rows,
    run_stream,
    write_input,
)

DRIVER = REPO / "tests" / "integration" / "driver.py"
FILES, ROWS = 2, 7  # order n is customer c{n % 7}: orders 6 and 13 are c6's
DDL = (
    "CREATE TABLE customers (name text PRIMARY KEY)",
    "INSERT INTO customers SELECT 'c' || n FROM generate_series(0, 5) AS n",
    "CREATE TABLE orders (order_id bigint PRIMARY KEY, customer text REFERENCES customers "
    "(name), amount double precision, status text)",
)


def _sinks(pg_url: str, workdir: Path) -> list[dict[str, Any]]:
    return [
        {
            "type": "postgres", "name": "pg", "url": pg_url, "table": "orders",
            "mode": "upsert", "keys": ["order_id"], "dead_letter": str(workdir / "letters"),
        }
    ]  # fmt: skip


def test_a_replay_taking_a_row_the_killed_attempt_refused_keeps_it_once(
    spark: Any, pg_url: str, tmp_path: Path
) -> None:
    execute(pg_url, *DDL)
    write_input(tmp_path / "input", FILES, ROWS)
    config = tmp_path / "sinks.json"
    config.write_text(json.dumps(_sinks(pg_url, tmp_path)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*sys.path])}
    cmd = [sys.executable, str(DRIVER), str(tmp_path), "--kill", "sink_done:0:pg",
           "--sinks", str(config)]  # fmt: skip
    killed = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert killed.returncode == KILL_EXIT_CODE, killed.stderr[-3000:]
    assert "KILL at sink_done batch 0 sink pg" in killed.stderr
    assert ("pg", 0) not in committed_marks(tmp_path / "ledger", PIPELINE)
    assert sorted(r[0] for r in query(pg_url, "SELECT order_id FROM orders")) == [
        0, 1, 2, 3, 4, 5,
    ]  # fmt: skip
    first = [json.loads(r["row"])["order_id"] for r in delta_rows(tmp_path / "letters")]
    assert first == [6]

    execute(pg_url, "INSERT INTO customers VALUES ('c6')")  # the fix the letter asks for
    with FanOut(PIPELINE, str(tmp_path / "ledger"), _sinks(pg_url, tmp_path)) as fan:
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")

    table = Counter(int(r[0]) for r in query(pg_url, "SELECT order_id FROM orders"))
    letters = Counter(json.loads(r["row"])["order_id"] for r in delta_rows(tmp_path / "letters"))
    assert table == Counter(range(FILES * ROWS))
    assert letters == Counter()  # each order once: in the table, none a dead letter
