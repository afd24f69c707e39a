"""A plugin that kills the driver right after a chosen partition of a batch committed.

It implements the documented per-partition hook ``fanout_partition_committed`` (called on
the executor right after each partition's transaction commits); the product code has no
test-only branch. The plugin is pickled to the executors with the partition tasks, so
this module must be importable there: the crash test puts the repository on
``PYTHONPATH``.
"""

from __future__ import annotations

import os
import signal

from fanout import hookimpl
from fanout.contract.partitions import PartitionCommit


class KillAfterPartition:
    """SIGKILLs the driver's process group (driver, JVM, Python workers: the whole
    machine, as far as the job is concerned) as soon as the first partition of batch
    ``batch`` committed, so the other partitions of that batch cannot finish."""

    def __init__(self, *, driver_pid: int, batch: int, note: str) -> None:
        self.driver_pid, self.kill_batch, self.note = driver_pid, batch, note

    @hookimpl
    def fanout_partition_committed(self, commit: PartitionCommit) -> None:
        """Kill the driver: this partition is committed, the batch is not marked."""
        if commit.batch_id == self.kill_batch:
            # the worker's stderr goes through the JVM, which dies too: note it in a file
            with open(self.note, "w") as note:
                note.write(
                    f"KILL driver after batch {commit.batch_id} partition {commit.partition}\n"
                )
            os.killpg(os.getpgid(self.driver_pid), signal.SIGKILL)
