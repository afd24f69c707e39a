"""A sink that writes from the executors, on fanout's partitioned-sink kit: one JSON-lines
file per partition and batch, whose rename is the partition's commit."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fanout import Batch, ConfigurationError, SinkContext, hookimpl
from fanout.partitioned.membership import CommittedPartition, PartitionDigest, PartitionPlan
from fanout.partitioned.outcome import PartitionOutcome
from fanout.partitioned.replay_route import route_mark
from fanout.partitioned.sink import PartitionedSink
from fanout.partitioned.task import CommitHooks


@dataclass(frozen=True)
class FileWriter:
    """Pickled to the executors: configuration only; it opens what it writes itself."""

    directory: str
    token: str  # the batch's idempotency token: a replay gets the same, a new epoch not
    plan: PartitionPlan
    route: str  # the batch's route (route_mark): the kit refuses a replay under another

    def write_partition(self, partition: int, batches: Iterator[Any], hooks: CommitHooks,
                        digest: Any) -> PartitionOutcome:  # fmt: skip
        rows = [row for batch in batches for row in batch.to_pylist()]
        final = Path(self.directory) / f"{self.token}-p{partition:03d}.jsonl"
        if final.exists():  # committed by an earlier attempt: a replay skips it
            return PartitionOutcome(partition, "skipped", rows=len(rows))
        if not rows:
            return PartitionOutcome(partition, "empty")
        mark = {"partitions": self.plan.partitions, "fingerprint": self.plan.fingerprint,
                "rows": digest.rows, "checksum": digest.checksum, "route": self.route}  # fmt: skip
        lines = [json.dumps(mark)] + [json.dumps(row, default=str) for row in rows]
        tmp = final.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        hooks.before(partition, len(rows), len(rows))
        os.replace(tmp, final)  # the partition's commit: atomic
        hooks.after(partition, len(rows), len(rows))
        return PartitionOutcome(partition, "committed", rows=len(rows), written=len(rows))


class PartitionedFilesSink(PartitionedSink):
    """Each partition of each batch in one file, exactly once."""

    guarantees = ("transactional",)

    def __init__(self, name: str, *, directory: str = "", key: str = "id", partitions: int = 4,
                 dead_letter: str | None = None):  # fmt: skip
        super().__init__(name)
        self.directory, self.key, self.partitions = directory, key, partitions
        self.dead_letter = dead_letter  # where rows failing the sink's route go

    def open(self, context: SinkContext) -> None:
        super().open(context)  # the kit keeps the per-partition commit hooks
        if not self.directory:
            raise ConfigurationError(f"sink {self.name!r}: option 'directory' is required")

    def partitioned_by(self) -> list[str]:
        return [self.key]  # the kit hashes by it, and refuses it when not deterministic

    def partition_writer(self, batch: Batch, plan: PartitionPlan | None) -> FileWriter:
        assert plan is not None  # membership is kept: committed partitions are skipped
        # created at the first write, not in open() (docs/writing-sinks.md: open())
        Path(self.directory).mkdir(parents=True, exist_ok=True)
        return FileWriter(self.directory, batch.idempotency_key.token, plan, route_mark(batch))

    def committed_partitions(self, batch: Batch, plan: PartitionPlan) -> list[CommittedPartition]:
        """The marks of the partitions holding the batch (each file's first line). The kit
        refuses a replay whose partitions differ, or recorded another route, before the
        route's dead letters or any partition are written."""
        marks = []
        for path in sorted(Path(self.directory).glob(f"{batch.idempotency_key.token}-p*.jsonl")):
            with path.open() as file:
                mark = json.loads(file.readline())
            marks.append(CommittedPartition(
                int(path.stem.rsplit("-p", 1)[1]), mark["partitions"], mark["fingerprint"],
                PartitionDigest(mark["rows"], mark["checksum"]), route=mark["route"],
            ))  # fmt: skip
        return marks


@hookimpl
def fanout_sink_types() -> dict[str, type[PartitionedSink]]:
    """The sink types of this module (a plugin registers them under the `fanout` entry point)."""
    return {"partitioned_files": PartitionedFilesSink}
