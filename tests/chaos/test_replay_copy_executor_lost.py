"""An executor lost while a replay reads its local-checkpointed copy of the batch (the
kit's ``snapshot``, taken when committed partitions are skipped): Spark cannot recompute
the copy, so the attempt fails (transient, saying so) with nothing more committed, and the
next attempt, on the executors Spark relaunched, takes a new copy and completes the batch
exactly once. On ``local-cluster`` (executor JVMs that can be SIGKILLed): the outer test
asks for the inner one's outcome in the suite's nested pytest with
``FANOUT_TEST_MASTER=cluster`` (conftest.local_cluster_run, one cluster start for the
tests that need one)."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fanout.errors import TransientSinkError
from tests.chaos.executor_kills import executors_of
from tests.integration.kit_route_sink import read_rows
from tests.integration.test_kit_replay_copy import ROWS, Copies, half_written, released

ON_CLUSTER = os.environ.get("FANOUT_TEST_MASTER") == "cluster"
INNER = (
    "tests/chaos/test_replay_copy_executor_lost.py::"
    "test_on_cluster_an_executor_lost_under_the_replays_copy"
)
ON_LOCAL_CLUSTER = [INNER]
"""Run in the suite's nested pytest on ``local-cluster`` (conftest.local_cluster_run),
after the Delta tests (conftest.SERIAL_HEAVY orders them so): it kills every executor."""


def kill_executors(copy: Any) -> None:
    """SIGKILL every executor JVM of this driver (the copy's blocks are on them)."""
    pids = executors_of(os.getpid())
    assert pids, "no executor JVM: not on local-cluster?"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(pid in executors_of(os.getpid()) for pid in pids):
        assert time.monotonic() < deadline, "the executors did not die"
        time.sleep(0.1)


@pytest.mark.skipif(not ON_CLUSTER, reason="needs FANOUT_TEST_MASTER=cluster (the outer test)")
def test_on_cluster_an_executor_lost_under_the_replays_copy(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink, replay, out = half_written(spark, tmp_path)
    kept = len(read_rows(out))
    copies = Copies(spark, monkeypatch, kill_executors)
    with pytest.raises(TransientSinkError) as lost:
        sink.write(replay)
    assert "CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND" in str(lost.value)
    assert "the next attempt takes a new copy of the batch" in str(lost.value)
    assert len(read_rows(out)) == kept < len(ROWS)
    result = sink.write(replace(replay, attempt=3))  # on the relaunched executors
    assert len(copies.ids) == 2 and released(spark, copies.ids[1])
    assert result.details["written"] == len(ROWS) - kept
    assert sorted((r["id"], r["v"]) for r in read_rows(out)) == ROWS


def test_an_executor_lost_during_a_replay_fails_it_and_the_next_takes_a_new_copy(
    local_cluster_run: Any,
) -> None:
    run = local_cluster_run
    assert run.outcomes([INNER]) == [("PASSED", INNER)], run.tail()
