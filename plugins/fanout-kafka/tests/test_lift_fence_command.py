"""``fanout ledger lift-fence`` (:mod:`fanout.app.lift_fence`): a new epoch's start killed
after its fences and before the ledger recorded it leaves the replaced epoch closed in the
sinks that fence, a Delta table and a Kafka topic here, and the old checkpoint's next batch
refused by both. Before, the refusal said to lift the fences "by hand from Python"; the
command, run as an operator runs it (its own process, the pipeline file), lifts them, and
the old checkpoint's run then writes the batch once in each. Once the ledger records that
epoch's start, the command refuses (exit 2) and lifts nothing.

Real Spark, real Delta tables, the tests' Kafka broker, a Delta ledger; the killed start is
the sinks' own fence hook called as the start calls it (``fence_earlier_epochs(pipeline,
1)``), with no start row written."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from kafka_log import committed_records
from kafkatools import Broker

from fanout import BatchFailedError, BatchInfo, FanOut, FanoutError
from fanout.app.recover_sinks import built_sink
from fanout.contract.sink import SinkContext
from fanout.delta_tables.io import read_delta
from tests.cli_process import fanout_process

pytestmark = pytest.mark.integration


def _sinks(tmp_path: Path, kafka: Broker, topic: str) -> list[dict[str, Any]]:
    return [
        {"type": "delta", "name": "lake", "path": str(tmp_path / "lake"), "mode": "append",
         "write_from": "driver"},
        {"type": "kafka", "name": "events", "bootstrap_servers": kafka.bootstrap,
         "topic": topic, "key": "id", "partitions": 2},
    ]  # fmt: skip


def _file(tmp_path: Path, pipeline: str, sinks: list[dict[str, Any]]) -> Path:
    """The pipeline file of the run: its ledger, its sinks."""
    lines = [
        "[pipeline]", f'name = "{pipeline}"', f'ledger = "{tmp_path / "ledger"}"',
        f'checkpoint = "{tmp_path / "checkpoint"}"', "", "[source]", 'format = "rate"',
    ]  # fmt: skip
    for sink in sinks:
        lines += ["", "[[sinks]]"]
        lines += [f"{k} = {v!r}" if isinstance(v, int) else f'{k} = "{v}"' for k, v in sink.items()]
    file = tmp_path / "pipeline.toml"
    file.write_text("\n".join(lines) + "\n")
    return file


def _batch(spark: Any, fan: FanOut, pipeline: str, batch_id: int, query: str) -> Any:
    """Batch ``batch_id`` of query ``query``: ids 10b .. 10b+3."""
    rows = spark.range(batch_id * 10, batch_id * 10 + 4)
    info = BatchInfo(pipeline, batch_id, query, [{"s": batch_id}], batch_timestamp_ms=1000)
    return fan.process(rows, info)


def _run(spark: Any, pipeline: str, tmp_path: Path, sinks: list[dict[str, Any]],
         batch_id: int, query: str, on_reset: str = "refuse") -> Any:  # fmt: skip
    fan = FanOut(pipeline, str(tmp_path / "ledger"), sinks, retries=0, parallelism=1,
                 on_checkpoint_reset=on_reset)  # type: ignore[arg-type]  # fmt: skip
    try:
        return _batch(spark, fan, pipeline, batch_id, query)
    finally:
        fan.close()


def _fence(pipeline: str, sinks: list[dict[str, Any]]) -> None:
    """What a start of epoch 1 killed after its fences left: each sink fenced as the start
    fences it, no start row in the ledger."""
    for options in sinks:
        sink, _ = built_sink(options)
        sink.open(SinkContext(pipeline))
        try:
            sink.fence_earlier_epochs(pipeline, 1)
        finally:
            sink.close()


def _ids(tmp_path: Path, kafka: Broker, topic: str) -> tuple[list[int], list[int]]:
    """The ids in the Delta table and among the topic's committed records."""
    lake = sorted(read_delta(str(tmp_path / "lake"))["id"].to_pylist())
    records = committed_records(kafka.bootstrap, topic, 3)
    return lake, sorted(int(r.key) for r in records if r.key is not None)


def _batch_zero(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> tuple[str, list[dict[str, Any]], Path]:
    """A new pipeline (its name, sinks and file) whose query ``q0`` wrote batch 0."""
    pipeline = f"lift{uuid.uuid4().hex[:6]}"
    sinks = _sinks(tmp_path, kafka, topic)
    file = _file(tmp_path, pipeline, sinks)
    _run(spark, pipeline, tmp_path, sinks, 0, "q0")
    return pipeline, sinks, file


def test_lift_fence_lets_the_old_checkpoint_complete_its_batch_once(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    pipeline, sinks, file = _batch_zero(spark, kafka, topic, tmp_path)
    _fence(pipeline, sinks)

    with pytest.raises(BatchFailedError) as refused:
        _run(spark, pipeline, tmp_path, sinks, 1, "q0")
    assert set(refused.value.failures) == {"lake", "events"}
    for error in refused.value.failures.values():
        assert "fanout ledger lift-fence --config PIPELINE.toml --epoch 1" in str(error)
    assert _ids(tmp_path, kafka, topic) == ([0, 1, 2, 3], [0, 1, 2, 3])

    lifted = fanout_process("ledger", "lift-fence", "--config", str(file), "--epoch", "1")
    assert lifted.returncode == 0, lifted
    # batch 0's marks were just written: the pipeline looks running, said, the lift done
    assert lifted.stderr.startswith(f"fanout: warning: pipeline '{pipeline}' looks running: ")
    newest, *lines = lifted.stdout.splitlines()
    assert newest.startswith(f"pipeline '{pipeline}' looks running: its newest mark is batch 0")
    fence = "the fence epoch 1's start left on epoch 0"
    assert lines == [
        f"pipeline '{pipeline}', sink 'lake': {fence} lifted: epoch 0 open to its writes again",
        f"pipeline '{pipeline}', sink 'events': epoch 0 open to its writes again ({fence} "
        "lifted; the sink does not tell whether there was one)",
        f"pipeline '{pipeline}': epoch 0's checkpoint can run again: restart the query on it "
        "(the one whose write was refused) to complete its batch",
    ]

    written = _run(spark, pipeline, tmp_path, sinks, 1, "q0")
    assert (written["lake"].rows, written["events"].rows) == (4, 4)
    every = [0, 1, 2, 3, 10, 11, 12, 13]
    assert _ids(tmp_path, kafka, topic) == (every, every)


def test_lift_fence_is_refused_once_the_ledger_records_the_epochs_start(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    pipeline, sinks, file = _batch_zero(spark, kafka, topic, tmp_path)
    _run(spark, pipeline, tmp_path, sinks, 1, "q1", on_reset="new_epoch")  # epoch 1 started

    refused = fanout_process("ledger", "lift-fence", "--config", str(file), "--epoch", "1")
    assert (refused.returncode, refused.stdout) == (2, ""), refused
    assert refused.stderr == (
        f"fanout: configuration error: pipeline '{pipeline}': --epoch 1: the ledger records "
        "that epoch 1 started (the pipeline's epoch is 1): its query relies on the fences "
        "closing the epochs before it, and a lift would let a replaced query write its "
        "batch beside it (the batch's rows twice). Nothing lifted. An earlier epoch's "
        "checkpoint cannot complete its batch any more: epoch 1's query writes it\n"
    )
    with pytest.raises(FanoutError):  # the replaced query's batch: refused, nothing written
        _run(spark, pipeline, tmp_path, sinks, 2, "q0")
    assert _ids(tmp_path, kafka, topic) == ([0, 1, 2, 3, 10, 11, 12, 13],) * 2
