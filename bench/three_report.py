"""bench_three_sinks' report: percentiles, and the ceilings any fan-out on this machine
can reach, printed beside the measured ratios."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    Run,
)

TARGETS = {"a_b": 1.7, "a_c": 1.5}
LATENCY_MAX = 1.2


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return float("nan")
    data = sorted(values)
    pos = (len(data) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def mean_ms(values: list[float] | None) -> str:
    return f"{1000 * statistics.fmean(values):7.0f}" if values else f"{'-':>7}"


def print_ceilings(
    best: dict[str, Run], ours: dict[str, float], singles: tuple[str, ...], cores: int, files: int
) -> None:
    """The best ratios any fan-out of these sinks could reach on this machine.

    A fan-out reads the source once and still does every sink's work: at least
    ``CPU(b) - 2 x CPU(s_source)`` (b reads and parses it three times, a once and caches
    it, which only adds), and at least the same from the single-sink runs (each reads it
    once). The smallest of these and a's own CPU is taken (a's own when fanout already
    beat the estimate). No run on ``cores`` cores can end sooner than that CPU divided by
    the cores, which bounds a/b and a/c from above.
    For the batch time, the source's whole CPU (query start included) is left out too, so
    that bound stays below anything a run could do within its batches.
    """
    source = ours["s_source"]
    least = min(ours["a"], ours["b"] - 2 * source, sum(ours[v] for v in singles) - 2 * source)
    fastest_a = least / cores
    slowest = max(singles, key=lambda v: statistics.fmean(best[v].batch_ms))
    slowest_mean = statistics.fmean(best[slowest].batch_ms) / 1000
    print(
        f"\nceilings on this machine ({cores} cores shared by Spark, PostgreSQL and Kafka): "
        f"the source alone took {source:.1f} CPU s; a fan-out of the three sinks needs at "
        f"least {least:.1f} CPU s, so it cannot end in under {fastest_a:.2f} s"
    )
    for key, target in TARGETS.items():
        ceiling = best[key[2]].seconds / fastest_a
        verdict = "reachable" if ceiling >= target else "OUT OF REACH"
        print(f"  a/{key[2]} <= {ceiling:.3f}   (target >= {target}: {verdict})")
    floor = (least - source) / cores / files / slowest_mean
    verdict = "reachable" if floor <= LATENCY_MAX else "OUT OF REACH"
    print(
        f"  mean batch time of a / of the slowest single sink ({slowest}) >= {floor:.3f}   "
        f"(target <= {LATENCY_MAX} at p50: {verdict})"
    )
