#!/usr/bin/env python
"""bench_three_sinks with every run's driver-side calls counted: Kafka clients' methods,
SQL statements (SQLAlchemy), Delta log reads (deltalake), Spark jobs and stages, and the
PostgreSQL server's transactions and rows (``pg_stat_database``: every process's).

    python bench/count_calls.py [bench_three_sinks' arguments]
    e.g. --rows 20000 --files 10 --variants s_kafka,a --repeat 1 --warmup-rounds 0

Counts do not depend on the machine's load, as times do: run it on two commits (each with
its own worktree on PYTHONPATH) and compare the lists to find a round trip, a log read or a
Spark job added per batch (a count that grows by the batch count), or per run (by one).
The executors' own calls (a partition's transaction) are not counted, except through the
PostgreSQL server's numbers. Times are printed beside the counts (load-dependent)."""

from __future__ import annotations

import collections
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

COUNTS: collections.Counter[str] = collections.Counter()
SECONDS: collections.defaultdict[str, float] = collections.defaultdict(float)
LOCK = threading.Lock()


def note(key: str, seconds: float) -> None:
    """Count one call of ``key`` that took ``seconds``."""
    with LOCK:
        COUNTS[key] += 1
        SECONDS[key] += seconds


def timed(key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, counted under ``key``."""

    def call(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            note(key, time.perf_counter() - t0)

    return call


def wrap_client(module: Any, name: str) -> None:
    """Replace the C client class ``module.name`` (immutable: cannot be patched) by a
    proxy counting its construction and every public method call."""
    base = getattr(module, name)

    class Counted:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._inner = timed(f"{name}()", base)(*args, **kwargs)

        def __enter__(self) -> Counted:
            self._inner.__enter__()
            return self

        def __exit__(self, *exc: object) -> Any:
            return self._inner.__exit__(*exc)

        def __len__(self) -> int:
            return len(self._inner)

        def __getattr__(self, attr: str) -> Any:
            value = getattr(self._inner, attr)
            return timed(f"{name}.{attr}", value) if callable(value) else value

    Counted.__name__ = name
    setattr(module, name, Counted)


def patch_class(cls: Any, label: str, methods: list[str]) -> None:
    """Count ``methods`` of the Python class ``cls`` in place (its identity kept: the
    admin client's ``super(AdminClient, self)`` needs it)."""
    for method in methods:
        original = getattr(cls, method, None)
        if callable(original):
            key = f"{label}()" if method == "__init__" else f"{label}.{method}"
            setattr(cls, method, timed(key, original))


def install() -> None:
    """Patch the clients the driver uses."""
    import confluent_kafka
    import confluent_kafka.admin
    import deltalake
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    for name in ("Consumer", "Producer"):
        wrap_client(confluent_kafka, name)
    admin = confluent_kafka.admin.AdminClient
    patch_class(admin, "AdminClient", ["__init__", *(m for m in dir(admin) if m[0] != "_")])
    delta_methods = ["__init__", "history", "update_incremental", "version",
                     "transaction_version", "load_as_version"]  # fmt: skip
    patch_class(deltalake.DeltaTable, "DeltaTable", delta_methods)

    @event.listens_for(Engine, "before_cursor_execute")
    def _before(conn: Any, *_: Any) -> None:
        conn.info["fanout_count_t0"] = time.perf_counter()

    @event.listens_for(Engine, "after_cursor_execute")
    def _after(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        t0 = conn.info.pop("fanout_count_t0", time.perf_counter())
        note("SQL " + " ".join(statement.split())[:70], time.perf_counter() - t0)


def pg_stats(services: Any) -> tuple[int, ...]:
    """The server's transactions and rows so far (all backends)."""
    import sqlalchemy as sa

    sql = (
        "SELECT xact_commit, tup_returned, tup_fetched, tup_inserted, tup_deleted, "
        "tup_updated FROM pg_stat_database WHERE datname = current_database()"
    )
    with services.engine.connect() as conn:
        return tuple(conn.execute(sa.text(sql)).one())


def main() -> int:
    install()
    import bench_three_sinks as bench

    def counted_run(variant: str, ctx: Any, services: Any) -> Any:
        services.fresh_broker()
        before = pg_stats(services)
        dag = ctx.spark.sparkContext._jsc.sc().dagScheduler()
        jobs, stages = dag.nextJobId(), dag.nextStageId()
        with LOCK:
            COUNTS.clear()
            SECONDS.clear()
        run = bench.RUNNERS[variant](ctx, services)
        jobs, stages = dag.nextJobId() - jobs, dag.nextStageId() - stages
        time.sleep(0.6)  # the statistics collector's delay
        after = pg_stats(services)
        with LOCK:
            counts, seconds = dict(COUNTS), dict(SECONDS)
        print(f"COUNT {variant}: {len(run.batch_ms)} batches, {run.seconds:.2f} s, Spark jobs "
              f"{jobs}, stages {stages}", flush=True)  # fmt: skip
        deltas = [a - b for a, b in zip(after, before, strict=True)]
        print(f"  PostgreSQL server (xacts, returned, fetched, inserted, deleted, updated): "
              f"{deltas}")  # fmt: skip
        for key in sorted(counts, key=lambda k: (-counts[k], k)):
            print(f"  {counts[key]:5d} {1000 * seconds[key]:9.1f} ms  {key}")
        return run

    bench.run_on_fresh_broker = counted_run
    sys.argv[0] = "bench_three_sinks.py"
    return bench.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
