"""Partition membership must be the same in every attempt of a batch (issue 13, holes 1
and 3): a replay skips the partitions already committed, so a row that moved between
partitions would be lost (moved into a committed one) or written twice (moved out of one).

Non-deterministic partitioning columns are refused before anything is written; a changed
partitioning between a kill and the restart is refused on the driver, before any
partition writes, naming the sink, the batch and what changed. The driver SIGKILLed
after some partitions of a batch committed restarts writing only the other partitions.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from fanout_kafka import KafkaSink
from kafkatools import Broker, create_topic, key_counts, marker, read_topic

from fanout import FanOut, hookimpl
from fanout.contract.batch import BatchInfo
from fanout.contract.sink import SinkResult
from fanout.errors import PartitioningError
from fanout.routes.route import Route
from fanout.sink_spec import SinkSpec
from fanout.testing import faults
from tests.integration.streams import SCHEMA, committed_marks, run_stream, run_to_end, write_input

DRIVER = Path(__file__).with_name("kafka_driver.py")
FILES, ROWS, PARTITIONS = 3, 40, 4
KILL_BATCH, KILL_PARTITION = 1, 1
SAFE = ["order_id", "status"]
STRICT = [*SAFE, "CAST(IF(status = 'paid', status, '1') AS INT) AS flag"]
"""A route refusing the paid orders (a CAST the ANSI mode refuses): route dead letters."""


def _drive(workdir: Path, kafka: Broker, topic: str, pipeline: str, *extra: str
           ) -> subprocess.CompletedProcess[str]:  # fmt: skip
    cmd = [sys.executable, str(DRIVER), str(workdir), kafka.bootstrap, topic, pipeline, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def _order_ids(records: list[dict[str, Any]]) -> Counter[int]:
    return Counter(int(json.loads(r["value"])["order_id"]) for r in records)


class _Results:
    """Records each sink result of a restart, by batch."""

    def __init__(self) -> None:
        self.by_batch: dict[int, dict[str, Any]] = {}

    @hookimpl
    def fanout_sink_done(
        self, info: BatchInfo, sink: str, result: SinkResult, duration_s: float
    ) -> None:
        """Keep the batch's result details."""
        self.by_batch[info.batch_id] = {"batch": info.batch_id, **result.details}


def _restart(
    spark: Any,
    kafka: Broker,
    topic: str,
    workdir: Path,
    pipeline: str,
    dlq: str,
    *,
    partitions: int = PARTITIONS,
    select: list[str] = SAFE,
    results: _Results | None = None,
) -> str:
    """Restart the killed driver's stream in this process, as :data:`DRIVER` runs it: the
    text of the error it ended with, ``""`` when it ran to the end of its input."""
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic, key="order_id",
                     partitions=partitions, dead_letter=f"kafka:{dlq}")  # fmt: skip
    spec = SinkSpec(sink, Route(select=tuple(select)))
    fan = FanOut(pipeline, str(workdir / "ledger"), [spec], plugins=[results] if results else [])
    return run_to_end(spark, fan, workdir)


def _results(out: str) -> dict[int, dict[str, Any]]:
    """The sink results the driver printed, by batch."""
    lines = [json.loads(x[len("RESULT ") :]) for x in out.splitlines() if x.startswith("RESULT ")]
    return {r["batch"]: r for r in lines}


def _damage(records: list[dict[str, Any]], expected: set[int]) -> str:
    ids = _order_ids(records)
    lost = sorted(expected - set(ids))
    doubled = sorted(i for i, n in ids.items() if n > 1)
    return (
        f"{len(records)} records: {len(lost)} ids lost {lost[:8]}, "
        f"{len(doubled)} doubled {doubled[:8]}"
    )


def test_keyless_sink_with_uuid_in_its_select_killed_mid_batch_is_refused_up_front(
    kafka: Broker, topic: str, tmp_path: Path
) -> None:
    rows = write_input(tmp_path / "input", FILES, ROWS)
    pipeline = f"uuid{uuid.uuid4().hex[:6]}"
    route = ["--keyless", "--select", "*", "uuid() AS event_id"]
    killed = _drive(tmp_path, kafka, topic, pipeline, *route,
                    "--kill", f"{KILL_BATCH}:{KILL_PARTITION}")  # fmt: skip
    was_killed = killed.returncode in (faults.KILL_EXIT_CODE, -9)
    if was_killed:  # today's code: the replay re-plans uuid() and moves rows between partitions
        _drive(tmp_path, kafka, topic, pipeline, *route)
    records = read_topic(kafka.bootstrap, topic, FILES * ROWS if was_killed else 0, timeout=20)
    assert not was_killed and records == [], (
        "not refused; after the kill and the replay: "
        + _damage(records, {r["order_id"] for r in rows})
    )
    assert "PartitioningError" in killed.stderr, killed.stderr[-3000:]
    assert "sink 'events'" in killed.stderr
    assert "uuid() AS event_id" in killed.stderr and "not deterministic" in killed.stderr


def test_keyless_sink_with_current_timestamp_in_its_select_and_an_in_batch_retry(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    """No crash at all: partition 2 of batch 1 aborts once, fanout retries the batch in
    the same process, and the retry evaluates current_timestamp() anew."""
    rows = write_input(tmp_path / "input", 2, ROWS)
    pipeline = f"ts{uuid.uuid4().hex[:6]}"
    veto = faults.VetoOnce(batch=1, partition=2, state=str(tmp_path / "veto.json"))
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic,
                     partitions=PARTITIONS)  # fmt: skip
    spec = SinkSpec(sink, Route(select=("*", "current_timestamp() AS seen_at")))
    refused: PartitioningError | None = None
    try:
        fan = FanOut(pipeline, str(tmp_path / "ledger"), [spec], retries=2, backoff_s=0.1,
                     plugins=[veto])  # fmt: skip
    except PartitioningError as exc:
        refused = exc
    else:
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")
    records = read_topic(kafka.bootstrap, topic, 0 if refused else 2 * ROWS, timeout=20)
    assert refused is not None and records == [], (
        "not refused; after the in-batch retry: " + _damage(records, {r["order_id"] for r in rows})
    )
    message = str(refused)
    assert "sink 'events'" in message and "current_timestamp() AS seen_at" in message
    assert "not deterministic" in message


def test_keyless_sink_fed_a_nondeterministic_source_column_is_refused_at_the_first_batch(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    """The route is deterministic, the source is not: caught on the batch's plan."""
    write_input(tmp_path / "input", 1, ROWS)
    pipeline = f"src{uuid.uuid4().hex[:6]}"
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic,
                     partitions=PARTITIONS)  # fmt: skip
    fan = FanOut(pipeline, str(tmp_path / "ledger"), [sink], retries=0)
    stream = (
        spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
        .json(str(tmp_path / "input")).selectExpr("*", "uuid() AS event_id")
    )  # fmt: skip
    query = (
        stream.writeStream.foreachBatch(fan)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True).start()
    )  # fmt: skip
    try:
        query.awaitTermination()
        raised = None
    except Exception as exc:  # Spark wraps the foreachBatch error
        raised = exc
    assert raised is not None, "the batch was written"
    text = str(raised)
    assert "sink 'events'" in text and "batch 0" in text, text[-2000:]
    assert "event_id" in text and "uuid()" in text and "not deterministic" in text
    assert "key" in text  # what to do: configure keys or make the column deterministic
    assert read_topic(kafka.bootstrap, topic, 0, timeout=5) == []
    assert committed_marks(tmp_path / "ledger", pipeline) == {}


def test_keyed_sink_with_a_nondeterministic_value_column_still_writes_exactly_once(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    """Only the key decides the partition: uuid() in another column is fine."""
    rows = write_input(tmp_path / "input", 2, ROWS)
    pipeline = f"kv{uuid.uuid4().hex[:6]}"
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic,
                     key="order_id", partitions=PARTITIONS)  # fmt: skip
    spec = SinkSpec(sink, Route(select=("*", "uuid() AS event_id")))
    fan = FanOut(pipeline, str(tmp_path / "ledger"), [spec])
    run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")
    records = read_topic(kafka.bootstrap, topic, 2 * ROWS)
    assert _order_ids(records) == {r["order_id"]: 1 for r in rows}
    assert all(len(json.loads(r["value"])["event_id"]) == 36 for r in records)


def test_a_batch_killed_mid_way_is_refused_while_partitions_topic_or_input_differ(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    """One kill after partition 1 of batch 1 committed (partitions 0..1 hold it, the rest
    and the ledger do not), then one restart per change, each refused on the driver before
    any partition writes (nothing new in either topic, no mark): ``partitions`` 4 -> 6
    (PartitioningError), ``topic`` changed (KafkaMarkerError, :mod:`fanout_kafka.target`),
    the route changed to one refusing rows the committed partitions wrote (the first
    attempt's route refused none, so no dead-letter target recorded it: refused before any
    letter is written, ``Sink.check_replay``), and the killed batch's input file rewritten,
    which no plan shows (the partitions that committed recorded their rows; the re-planned
    ones differ). With everything as it was, the restart writes only the partitions not
    yet committed: exactly once overall. One kill for all, of a driver subprocess; the
    restarts run in the test's process, which shares nothing with the killed driver but
    the checkpoint, the ledger and the broker (a driver subprocess starts Spark, ~20 s):
    it is also the plain kill-between-partitions-and-restart test."""
    rows = write_input(tmp_path / "input", FILES, ROWS)
    pipeline = f"moved{uuid.uuid4().hex[:6]}"
    dlq = f"{topic}-dlq"
    create_topic(kafka.bootstrap, dlq, 1)
    routed = ("--dead-letter", f"kafka:{dlq}", "--select", *SAFE)
    killed = _drive(tmp_path, kafka, topic, pipeline, *routed,
                    "--kill", f"{KILL_BATCH}:{KILL_PARTITION}")  # fmt: skip
    assert killed.returncode in (faults.KILL_EXIT_CODE, -9), killed.stderr[-3000:]
    assert f"KILL driver after batch {KILL_BATCH} partition {KILL_PARTITION}" in killed.stderr
    assert sorted(_results(killed.stdout)) == list(range(KILL_BATCH))
    markers = [marker(kafka.bootstrap, pipeline, "events", p, "__fanout_markers")
               for p in range(PARTITIONS)]  # fmt: skip
    assert markers[: KILL_PARTITION + 1] == [KILL_BATCH + 1] * (KILL_PARTITION + 1), markers
    assert all(m <= KILL_BATCH for m in markers[KILL_PARTITION + 1 :]), markers
    assert ("events", KILL_BATCH) not in committed_marks(tmp_path / "ledger", pipeline)
    held = key_counts(read_topic(kafka.bootstrap, topic, ROWS))  # batch 0 + partitions 0..1
    assert ROWS < sum(held.values()) < 2 * ROWS and set(held.values()) == {1}

    # The restarts run in this process (a driver subprocess each would start Spark, ~20 s):
    # like a restarted driver, it knows of the killed one only its checkpoint, the ledger
    # and the broker.
    def unchanged(what: str, error: str) -> None:
        after = read_topic(kafka.bootstrap, topic, sum(held.values()))
        assert error and key_counts(after) == held, (
            f"the restart with {what} was not refused: "
            + _damage(after, {r["order_id"] for r in rows})
        )
        assert ("events", KILL_BATCH) not in committed_marks(tmp_path / "ledger", pipeline)

    changed = _restart(spark, kafka, topic, tmp_path, pipeline, dlq, partitions=6)
    unchanged("partitions=6", changed)
    assert "PartitioningError" in changed, changed[-3000:]
    assert f"sink 'events', batch {KILL_BATCH}" in changed
    assert "partitions 4" in changed and "now 6" in changed

    other = f"orders-new-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, other, 3)
    moved = _restart(spark, kafka, other, tmp_path, pipeline, dlq)
    unchanged(f"topic {other!r}", moved)
    assert read_topic(kafka.bootstrap, other, 0, timeout=5) == []
    assert "KafkaMarkerError" in moved, moved[-3000:]
    assert f"sink 'events', batch {KILL_BATCH}" in moved, moved[-3000:]
    assert (
        f"option 'topic' changed in the middle of batch {KILL_BATCH}: partition(s) "
        f"{list(range(KILL_PARTITION + 1))} to {topic!r} committed it, and 'topic' is now "
        f"{other!r}" in moved
    ), moved[-3000:]
    assert f"Set 'topic' back to {topic!r} until this batch completes" in moved

    paid = {str(r["order_id"]) for r in rows if r["status"] == "paid"}
    assert paid & (set(held) - {str(i) for i in range(ROWS)})  # the new route refuses some
    rerouted = _restart(spark, kafka, topic, tmp_path, pipeline, dlq, select=STRICT)
    unchanged("the route refusing paid orders", rerouted)
    assert "KafkaMarkerError" in rerouted, rerouted[-3000:]
    assert (
        f"sink 'events', batch {KILL_BATCH}: route changed in the middle of batch "
        f"{KILL_BATCH}: partition(s) {list(range(KILL_PARTITION + 1))} committed it under "
        "another route than now, and a replay skips them, so a row the new route refuses "
        "would be both in the topic" in rerouted
    ), rerouted[-3000:]
    assert "Nothing was written. Set the route ('where', 'select') back until this" in rerouted
    assert read_topic(kafka.bootstrap, dlq, 0, timeout=5) == []  # no letter written

    path = tmp_path / "input" / f"orders-{KILL_BATCH:04d}.json"
    original = path.read_text()
    rewritten = [dict(json.loads(line), order_id=10_000 + i)
                 for i, line in enumerate(original.splitlines())]  # fmt: skip
    path.write_text("\n".join(json.dumps(r) for r in rewritten) + "\n")
    replay = _restart(spark, kafka, topic, tmp_path, pipeline, dlq)
    unchanged("the batch's input rewritten", replay)
    assert f"sink 'events', batch {KILL_BATCH}: rows moved between partitions" in replay
    assert "re-planned it now holds" in replay

    path.write_text(original)  # everything as it was: the batch completes exactly once
    results = _Results()
    assert _restart(spark, kafka, topic, tmp_path, pipeline, dlq, results=results) == ""
    done = results.by_batch
    assert sorted(done) == list(range(KILL_BATCH, FILES))
    assert done[KILL_BATCH]["skipped_partitions"] == list(range(KILL_PARTITION + 1))
    assert all(p > KILL_PARTITION for p in done[KILL_BATCH]["committed_partitions"])
    records = read_topic(kafka.bootstrap, topic, FILES * ROWS)
    assert _order_ids(records) == {r["order_id"]: 1 for r in rows}
    assert key_counts(records) == {str(r["order_id"]): 1 for r in rows}
    assert read_topic(kafka.bootstrap, other, 0, timeout=5) == []
    assert read_topic(kafka.bootstrap, dlq, 0, timeout=5) == []
    assert committed_marks(tmp_path / "ledger", pipeline) == {
        ("events", b): 1 for b in range(FILES)
    }
