"""fanout.partitioned.worker_gc.collection_paused: the cyclic collector held off for a
block, and left as it was found."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from fanout.partitioned.worker_gc import collection_paused


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    if enabled:
        gc.enable()
    else:
        gc.disable()


def _collections() -> int:
    # Of every generation: a young generation's overflow collects an older one when that
    # one is due too, and then only the older generation's count moves.
    return sum(int(generation["collections"]) for generation in gc.get_stats())


def test_no_collection_runs_in_the_block_and_the_collector_is_back_after() -> None:
    gc.enable()
    before = _collections()
    with collection_paused():
        assert not gc.isenabled()
        kept = [[i] for i in range(20 * gc.get_threshold()[0])]  # lists: tracked objects
        assert _collections() == before
    assert gc.isenabled()
    more = [[i] for i in range(2 * gc.get_threshold()[0])]
    assert _collections() > before
    assert len(kept) + len(more) > 0


def test_an_error_in_the_block_enables_the_collector_again() -> None:
    gc.enable()
    with pytest.raises(ValueError, match="boom"), collection_paused():
        raise ValueError("boom")
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled() -> None:
    gc.disable()
    with collection_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()
