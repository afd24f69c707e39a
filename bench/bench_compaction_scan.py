#!/usr/bin/env python
"""What a Delta sink's open and fanout's first compaction read of a table fanout never
compacted (ARCHITECTURE §4, "Compactions that race", the mark).

    python bench/bench_compaction_scan.py [--commits 300,1200] [--repeat 15] [--workdir DIR]

A table of N single-row appends (``--commits``, delta-rs, local disk; built once in the work
directory and reused), loaded once. Timed, each ``--repeat`` times with this process's
memory of checked versions cleared (a new process each time), median and best:

  open_scan      ``worth_a_scan``: a sink's open without ``compact_every``
  open_repair    ``repair_unchecked``: a sink's open with ``compact_every``
  first_scan     the scan fanout's first compaction of the table runs before it commits
                 the mark (``repair.scan``), on the loaded table
  first_loaded   the same, the table's load included

Run it on two commits, each from its own worktree on ``PYTHONPATH``, to compare them. The
last line is machine-readable: ``<case>_<N>=<median ms>`` for each.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from fanout.delta_tables.compaction import repair, repair_unchecked, scan, worth_a_scan


def table_of(workdir: Path, commits: int) -> str:
    """The path of a table of ``commits`` single-row appends in ``workdir`` (built once)."""
    path = workdir / f"appends-{commits}"
    if not path.exists():
        for i in range(commits):
            write_deltalake(str(path), pa.table({"id": [i]}), mode="append")
    if DeltaTable(str(path)).version() != commits - 1:
        raise SystemExit(f"{path} is not a table of {commits} commits: remove it")
    return str(path)


def timed(work: Callable[[], object], repeat: int) -> tuple[float, float]:
    """The median and the best of ``repeat`` runs of ``work`` in ms, each as a new
    process's (nothing remembered as checked)."""
    runs: list[float] = []
    for _ in range(repeat):
        scan._checked_through.clear()
        start = time.perf_counter()
        work()
        runs.append((time.perf_counter() - start) * 1000)
    return statistics.median(runs), min(runs)


def cases(path: str) -> dict[str, Callable[[], object]]:
    """The timed calls on the table at ``path``, by name."""
    loaded = DeltaTable(path)
    return {
        "open_scan": lambda: worth_a_scan(loaded),
        "open_repair": lambda: repair_unchecked(loaded, "bench", None),
        "first_scan": lambda: repair.scan(loaded, "bench", None, data_change=False),
        "first_loaded": lambda: repair.scan(DeltaTable(path), "bench", None, data_change=False),
    }


def main() -> None:
    """Parse the options, time every case at every table size, print the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", default="300,1200")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.gettempdir()) / "fanout-bench-compaction-scan"
    workdir.mkdir(parents=True, exist_ok=True)
    results: list[str] = []
    for commits in (int(n) for n in args.commits.split(",")):
        for name, work in cases(table_of(workdir, commits)).items():
            median, best = timed(work, args.repeat)
            print(f"{commits:6d} commits  {name:13s} median {median:8.2f} ms  best {best:8.2f} ms")
            results.append(f"{name}_{commits}={median:.2f}")
    print(" ".join(results))


if __name__ == "__main__":
    main()
