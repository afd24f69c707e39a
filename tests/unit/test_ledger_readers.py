"""One reader of the ledger's rows: the marks as of the log (ARCHITECTURE §4, "Readers").

A lost mark a write's own mark replaced stays in the ledger table (§5, "A batch in
flight"); every reader of the rows must leave it out but one, the refused query's check.
So the ledger reads them (``committed_entries``, ``DeltaLedger.rows``, the epochs'
owners) through one filter, and the rows as written are reached only by name. Checked
here: by behaviour, and in the code, as ``test_layers.py`` checks imports: no module
outside ``fanout/ledger`` reads the ledger's rows past that reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LOST_MARK, LedgerEntry
from fanout.ledger.memory import MemoryLedger

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "fanout", *sorted((ROOT / "plugins").glob("fanout-*/fanout_*"))]
LEDGER = ROOT / "fanout" / "ledger"

RAW_READERS = {"read", "entries", "committed_entries_with_replaced"}
"""What gives a ledger's rows as written: ``DeltaLedger.read``, ``MemoryLedger.entries``,
and the named way of the one check that needs them."""

RAW_HELPERS = {"entries_from_arrow", "without_replaced", "rows_without_replaced"}
"""Helpers of ledger rows read raw (the last two: the filters each reader applied by hand
before the one reader)."""

TABLE_READS = {
    *("read_arrow", "read_delta", "open_table", "DeltaTable", "QueryBuilder"),
    *("load", "dataset", "read_table"),
}
"""The ways to read a Delta table's rows past the ledger (``fanout.delta_tables.io``,
delta-rs itself; Spark's ``spark.read...load``, pyarrow's datasets and Parquet files)."""

ON_PURPOSE = {("fanout/steps/unmarked/restart.py", "committed_entries_with_replaced")}
"""The readers of the rows as written outside the ledger, each for its reason: the refused
query's check (a lost mark its refusal recorded names it, also once replaced)."""


def _sources() -> list[Path]:
    return [
        path
        for source in SOURCES
        for path in sorted(source.rglob("*.py"))
        if LEDGER not in path.parents
    ]


def _ledger_names(tree: ast.Module) -> set[str]:
    """The names ``tree`` binds to a ledger or its location under any name: typed as a
    ledger (``led: DeltaLedger``), or bound to code that names one (``found =
    DeltaLedger(path)``, ``where = config.ledger``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            if "ledger" in ast.unparse(node.annotation).lower():
                names.add(node.arg)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr):
            value = node.value
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            typed = (
                isinstance(node, ast.AnnAssign) and "ledger" in ast.unparse(node.annotation).lower()
            )
            if typed or (value is not None and "ledger" in ast.unparse(value).lower()):
                names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _raw_reads(path: Path) -> list[tuple[str, int, str]]:
    """``path``'s reads of a ledger's rows past its reader: (what, line, code)."""
    tree = ast.parse(path.read_text())
    bound = _ledger_names(tree)

    def names_ledger(*nodes: ast.AST) -> bool:
        text = " ".join(ast.unparse(n) for n in nodes).lower()
        used = {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name)}
        return "ledger" in text or bool(used & bound)

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in RAW_READERS:
            distinct = node.attr not in ("read", "entries")  # names no other thing uses
            if distinct or names_ledger(node.value):
                found.append((node.attr, node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call):
            name = ast.unparse(node.func).split(".")[-1]
            if name in TABLE_READS and names_ledger(*node.args, *node.keywords):
                found.append((name, node.lineno, ast.unparse(node)))
            if name == "committed_entries" and any(k.arg == "replaced" for k in node.keywords):
                found.append(("replaced=", node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fanout.ledger"):
            for alias in node.names:
                if alias.name in (
                    "entries_from_arrow",
                    "without_replaced",
                    "rows_without_replaced",
                ):
                    found.append((alias.name, node.lineno, f"import {alias.name}"))
    return sorted(found, key=lambda f: (f[1], f[0]))


def test_nothing_outside_the_ledger_reads_its_rows_past_its_reader() -> None:
    """The code reading a ledger's rows as written, outside ``fanout/ledger``: only the
    readers of :data:`ON_PURPOSE`, each where it is."""
    seen: set[tuple[str, str]] = set()
    unexpected = []
    for path in _sources():
        where = str(path.relative_to(ROOT))
        for what, line, code in _raw_reads(path):
            if (where, what) in ON_PURPOSE:
                seen.add((where, what))
            else:
                unexpected.append(f"{where}:{line}: {code}")
    assert unexpected == []
    assert seen == ON_PURPOSE  # the allowance names code that still exists


def test_the_check_finds_a_raw_read(tmp_path: Path) -> None:
    """The check above can fail: each way of reading past the reader is found."""
    module = tmp_path / "status.py"
    module.write_text(
        "from fanout.ledger.entry import entries_from_arrow\n"
        "rows = ledger.read(pipeline).to_pylist()\n"
        "rows = self.ledger.entries\n"
        "rows = DeltaLedger(path).read('p')\n"
        "rows = read_arrow(open_table(config.ledger))\n"
        "rows = ledger.committed_entries(p, 3, replaced=True)\n"
        "rows = led.committed_entries_with_replaced(p)\n"
        "rows = spool.read(key)\n"
    )
    assert [(what, line) for what, line, _ in _raw_reads(module)] == [
        ("entries_from_arrow", 1),
        ("read", 2),
        ("entries", 3),
        ("read", 4),
        ("open_table", 5),
        ("read_arrow", 5),
        ("replaced=", 6),
        ("committed_entries_with_replaced", 7),
    ]


def test_the_check_finds_a_raw_read_whatever_the_names(tmp_path: Path) -> None:
    """A ledger under a name without "ledger" in it (a parameter typed as one, a name bound
    to one), its location under such a name, and a read of the table by Spark or pyarrow
    are found too; a spool's or a source's ``read`` is not."""
    module = tmp_path / "report.py"
    module.write_text(
        "def show(led: DeltaLedger, store: Ledger, spool: Spool) -> None:\n"
        "    rows = led.read(pipeline).to_pylist()\n"
        "    rows = store.entries\n"
        "    rows = spool.read(key)\n"
        "def scan(config: Config, source: Source) -> None:\n"
        "    found = DeltaLedger(path)\n"
        "    rows = found.read('p')\n"
        "    where = config.ledger\n"
        "    rows = read_delta(where)\n"
        "    rows = spark.read.format('delta').load(config.ledger)\n"
        "    rows = pyarrow.dataset.dataset(where).to_table()\n"
        "    rows = source.read(key)\n"
    )
    assert [(what, line) for what, line, _ in _raw_reads(module)] == [
        ("read", 2),
        ("entries", 3),
        ("read", 7),
        ("read_delta", 9),
        ("load", 10),
        ("dataset", 11),
    ]


def _mark(batch: int, rows: int | None = None, error: str | None = None) -> LedgerEntry:
    return LedgerEntry("p", "pg", batch, "committed", query_id="q1", rows=rows, error=error)


@pytest.fixture(params=["delta", "memory"])
def replaced(request: pytest.FixtureRequest, tmp_path: Path) -> DeltaLedger | MemoryLedger:
    """A ledger holding batch 0's mark, and batch 1's lost mark (``fanout recover``, the
    batch in flight) and the write's own mark that replaced it."""
    ledger: DeltaLedger | MemoryLedger
    if request.param == "delta":
        ledger = DeltaLedger(str(tmp_path / "ledger"))
    else:
        ledger = MemoryLedger()
    ledger.open()
    lost = _mark(1, error=f"{LOST_MARK}: recorded by fanout recover: it holds the batch")
    for entry in (_mark(0, 10), lost, _mark(1, 30)):
        assert ledger.mark_committed(entry) is True
    return ledger


def test_the_marks_as_of_the_log_leave_the_replaced_lost_mark_out(
    replaced: DeltaLedger | MemoryLedger,
) -> None:
    marks = replaced.committed_entries("p")
    assert sorted((e.batch_id, e.rows, e.error) for e in marks) == [(0, 10, None), (1, 30, None)]
    written = replaced.committed_entries_with_replaced("p", 1, 0)
    assert sorted((e.batch_id, e.lost, e.rows or 0) for e in written) == [
        (1, False, 30),
        (1, True, 0),
    ]
    assert replaced.epoch_owners("p") == {0: "q1"}


def test_delta_ledger_rows_are_as_of_the_log_and_read_is_as_written(tmp_path: Path) -> None:
    ledger = DeltaLedger(str(tmp_path / "ledger"))
    ledger.open()
    lost = _mark(1, error=f"{LOST_MARK}: recorded by fanout recover: it holds the batch")
    for entry in (_mark(0, 10), lost, _mark(1, 30)):
        ledger.mark_committed(entry)
    assert sorted((r["batch_id"], r["rows"]) for r in ledger.rows("p")) == [(0, 10), (1, 30)]
    assert sorted((r["batch_id"], r["rows"]) for r in ledger.rows()) == [(0, 10), (1, 30)]
    as_written = ledger.read("p").to_pylist()
    assert sorted((r["batch_id"], r["rows"] or 0) for r in as_written) == [(0, 10), (1, 0), (1, 30)]
