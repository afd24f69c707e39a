"""A run killed with SIGKILL in the middle of batch 0 of epoch 0, for the checkpoint-reset
tests: ``python kill_epoch_prefix.py <bootstrap> <topic> <pipeline> <prefix> [<epoch>]``
(epoch 0 by default; a later epoch's rows are keyed ``e<epoch>k<i>`` and ``e<epoch>x<i>``). Sink
``events`` (2 partitions, ``transactional_id_prefix`` ``<prefix>``) reads its markers
(recording its prefix); its two tasks run at once, as Spark runs them: partition 1's
produces its rows and waits before its commit, partition 0's commits meanwhile
(:data:`KEPT_ROWS`), and the process is killed: partition 1's transaction left open."""

from __future__ import annotations

import os
import signal
import sys
import threading
from dataclasses import replace

import pyarrow as pa
from fanout_kafka import KafkaSink
from fanout_kafka.transaction import PartitionWriter

from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.sink import SinkContext
from fanout.partitioned.membership import PartitionPlan

PLAN = PartitionPlan(2, (("id", "string"),))
KEPT_ROWS = [{"id": f"k{i}", "v": "kept"} for i in range(5)]
KILLED_ROWS = [{"id": f"x{i}", "v": "killed"} for i in range(3)]


class HoldBeforeCommit:
    """Commit hooks: once the records are produced, say so and wait (for the kill)."""

    def __init__(self) -> None:
        self.reached = threading.Event()

    def before(self, partition: int, rows: int, written: int) -> None:
        self.reached.set()
        threading.Event().wait(600)

    def after(self, partition: int, rows: int, written: int) -> None:
        pass


def main() -> None:
    bootstrap, topic, pipeline, prefix = sys.argv[1:5]
    epoch = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    tag = f"e{epoch}" if epoch else ""
    sink = KafkaSink("events", bootstrap_servers=bootstrap, topic=topic, key="id", value="v",
                     partitions=2, transactional_id_prefix=prefix)  # fmt: skip
    sink.open(SinkContext(pipeline))
    info = BatchInfo(pipeline, 0, epoch=epoch)
    batch = Batch(None, info, "events", txn_app_id(pipeline, "events", epoch))
    sink.committed_partitions(batch, PLAN)
    settings = replace(sink.settings(batch), plan=PLAN)
    hold = HoldBeforeCommit()
    killed = PartitionWriter(settings, 1, 0, hold)  # type: ignore[arg-type]
    rows = [pa.RecordBatch.from_pylist([{**r, "id": tag + r["id"]} for r in KILLED_ROWS])]
    threading.Thread(target=killed.run, args=(rows,), daemon=True).start()
    assert hold.reached.wait(60), "partition 1 never produced its rows"
    kept_rows = [{**r, "id": tag + r["id"]} for r in KEPT_ROWS]
    kept = PartitionWriter(settings, 0, 0).run([pa.RecordBatch.from_pylist(kept_rows)])
    assert kept.status == "committed", kept
    os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(3)  # not killed


if __name__ == "__main__":
    main()
