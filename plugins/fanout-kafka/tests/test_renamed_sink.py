"""A Kafka sink renamed between a crash and its replay (docs/architecture.md §8, "A sink
renamed mid-batch").

The sink wrote batch 0 (marked) under its old name. Its marker groups are named by the
sink: killed after its partitions committed batch 1 and before its ledger mark, then
restarted with the sink renamed (same topic), the replay found no marker under the new
name and wrote every partition of batch 1 again: read_committed readers got its records
twice. The run is now refused at its first batch (:mod:`fanout.steps.renamed`, the new
sink's ``holds_batch_of`` the old name), nothing written, and the refusal names the old
sink, the batch and the ways on.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from kafkatools import Broker, read_topic

from fanout import BatchFailedError, BatchInfo, FanOut
from fanout.errors import RenamedSinkError
from fanout.testing.faults import MarkLost


def _sink(kafka: Broker, topic: str, name: str) -> dict[str, Any]:
    return {"type": "kafka", "name": name, "bootstrap_servers": kafka.bootstrap,
            "topic": topic, "key": "id", "partitions": 2,
            "marker_topic": f"{topic}-markers", "create_topic": True}  # fmt: skip


def test_a_kafka_sink_renamed_between_a_crash_and_its_replay_is_refused(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    pipeline, ledger = f"kren{uuid.uuid4().hex[:6]}", str(tmp_path / "ledger")
    FanOut(pipeline, ledger, [_sink(kafka, topic, "old")], retries=0).process(
        spark.range(0, 4), BatchInfo(pipeline, 0, "q")
    )
    with pytest.raises(BatchFailedError):  # the driver "dies" before the ledger mark
        FanOut(pipeline, MarkLost(ledger, "old"), [_sink(kafka, topic, "old")],
               retries=0).process(spark.range(4, 8), BatchInfo(pipeline, 1, "q"))  # fmt: skip

    renamed = FanOut(pipeline, ledger, [_sink(kafka, topic, "new")], retries=0)
    refused: BatchFailedError | None = None
    try:
        renamed.process(spark.range(4, 8), BatchInfo(pipeline, 1, "q"))
    except BatchFailedError as exc:
        refused = exc
    renamed.close()
    keys = sorted(int(r["key"]) for r in read_topic(kafka.bootstrap, topic, 8))
    assert keys == list(range(8))  # before: 4-7 twice
    assert refused is not None and set(refused.failures) == {"new"}
    text = str(refused.failures["new"])
    assert f"topic '{topic}' holds batch 1 of sink 'old'" in text
    assert "rename the sink back to 'old'" in text

    # the way out it names: the old name completes the batch, then the new one goes on
    back = FanOut(pipeline, ledger, [_sink(kafka, topic, "old")], retries=0)
    assert back.process(spark.range(4, 8), BatchInfo(pipeline, 1, "q"))["old"].already_written
    back.close()
    after = FanOut(pipeline, ledger, [_sink(kafka, topic, "new")], retries=0)
    after.process(spark.range(8, 10), BatchInfo(pipeline, 2, "q"))
    after.close()
    keys = sorted(int(r["key"]) for r in read_topic(kafka.bootstrap, topic, 10))
    assert keys == list(range(10))


def test_a_kafka_sink_killed_in_its_first_batch_and_renamed_is_refused_at_its_first_write(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed in its very first batch (after its transactions committed, before any mark
    or failure row), the old name is unknown to the ledger, so the run's start check asks
    nothing; the renamed sink wrote the batch again (batch 0's records twice for a
    read_committed reader). Its first write to the topic now finds the old name in the
    records' headers at the topic's end, confirmed by that name's markers of the batch,
    and refuses before writing (:mod:`fanout_kafka.renamed`)."""
    pipeline, ledger = f"kren{uuid.uuid4().hex[:6]}", str(tmp_path / "ledger")
    with pytest.raises(BatchFailedError):  # the driver "dies" before the ledger mark
        FanOut(pipeline, MarkLost(ledger, "old"), [_sink(kafka, topic, "old")],
               retries=0).process(spark.range(0, 4), BatchInfo(pipeline, 0, "q"))  # fmt: skip

    renamed = FanOut(pipeline, ledger, [_sink(kafka, topic, "new")], retries=0)
    refused: BatchFailedError | None = None
    try:
        renamed.process(spark.range(0, 4), BatchInfo(pipeline, 0, "q"))
    except BatchFailedError as exc:
        refused = exc
    renamed.close()
    keys = sorted(int(r["key"]) for r in read_topic(kafka.bootstrap, topic, 4))
    assert keys == list(range(4))  # before: 0-3 twice
    assert refused is not None and set(refused.failures) == {"new"}
    error = refused.failures["new"]
    assert isinstance(error, RenamedSinkError)
    text = str(error)
    assert f"topic '{topic}' holds batch 0 of sink 'old'" in text
    assert "rename the sink back to 'old' and restart" in text
    assert "cannot be removed from a topic" in text
    assert "remove batch" not in text  # the one way offered where a target can give it back

    # the way out it names: the old name completes the batch, then the new one goes on
    back = FanOut(pipeline, ledger, [_sink(kafka, topic, "old")], retries=0)
    assert back.process(spark.range(0, 4), BatchInfo(pipeline, 0, "q"))["old"].already_written
    back.close()
    # a vanished name's records of a later batch with no marker in this epoch (an older
    # epoch's: the headers carry none) do not refuse; the topic's end is read once, at the
    # new name's first write, not per batch
    from confluent_kafka import Producer
    from fanout_kafka import renamed as renamed_module
    from fanout_kafka.records import batch_headers

    ghost = Producer({"bootstrap.servers": kafka.bootstrap})
    ghost.produce(topic, b"{}", b"99", partition=0,
                  headers=list(batch_headers(pipeline, "ghost", 9)))  # fmt: skip
    ghost.flush(30)
    reads: list[dict[str, int] | None] = []
    tail_writers = renamed_module.tail_writers

    def counted(*args: Any, **kwargs: Any) -> dict[str, int] | None:
        reads.append(tail_writers(*args, **kwargs))
        return reads[-1]

    monkeypatch.setattr(renamed_module, "tail_writers", counted)
    after = FanOut(pipeline, ledger, [_sink(kafka, topic, "new")], retries=0)
    after.process(spark.range(4, 6), BatchInfo(pipeline, 1, "q"))
    after.process(spark.range(6, 8), BatchInfo(pipeline, 2, "q"))
    after.close()
    assert reads == [{"ghost": 9}]  # batch 1's first write only; ghost: no marker, written
    keys = sorted(int(r["key"]) for r in read_topic(kafka.bootstrap, topic, 9))
    assert keys == [*range(8), 99]


def test_the_topic_end_names_only_vanished_sinks_of_the_pipeline_from_the_batch_on(
    kafka: Broker, topic: str
) -> None:
    """:func:`fanout_kafka.renamed.tail_writers`, the first write's read: of the records at
    the end of each partition (read_committed), the sinks of this pipeline not configured
    now, each with its highest batch at or past the one to write. Another pipeline's sink,
    a configured one, a batch before it, records without fanout's headers or with a batch
    id that is no number, and what lies past the last ``depth`` offsets are not named."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient
    from fanout_kafka.records import batch_headers
    from fanout_kafka.renamed import tail_writers

    producer = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": topic})
    producer.init_transactions(30)
    producer.begin_transaction()
    sent = [("p", "gone", 3, 0), ("p", "gone", 4, 1), ("p", "early", 2, 2), ("q", "other", 9, 0),
            ("p", "kept", 7, 1), ("p", "deep", 9, 2)]  # fmt: skip
    for pipeline, sink, batch, partition in sent:
        headers = list(batch_headers(pipeline, sink, batch))
        producer.produce(topic, b"v", b"k", partition=partition, headers=headers)
    producer.produce(topic, b"v", b"k", partition=2)  # no headers
    producer.produce(topic, b"v", b"k", partition=2,
                     headers=[("fanout.pipeline", b"p"), ("fanout.sink", b"odd"),
                              ("fanout.batch_id", b"x")])  # fmt: skip
    producer.flush(30)
    producer.commit_transaction(30)
    config = {"bootstrap.servers": kafka.bootstrap}
    with AdminClient(config) as admin:
        found = tail_writers(admin, config, topic, "p", {"kept"}, 3, 10.0)
        assert found == {"gone": 4, "deep": 9}
        # partition 2 holds deep, the headerless record, odd, and the commit marker: the
        # last 3 offsets leave deep out
        assert tail_writers(admin, config, topic, "p", {"kept"}, 3, 10.0, depth=3) == {"gone": 4}
