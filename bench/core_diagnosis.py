"""bench_core's instrumented run of variant (a): where a batch's time goes, measured by
wrapping the ledger and the batch DataFrame and with an observer plugin (fanout itself is
not modified)."""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


from common import (
    TARGETS,
    Ctx,
    Run,
    _batch_ms,
    _cleanup,
    _fanout,
    _start,
    _targets,
    _timed,
    verify,
)


class TimedLedger:
    """A Ledger that times every call of the ledger it wraps, per batch."""

    def __init__(self, inner: Any, diag: Diag) -> None:
        self.inner, self.diag = inner, diag

    def _timed(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.diag.add(what, time.perf_counter() - t0)

    def open(self) -> None:
        self.inner.open()

    def last_committed(self, pipeline: str, sinks: Any, epoch: int = 0) -> Any:
        return self._timed("ledger_plan", self.inner.last_committed, pipeline, list(sinks), epoch)

    def lookup(self, pipeline: str, sinks: Any) -> Any:
        return self._timed("ledger_lookup", self.inner.lookup, pipeline, list(sinks))

    def start_epoch(self, entry: Any) -> None:
        self._timed("ledger_epoch", self.inner.start_epoch, entry)

    def check_start(self, entry: Any) -> None:
        self._timed("ledger_epoch", self.inner.check_start, entry)

    def sink_names(self, pipeline: str) -> list[str]:
        return self._timed("ledger_scan", self.inner.sink_names, pipeline)  # type: ignore[no-any-return]

    def mark_committed(self, entry: Any) -> Any:
        return self._timed("ledger_mark", self.inner.mark_committed, entry)

    def record_failure(self, entry: Any) -> None:
        self._timed("ledger_failure", self.inner.record_failure, entry)

    def committed_entries(
        self, pipeline: str, min_batch_id: int = 0, epoch: int | None = None
    ) -> Any:
        return self._timed(
            "ledger_scan", self.inner.committed_entries, pipeline, min_batch_id, epoch
        )

    def epoch_owners(self, pipeline: str) -> Any:
        return self._timed("ledger_owners", self.inner.epoch_owners, pipeline)


class TimedDF:
    """Wraps a batch DataFrame so its toArrow (scan + JSON parse + conversion) is timed."""

    def __init__(self, df: Any, diag: Diag) -> None:
        self._df, self._diag = df, diag

    def toArrow(self) -> Any:
        t0 = time.perf_counter()
        table = self._df.toArrow()
        self._diag.add("to_arrow", time.perf_counter() - t0)
        return table

    def __getattr__(self, name: str) -> Any:
        return getattr(self._df, name)


class Diag:
    """Per-batch accumulators filled by the wrappers and by a fanout observer plugin."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.batches: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.current = -1
        self.t_call = 0.0

    def add(self, what: str, seconds: float) -> None:
        with self.lock:
            self.batches[self.current][what] += seconds

    # fanout observer hooks
    def fanout_batch_start(self, info: Any, pending: Any, skipped: Any) -> None:
        self.add("before_writes", time.perf_counter() - self.t_call)
        self.t_start = time.perf_counter()

    def fanout_sink_done(self, info: Any, sink: str, result: Any, duration_s: float) -> None:
        self.add("sink_sum", duration_s)
        with self.lock:
            b = self.batches[self.current]
            b["sink_max"] = max(b["sink_max"], duration_s)

    def fanout_batch_end(self, info: Any, results: Any) -> None:
        self.add("writes_wall", time.perf_counter() - self.t_start)


def _observer(diag: Diag) -> object:
    from fanout import hookimpl

    class Observer:
        @hookimpl
        def fanout_batch_start(self, info: Any, pending: Any, skipped: Any) -> None:
            diag.fanout_batch_start(info, pending, skipped)

        @hookimpl
        def fanout_sink_done(self, info: Any, sink: str, result: Any, duration_s: float) -> None:
            diag.fanout_sink_done(info, sink, result, duration_s)

        @hookimpl
        def fanout_batch_end(self, info: Any, results: Any) -> None:
            diag.fanout_batch_end(info, results)

    return Observer()


def diagnose_a(ctx: Ctx) -> tuple[Run, Diag]:
    from fanout.ledger.delta import DeltaLedger

    run = ctx.run_dir("a-diag")
    diag = Diag()
    ledger = TimedLedger(DeltaLedger(str(run / "ledger")), diag)
    fan = _fanout(run, ledger, plugins=(_observer(diag),))

    def timed_fan(df: Any, batch_id: int) -> None:
        diag.current = batch_id
        diag.t_call = time.perf_counter()
        fan(TimedDF(df, diag), batch_id)
        diag.add("foreach_batch", time.perf_counter() - diag.t_call)

    try:
        seconds, qs = _timed(ctx, [lambda: _start(ctx, timed_fan, run / "ckpt")])
    finally:
        fan.close()
    verify(_targets(run), ctx.rows, "a-diag")
    _cleanup(ctx, run)
    trig = {
        p["batchId"]: float(p["durationMs"]["triggerExecution"]) / 1000
        for q in qs
        for p in q.recentProgress
        if p["numInputRows"] > 0
    }
    for batch_id, t in trig.items():
        diag.batches[batch_id]["trigger"] = t
    return Run("a-diag", seconds, _batch_ms(qs)), diag


def print_diagnosis(run: Run, diag: Diag, best: dict[str, Run]) -> None:
    data = {b: v for b, v in diag.batches.items() if v.get("trigger")}
    n = len(data)

    def mean(key: str) -> float:
        return 1000 * statistics.fmean(v.get(key, 0.0) for v in data.values()) if n else 0.0

    arrow, sink_max, sink_sum = mean("to_arrow"), mean("sink_max"), mean("sink_sum")
    writes_wall, before, fb, trig = (
        mean("writes_wall"),
        mean("before_writes"),
        mean("foreach_batch"),
        mean("trigger"),
    )
    lookup, mark = mean("ledger_lookup"), mean("ledger_mark")
    after = fb - before - writes_wall
    print(
        f"\nWhere the time goes in (a): one more instrumented run ({run.seconds:.2f} s, "
        f"{n} batches), mean per batch:"
    )
    rows = [
        ("Spark batch (triggerExecution)", trig),
        ("  outside foreachBatch (plan source, offset/commit logs)", trig - fb),
        ("  foreachBatch = FanOut call", fb),
        ("    before writes: context (offsets file) + guard + plan", before),
        ("      of which ledger lookup (epoch, high water, marks)", lookup),
        ("    writes phase (3 sinks in parallel threads, wall)", writes_wall),
        ("      shared toArrow (scan + JSON parse + Arrow), once", arrow),
        ("      slowest sink write incl. waiting for toArrow", sink_max),
        ("      => slowest sink's own delta-rs work (txn check, write, reopen)", sink_max - arrow),
        ("      sum of 3 sinks' own delta-rs work", sink_sum - TARGETS * arrow),
        ("      ledger mark calls, sum of 3 (wait for sinks still writing, share 1 commit)", mark),
        ("    after writes (settle, hooks)", after),
    ]
    for label, ms in rows:
        print(f"  {label:<72} {ms:8.1f} ms")
    ledger_ms = lookup + mark
    print(
        f"  ledger calls per batch in total: {ledger_ms:.1f} ms of wall time in the calls "
        f"({ledger_ms / trig:.1%} of the batch; marks run in the sink threads, an early "
        "sink's mark waiting while the others write)"
    )
    for variant in ("d", "c", "b"):
        r = best.get(variant)
        if r is None or not r.timings.rows:
            continue
        a_s, w_s = r.timings.totals()
        calls = len(r.timings.rows)
        print(
            f"  ({variant}) per toArrow {1000 * a_s / calls:.1f} ms, per write "
            f"{1000 * w_s / calls:.1f} ms over {calls} target-batches"
        )
