"""What the benchmarks share: the input generator, a run's context and result, starting
and timing streaming queries, verifying targets, the machine's load, the work directory."""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from deltawriter import Timings

PIPELINE = "bench"
TARGETS = 3
SCHEMA = "order_id BIGINT, customer STRING, amount DOUBLE, qty INT, status STRING, ts TIMESTAMP"
STATUSES = ("new", "paid", "shipped", "delivered", "cancelled", "refunded")


class BenchFailure(Exception):
    """A run lost, duplicated or failed to write rows: the numbers would mean nothing."""


def generate_input(directory: Path, rows: int, files: int, seed: int = 7) -> None:
    """``rows`` JSON lines in ``files`` files, order_id 0..rows-1 (unique)."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    base = datetime(2024, 1, 1, tzinfo=UTC)
    per_file = math.ceil(rows / files)
    for f in range(files):
        start, end = f * per_file, min(rows, (f + 1) * per_file)
        lines = []
        for i in range(start, end):
            ts = (base + timedelta(milliseconds=i * 37)).isoformat(timespec="milliseconds")
            lines.append(
                f'{{"order_id":{i},"customer":"cust_{rng.randrange(50_000):05d}",'
                f'"amount":{rng.random() * 500:.2f},"qty":{rng.randrange(1, 20)},'
                f'"status":"{STATUSES[rng.randrange(len(STATUSES))]}","ts":"{ts}"}}'
            )
        tmp = directory / f".part-{f:05d}.json.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.rename(directory / f"part-{f:05d}.json")  # the file source never sees half a file


def fresh_inputs(
    workdir: Path, rows: int, files: int, warm_rows: int, warm_files: int
) -> tuple[Path, Path]:
    """A benchmark's input, written afresh under ``workdir``: ``input`` (``rows`` rows in
    ``files`` files) and ``warmup-input`` (``warm_rows`` in ``warm_files``, other values);
    the runs of an earlier benchmark there (``runs``) are removed. Prints what it wrote.
    Returns the two directories."""
    source, warm = workdir / "input", workdir / "warmup-input"
    for d in (source, warm, workdir / "runs"):
        shutil.rmtree(d, ignore_errors=True)
    t0 = time.perf_counter()
    generate_input(source, rows, files)
    generate_input(warm, warm_rows, warm_files, seed=11)
    print(
        f"input: {rows} rows of JSON lines in {files} files under {source} "
        f"({sum(f.stat().st_size for f in source.iterdir()) / 1e6:.0f} MB, "
        f"generated in {time.perf_counter() - t0:.1f} s)"
    )
    return source, warm


@dataclass
class Run:
    variant: str
    seconds: float
    batch_ms: list[float]  # triggerExecution of every data batch of every query of the run
    timings: Timings = field(default_factory=Timings)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def batch_mean_ms(self) -> float:
        return statistics.fmean(self.batch_ms) if self.batch_ms else float("nan")


@dataclass
class Ctx:
    spark: Any
    source: Path
    rows: int
    root: Path  # where run directories are created
    keep: bool
    counter: int = 0

    def run_dir(self, name: str) -> Path:
        self.counter += 1
        path = self.root / f"{self.counter:02d}-{name}"
        path.mkdir(parents=True)
        return path


def start_query(
    spark: Any, source: Path, fn: Callable[[Any, int], object], checkpoint: Path
) -> Any:
    """A streaming query of the JSON files in ``source`` (:data:`SCHEMA`), one file a
    micro-batch, into ``foreachBatch(fn)``, ending once the files there now are read."""
    return (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .writeStream.foreachBatch(fn)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def _start(ctx: Ctx, fn: Callable[[Any, int], object], checkpoint: Path) -> Any:
    return start_query(ctx.spark, ctx.source, fn, checkpoint)


def _timed(ctx: Ctx, starters: Sequence[Callable[..., Any]]) -> tuple[float, list[Any]]:
    t0 = time.perf_counter()
    queries = [start() for start in starters]
    for q in queries:
        q.awaitTermination()
    elapsed = time.perf_counter() - t0
    for q in queries:
        if q.exception() is not None:
            raise BenchFailure(f"query {q.id} failed: {q.exception()}")
    return elapsed, queries


def _batch_ms(queries: list[Any]) -> list[float]:
    out = []
    for q in queries:
        for p in q.recentProgress:
            if p["numInputRows"] > 0:
                out.append(float(p["durationMs"]["triggerExecution"]))
    return out


def _last_batch_id(queries: list[Any]) -> int:
    return max(p["batchId"] for q in queries for p in q.recentProgress if p["numInputRows"] > 0)


def verify(paths: list[Path], n: int, variant: str) -> None:
    """Every target holds exactly rows 0..n-1, once each."""
    import pyarrow.compute as pc

    from fanout.delta_tables.io import read_delta

    for path in paths:
        ids = read_delta(str(path), columns=["order_id"]).column("order_id")
        rows, distinct = len(ids), pc.count_distinct(ids).as_py()
        lo, hi = (pc.min(ids).as_py(), pc.max(ids).as_py()) if rows else (None, None)
        if rows != n or distinct != n or lo != 0 or hi != n - 1:
            raise BenchFailure(
                f"variant {variant}: {path} holds {rows} rows, {distinct} distinct order_ids "
                f"(min {lo}, max {hi}); expected exactly {n} (0..{n - 1})"
            )


def _targets(run: Path) -> list[Path]:
    return [run / f"t{i}" for i in range(TARGETS)]


def _cleanup(ctx: Ctx, run: Path) -> None:
    if not ctx.keep:
        shutil.rmtree(run, ignore_errors=True)


def foreign_jvms() -> int:
    """Java processes on this machine that are not this benchmark's Spark driver."""
    count = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            comm, ppid = (
                stat[stat.index("(") + 1 : stat.rindex(")")],
                int(stat.rsplit(")", 1)[1].split()[1]),
            )
        except (OSError, ValueError, IndexError):
            continue
        if comm == "java" and ppid != os.getpid():
            count += 1
    return count


def report_load(load_before: float, foreign_before: int) -> None:
    """Print the load around the timed runs, warning when other work shared the CPU."""
    load_after, foreign_after = os.getloadavg()[0], foreign_jvms()
    print(
        f"1-min load average before/after the timed runs: {load_before:.2f} / {load_after:.2f} "
        f"on {os.cpu_count()} cores; other JVMs running before/after: {foreign_before} / "
        f"{foreign_after}"
        + (
            "  (WARNING: other work shared the CPU: numbers are noisy)"
            if foreign_before or foreign_after
            else ""
        )
    )


def interleaved_rounds(
    variants: Sequence[str],
    repeat: int,
    run: Callable[[str], Run],
    said: Callable[[str, Run], str],
) -> tuple[defaultdict[str, list[Run]], dict[str, Run]]:
    """The timed runs: ``repeat`` rounds of one ``run`` of each variant, every other round
    in reverse order (to spread any drift), each printed as ``  round N: `` followed by
    ``said(variant, run)``; then the load around them (:func:`report_load`). Returns every
    variant's runs and its fastest."""
    load_before, foreign_before = os.getloadavg()[0], foreign_jvms()
    runs: defaultdict[str, list[Run]] = defaultdict(list)
    for rep in range(repeat):
        order = variants if rep % 2 == 0 else tuple(reversed(variants))
        for variant in order:
            r = run(variant)
            runs[variant].append(r)
            print(f"  round {rep + 1}: {said(variant, r)}", flush=True)
    best = {v: min(rs, key=lambda r: r.seconds) for v, rs in runs.items()}
    report_load(load_before, foreign_before)
    return runs, best


def exit_on_sigterm() -> None:
    """Make SIGTERM (``kill``, ``timeout``) exit through Python, so a benchmark's cleanup runs:
    its embedded servers stop and its work directory goes. Killed without it, a benchmark
    left an embedded PostgreSQL server running its last statement for 20 minutes, slowing
    every benchmark after it."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


def run_with_workdir(
    args: argparse.Namespace, prefix: str, bench: Callable[[argparse.Namespace, Path], int]
) -> int:
    """Run ``bench`` in ``args.workdir`` (or a new temporary one, removed afterwards unless
    ``--keep``); a :class:`BenchFailure` becomes exit code 1, SIGTERM an exit that cleans
    up (:func:`exit_on_sigterm`)."""
    exit_on_sigterm()
    made_workdir = args.workdir is None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        return bench(args, workdir)
    except BenchFailure as exc:
        print(f"\nBENCHMARK FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if made_workdir and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        elif args.keep:
            print(f"(kept {workdir})", file=sys.stderr)  # stdout's last line stays the result


def _fanout(
    run: Path, ledger: Any, plugins: tuple[object, ...] = (), parallelism: int | None = None
) -> Any:
    from fanout import FanOut

    sinks = [
        {"type": "delta", "name": p.name, "path": str(p), "engine": "rs", "mode": "append"}
        for p in _targets(run)
    ]
    return FanOut(
        pipeline=PIPELINE, ledger=ledger, sinks=sinks, plugins=plugins, parallelism=parallelism
    )
