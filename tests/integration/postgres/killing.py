"""A postgres sink that kills the driver right after a chosen partition committed.

It uses the sink's documented observation point (``on_partition_committed``, called on
the executor after each partition's transaction commits); the product code has no
test-only branch. The sink is pickled to the executors, so this module must be importable
there: the crash test puts the repository on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from fanout_postgres import PartitionCommit, PostgresSink


class KillAfterPartition(PostgresSink):
    """SIGKILLs the driver's process group (driver, JVM, Python workers: the whole
    machine, as far as the job is concerned) as soon as the first partition of batch
    ``batch`` committed, so the other partitions of that batch cannot finish."""

    def __init__(
        self, name: str, *, driver_pid: int, batch: int, note: str, **options: Any
    ) -> None:
        super().__init__(name, **options)
        self.driver_pid, self.kill_batch, self.note = driver_pid, batch, note

    def on_partition_committed(self, commit: PartitionCommit) -> None:
        """Kill the driver: this partition is committed, the batch is not marked."""
        if commit.batch_id == self.kill_batch:
            # the worker's stderr goes through the JVM, which dies too: note it in a file
            with open(self.note, "w") as note:
                note.write(
                    f"KILL driver after batch {commit.batch_id} partition {commit.partition}\n"
                )
            os.killpg(os.getpgid(self.driver_pid), signal.SIGKILL)
