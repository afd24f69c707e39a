"""A fanout plugin for a test that runs ``fanout run`` in a process of its own: it holds the
run after a chosen batch until the test opens a gate, so what the test does meanwhile (a
service brought back) lands between two known batches, not wherever the run has got to
(which, on a loaded machine, may be its end).

Named in the pipeline file (``plugins = ["tests.integration.hold_after_batch"]``, the
repository on the process's ``PYTHONPATH``) and set by its environment:
``FANOUT_TEST_HOLD_AFTER=BATCH:GATE`` holds the run in ``fanout_batch_end`` of batch
``BATCH`` (every sink written and marked, before Spark commits the batch) until the file
``GATE`` exists, at most :data:`WAIT_S`. Unset, it does nothing.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from fanout import BatchInfo, SinkResult, hookimpl

ENV = "FANOUT_TEST_HOLD_AFTER"
"""The environment variable saying which batch to hold the run after, and the gate file."""

WAIT_S = 300.0
"""How long a run waits for its gate (a test that failed before opening it: the run goes
on, and the test's own assertions say what went wrong)."""


@hookimpl
def fanout_batch_end(info: BatchInfo, results: Mapping[str, SinkResult]) -> None:
    """Hold the run after the batch :data:`ENV` names until its gate file exists."""
    held = os.environ.get(ENV)
    if not held:
        return
    batch, _, gate = held.partition(":")
    if info.batch_id != int(batch):
        return
    print(f"held after batch {batch} until {gate} exists", file=sys.stderr, flush=True)
    deadline = time.monotonic() + WAIT_S
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
