"""Dead letters written before the sink's commit, the sink's ``dead_letter`` moved between a
kill and the replay (docs/architecture.md §7, "A ``dead_letter`` moved").

Sink bronze (Delta) has a route (its ``select`` fails on the paid orders: route letters,
written by fanout at each attempt before the sink's write) and a CHECK constraint (it
refuses the shipped orders: the sink's own letters, written before its one commit). The
driver (a subprocess) is killed right after bronze wrote batch 2's refused rows to Delta
table ``letters_a``, its route letters there already, before its commit and its mark. The
restart on the same checkpoint names another Delta table, ``letters_b``.

The replay, which writes the batch (not committed), wrote both kinds of its letters to
``letters_b`` too: each was kept twice, once in each table. The restart now asks
``letters_a`` (recorded in the ledger as the sink's target until batch 2) what it holds of
the batch, and writes none of those again; batch 3's go to ``letters_b``."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from fanout import FanOut
from fanout.contract.batch import txn_app_id
from fanout.testing.faults import KILL_EXIT_CODE
from tests.integration.driver import PIPELINE
from tests.integration.streams import (
    committed_marks,
    delta_rows,
    id_counts,
    run_stream,
    write_input,
)

DRIVER = Path(__file__).with_name("driver.py")
FILES, ROWS = 4, 12
KILL_BATCH = 2
# a paid order's customer ("c3") is no number: the cast fails under ANSI mode, the row is
# a route letter; the others pass with flag 0
SELECT = ["order_id", "status", "CAST(IF(status = 'paid', customer, '0') AS INT) AS flag"]


def _bronze(workdir: Path, letters: str) -> list[dict[str, object]]:
    return [
        {
            "type": "delta",
            "name": "bronze",
            "path": str(workdir / "bronze"),
            "select": SELECT,
            "dead_letter": str(workdir / letters),
        }
    ]


def _letters(path: Path, source: str) -> Counter[tuple[int, int]]:
    """(batch, order id) of each letter of ``source`` in the Delta table at ``path``."""
    if not (path / "_delta_log").exists():
        return Counter()
    return Counter(
        (r["batch_id"], json.loads(r["row"])["order_id"])
        for r in delta_rows(path)
        if r["source"] == source
    )


def test_a_replay_under_a_moved_target_writes_no_letter_the_first_target_holds(
    spark: Any, tmp_path: Path
) -> None:
    rows = write_input(tmp_path / "input", FILES, ROWS)
    schema = pa.schema([("order_id", pa.int64()), ("status", pa.string()), ("flag", pa.int32())])
    write_deltalake(str(tmp_path / "bronze"), schema.empty_table())
    DeltaTable(str(tmp_path / "bronze")).alter.add_constraint({"held": "status <> 'shipped'"})
    config = tmp_path / "sinks.json"
    config.write_text(json.dumps(_bronze(tmp_path, "letters_a")))
    cmd = [sys.executable, str(DRIVER), str(tmp_path), "--kill-after-letters", str(KILL_BATCH),
           "--sinks", str(config)]  # fmt: skip
    killed = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert killed.returncode == KILL_EXIT_CODE, killed.stderr[-3000:]
    assert f"KILL after batch {KILL_BATCH}'s dead letters" in killed.stderr
    bronze = DeltaTable(str(tmp_path / "bronze"))
    assert bronze.transaction_version(txn_app_id(PIPELINE, "bronze")) == KILL_BATCH - 1

    def ids(batch: int, status: str) -> set[int]:
        chunk = rows[batch * ROWS : (batch + 1) * ROWS]
        return {r["order_id"] for r in chunk if r["status"] == status}

    def letters(batches: range, status: str) -> Counter[tuple[int, int]]:
        return Counter({(b, i): 1 for b in batches for i in ids(b, status)})

    written = range(KILL_BATCH + 1)  # the killed attempt wrote batch 2's letters first
    a, b = tmp_path / "letters_a", tmp_path / "letters_b"
    assert _letters(a, "route") == letters(written, "paid")
    assert _letters(a, "refused") == letters(written, "shipped")

    with FanOut(PIPELINE, str(tmp_path / "ledger"), _bronze(tmp_path, "letters_b")) as fan:
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")

    assert _letters(a, "route") == letters(written, "paid")
    assert _letters(a, "refused") == letters(written, "shipped")
    assert _letters(b, "route") == letters(range(FILES - 1, FILES), "paid")
    assert _letters(b, "refused") == letters(range(FILES - 1, FILES), "shipped")
    kept = id_counts(delta_rows(tmp_path / "bronze"))
    assert kept == Counter({r["order_id"]: 1 for r in rows if r["status"] == "new"})
    assert committed_marks(tmp_path / "ledger", PIPELINE) == {
        ("bronze", k): 1 for k in range(FILES)
    }


def _files(workdir: Path, letters: str) -> list[dict[str, object]]:
    return [
        {
            "type": "direct_letters",
            "name": "files",
            "directory": str(workdir / "files"),
            "dead_letter": str(workdir / letters),
        }
    ]


def test_a_plugin_writing_to_the_target_itself_writes_no_letter_the_first_target_holds(
    spark: Any, tmp_path: Path
) -> None:
    """A plugin sink of a third party (``direct_letters_sink``) hands its refused rows to
    ``context.dead_letters.write(...)`` itself, not through ``write_letters``. Killed right
    after batch 2's file (its commit) and its letters in ``letters_a``, before its mark; the
    restart names ``letters_b``, and the replay, finding the batch's file, hands the letters
    over again: the target's ``write`` wrote them to ``letters_b`` too, each kept twice. The
    target fanout hands a sink now filters its ``write`` as ``write_letters`` does."""
    from tests.integration import direct_letters_sink

    rows = write_input(tmp_path / "input", FILES, ROWS)
    config = tmp_path / "sinks.json"
    config.write_text(json.dumps(_files(tmp_path, "letters_a")))
    cmd = [sys.executable, str(DRIVER), str(tmp_path), "--kill-after-letters", str(KILL_BATCH),
           "--sinks", str(config), "--plugin", direct_letters_sink.__name__]  # fmt: skip
    killed = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert killed.returncode == KILL_EXIT_CODE, killed.stderr[-3000:]
    assert f"KILL after batch {KILL_BATCH}'s dead letters" in killed.stderr
    assert ("files", KILL_BATCH) not in committed_marks(tmp_path / "ledger", PIPELINE)

    def shipped(batches: range) -> Counter[tuple[int, int]]:
        return Counter(
            {(b, r["order_id"]): 1 for b in batches
             for r in rows[b * ROWS : (b + 1) * ROWS] if r["status"] == "shipped"}
        )  # fmt: skip

    a, b = tmp_path / "letters_a", tmp_path / "letters_b"
    assert _letters(a, "refused") == shipped(range(KILL_BATCH + 1))

    with FanOut(
        PIPELINE, str(tmp_path / "ledger"), _files(tmp_path, "letters_b"),
        plugins=[direct_letters_sink],
    ) as fan:  # fmt: skip
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")

    assert _letters(a, "refused") == shipped(range(KILL_BATCH + 1))
    assert _letters(b, "refused") == shipped(range(KILL_BATCH + 1, FILES))
    taken = Counter(
        r["order_id"]
        for path in sorted((tmp_path / "files").glob("*.json"))
        for r in json.loads(path.read_text())["rows"]
    )
    assert taken == Counter({r["order_id"]: 1 for r in rows if r["status"] != "shipped"})
    assert committed_marks(tmp_path / "ledger", PIPELINE) == {("files", k): 1 for k in range(FILES)}
