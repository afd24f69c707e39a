"""Kafka sinks with faults, through the sink's documented executor-side extension points
(``before_commit``, ``on_partition_committed``); product code has no test branches.

Spark executors are separate Python processes: these classes are pickled by value
(:func:`ship`), and they keep their state in files, not in memory.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from fanout_kafka import KafkaSink

from fanout.errors import TransientSinkError

KILL_EXIT_CODE = 137


def ship() -> None:
    """Pickle this module's classes by value, so executors need not import it."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


class VetoOnceSink(KafkaSink):
    """Vetoes partition ``partition`` of batch ``batch`` once, after its records were
    delivered and before its commit: an aborted attempt. Records what it vetoed in
    ``state`` (JSON)."""

    def __init__(self, name: str, *, batch: int, partition: int, state: str, **options: Any):
        super().__init__(name, **options)
        self.veto_batch, self.veto_partition, self.state = batch, partition, state

    def before_commit(self, batch_id: int, partition: int, records: int) -> None:
        """Abort the chosen partition's first attempt with a transient error."""
        state = Path(self.state)
        if (batch_id, partition) == (self.veto_batch, self.veto_partition) and not state.exists():
            state.write_text(json.dumps({"batch": batch_id, "partition": partition,
                                         "records": records}))  # fmt: skip
            raise TransientSinkError("injected veto before commit", sink=self.name,
                                     batch_id=batch_id)  # fmt: skip


class KillDriverSink(KafkaSink):
    """SIGKILLs the driver (pid ``driver_pid``) right after partition ``partition`` of
    batch ``batch`` committed, then exits this worker: a driver dying between the
    partitions' commits."""

    def __init__(
        self, name: str, *, batch: int, partition: int, driver_pid: int, **options: Any
    ) -> None:
        super().__init__(name, **options)
        self.kill_batch, self.kill_partition, self.driver_pid = batch, partition, driver_pid

    def on_partition_committed(self, batch_id: int, partition: int, records: int) -> None:
        """Kill the driver after the chosen partition's commit."""
        if (batch_id, partition) == (self.kill_batch, self.kill_partition):
            print(f"KILL after batch {batch_id} partition {partition}", file=sys.stderr,
                  flush=True)  # fmt: skip
            os.kill(self.driver_pid, signal.SIGKILL)
            os._exit(KILL_EXIT_CODE)
