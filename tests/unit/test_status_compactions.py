"""``fanout status`` shows a Delta compaction that left rows twice and cannot be taken back,
of a sink's table (``--config``) or of the ledger's, with the fix; exit 0, as for the other
problems it shows (ARCHITECTURE §4, "Compactions that race"). Real delta-rs tables, no
Spark. Before, only the run's log said it, once per compaction."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake

from fanout.app.cli import main
from fanout.delta_tables.compaction.marker import mark_compacted
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry, now_utc
from tests.newest_lines import readout

KILLED = CommitProperties(custom_metadata={"fanoutCommit": "compaction killed"})


def _refused(path: str) -> None:
    """A fanout compaction killed before its check after another program's OPTIMIZE of
    the same files, whose files a third compaction then rewrote: its rows are twice, and
    it cannot be taken back."""
    table = DeltaTable(path)
    mark_compacted(table, None, table.version())  # as fanout's first compaction
    mine = DeltaTable(path)
    DeltaTable(path).optimize.compact()
    mine.optimize.compact(commit_properties=KILLED)
    DeltaTable(path).optimize.compact()


def _ledger(tmp_path: Path) -> DeltaLedger:
    ledger = DeltaLedger(str(tmp_path / "ledger"), compact_after_files=None)
    ledger.open()
    for batch_id in range(2):
        entry = LedgerEntry("p", "orders", batch_id, "committed", "q", started_at=now_utc())
        ledger.mark_committed(entry)
    return ledger


def _footer(out: str) -> str:
    """The standing problems' lines, unwrapped."""
    assert "\n\nto fix by hand:\n" in out, out
    lines = out.split("\n\nto fix by hand:\n")[1].split("\n\n")[0].splitlines()
    return " ".join(line.strip() for line in lines)


def _message(what: str, version: int) -> str:
    return (
        f"{what}: the compaction committed at version {version} (fanoutCommit = 'compaction "
        "killed') rewrote files another compaction had rewritten first, so rows are in the "
        "table twice; the process that committed it ended before it checked that, and it "
        "cannot be taken back now: since then a later commit removed its files ["
    )


def test_status_shows_a_sinks_refused_compaction_with_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _ledger(tmp_path)
    table = str(tmp_path / "orders")
    for i in range(4):
        write_deltalake(table, pa.table({"id": [i]}), mode="append")
    _refused(table)  # the mark at 4, the killed compaction at 6
    config = tmp_path / "pipeline.toml"
    config.write_text(
        f'[pipeline]\nname = "p"\nledger = "{tmp_path}/ledger"\ncheckpoint = '
        f'"{tmp_path}/ckpt"\n[source]\nformat = "rate"\n'
        f'[[sinks]]\ntype = "delta"\nname = "orders"\npath = "{table}"\n'
        f'[[sinks]]\ntype = "delta"\nname = "clean"\npath = "{tmp_path}/clean"\n'
    )

    assert main(["status", "--config", str(config)]) == 0

    shown = _footer(readout(capsys).out)
    assert shown.startswith(_message(f"sink 'orders' table {table}", 6)), shown
    assert shown.endswith(
        "Deduplicate the table, or RESTORE it to version 5 if nothing was written since. "
        "Every fanout compaction of the table reports this again until the fix commits with "
        "fanoutCommit = 'take back killed' in its commit info (delta-rs: "
        "CommitProperties(custom_metadata=...); Spark: the write option userMetadata = "
        "'take back killed'); a RESTORE to the version before it needs no mark"
    ), shown
    assert main(["status", "--config", str(config), "--json"]) == 0
    listed = {s["sink"]: s for s in json.loads(readout(capsys).out)}
    assert [text.startswith(_message(f"sink 'orders' table {table}", 6))
            for text in listed["orders"]["standing_problems"]] == [True]  # fmt: skip
    assert listed["clean"]["standing_problems"] == []
    assert listed["orders"]["ledger_problems"] == listed["clean"]["ledger_problems"] == []
    assert DeltaTable(table).version() == 7  # nothing changed


def test_status_shows_the_ledgers_refused_compaction(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = _ledger(tmp_path)
    _refused(ledger.path)  # marks at 0-2 (the ledger's creation first), the mark at 3
    version = DeltaTable(ledger.path).version()

    assert main(["status", "--ledger", ledger.path]) == 0

    shown = _footer(readout(capsys).out)
    assert shown.startswith(_message(f"ledger at {ledger.path}", 5)), shown
    assert DeltaTable(ledger.path).version() == version  # nothing changed


def test_status_of_a_ledger_and_sinks_without_refused_compactions_adds_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = _ledger(tmp_path)
    ledger.maintain(vacuum_retention_hours=None)  # a fanout compaction, checked

    assert main(["status", "--ledger", ledger.path]) == 0
    assert "to fix by hand" not in readout(capsys).out
    assert main(["status", "--ledger", ledger.path, "--json"]) == 0
    [shown] = json.loads(readout(capsys).out)
    assert "ledger_problems" not in shown and "standing_problems" not in shown
