"""A partition task killed with SIGKILL at a chosen point, for the dead-letter tests:
``python kill_partition.py <bootstrap> <topic> <pipeline> <delta path> <message.max.bytes>
<before_commit|after_commit>``. Writes partition 0 of batch 0 of sink ``events`` (rows
:data:`ROWS`, dead letters to the Delta table), and kills itself just before its Kafka
transaction commits, or right after it committed (before the letters are parked)."""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import replace

import pyarrow as pa
from fanout_kafka import KafkaSink
from fanout_kafka.transaction import PartitionWriter

from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.sink import SinkContext
from fanout.deadletters.delta import DeltaDeadLetters
from fanout.partitioned.membership import PartitionPlan

PLAN = PartitionPlan(1, (("id", "string"),))
SMALL = [f"s{i}" for i in range(4)]
MID, BIG = "mid", "big"  # ~1500 and ~3000 bytes
PAYLOAD = {MID: "m" * 1500, BIG: "b" * 3000}
ROWS = [{"id": k, "v": PAYLOAD.get(k, f"small-{k}")} for k in [*SMALL, MID, BIG]]


def open_sink(
    bootstrap: str, topic: str, pipeline: str, dead: DeltaDeadLetters, message_max_bytes: int
) -> KafkaSink:
    """The sink under test: its producer refuses records over ``message_max_bytes``, its
    encoder lets them through (``max_record_bytes``)."""
    sink = KafkaSink(
        "events", bootstrap_servers=bootstrap, topic=topic, key="id", value="v",
        partitions=1, max_record_bytes=100_000,
        producer={"message.max.bytes": message_max_bytes, "linger.ms": 0},
    )  # fmt: skip
    sink.open(SinkContext(pipeline, dead_letters=dead))
    return sink


def batch(pipeline: str) -> Batch:
    """Batch 0 of sink ``events``."""
    return Batch(None, BatchInfo(pipeline, 0), "events", txn_app_id(pipeline, "events"))


class Kill:
    """Commit hooks that SIGKILL the process at ``point``."""

    def __init__(self, point: str) -> None:
        self.point = point

    def before(self, partition: int, rows: int, written: int) -> None:
        if self.point == "before_commit":
            os.kill(os.getpid(), signal.SIGKILL)

    def after(self, partition: int, rows: int, written: int) -> None:
        if self.point == "after_commit":
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    bootstrap, topic, pipeline, path, max_bytes, point = sys.argv[1:7]
    sink = open_sink(bootstrap, topic, pipeline, DeltaDeadLetters(path), int(max_bytes))
    sink.committed_partitions(batch(pipeline), PLAN)
    settings = replace(sink.settings(batch(pipeline)), plan=PLAN)
    PartitionWriter(settings, 0, 0, Kill(point)).run([pa.RecordBatch.from_pylist(ROWS)])  # type: ignore[arg-type]
    sys.exit(3)  # not killed: the point was never reached


if __name__ == "__main__":
    main()
