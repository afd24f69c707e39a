"""bench_three_sinks' report: percentiles, and the ceilings any fan-out on this machine
can reach, printed beside the measured ratios."""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    Run,
)

RATIO_A_C_MIN = 1.5  # a/c: fanout against one foreachBatch writing the sinks in turn
A_B_SHARE_OF_CEILING = 0.9  # a/b: against the ceiling this machine allows (see ceilings)
LATENCY_MAX = 1.2  # a's p50 batch time / the slowest single sink's
EFFICIENCY_MIN = 0.85  # the fastest a could end (CPU floor / cores) / a's time


@dataclass(frozen=True)
class Ceilings:
    """What any fan-out of these sinks could reach on this machine (see :func:`ceilings`).

    :param least_cpu: the least CPU seconds a fan-out of the three sinks needs.
    :param fastest_a: ``least_cpu`` spread over every core: no run ends sooner (s).
    :param a_b: the best a/b, ``b``'s time / ``fastest_a``.
    :param a_c: the best a/c.
    :param latency: the least mean batch time of a / of the slowest single sink's.
    :param slowest: that single sink's variant.
    """

    source_cpu: float
    least_cpu: float
    fastest_a: float
    a_b: float
    a_c: float
    latency: float
    slowest: str


@dataclass(frozen=True)
class Ratios:
    """The target ratios of one set of runs (each variant's best, or one round's)."""

    a_b: float
    a_b_ceiling: float
    a_c: float
    latency: float
    efficiency: float
    slowest: str
    """The single sink whose p50 the latency is measured against."""

    def line(self) -> str:
        """The machine-readable form, as the benchmark's last line."""
        return (
            f"ratio_a_b={self.a_b:.3f} ratio_a_b_ceiling={self.a_b_ceiling:.3f} "
            f"ratio_a_c={self.a_c:.3f} latency_vs_slowest={self.latency:.3f} "
            f"efficiency={self.efficiency:.3f}"
        )


def ratios(
    runs: dict[str, Run], ours: dict[str, float], singles: tuple[str, ...], cores: int, files: int
) -> tuple[Ratios, Ceilings]:
    """The target ratios of ``runs`` (one run per variant, ``ours`` their CPU seconds) and
    the ceilings they are held against."""
    top = ceilings(runs, ours, singles, cores, files)
    p50 = {v: percentile(runs[v].batch_ms, 0.5) for v in ("a", *singles)}
    slowest = max(singles, key=lambda v: p50[v])
    found = Ratios(
        a_b=runs["b"].seconds / runs["a"].seconds,
        a_b_ceiling=top.a_b,
        a_c=runs["c"].seconds / runs["a"].seconds,
        latency=p50["a"] / p50[slowest],
        efficiency=top.fastest_a / runs["a"].seconds,
        slowest=slowest,
    )
    return found, top


def median_ratios(found: list[Ratios]) -> Ratios:
    """Each ratio's median over ``found`` (the ceiling's too; ``slowest``: the most common)."""
    return Ratios(
        a_b=statistics.median(r.a_b for r in found),
        a_b_ceiling=statistics.median(r.a_b_ceiling for r in found),
        a_c=statistics.median(r.a_c for r in found),
        latency=statistics.median(r.latency for r in found),
        efficiency=statistics.median(r.efficiency for r in found),
        slowest=statistics.mode(r.slowest for r in found),
    )


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


def ceilings(
    best: dict[str, Run], ours: dict[str, float], singles: tuple[str, ...], cores: int, files: int
) -> Ceilings:
    """The best ratios any fan-out of these sinks could reach on this machine.

    A fan-out reads the source once and still does every sink's work: at least
    ``CPU(b) - 2 x CPU(s_source)`` (b reads and parses it three times, a once and caches
    it, which only adds), and at least the same from the single-sink runs (each reads it
    once). The smallest of these and a's own CPU is taken (a's own when fanout already
    beat the estimate). No run on ``cores`` cores can end sooner than that CPU divided by
    the cores, which bounds a/b and a/c from above.
    For the batch time: a's batches do all of that CPU but what a spent outside them (its
    query's start and end), which is at most ``cores x`` a's time outside its batches; so
    a's mean batch takes at least the rest, spread over every core, divided by the batches.
    """
    source = ours["s_source"]
    least = min(ours["a"], ours["b"] - 2 * source, sum(ours[v] for v in singles) - 2 * source)
    fastest_a = least / cores
    slowest = max(singles, key=lambda v: statistics.fmean(best[v].batch_ms))
    slowest_mean = statistics.fmean(best[slowest].batch_ms) / 1000
    in_batches = max(0.0, least - cores * _outside_batches(best["a"]))  # a's batches' least CPU
    return Ceilings(
        source_cpu=source,
        least_cpu=least,
        fastest_a=fastest_a,
        a_b=best["b"].seconds / fastest_a,
        a_c=best["c"].seconds / fastest_a,
        latency=in_batches / cores / files / slowest_mean,
        slowest=slowest,
    )


@dataclass(frozen=True)
class SourceIdle:
    """The ceilings again, counting the idle the source alone left (informational).

    :param idle: core-seconds the source alone, with no sink, left the cores idle: Spark's
        loop between batches (one thread) and its scan's last task running alone.
    :param fastest_a: the soonest a fan-out could end, idling as much and no more (s).
    :param a_b: ``b``'s time / that.
    :param efficiency: that / a's time.
    """

    idle: float
    fastest_a: float
    a_b: float
    efficiency: float


def with_source_idle(
    best: dict[str, Run], ours: dict[str, float], top: Ceilings, cores: int
) -> SourceIdle:
    """:func:`ceilings`' floor plus the idle of the source alone, spread over the cores.

    A fan-out's batch waits for Spark's loop and its scan as the source's does, and its
    sinks' tasks cannot start before the scan's last task ends: the source alone's idle is
    an estimate of what no fan-out avoids (its driver's work beside the scan may fill some
    of it, so an estimate, not a bound)."""
    idle = max(0.0, cores * best["s_source"].seconds - ours["s_source"])
    fastest = top.fastest_a + idle / cores
    return SourceIdle(
        idle=idle,
        fastest_a=fastest,
        a_b=best["b"].seconds / fastest,
        efficiency=fastest / best["a"].seconds,
    )


def _outside_batches(run: Run) -> float:
    """Seconds of ``run`` outside its batches that read rows: its query's start and end."""
    return max(0.0, run.seconds - sum(run.batch_ms) / 1000)


def print_ceilings(top: Ceilings, cores: int) -> None:
    """The ceilings, one line each."""
    print(
        f"\nceilings on this machine ({cores} cores shared by Spark, PostgreSQL and Kafka): "
        f"the source alone took {top.source_cpu:.1f} CPU s; a fan-out of the three sinks needs "
        f"at least {top.least_cpu:.1f} CPU s, so it cannot end in under {top.fastest_a:.2f} s"
    )
    print(f"  a/b <= {top.a_b:.3f}")
    reach = "reachable" if top.a_c >= RATIO_A_C_MIN else "OUT OF REACH"
    print(f"  a/c <= {top.a_c:.3f}   (target >= {RATIO_A_C_MIN}: {reach})")
    reach = "reachable" if top.latency <= LATENCY_MAX else "OUT OF REACH"
    print(
        f"  mean batch time of a / of the slowest single sink ({top.slowest}) >= "
        f"{top.latency:.3f}   (target <= {LATENCY_MAX} at p50: {reach})"
    )
