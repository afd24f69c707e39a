"""bench_three_sinks' measurements of the machine (CPU per process) and its checks: each
target holds exactly the input, once."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    BenchFailure,
    Ctx,
    _cleanup,
    _timed,
)
from common import verify as verify_delta
from kafka_count import count_once
from proc_cpu import (
    CLK,
    children_of,
    jit_cpu,
    proc_table,
    python_workers_cpu,
    spark_jvms,
    tree_cpu,
)
from three_services import Plan, Services


def _machine_cpu() -> float:
    """Busy CPU seconds of the whole machine (user, nice, system, irq, softirq, steal)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLK


def cpu_snapshot(services: Services) -> dict[str, float]:
    """CPU seconds used so far by each process group of this benchmark, and the machine."""
    table = proc_table()
    children = children_of(table)
    me = os.getpid()
    jvms = spark_jvms(table, children)
    return {
        "driver": table[me][2],
        "spark_jvm": sum(table[p][2] for p in jvms),
        "jit": sum(jit_cpu(p) for p in jvms),
        "py_workers": python_workers_cpu(table),
        "postgres": tree_cpu(table, children, services.pg_pid),
        "tansu": tree_cpu(table, children, services.kafka_pid),
        "machine": _machine_cpu(),
    }


def find_postmaster(data_dir: Path) -> int | None:
    """The embedded server's postmaster: a ``postgres`` process started on ``data_dir``
    whose parent is not one."""
    table = proc_table()
    for pid, (ppid, comm, *_rest) in table.items():
        if comm != "postgres" or table.get(ppid, (0, ""))[1] == "postgres":
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(data_dir) in cmdline:
            return pid
    return None


def timed(ctx: Ctx, services: Services, starters: Sequence[Callable[..., Any]]) -> tuple:
    """bench_core's ``_timed`` (first start to last termination), plus the CPU seconds
    each process group used meanwhile."""
    before = cpu_snapshot(services)
    seconds, queries = _timed(ctx, starters)
    after = cpu_snapshot(services)
    return seconds, queries, {k: after[k] - before[k] for k in before}


def verify_pg(services: Services, table: str, n: int, variant: str) -> None:
    from sqlalchemy import text

    with services.engine.connect() as conn:
        rows, distinct, lo, hi = conn.execute(
            text(
                "SELECT count(*), count(DISTINCT order_id), min(order_id), max(order_id) "
                f'FROM "{table}"'
            )
        ).one()
    if rows != n or distinct != n or (n and (lo != 0 or hi != n - 1)):
        raise BenchFailure(
            f"variant {variant}: PostgreSQL table {table} holds {rows} rows, {distinct} "
            f"distinct order_ids (min {lo}, max {hi}); expected exactly {n} (0..{n - 1})"
        )


def verify_kafka(services: Services, topic: str, n: int, variant: str) -> None:
    """The topic holds exactly ``n`` records once each (:func:`kafka_count.count_once`,
    which explains Tansu's stuck last stable offset): a run verified on the uncommitted
    read is listed in ``services.lso_stuck`` (printed with the results); any other
    shortfall or any extra record fails the run."""
    found = count_once(services.bootstrap, topic, n)
    if found.exact:
        return
    count = found.committed.count
    if found.lso_stuck:
        seen = f"read_committed saw {count:,} of {n:,}"
        services.lso_stuck.append(f"{variant}: {seen} ({found.detail})")
        print(
            f"  WARNING {variant}: Tansu served {count:,} of {n:,} committed records to "
            f"read_committed; read_uncommitted holds exactly {n:,}, once each (stuck last "
            "stable offset, see kafka_count)",
            flush=True,
        )
        return
    message = (
        f"variant {variant}: Kafka topic {topic} holds {count} committed records with "
        f"{len(found.committed.keys)} distinct keys; expected exactly {n} ({found.detail})"
    )
    raise BenchFailure(message)


def verify_ledger(ledger: Any, pipeline: str, sinks: list[str], last: int, variant: str) -> None:
    marks = ledger.last_committed(pipeline, sinks)
    if any(v != last for v in marks.values()):
        raise BenchFailure(f"variant {variant}: ledger marks {marks}, expected {last} each")


def verify_all(
    ctx: Ctx, services: Services, plan: Plan, kinds: tuple[str, ...], variant: str
) -> None:
    if "delta" in kinds:
        verify_delta([plan.delta_path], ctx.rows, variant)
    if "pg" in kinds:
        verify_pg(services, plan.table, ctx.rows, variant)
    if "kafka" in kinds:
        verify_kafka(services, plan.topic, ctx.rows, variant)


def finish(ctx: Ctx, services: Services, plan: Plan, kinds: tuple[str, ...]) -> None:
    if not ctx.keep:
        services.drop(
            [plan.table] if "pg" in kinds else [],
            [plan.topic, plan.marker_topic] if "kafka" in kinds else [plan.marker_topic],
        )
    _cleanup(ctx, plan.run)
