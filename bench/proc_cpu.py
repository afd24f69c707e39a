"""CPU seconds of this benchmark's processes, read from ``/proc`` (Linux): the Spark
driver, its JVM, the JVM's Python workers, a service's process tree."""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

CLK = os.sysconf("SC_CLK_TCK")

ProcTable = dict[int, tuple[int, str, float, float]]
"""pid -> (ppid, comm, own CPU s, own + reaped children's CPU s)."""


def proc_table() -> ProcTable:
    """Every process now running, as :data:`ProcTable`."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        f = _fields(stat)
        own = _own_cpu(f)
        out[int(d.name)] = (int(f[1]), comm, own, own + (int(f[13]) + int(f[14])) / CLK)
    return out


def children_of(table: ProcTable) -> dict[int, list[int]]:
    """pid -> its children's pids."""
    children: dict[int, list[int]] = defaultdict(list)
    for pid, (ppid, *_rest) in table.items():
        children[ppid].append(pid)
    return children


def tree_cpu(table: ProcTable, children: dict[int, list[int]], root: int | None) -> float:
    """CPU seconds of ``root`` and every process under it (reaped ones included)."""
    if root is None or root not in table:
        return 0.0
    return table[root][3] + sum(tree_cpu(table, children, c) for c in children.get(root, []))


def spark_jvms(table: ProcTable, children: dict[int, list[int]]) -> list[int]:
    """This process's ``java`` children: the Spark driver JVM of a local session."""
    return [p for p in children.get(os.getpid(), []) if table[p][1] == "java"]


def thread_kind(comm: str) -> str:
    """What a JVM thread named ``comm`` (``/proc``'s name: its first 15 characters) is:
    ``query thread`` (a streaming query's ``stream execution thread``), ``JIT compiler``,
    ``garbage collector``, ``executor tasks``, else the name without its number."""
    if comm.startswith("stream executio"):
        return "query thread"
    if comm.startswith(("C1 Compiler", "C2 Compiler")):
        return "JIT compiler"
    if comm.startswith("GC Thread"):
        return "garbage collector"
    if comm.startswith("Executor task"):
        return "executor tasks"
    return comm.rstrip("0123456789").rstrip("#-")


def thread_cpu_by_kind(pid: int) -> dict[str, float]:
    """CPU seconds used so far by the live threads of process ``pid``, summed by
    :func:`thread_kind`."""
    totals: dict[str, float] = defaultdict(float)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        totals[thread_kind(comm)] += _own_cpu(_fields(stat))
    return dict(totals)


def jit_cpu(pid: int) -> float:
    """CPU seconds used so far by the JIT compiler threads (HotSpot's ``C1 CompilerThre``
    and ``C2 CompilerThre``) of JVM ``pid``: what a JVM not yet warm spends compiling."""
    return thread_cpu_by_kind(pid).get("JIT compiler", 0.0)


def _fields(stat: str) -> list[str]:
    """The fields of a ``/proc/.../stat`` line after the command name: [1] is the parent's
    pid, [11..14] utime, stime, cutime, cstime in clock ticks."""
    return stat.rsplit(")", 1)[1].split()


def _own_cpu(fields: list[str]) -> float:
    """A process's or thread's own CPU seconds (utime + stime) from :func:`_fields`."""
    return (int(fields[11]) + int(fields[12])) / CLK


def python_workers_cpu(table: ProcTable | None = None) -> float:
    """CPU seconds used so far by Spark's Python workers: every process under this
    process's JVM children."""
    table = proc_table() if table is None else table
    children = children_of(table)
    jvms = spark_jvms(table, children)
    return sum(tree_cpu(table, children, c) for j in jvms for c in children.get(j, []))
