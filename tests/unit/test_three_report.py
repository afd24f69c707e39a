"""bench/three_report.py: the three-sink benchmark's target ratios, from one run per variant
(the best runs, or one round's), and their medians over rounds (no Spark here)."""

from __future__ import annotations

import pytest

from tests.unit.bench_modules import load_bench

common, report = load_bench("common", "three_report")
Run, Ratios = common.Run, report.Ratios
SINGLES = ("s_delta", "s_pg", "s_kafka")


def _runs(a_seconds: float, a_p50: float, kafka_p50: float) -> dict[str, object]:
    def run(variant: str, seconds: float, p50: float) -> object:
        return Run(variant, seconds, [p50 - 10, p50, p50 + 10])

    return {
        "s_source": run("s_source", 2.0, 150),
        "s_delta": run("s_delta", 2.5, 250),
        "s_pg": run("s_pg", 4.5, 450),
        "s_kafka": run("s_kafka", 5.6, kafka_p50),
        "a": run("a", a_seconds, a_p50),
        "b": run("b", 10.0, 800),
        "c": run("c", 12.0, 1200),
    }


# CPU seconds: the least a fan-out needs is min(a 12, b - 2 x source = 14, singles - 2 x
# source = 16) = 12, so no run on 2 cores ends before 6 s
OURS = {"s_source": 3.0, "s_delta": 4.0, "s_pg": 7.0, "s_kafka": 11.0, "a": 12.0, "b": 20.0,
        "c": 13.0}  # fmt: skip


def test_ratios_of_one_run_per_variant() -> None:
    found, top = report.ratios(_runs(7.5, 700, 560), OURS, SINGLES, 2, 10)  # type: ignore[attr-defined]
    assert top.least_cpu == 12.0 and top.fastest_a == 6.0
    assert found == Ratios(
        a_b=10.0 / 7.5, a_b_ceiling=10.0 / 6.0, a_c=12.0 / 7.5, latency=700 / 560,
        efficiency=6.0 / 7.5, slowest="s_kafka",
    )  # fmt: skip
    assert found.line() == (
        "ratio_a_b=1.333 ratio_a_b_ceiling=1.667 ratio_a_c=1.600 latency_vs_slowest=1.250 "
        "efficiency=0.800"
    )


def test_the_latency_is_against_the_slowest_single_sink_of_the_same_runs() -> None:
    found, _ = report.ratios(_runs(7.5, 700, 400), OURS, SINGLES, 2, 10)  # type: ignore[attr-defined]
    assert (found.slowest, found.latency) == ("s_pg", pytest.approx(700 / 450))


def test_median_ratios_takes_each_ratio_s_median() -> None:
    rounds = [
        Ratios(1.3, 1.6, 1.5, 1.30, 0.85, "s_kafka"),
        Ratios(1.4, 1.5, 1.4, 1.22, 0.88, "s_kafka"),
        Ratios(1.0, 1.7, 1.6, 1.35, 0.80, "s_pg"),
    ]
    assert report.median_ratios(rounds) == Ratios(1.3, 1.6, 1.5, 1.30, 0.85, "s_kafka")  # type: ignore[attr-defined]


def test_the_latency_ceiling_leaves_out_only_what_a_spent_outside_its_batches() -> None:
    runs = _runs(7.5, 700, 560)
    runs["a"] = Run("a", 7.2, [700.0] * 10)
    _, top = report.ratios(runs, OURS, SINGLES, 2, 10)  # type: ignore[attr-defined]
    # 12 CPU s, at most 2 cores x (7.2 - 7.0 s) of it outside a's batches: 11.6 CPU s in 10
    # batches on 2 cores is 0.58 s a batch at least, against s_kafka's mean of 0.56 s
    assert top.latency == pytest.approx(0.58 / 0.56)


def test_the_source_alone_s_idle_is_added_to_the_floor() -> None:
    # s_source ran 2.0 s on 2 cores for 3.0 CPU s: it left 1.0 core-s idle, so a fan-out
    # idling as much ends no sooner than 6.0 + 1.0 / 2 = 6.5 s
    best = _runs(7.5, 700, 560)
    _, top = report.ratios(best, OURS, SINGLES, 2, 10)  # type: ignore[attr-defined]
    idle = report.with_source_idle(best, OURS, top, 2)  # type: ignore[attr-defined]
    assert idle == report.SourceIdle(  # type: ignore[attr-defined]
        idle=1.0, fastest_a=6.5, a_b=10.0 / 6.5, efficiency=6.5 / 7.5
    )
