"""tests/unit/bench_modules.py: a benchmark module loaded for a test leaves no trace."""

from __future__ import annotations

import sys

from tests.unit.bench_modules import BENCH, load_bench


def test_a_loaded_bench_module_leaves_neither_its_modules_nor_bench_on_the_path() -> None:
    (common,) = load_bench("common")
    assert common.SCHEMA.startswith("order_id BIGINT")
    # common put bench/ on sys.path and imported deltawriter from it
    assert not {"common", "deltawriter"} & set(sys.modules)
    assert str(BENCH) not in sys.path
