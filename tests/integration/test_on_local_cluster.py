"""The Delta sink's executor-side tests again, on ``local-cluster`` (two executor JVMs,
other processes than the driver, each with its own Python workers): a path, a credential
or a state only the driver holds would fail there. They run in a pytest of their own
(one SparkSession per process), whose ``spark`` fixture starts the cluster because
``FANOUT_TEST_MASTER=cluster`` (conftest.py), beside the other tests' cluster runs
(conftest.local_cluster_run: one cluster start); any test can be run that way by hand."""

from __future__ import annotations

from typing import Any

MODULES = [
    "plugins/fanout-delta/tests/test_delta_distributed.py",
    "plugins/fanout-delta/tests/test_delta_object_store.py",
]
SAME_ON_ANY_MASTER = [
    "plugins/fanout-delta/tests/test_delta_distributed.py::"
    "test_driver_killed_before_the_commit_then_restarted_writes_every_row_once",
]
"""Tests whose work runs in a driver subprocess on ``local[2]`` whatever the session's
master: on the cluster they would repeat the same run (~75 s of CI)."""
ON_LOCAL_CLUSTER = [*(f"--deselect={test}" for test in SAME_ON_ANY_MASTER), *MODULES]


def test_the_delta_executor_tests_pass_on_local_cluster(local_cluster_run: Any) -> None:
    """Every test of :data:`MODULES` passed there but those deselected: the run ended
    normally, its summary names an outcome for every test it selected, and for these
    modules, PASSED only (a skip, a failure or a module that failed to import would be
    named with its file)."""
    run = local_cluster_run
    assert run.finished(), run.tail()
    deselected, selected = run.selected()
    assert deselected == len(SAME_ON_ANY_MASTER), run.tail()  # every deselection matched
    assert len(run.outcomes()) == selected, run.tail()
    outcomes = run.outcomes(MODULES)
    assert outcomes and {outcome for outcome, _ in outcomes} == {"PASSED"}, run.tail()
    assert not set(SAME_ON_ANY_MASTER) & {test for _, test in outcomes}
