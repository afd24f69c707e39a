"""bench/bench_kafka_encode.py: it encodes the benchmarks' own rows, checks the two paths
agree, and ends with its machine-readable line."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from tests.unit.bench_modules import load_bench


def test_its_rows_are_those_the_other_benchmarks_stream(tmp_path: Path) -> None:
    common, encode = load_bench("common", "bench_kafka_encode")
    common.generate_input(tmp_path, 40, 1)
    streamed = [json.loads(line) for line in (tmp_path / "part-00000.json").read_text().split()]
    rows = encode.bench_table(40).to_pylist()
    assert [r["order_id"] for r in rows] == list(range(40))
    for row, line in zip(rows, streamed, strict=True):
        assert {k: row[k] for k in ("order_id", "customer", "amount", "qty", "status")} == {
            k: line[k] for k in ("order_id", "customer", "amount", "qty", "status")
        }
        assert row["ts"] == datetime.fromisoformat(line["ts"])


def test_it_checks_the_records_and_ends_with_its_figures(
    capsys: pytest.CaptureFixture[str],
) -> None:
    (encode,) = load_bench("bench_kafka_encode")
    result = encode.main(["--rows", "3000", "--repeat", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert set(result) == {"encode_us_per_record", "row_us_per_record", "ratio_vs_row"}
    assert lines[-1] == " ".join(f"{k}={v:.3f}" for k, v in result.items())
    assert lines[-2].endswith("records equal")
    assert result["ratio_vs_row"] == pytest.approx(
        result["row_us_per_record"] / result["encode_us_per_record"]
    )
