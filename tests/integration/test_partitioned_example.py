"""The executor-side sink of the plugin author's guide (examples/partitioned_sink.py), on
the partitioned-sink kit: a partition vetoed by a ``fanout_partition_commit`` hook fails the
batch; the replay skips the committed partitions and writes the vetoed one, each row once;
a replay whose partitions would hold other rows is refused before anything is written."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from fanout import (
    BatchFailedError,
    BatchInfo,
    FanOut,
    PartitioningError,
    TransientSinkError,
    hookimpl,
)
from fanout.contract.partitions import PartitionCommit
from fanout.ledger.memory import MemoryLedger

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

from partitioned_sink import PartitionedFilesSink  # noqa: E402


class VetoOnce:
    """Vetoes one partition's first commit (its state in a file: executors are other
    processes, and the plugin is pickled to them)."""

    def __init__(self, state: str, partition: int) -> None:
        self.state, self.partition = state, partition

    @hookimpl
    def fanout_partition_commit(self, commit: PartitionCommit) -> None:
        if commit.partition == self.partition and not Path(self.state).exists():
            Path(self.state).write_text(json.dumps({"rows": commit.rows}))
            raise TransientSinkError("vetoed", sink=commit.sink, batch_id=commit.batch_id)


class Committed:
    """Notes every committed partition in a directory."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    @hookimpl
    def fanout_partition_committed(self, commit: PartitionCommit) -> None:
        Path(self.directory, f"b{commit.batch_id}-p{commit.partition}").write_text(str(commit.rows))


def files(directory: Path) -> dict[str, list[dict[str, Any]]]:
    return {
        p.name: [json.loads(line) for line in p.read_text().splitlines()[1:]]
        for p in sorted(directory.glob("*.jsonl"))
    }


def test_a_vetoed_partition_replays_alone_and_every_row_lands_once(
    spark: Any, tmp_path: Path
) -> None:
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # executors need not import it
    cloudpickle.register_pickle_by_value(sys.modules["partitioned_sink"])
    out, seen = tmp_path / "out", tmp_path / "seen"
    seen.mkdir()
    rows = [(i, f"v{i}") for i in range(40)]
    batch = spark.createDataFrame(rows, "id INT, v STRING")
    sink = PartitionedFilesSink("files", directory=str(out), partitions=3)
    veto = VetoOnce(str(tmp_path / "veto.json"), partition=1)
    ledger = MemoryLedger()
    fan = FanOut("parts", ledger, [sink], retries=0, plugins=[veto, Committed(str(seen))])
    with pytest.raises(BatchFailedError) as failed:
        fan.process(batch, BatchInfo("parts", 0, "q"))
    assert (
        "1 of 3 partition(s) failed; partitions holding the batch (skipped on replay): [0, 2]"
        in (str(failed.value))
    )
    assert sorted(p.name for p in seen.iterdir()) == ["b0-p0", "b0-p2"]
    assert sorted(files(out)) == ["parts~files~000000000000-p000.jsonl",
                                  "parts~files~000000000000-p002.jsonl"]  # fmt: skip

    result = fan.process(batch, BatchInfo("parts", 0, "q"))["files"]
    assert result.details["skipped_partitions"] == [0, 2]
    assert result.details["committed_partitions"] == [1]
    assert sorted(p.name for p in seen.iterdir()) == ["b0-p0", "b0-p1", "b0-p2"]
    written = [row["id"] for rows_ in files(out).values() for row in rows_]
    assert sorted(written) == list(range(40))  # every row once
    vetoed = json.loads((tmp_path / "veto.json").read_text())["rows"]
    assert vetoed == len(files(out)["parts~files~000000000000-p001.jsonl"])

    again = PartitionedFilesSink("files", directory=str(out), partitions=3)
    fan = FanOut("parts", MemoryLedger(), [again])  # the same batch, its rows changed
    other = spark.createDataFrame([(i, f"v{i}") for i in range(41)], "id INT, v STRING")
    with pytest.raises(BatchFailedError) as refused:
        fan.process(other, BatchInfo("parts", 0, "q"))
    assert isinstance(refused.value.failures["files"], PartitioningError)
    assert sorted(int(r["id"]) for f in files(out).values() for r in f) == list(range(40))
