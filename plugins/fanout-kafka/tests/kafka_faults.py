"""Faults injected through the documented per-partition commit hooks
(``fanout_partition_commit``, ``fanout_partition_committed``); product code has no test
branches.

Spark executors are separate Python processes: these plugins are pickled by value
(:func:`ship`) with the partition tasks, and they keep their state in files, not in memory.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from fanout import hookimpl
from fanout.contract.partitions import PartitionCommit
from fanout.errors import TransientSinkError

KILL_EXIT_CODE = 137


def ship() -> None:
    """Pickle this module's classes by value, so executors need not import it."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


class VetoOnce:
    """Vetoes partition ``partition`` of batch ``batch`` once, after its records were
    delivered and before its commit: an aborted attempt. Records what it vetoed in
    ``state`` (JSON)."""

    def __init__(self, *, batch: int, partition: int, state: str) -> None:
        self.veto_batch, self.veto_partition, self.state = batch, partition, state

    @hookimpl
    def fanout_partition_commit(self, commit: PartitionCommit) -> None:
        """Abort the chosen partition's first attempt with a transient error."""
        state = Path(self.state)
        chosen = (commit.batch_id, commit.partition) == (self.veto_batch, self.veto_partition)
        if chosen and not state.exists():
            state.write_text(json.dumps({"batch": commit.batch_id, "partition": commit.partition,
                                         "records": commit.written}))  # fmt: skip
            raise TransientSinkError("injected veto before commit", sink=commit.sink,
                                     batch_id=commit.batch_id)  # fmt: skip


class KillDriver:
    """SIGKILLs the driver (pid ``driver_pid``) right after partition ``partition`` of
    batch ``batch`` committed, then exits this worker: a driver dying between the
    partitions' commits."""

    def __init__(self, *, batch: int, partition: int, driver_pid: int) -> None:
        self.kill_batch, self.kill_partition, self.driver_pid = batch, partition, driver_pid

    @hookimpl
    def fanout_partition_committed(self, commit: PartitionCommit) -> None:
        """Kill the driver after the chosen partition's commit."""
        if (commit.batch_id, commit.partition) == (self.kill_batch, self.kill_partition):
            print(f"KILL after batch {commit.batch_id} partition {commit.partition}",
                  file=sys.stderr, flush=True)  # fmt: skip
            os.kill(self.driver_pid, signal.SIGKILL)
            os._exit(KILL_EXIT_CODE)
