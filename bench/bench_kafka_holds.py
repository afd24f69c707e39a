#!/usr/bin/env python
"""The Kafka sink's ``holds_batch`` with a Delta dead-letter table: what a run's start (the
lost-target check), ``fanout recover`` and a new epoch pay for the letters check.

    python bench/bench_kafka_holds.py [--partitions 8] [--repeat 15] [--bootstrap HOST:PORT]

One sink with ``--partitions`` partitions and a Delta dead-letter table writes, partition
by partition on the driver (``PartitionWriter``, no Spark), three batches:

  letters   batch 0: every partition sets one record aside (over ``max_record_bytes``),
            names it in its journal and parks it (held whole: ``True``)
  none      batch 1: no letters (``True``; the journals are batch 0's)
  waiting   batch 2: every partition commits a letter whose park fails (a task killed
            between its commit and the park): ``PartlyHeld(n, n, letters=n)``

each timed while it is the last batch written (a later batch's markers answer without
the letters), ``holds_batch`` about it (wall clock, median and best of ``--repeat``, after
one untimed call) and checks its answer. The broker is the embedded Tansu broker unless
--bootstrap names one. The last line is machine-readable:
``holds_ms_letters=... holds_ms_none=... holds_ms_waiting=...`` (medians), then the
letters check's parts about the last batch: its groups' offsets (``named_letters``), and
its journals read by one consumer and by one consumer per partition, as journals committed
without a count (by the version before) are read.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from fanout import PartlyHeld
from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.sink import SinkContext
from fanout.deadletters.delta import DeltaDeadLetters
from fanout.partitioned.membership import MemberDigest, PartitionPlan


class _FailingPark(DeltaDeadLetters):
    """The Delta table while ``failing``: its writes fail (the park after a commit)."""

    failing = False

    def write(self, *args: Any, **kwargs: Any) -> int:
        if _FailingPark.failing:
            raise OSError("the object store is away")
        return super().write(*args, **kwargs)


def _write(sink: Any, pipeline: str, partitions: int, batch_id: int, letters: bool) -> None:
    from fanout_kafka.transaction import PartitionWriter

    batch = Batch(None, BatchInfo(pipeline, batch_id), sink.name, txn_app_id(pipeline, sink.name))
    plan = PartitionPlan(partitions, (("id", "string"),))
    settings = replace(sink.settings(batch), plan=plan)
    for p in range(partitions):
        rows = [{"id": f"{batch_id}-{p}-{i}", "v": f"small-{i}"} for i in range(3)]
        if letters:
            rows.append({"id": f"{batch_id}-{p}-big", "v": "x" * 2000})
        outcome = PartitionWriter(settings, p, batch_id, digest=MemberDigest()).run(
            [pa.RecordBatch.from_pylist(rows)]
        )
        expected = "failed" if _FailingPark.failing else "committed"
        if outcome.status != expected:
            raise SystemExit(f"batch {batch_id} partition {p}: {outcome}")


def _time(call: Any, repeat: int) -> tuple[float, float, Any]:
    answer = call()  # untimed: the driver's admin client connects
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        again = call()
        times.append((time.perf_counter() - start) * 1000)
        if again != answer:
            raise SystemExit(f"holds_batch answered {again!r}, before {answer!r}")
    return statistics.median(times), min(times), answer


def _parts(sink: Any, pipeline: str, n: int, repeat: int) -> dict[str, float]:
    """The letters check's parts about the last batch (2): its offsets, and its journals
    read by one consumer and by one consumer per partition (as journals without a count,
    committed by the version before, are read)."""
    from fanout_kafka.letters import named_letters, read_journals
    from fanout_kafka.membership import read_offsets

    batch = Batch(None, BatchInfo(pipeline, 2), sink.name, txn_app_id(pipeline, sink.name))
    settings = sink.settings(batch)
    config = {"bootstrap.servers": settings.bootstrap_servers}
    groups = [settings.letters_group(p) for p in range(n)]
    positions = dict(enumerate(read_offsets(config, settings.marker_topic, groups, 30.0)))
    calls = {
        "offsets": lambda: named_letters(settings, 2, n),
        "journals_one_consumer": lambda: read_journals(settings, positions, 30.0),
        "journals_per_partition": lambda: [
            read_journals(settings, {p: at}, 30.0) for p, at in positions.items()
        ],
    }
    found = {}
    for part, call in calls.items():
        median, best, _ = _time(call, repeat)
        print(f"  {part:24} median {median:7.1f} ms, best {best:7.1f} ms")
        found[part] = median
    return found


def main() -> int:
    """Run the benchmark; exit 1 when an answer is not the expected one."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--bootstrap")
    args = parser.parse_args()
    logging.getLogger("fanout_kafka").setLevel(logging.CRITICAL)  # the failed parks
    from confluent_kafka.admin import AdminClient, NewTopic
    from fanout_kafka import KafkaSink
    from fanout_kafka.embedded import EmbeddedKafka

    n = args.partitions
    with ExitStack() as stack:
        bootstrap = args.bootstrap or stack.enter_context(EmbeddedKafka())
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-holds-")))
        topic, pipeline = f"holds-{uuid.uuid4().hex[:8]}", f"holds{uuid.uuid4().hex[:6]}"
        with AdminClient({"bootstrap.servers": bootstrap}) as admin:
            for future in admin.create_topics([NewTopic(topic, n)]).values():
                future.result(30)
        sink = KafkaSink("events", bootstrap_servers=bootstrap, topic=topic, key="id",
                         value="v", partitions=n, max_record_bytes=1000)  # fmt: skip
        sink.open(SinkContext(pipeline, dead_letters=_FailingPark(str(work / "dead"))))
        stack.callback(sink.close)
        expected = {"letters": True, "none": True, "waiting": PartlyHeld(n, n, letters=n)}
        found: dict[str, float] = {}
        for batch_id, case in enumerate(expected):
            # each batch the last written: a later batch's markers answer without letters
            _FailingPark.failing = case == "waiting"
            _write(sink, pipeline, n, batch_id, letters=case != "none")
            _FailingPark.failing = False
            median, best, answer = _time(
                lambda b=batch_id: sink.holds_batch(pipeline, 0, b), args.repeat
            )
            print(f"{case:8} batch {batch_id}: {answer!r:45} median {median:7.1f} ms, "
                  f"best {best:7.1f} ms ({n} partitions, {args.repeat} calls)")  # fmt: skip
            if answer != expected[case]:
                print(f"expected {expected[case]!r}", file=sys.stderr)
                return 1
            found[case] = median
        found.update(_parts(sink, pipeline, n, args.repeat))
        print(" ".join(f"holds_ms_{case}={ms:.1f}" for case, ms in found.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
