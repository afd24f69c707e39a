"""Rows to Kafka records: keys, values, headers, and the bad records caught before
anything is sent."""

from __future__ import annotations

import datetime as dt
import decimal
import json

from fanout_kafka.records import (
    RECORD_OVERHEAD_BYTES,
    BadRecord,
    Encoder,
    Record,
    batch_headers,
)
from fanout_kafka.values import to_bytes


def encoder(**overrides: object) -> Encoder:
    options: dict[str, object] = {
        "key_columns": ("id",),
        "value_column": None,
        "header_columns": (),
        "headers": batch_headers("p", "s", 7),
        "max_record_bytes": 1000,
    }
    options.update(overrides)
    return Encoder(**options)  # type: ignore[arg-type]


def test_json_value_single_column_key_and_batch_headers() -> None:
    record = encoder().encode({"id": 42, "name": "é", "amount": 1.5})
    assert record == Record(
        b"42",
        json.dumps({"id": 42, "name": "é", "amount": 1.5}, separators=(",", ":"),
                   ensure_ascii=False).encode(),
        [("fanout.pipeline", b"p"), ("fanout.sink", b"s"), ("fanout.batch_id", b"7")],
    )  # fmt: skip


def test_several_key_columns_make_a_json_array_key() -> None:
    record = encoder(key_columns=("a", "b")).encode({"a": "x", "b": 3})
    assert isinstance(record, Record) and record.key == b'["x",3]'


def test_value_column_is_sent_as_is_and_null_is_a_tombstone() -> None:
    enc = encoder(value_column="payload", headers=())
    assert enc.encode({"id": "k", "payload": b"\x00\x01"}) == Record(b"k", b"\x00\x01", [])
    assert enc.encode({"id": "k", "payload": "text"}) == Record(b"k", b"text", [])
    assert enc.encode({"id": "k", "payload": None}) == Record(b"k", None, [])


def test_header_columns_are_added_when_not_null() -> None:
    enc = encoder(header_columns=("trace", "tenant"), headers=())
    record = enc.encode({"id": 1, "trace": "t-1", "tenant": None})
    assert isinstance(record, Record) and record.headers == [("trace", b"t-1")]


def test_keyless_records_have_no_key() -> None:
    record = encoder(key_columns=None).encode({"id": None})
    assert isinstance(record, Record) and record.key is None


def test_null_key_is_a_bad_record_naming_the_column() -> None:
    bad = encoder(key_columns=("id", "region")).encode({"id": 1, "region": None})
    assert isinstance(bad, BadRecord)
    assert bad.reason.startswith("null key: key column(s) 'region' are null in row ")
    assert '"id": 1' in bad.reason


def test_a_null_key_rows_preview_spells_floats_as_spark_does() -> None:
    row = {"id": None, "big": 1e20, "small": 0.0001, "one": 1.0, "nan": float("nan")}
    bad = encoder().encode({**row, "nested": [2.5e-7, {"x": -0.0}]})
    assert isinstance(bad, BadRecord)
    assert bad.reason == (
        "null key: key column(s) 'id' are null in row "
        '{"id": null, "big": 1.0E20, "small": 1.0E-4, "one": 1.0, "nan": "NaN", '
        '"nested": [2.5E-7, {"x": -0.0}]}'
    )


def test_record_over_the_limit_is_a_bad_record_with_size_and_limit() -> None:
    enc = encoder(headers=(), max_record_bytes=500)
    # key 1 byte, value {"id":1,"v":"..."} 15 bytes and the x's: exactly the limit
    fits = enc.encode({"id": 1, "v": "x" * (500 - RECORD_OVERHEAD_BYTES - 1 - 15)})
    assert isinstance(fits, Record) and fits.size == 500
    bad = enc.encode({"id": 1, "v": "x" * (500 - RECORD_OVERHEAD_BYTES - 15)})
    assert isinstance(bad, BadRecord) and bad.record.size == 501
    assert bad.reason == (
        "record of 501 bytes (key '1') is over the sink's limit of 500 bytes (max_record_bytes: "
        "by default the topic's max.message.bytes less the record batch header, at most the "
        "producer's message.max.bytes; sizes as librdkafka counts them)"
    )


def test_a_record_size_counts_headers_as_librdkafka_does() -> None:
    """librdkafka (``rd_kafka_msg_new0``) refuses a record whose key, value and headers
    (each name and value with its length as a zigzag varint) plus 36 bytes of framing are
    over ``message.max.bytes``; header names are counted in UTF-8 bytes."""
    headers = [("h", b"x"), ("é" * 32, b"v" * 64), ("n" * 64, b"w" * 8192)]
    record = Record(b"k", b"value", headers)
    # name 1 + 1, value 1 + 1; name 64 bytes + 2 (2*64 = 128 takes two varint bytes),
    # value 64 + 2; name 64 + 2, value 8192 + 3 (2*8192 = 16384 takes three)
    assert record.size == 1 + 5 + (2 + 2) + (66 + 66) + (66 + 8195) + RECORD_OVERHEAD_BYTES
    assert RECORD_OVERHEAD_BYTES == 36


def test_encode_all_splits_good_and_bad_in_order() -> None:
    good, bad = encoder().encode_all([{"id": 1}, {"id": None}, {"id": 2}])
    assert [r.key for r in good] == [b"1", b"2"]
    assert len(bad) == 1 and bad[0].reason.startswith("null key")


def test_json_of_dates_decimals_and_bytes() -> None:
    row = {
        "id": 1,
        "at": dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        "day": dt.date(2024, 1, 2),
        "price": decimal.Decimal("1.10"),
        "blob": b"\x01\x02",
    }
    record = encoder(headers=()).encode(row)
    assert isinstance(record, Record) and json.loads(record.value or b"") == {
        "id": 1,
        "at": "2024-01-02T03:04:05+00:00",
        "day": "2024-01-02",
        "price": "1.10",
        "blob": "AQI=",
    }
    assert to_bytes(dt.date(2024, 1, 2)) == b"2024-01-02"
    assert to_bytes(3.5) == b"3.5"


def test_an_instant_is_utc_text_whatever_the_session_zone_nested_and_in_keys() -> None:
    import pyarrow as pa

    # Arrow carries Spark's instants in the session's zone (here Asia/Kolkata, +05:30);
    # a zone other than UTC takes the row-by-row path
    zone = pa.timestamp("us", tz="Asia/Kolkata")
    at = dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC)
    table = pa.table(
        {
            "id": pa.array([at], pa.timestamp("us", tz="UTC")).cast(zone),
            "s": pa.array(
                [{"at": at, "day": dt.date(2024, 1, 2)}],
                pa.struct([("at", zone), ("day", pa.date32())]),
            ),
            "a": pa.array([[at.replace(microsecond=0)]], pa.list_(zone)),
        }
    )
    good, bad = encoder(headers=()).encode_arrow(table.to_batches())
    assert bad == []
    assert [(r.key, r.value) for r in good] == [
        (
            b"2024-01-02T03:04:05.123456+00:00",
            b'{"id":"2024-01-02T03:04:05.123456+00:00",'
            b'"s":{"at":"2024-01-02T03:04:05.123456+00:00","day":"2024-01-02"},'
            b'"a":["2024-01-02T03:04:05+00:00"]}',
        )
    ]


def test_a_dead_letter_keeps_every_byte_of_the_record() -> None:
    """Key, value and header values that are not UTF-8 (binary columns) were decoded with
    ``errors="replace"``: a dead letter held U+FFFD instead of the bytes. Text stays text,
    other bytes are ``{"base64": ...}``; headers keep their order and repeated names."""
    from fanout_kafka.records import bad_letter

    from fanout.deadletters.layout import letter_json

    record = Record(
        b"\xff\x00k",
        b'{"a":"\xc3\xa9"}',
        [("h", b"text"), ("bin", b"\x80\x81"), ("h", b""), ("é", b"\xc3\xa9")],
    )
    letter = bad_letter(BadRecord(record, "why"), "orders", 3)
    assert (letter.reason, letter.partition, letter.row) == ("why", 3, None)
    assert json.loads(letter_json(dict(letter.details))) == {
        "topic": "orders",
        "key": {"base64": "/wBr"},
        "value": '{"a":"é"}',
        "headers": [["h", "text"], ["bin", {"base64": "gIE="}], ["h", ""], ["é", "é"]],
        "record_bytes": record.size,
    }
    assert bad_letter(BadRecord(Record(None, None, []), "x"), "t", None).details["key"] is None
