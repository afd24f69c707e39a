"""A minimal sink on the partitioned-sink kit that records each partition's route only
through :attr:`CommittedPartition.route` (no ``check_replay`` of its own): one JSON file
per partition and batch, whose rename is the commit. Registered as ``route_recording``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fanout import Batch, SinkContext, hookimpl
from fanout.partitioned.membership import CommittedPartition, PartitionDigest, PartitionPlan
from fanout.partitioned.outcome import PartitionOutcome
from fanout.partitioned.replay_route import route_mark
from fanout.partitioned.sink import PartitionedSink
from fanout.partitioned.task import CommitHooks


@dataclass(frozen=True)
class MarkWriter:
    """Writes a partition's rows under the mark the kit reads back."""

    directory: str
    token: str
    plan: PartitionPlan
    route: str

    def write_partition(self, partition: int, batches: Iterator[Any], hooks: CommitHooks,
                        digest: Any) -> PartitionOutcome:  # fmt: skip
        """One file: ``{"mark": ..., "rows": [...]}``."""
        rows = [row for batch in batches for row in batch.to_pylist()]
        final = Path(self.directory) / f"{self.token}-{partition}.json"
        if final.exists():
            return PartitionOutcome(partition, "skipped", rows=len(rows))
        if not rows:
            return PartitionOutcome(partition, "empty")
        plan, found = self.plan, PartitionDigest(digest.rows, digest.checksum)
        mark = CommittedPartition(
            partition, plan.partitions, plan.fingerprint, found, route=self.route
        )
        tmp = final.with_suffix(".tmp")
        tmp.write_text(json.dumps({"mark": asdict(mark), "rows": rows}, default=str))
        hooks.before(partition, len(rows), len(rows))
        os.replace(tmp, final)
        return PartitionOutcome(partition, "committed", rows=len(rows), written=len(rows))


class RouteRecordingSink(PartitionedSink):
    """Each partition of each batch in one file; counts its reads of the committed
    partitions (``mark_reads``)."""

    guarantees = ("transactional",)

    def __init__(self, name: str, *, directory: str, partitions: int = 3,
                 dead_letter: str | None = None) -> None:  # fmt: skip
        super().__init__(name)
        self.directory, self.partitions, self.dead_letter = directory, partitions, dead_letter
        self.mark_reads = 0

    def open(self, context: SinkContext) -> None:
        """Keep the commit hooks; make the directory."""
        super().open(context)
        Path(self.directory).mkdir(parents=True, exist_ok=True)

    def partitioned_by(self) -> list[str]:
        """By ``id``."""
        return ["id"]

    def partition_writer(self, batch: Batch, plan: PartitionPlan | None) -> MarkWriter:
        """The batch's writer, recording its route."""
        assert plan is not None
        return MarkWriter(self.directory, batch.idempotency_key.token, plan, route_mark(batch))

    def committed_partitions(self, batch: Batch, plan: PartitionPlan) -> list[CommittedPartition]:
        """The marks of the batch's files."""
        self.mark_reads += 1
        found = sorted(Path(self.directory).glob(f"{batch.idempotency_key.token}-*.json"))
        marks = [json.loads(path.read_text())["mark"] for path in found]
        return [
            CommittedPartition(**{**m, "digest": PartitionDigest(**m["digest"])}) for m in marks
        ]


def read_rows(directory: Path) -> list[dict[str, Any]]:
    """The rows of every committed file."""
    files = sorted(directory.glob("*.json"))
    return [row for path in files for row in json.loads(path.read_text())["rows"]]


@hookimpl
def fanout_sink_types() -> dict[str, type[PartitionedSink]]:
    """``route_recording``."""
    return {"route_recording": RouteRecordingSink}
