"""Findings of an adversarial review of the Kafka sink, each reproduced here and fixed:
each test asserts the promised behaviour (nothing lost, doubled or silently altered;
refusals naming sink, batch, column and key; secrets masked) and failed on the code the
review read."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from fanout_kafka import KafkaBadRecordError, KafkaSink
from fanout_kafka.errors import KafkaMarkerError
from fanout_kafka.records import LIMIT_SOURCES, batch_headers
from kafkatools import Broker, create_topic, key_counts, read_topic

from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.sink import SinkResult
from fanout.testing import open_sink
from tests.integration.streams import delta_rows


def opened(kafka: Broker, topic: str, pipeline: str | None = None, **options: Any) -> KafkaSink:
    """A sink ``events`` on ``topic`` keyed by ``id`` (one partition unless told),
    opened for ``pipeline`` (a fresh one by default)."""
    options.setdefault("key", "id")
    options.setdefault("partitions", 1)
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic, **options)
    return open_sink(sink, pipeline or f"rd{uuid.uuid4().hex[:6]}")


def write(sink: KafkaSink, df: Any, batch_id: int = 0) -> SinkResult:
    """Batch ``batch_id`` of ``df`` through ``sink``."""
    pipeline = sink.pipeline or "p"
    info = BatchInfo(pipeline, batch_id)
    return sink.write(Batch(df, info, sink.name, txn_app_id(pipeline, sink.name)))


HEADS = [f"h{i:02d}" for i in range(60)]


def _payloads(pipeline: str) -> tuple[str, str]:
    """Payloads making a record keyed ``1`` with the 60 header columns ``x`` 2001 bytes
    and one keyed ``2`` 2000 bytes as librdkafka counts them: 36 bytes of framing, key,
    value, and each header's name and value with a 1-byte length varint apiece."""
    heads = [*batch_headers(pipeline, "events", 0), *[(h, b"x") for h in HEADS]]
    framing = 36 + sum(len(name) + len(value) + 2 for name, value in heads)
    return "v" * (2001 - framing - 1), "w" * (2000 - framing - 1)


def _header_rows(spark: Any, rows: list[tuple[Any, ...]]) -> Any:
    columns = ", ".join(f"{c} STRING" for c in HEADS)
    return spark.createDataFrame(rows, f"id LONG, payload STRING, {columns}")


def test_a_row_sharing_key_and_value_with_a_refused_record_is_not_lost(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    """Two rows with the same key and value but different header columns: the one with
    60 headers is over the producer's ``message.max.bytes`` as librdkafka counts it (each
    header's length varints). The sink's bound did not count those: the producer refused
    it, and the retry dropped every record of its key and value, the other row too (in
    neither the topic nor the dead-letter table, no error). Now the sink counts as
    librdkafka does: it refuses that record before sending, naming key, size and limit; a
    record of exactly the limit is written, and so is the row sharing key and value."""
    pipeline = f"rd{uuid.uuid4().hex[:6]}"
    sink = opened(kafka, topic, pipeline, value="payload", headers=HEADS,
                  producer={"message.max.bytes": 2000},
                  dead_letter=str(tmp_path / "dlq"))  # fmt: skip
    over, at = _payloads(pipeline)
    df = _header_rows(spark, [(1, over, *(["x"] * 60)), (1, over, *([None] * 60)),
                              (2, at, *(["x"] * 60))])  # fmt: skip
    result = write(sink, df)
    letters = delta_rows(tmp_path / "dlq")
    assert [(r["reason"], json.loads(r["details"])["key"]) for r in letters] == [
        (f"record of 2001 bytes (key '1') is over the sink's limit of 2000 bytes "
         f"({LIMIT_SOURCES})", "1")
    ]  # fmt: skip
    assert (result.rows, result.details["written"], result.details["dead_letters"]) == (2, 2, 1)
    records = read_topic(kafka.bootstrap, topic, 2, timeout=10)
    assert sorted((r["key"], r["value"], r["headers"].get("h00")) for r in records) == [
        ("1", over, None),
        ("2", at, "x"),
    ]


def test_a_row_sharing_key_and_value_with_a_record_the_producer_refuses_is_written(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    """``max_record_bytes`` set over the producer's ``message.max.bytes``: the producer
    refuses the record with 60 headers (2001 bytes as librdkafka counts them) and the
    partition is redone without it. The redo left out every record of the refused one's
    key and value; the row differing only in its headers must still be written."""
    pipeline = f"rd{uuid.uuid4().hex[:6]}"
    sink = opened(kafka, topic, pipeline, value="payload", headers=HEADS,
                  max_record_bytes=100_000, producer={"message.max.bytes": 2000},
                  dead_letter=str(tmp_path / "dlq"))  # fmt: skip
    over, _ = _payloads(pipeline)
    result = write(sink, _header_rows(spark, [(1, over, *(["x"] * 60)), (1, over, *([None] * 60))]))
    letters = delta_rows(tmp_path / "dlq")
    assert [(r["reason"], json.loads(r["details"])["key"]) for r in letters] == [
        ("record of 2001 bytes (key '1') refused by the producer: over its message.max.bytes "
         "of 2000 bytes (max_record_bytes, 100000, let it through)", "1")
    ]  # fmt: skip
    assert (result.rows, result.details["written"], result.details["dead_letters"]) == (1, 1, 1)
    seen = [(r["key"], r["value"], r["headers"].get("h00")) for r in
            read_topic(kafka.bootstrap, topic, 1, timeout=10)]  # fmt: skip
    # Tansu shows read_committed readers the aborted first attempt's copy too
    assert seen == [("1", over, None)] * len(seen)
    assert len(seen) == 1 if kafka.hides_aborted else len(seen) in (1, 2)


def test_a_replay_after_the_marker_topic_changed_does_not_write_committed_partitions_again(
    spark: Any, kafka: Broker, topic: str
) -> None:
    """Batch 0 fails in one partition (a null key, no dead-letter target) after the other
    committed. The restart adds the dead-letter target and, in the same edit, moves the
    markers to another topic. The replay cannot see that partition 1 holds the batch and
    writes it again: its rows twice, no error. Expected: each row once, or the replay
    refused (the ledger knows the batch is half written; the new marker topic shows no
    partition of it)."""
    sink = opened(kafka, topic, partitions=2)
    rows = [(i, f"v{i}") for i in range(1, 9)] + [(None, "no key")]
    df = spark.createDataFrame(rows, "id LONG, payload STRING")
    with pytest.raises(KafkaBadRecordError) as first:
        write(sink, df)
    held = re.search(r"partitions holding the batch \(skipped on replay\): \[(\d)\]\n",
                     str(first.value))  # fmt: skip
    assert held is not None, str(first.value)
    dlq = f"{topic}-dlq"
    create_topic(kafka.bootstrap, dlq, 1)
    markers = f"markers-{uuid.uuid4().hex[:8]}"
    moved = opened(kafka, topic, str(sink.pipeline), partitions=2, dead_letter=f"kafka:{dlq}",
                   marker_topic=markers)  # fmt: skip
    with pytest.raises(KafkaMarkerError) as refused:  # refused before anything is written
        write(moved, df)
    assert str(refused.value) == (
        f"sink 'events', batch 0: batch 0 is half written: its markers say partition(s) "
        f"[{held[1]}] in topic '__fanout_markers' hold it, but this sink's marker_topic is "
        f"now '{markers}', where no partition holds it. A replay reads only the markers in "
        "the topic configured now, so it would write those partitions again. Nothing was "
        "written. Set marker_topic back to '__fanout_markers' until this batch is complete "
        "(a change between batches is safe); if those markers are another pipeline's with "
        "the same pipeline and sink names, rename one of them."
    )
    # back on the first marker topic, the replay completes the batch: each row once
    back = opened(kafka, topic, str(sink.pipeline), partitions=2, dead_letter=f"kafka:{dlq}")
    result = write(back, df)
    assert (result.rows, result.details["dead_letters"]) == (8, 1)
    counts = key_counts(read_topic(kafka.bootstrap, topic, 8))
    assert counts == {str(i): 1 for i in range(1, 9)}
    # the batch complete, the move is safe: batch 1 on the new marker topic
    result = write(moved, spark.createDataFrame([(9, "v9")], "id LONG, payload STRING"), 1)
    assert (result.rows, result.details["written"]) == (1, 1)
    assert key_counts(read_topic(kafka.bootstrap, topic, 9)) == {
        **counts, "9": 1
    }  # fmt: skip


def test_a_map_column_is_written_as_a_json_object(spark: Any, kafka: Broker, topic: str) -> None:
    """The README promises the row as JSON the way Spark's ``to_json`` writes it. A map
    was written as an array of [key, value] pairs (pyarrow's ``to_pylist`` form), an empty
    map as ``[]``: a reader saw another type than the batch held."""
    sink = opened(kafka, topic)
    df = spark.sql(
        "SELECT 1L AS id, map('a', 1, 'b', 2) AS m, map('k', 'v') AS s, "
        "map_filter(map('x', 1), (k, v) -> false) AS e"
    )
    write(sink, df)
    (record,) = read_topic(kafka.bootstrap, topic, 1)
    assert json.loads(record["value"]) == {
        "id": 1, "m": {"a": 1, "b": 2}, "s": {"k": "v"}, "e": {}
    }  # fmt: skip


def test_a_day_time_interval_keeps_its_microseconds(spark: Any, kafka: Broker, topic: str) -> None:
    """A day-time interval was written as float seconds (``timedelta.total_seconds()``):
    100000 days and 1 microsecond (8640000000.000001 s) arrived as 8640000000.000002, a
    value other than the batch's, without an error. Now an interval is refused before
    the first record, wherever the sink writes it as JSON or text: in the row's JSON, as
    a key column, as a header column; and nothing is produced."""
    from fanout.errors import SchemaMismatchError

    df = spark.sql(
        "SELECT 1L AS id, 'p' AS payload, INTERVAL '100000 00:00:00.000001' DAY TO SECOND AS d"
    )
    advice = (
        "batch column(s) cannot be written as JSON faithfully: column 'd' (interval day to "
        "second): an interval has no faithful JSON form here (written as a float of seconds, "
        "or not at all); cast it in the query, e.g. CAST(d AS STRING), or a number of a "
        "stated unit"
    )
    for options in ({}, {"key": "d", "value": "payload"},
                    {"value": "payload", "headers": ["d"]}):  # fmt: skip
        sink = opened(kafka, topic, **options)
        with pytest.raises(SchemaMismatchError) as caught:
            write(sink, df, batch_id=3)
        refused = caught.value
        assert (str(refused), refused.sink, refused.batch_id, refused.columns) == (
            f"sink 'events', batch 3: {advice}",
            "events",
            3,
            ["d"],
        )
    assert read_topic(kafka.bootstrap, topic, 0, timeout=5) == []


def test_an_oauth_assertion_key_passphrase_is_a_secret() -> None:
    """``secret_values()`` decides what fanout masks in errors, logs and the ledger; the
    librdkafka setting ``sasl.oauthbearer.assertion.private.key.passphrase`` holds a
    password but matches none of the secret words (password, secret, key.pem, ...)."""
    sink = KafkaSink("events", bootstrap_servers="127.0.0.1:9", topic="t", producer={
        "sasl.oauthbearer.assertion.private.key.passphrase": "hunter2-passphrase"})  # fmt: skip
    assert list(sink.secret_values()) == ["hunter2-passphrase"]


def test_validate_refuses_a_keyless_sink_over_a_map_column(spark: Any, kafka: Broker) -> None:
    """A keyless sink partitions by every column, and Spark refuses to hash a map
    (``DATATYPE_MISMATCH.HASH_MAP_TYPE``): every batch of such a query fails. ``fanout
    validate`` (``check_schema``) passes it, so the stream starts and stalls at its first
    batch with Spark's error instead of failing before it starts."""
    from fanout.errors import SchemaMismatchError

    sink = open_sink(KafkaSink("events", bootstrap_servers=kafka.bootstrap,
                               topic=_any_topic(kafka), partitions=2), "rdmap")  # fmt: skip
    df = spark.sql("SELECT 1L AS id, map('a', 1) AS m")
    with pytest.raises(SchemaMismatchError) as refused:
        sink.check_schema(df.toArrow().schema)
    advice = (
        "column(s) 'm' (map<string,int>) cannot assign rows to partitions: Spark cannot hash "
        "a map or a variant (DATATYPE_MISMATCH.HASH_MAP_TYPE or HASH_VARIANT_TYPE). This "
        "sink has no key, so it partitions by every column it writes: give it key columns "
        "(Kafka 'key', PostgreSQL 'keys'), or drop the column or convert it in the query or "
        "the sink's select (e.g. to_json(m))"
    )
    assert (str(refused.value), refused.value.columns) == (f"sink 'events': {advice}", ["m"])
    with pytest.raises(SchemaMismatchError) as at_batch:  # the stream's first batch too
        write(sink, df, batch_id=3)
    assert str(at_batch.value) == f"sink 'events', batch 3: {advice}"


def test_a_record_the_producer_refuses_is_named_by_its_key(
    spark: Any, kafka: Broker, topic: str
) -> None:
    """Without a dead-letter target, a record the local producer refuses (over its
    ``message.max.bytes``, which ``max_record_bytes`` set higher let through) failed the
    batch with librdkafka's words only ("Broker: Message size too large", though nothing
    was sent): no key, no size, no limit, so the user could not find the row. Now it is
    named as the sink's own size check names a record, and nothing is produced."""
    pipeline = f"rd{uuid.uuid4().hex[:6]}"
    sink = opened(kafka, topic, pipeline, value="payload", headers=HEADS,
                  max_record_bytes=100_000, producer={"message.max.bytes": 2000})  # fmt: skip
    over, _ = _payloads(pipeline)
    with pytest.raises(KafkaBadRecordError) as caught:
        write(sink, _header_rows(spark, [(1, over, *(["x"] * 60))]))
    assert str(caught.value) == (
        "sink 'events', batch 0: 1 of 1 partition(s) failed; partitions holding the batch "
        "(skipped on replay): none\n"
        f"  - partition 0 (transactional.id 'fanout/{pipeline}/events-0', topic {topic!r}): "
        "1 record(s) the topic cannot take and no 'dead_letter' target: record of 2001 bytes "
        "(key '1') refused by the producer: over its message.max.bytes of 2000 bytes "
        "(max_record_bytes, 100000, let it through)"
    )
    assert read_topic(kafka.bootstrap, topic, 0, timeout=5) == []


def test_a_date_python_cannot_hold_is_written_as_spark_writes_it(
    spark: Any, kafka: Broker, topic: str
) -> None:
    """Spark holds dates and timestamps outside Python's years 1-9999 (0000-12-31,
    +10000-01-01). The encoder turned them into Python objects, which raised
    ``OverflowError: date value out of range``: the partition failed with that text alone
    and the dead-letter target was not used, so no replay could complete the batch. Now
    they are written from their stored integers, a date as Spark's ``to_json`` writes
    it, in the value, a header column and a nested struct; nothing is dead-lettered."""
    dlq = f"{topic}-dlq"
    create_topic(kafka.bootstrap, dlq, 1)
    sink = opened(kafka, topic, dead_letter=f"kafka:{dlq}", headers=["d"])
    df = spark.sql(
        "SELECT id, d, t, named_struct('d', d) AS s FROM VALUES "
        "(1L, DATE'2024-05-01', timestamp_micros(0)), "
        "(2L, date_add(DATE'0001-01-01', -1), timestamp_micros(-62135596800000001)), "
        "(3L, date_add(DATE'9999-12-31', 1), timestamp_micros(253402300800000123)) "
        "AS v(id, d, t)"
    )
    result = write(sink, df)
    assert (result.rows, result.details["written"], result.details["dead_letters"]) == (3, 3, 0)
    records = sorted(read_topic(kafka.bootstrap, topic, 3), key=lambda r: r["key"])
    assert [(r["key"], r["headers"]["d"], r["value"]) for r in records] == [
        ("1", "2024-05-01",
         '{"id":1,"d":"2024-05-01","t":"1970-01-01T00:00:00+00:00","s":{"d":"2024-05-01"}}'),
        ("2", "0000-12-31",
         '{"id":2,"d":"0000-12-31","t":"0000-12-31T23:59:59.999999+00:00",'
         '"s":{"d":"0000-12-31"}}'),
        ("3", "+10000-01-01",
         '{"id":3,"d":"+10000-01-01","t":"+10000-01-01T00:00:00.000123+00:00",'
         '"s":{"d":"+10000-01-01"}}'),
    ]  # fmt: skip
    written_by_spark = df.orderBy("id").selectExpr("to_json(s)").collect()
    spark_json = [json.loads(r[0])["d"] for r in written_by_spark]
    assert spark_json == ["2024-05-01", "0000-12-31", "+10000-01-01"]


def test_two_sinks_of_one_fan_out_sharing_a_transactional_id_prefix_are_refused_at_build(
    kafka: Broker, topic: str, tmp_path: Path
) -> None:
    """Two Kafka sinks of one ``FanOut`` with the same explicit ``transactional_id_prefix``
    fence each other's producers in every batch (seen: each partition of sink ``b``
    ``KafkaFencedError`` on ``shared-0``/``shared-1``, not retried). Both prefixes are
    known when the ``FanOut`` is built, where the clash could be refused."""
    from fanout import FanOut
    from fanout.errors import ConfigurationError

    other = f"{topic}-b"
    create_topic(kafka.bootstrap, other, 1)
    sinks = [
        {"type": "kafka", "name": name, "bootstrap_servers": kafka.bootstrap, "topic": target,
         "key": "id", "partitions": 2, "transactional_id_prefix": "shared"}
        for name, target in (("a", topic), ("b", other))
    ]  # fmt: skip
    with pytest.raises(ConfigurationError) as refused:
        FanOut("rdshared", str(tmp_path / "ledger"), sinks).close()
    assert str(refused.value) == (
        "pipeline 'rdshared': sinks 'a' and 'b' both use the Kafka transactional ids "
        "shared-<p> (transactional_id_prefix 'shared'), which a sink must have to itself "
        "(they would fence or overwrite each other in every batch): give each its own"
    )


def _any_topic(kafka: Broker) -> str:
    name = f"orders-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, name, 1)
    return name
