"""A Spark string holding bytes that are not UTF-8 (``CAST(X'FF' AS STRING)``) is a bad
record naming the column and the bytes: the column-wise encoder wrote them into the JSON
value as they were (a record no JSON parser reads, sent without a word), and the
row-by-row one (a nested string) failed the task with a bare ``UnicodeDecodeError``."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
from fanout_kafka import KafkaSink
from fanout_kafka.records import BadRecord, Encoder, Record
from kafkatools import Broker, read_topic

from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.testing import open_sink
from tests.integration.streams import delta_rows

FIX = "fix the text in the query (e.g. decode() of its bytes in their encoding) or write the "
FIX += "column as binary"


def _text(*values: bytes | None) -> pa.Array:
    """A string array holding these bytes unchecked, as Spark hands them to Arrow."""
    raw = pa.array(list(values), pa.binary())
    return pa.Array.from_buffers(pa.string(), len(raw), raw.buffers())


def test_a_top_level_string_not_utf8_is_a_bad_record_naming_column_and_bytes() -> None:
    batch = pa.RecordBatch.from_arrays([pa.array([1, 2]), _text(b"a\xffb", b"ok")], ["id", "s"])
    good, bad = Encoder(("id",), None, (), (), 10_000).encode_arrow([batch])
    assert good == [Record(b"2", b'{"id":2,"s":"ok"}', [])]
    assert bad == [
        BadRecord(
            Record(b"1", b'{"id":1,"s":"Yf9i"}', []),
            f"record of 56 bytes (key '1'): column 's' holds text that is not UTF-8: "
            f"b'a\\xffb'; {FIX}",
        )
    ]


def test_a_nested_string_not_utf8_is_a_bad_record_naming_the_column() -> None:
    nested = pa.StructArray.from_arrays([_text(b"ok", b"\xc3")], ["t"])
    batch = pa.RecordBatch.from_arrays([pa.array([1, 2]), nested], ["id", "n"])
    good, bad = Encoder(("id",), None, (), (), 10_000).encode_arrow([batch])
    assert good == [Record(b"1", b'{"id":1,"n":{"t":"ok"}}', [])]
    assert bad == [
        BadRecord(
            Record(b"2", b'{"id":2,"n":null}', []),
            "record of 54 bytes (key '2'): column 'n' holds text nested in it that is not "
            f"UTF-8 (left out of the letter's value); {FIX}",
        )
    ]


def test_spark_text_not_utf8_goes_to_the_dead_letter_table(
    spark: Any, kafka: Broker, topic: str, tmp_path: Path
) -> None:
    pipeline = f"u8{uuid.uuid4().hex[:6]}"
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic, key="id",
                     partitions=1, headers=False, dead_letter=str(tmp_path / "dlq"))  # fmt: skip
    open_sink(sink, pipeline)
    df = spark.sql("SELECT * FROM VALUES (1, 'ok'), (2, CAST(X'61FF' AS STRING)) AS t(id, s)")
    result = sink.write(Batch(df, BatchInfo(pipeline, 0), "events",
                              txn_app_id(pipeline, "events")))  # fmt: skip
    assert (result.details["written"], result.details["dead_letters"]) == (1, 1)
    assert [(r["key"], r["value"]) for r in read_topic(kafka.bootstrap, topic, 1)] == [
        ("1", '{"id":1,"s":"ok"}')
    ]
    (letter,) = delta_rows(tmp_path / "dlq")
    assert letter["reason"] == (
        f"record of 56 bytes (key '2'): column 's' holds text that is not UTF-8: b'a\\xff'; {FIX}"
    )
    assert json.loads(letter["details"])["value"] == '{"id":2,"s":"Yf8="}'
