"""A checkpoint reset together with a changed ``transactional_id_prefix``, after a run
killed in the middle of a batch (a real subprocess, SIGKILL with one partition's
transaction open and the other committed: ``kill_epoch_prefix.py``).

The prefix is recorded per scope (:mod:`fanout_kafka.former_ids`), and the new epoch's
scope had none, so nothing fenced the former ids: the new epoch's start closed the replaced
scope under the *new* ids (:class:`fanout_kafka.fence.ScopeFence`), which no task of it
holds. On Tansu the killed run's open transaction then held back the committed
partition's marker, so the start was told the replaced batch was not written at all (the
new epoch reads it again: partition 0's records twice), and held back the new epoch's own
markers too (its transactions share the topic's partition), so each of its replays wrote
again; on Kafka a task of the replaced run still alive could commit beside the new epoch.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from fanout_kafka import KafkaSink
from fanout_kafka.former_ids import recorded_prefix
from fanout_kafka.transaction import PartitionWriter
from kafka_log import committed_records
from kafkatools import Broker, create_topic, marker

from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.sink import PartlyHeld, SinkContext
from fanout.partitioned.membership import PartitionPlan

KILL = Path(__file__).with_name("kill_epoch_prefix.py")
PLAN = PartitionPlan(2, (("id", "string"),))
KEPT = [(f"k{i}", "kept") for i in range(5)]  # partition 0 of the killed run, committed


def _killed_run(kafka: Broker, topic: str, pipeline: str, prefix: str, epoch: int = 0) -> None:
    killed = subprocess.run(
        [sys.executable, str(KILL), kafka.bootstrap, topic, pipeline, prefix, str(epoch)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]


def _new_epoch_sink(
    kafka: Broker, topic: str, pipeline: str, prefix: str, partitions: int = 2
) -> KafkaSink:
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic, key="id",
                     value="v", partitions=partitions, transactional_id_prefix=prefix)  # fmt: skip
    sink.open(SinkContext(pipeline))
    return sink


def _batch(pipeline: str, epoch: int) -> Batch:
    info = BatchInfo(pipeline, 0, epoch=epoch)
    return Batch(None, info, "events", txn_app_id(pipeline, "events", epoch))


def _write(
    sink: KafkaSink, pipeline: str, partition: int, rows: list[dict[str, str]],
    plan: PartitionPlan = PLAN, epoch: int = 1,
) -> Any:  # fmt: skip
    """Partition ``partition`` of batch 0 of ``epoch``, as the new epoch's task writes it."""
    settings = replace(sink.settings(_batch(pipeline, epoch)), plan=plan)
    return PartitionWriter(settings, partition, 0).run([pa.RecordBatch.from_pylist(rows)])


def _committed(kafka: Broker, topic: str) -> list[tuple[str, str]]:
    found = committed_records(kafka.bootstrap, topic, 1)
    return sorted(((r.key or b"").decode(), (r.value or b"").decode()) for r in found)


def _first_batch_then_replay(
    kafka: Broker, topic: str, pipeline: str, prefix: str, epoch: int
) -> KafkaSink:
    """Batch 0 of ``epoch`` under ``prefix`` on one partition (the epoch's first, no start
    fence), its 4 rows keyed ``n<i>`` committed, then its replay: the marker is read
    (not held back by the killed run's open transaction), every record once. The sink."""
    sink = _new_epoch_sink(kafka, topic, pipeline, prefix, partitions=1)
    one = PartitionPlan(1, (("id", "string"),))
    assert sink.committed_partitions(_batch(pipeline, epoch), one) == []
    rows = [{"id": f"n{i}", "v": "new"} for i in range(4)]
    assert _write(sink, pipeline, 0, rows, one, epoch=epoch).status == "committed"

    again = _new_epoch_sink(kafka, topic, pipeline, prefix, partitions=1)  # a replay
    assert [c.partition for c in again.committed_partitions(_batch(pipeline, epoch), one)] == [0]
    assert marker(kafka.bootstrap, f"{pipeline}@e{epoch}", "events", 0, "__fanout_markers") == 1
    assert _committed(kafka, topic) == sorted([*KEPT, *((f"n{i}", "new") for i in range(4))])
    return sink


@pytest.mark.parametrize("new_prefix", ["new", "old"])
def test_the_new_epochs_start_closes_the_replaced_scope_under_its_own_prefix(
    kafka: Broker, new_prefix: str
) -> None:
    """The start fences the ids of the prefix the replaced scope recorded: the killed
    run's transaction is aborted, so the start sees partition 0 committed (PartlyHeld)
    and the new epoch writes partition 1 only, each record once, its marker applied.
    With the prefix unchanged too: the fence read partition 0's marker while partition 1's
    open transaction, not yet ended by the fence's other thread, held it back on Tansu
    (``holds_batch`` said ``None``, 2 runs in 3), so every id is now ended first there."""
    topic, pipeline = f"ep-{uuid.uuid4().hex[:8]}", f"ep{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap, topic, 1)  # both partitions' records share its partition
    _killed_run(kafka, topic, pipeline, f"{pipeline}-old")
    sink = _new_epoch_sink(kafka, topic, pipeline, f"{pipeline}-{new_prefix}")

    sink.fence_earlier_epochs(pipeline, 1)  # the new epoch's start, then its question
    assert sink.holds_batch(pipeline, 0, 0) == PartlyHeld(1, None)  # partition 0 of ?
    assert sink.committed_partitions(_batch(pipeline, 1), PLAN) == []
    again = [{"id": f"x{i}", "v": "again"} for i in range(3)]  # partition 1's rows, read again
    assert _write(sink, pipeline, 1, again).status == "committed"

    assert marker(kafka.bootstrap, f"{pipeline}@e1", "events", 1, "__fanout_markers") == 1
    assert _committed(kafka, topic) == sorted([*KEPT, *((f"x{i}", "again") for i in range(3))])


def test_the_new_epochs_first_batch_fences_the_replaced_epochs_prefix(kafka: Broker) -> None:
    """Without the start's fence (a sink opened for the new epoch's first batch only), and
    with one partition where the replaced epoch had two: the new scope has no record yet,
    so the replaced scope's is read, and that prefix's ids of the replaced scope's span
    (the killed partition 1's too) are fenced before the markers are read; the new epoch's
    marker is applied, not held back by the killed run's open transaction."""
    topic, pipeline = f"ep-{uuid.uuid4().hex[:8]}", f"ep{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap, topic, 1)
    _killed_run(kafka, topic, pipeline, f"{pipeline}-old")
    sink = _first_batch_then_replay(kafka, topic, pipeline, f"{pipeline}-new", 1)
    assert recorded_prefix(sink.settings(_batch(pipeline, 1)), 10) == f"{pipeline}-new"


def test_a_reset_of_a_reset_fences_the_prefix_of_the_last_epoch_that_recorded_one(
    kafka: Broker,
) -> None:
    """Prefix changed at two resets in a row: epoch 0 under ``a`` killed mid-batch, epoch 1
    under ``b`` killed before its first batch (its scope records nothing, and its start
    did not fence this sink: the case of the test above), epoch 2 under ``c``. The new
    epoch's lookup walks back over the epochs that recorded nothing to epoch 0's record,
    so ``a``'s open transaction is aborted before the markers are read: epoch 2's marker
    is applied, not held back on Tansu (a replay wrote its rows again), each record once."""
    topic, pipeline = f"ep-{uuid.uuid4().hex[:8]}", f"ep{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap, topic, 1)
    _killed_run(kafka, topic, pipeline, f"{pipeline}-a")
    _first_batch_then_replay(kafka, topic, pipeline, f"{pipeline}-c", 2)


def test_a_reset_of_a_reset_closes_the_epoch_killed_mid_batch_under_its_prefix(
    kafka: Broker,
) -> None:
    """Epoch 0 under ``a`` killed mid-batch; epoch 1 under ``b`` started (its fence ends
    ``a``'s transaction), then killed in the middle of its own batch (partition 1's
    transaction open under ``b``); epoch 2 under ``c``: its start closes epoch 1's scope
    under ``b``, the prefix recorded there, so the start sees epoch 1's partition 0
    committed and epoch 2 writes partition 1 only: every record once."""
    topic, pipeline = f"ep-{uuid.uuid4().hex[:8]}", f"ep{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap, topic, 1)
    _killed_run(kafka, topic, pipeline, f"{pipeline}-a")
    first = _new_epoch_sink(kafka, topic, pipeline, f"{pipeline}-b")
    first.fence_earlier_epochs(pipeline, 1)
    assert first.holds_batch(pipeline, 0, 0) == PartlyHeld(1, None)
    _killed_run(kafka, topic, pipeline, f"{pipeline}-b", epoch=1)

    sink = _new_epoch_sink(kafka, topic, pipeline, f"{pipeline}-c")
    sink.fence_earlier_epochs(pipeline, 2)
    assert sink.holds_batch(pipeline, 1, 0) == PartlyHeld(1, None)
    assert sink.committed_partitions(_batch(pipeline, 2), PLAN) == []
    again = [{"id": f"e1x{i}", "v": "again"} for i in range(3)]  # partition 1's, read again
    assert _write(sink, pipeline, 1, again, epoch=2).status == "committed"

    assert marker(kafka.bootstrap, f"{pipeline}@e2", "events", 1, "__fanout_markers") == 1
    assert _committed(kafka, topic) == sorted([
        *KEPT, *((f"e1k{i}", "kept") for i in range(5)), *((f"e1x{i}", "again") for i in range(3)),
    ])  # fmt: skip
