"""``KafkaSink.check_schema`` (what ``fanout validate`` asks of a sink whose source declares
its schema): after ``open()`` on the broker, a schema without the columns the options name,
or with a ``value`` column that is neither string nor binary, fails before the stream
starts, in the words of the first batch less its batch id."""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow as pa
import pytest
from fanout_kafka import KafkaSink
from kafkatools import Broker, _consume

from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.errors import SchemaMismatchError
from fanout.testing import open_sink

ORDERS = pa.schema([("order_id", pa.int64()), ("status", pa.string()), ("price", pa.float64())])
COLUMNS = "(columns: order_id, status, price)"


def _opened(kafka: Broker, topic: str, **options: Any) -> KafkaSink:
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic, partitions=2,
                     **options)  # fmt: skip
    return open_sink(sink, f"checks{uuid.uuid4().hex[:6]}")


CASES = [
    pytest.param(
        {"key": "id"}, ["id"],
        f"column(s) 'id' named by option 'key' are not in the batch {COLUMNS}; add them in "
        "the query or the sink's select, or change the option",
        id="key-column-missing",
    ),
    pytest.param(
        {"key": ["order_id", "region"], "headers": ["trace_id"], "order_by": "ts"},
        ["region", "trace_id", "ts"],
        f"column(s) 'region', 'trace_id', 'ts' named by options 'key', 'order_by', 'headers' "
        f"are not in the batch {COLUMNS}; add them in the query or the sink's select, or "
        "change the options",
        id="key-order-and-header-columns-missing",
    ),
    pytest.param(
        {"key": "order_id", "value": "payload"}, ["payload"],
        f"column(s) 'payload' named by option 'value' are not in the batch {COLUMNS}; add "
        "them in the query or the sink's select, or change the option",
        id="value-column-missing",
    ),
    pytest.param(
        {"key": "order_id", "value": "price"}, ["price"],
        "option 'value' names column 'price' of type double; it must be a string or binary "
        "column (or use value='json')",
        id="value-column-of-another-type",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("options", "columns", "message"), CASES)
def test_a_schema_the_options_do_not_fit_fails_before_the_stream_starts(
    kafka: Broker, topic: str, options: dict[str, Any], columns: list[str], message: str
) -> None:
    sink = _opened(kafka, topic, **options)
    with pytest.raises(SchemaMismatchError) as checked:
        sink.check_schema(ORDERS)
    assert str(checked.value) == f"sink 'events': {message}"
    assert checked.value.columns == columns
    assert checked.value.batch_id is None


def test_a_schema_the_options_fit_passes(kafka: Broker, topic: str) -> None:
    _opened(kafka, topic).check_schema(ORDERS)  # keyless, the row as JSON
    fits = {"key": ["order_id", "status"], "headers": ["status"], "order_by": "price",
            "value": "status"}  # fmt: skip
    _opened(kafka, topic, **fits).check_schema(ORDERS)
    binary = pa.schema([*ORDERS, pa.field("payload", pa.binary())])
    _opened(kafka, topic, key="order_id", value="payload").check_schema(binary)


def test_the_first_batch_is_refused_in_the_same_words(
    spark: Any, kafka: Broker, topic: str
) -> None:
    sink = _opened(kafka, topic, key="id")
    with pytest.raises(SchemaMismatchError) as checked:
        sink.check_schema(ORDERS)
    df = spark.createDataFrame([(1, "paid", 9.5)], "order_id LONG, status STRING, price DOUBLE")
    info = BatchInfo(sink.pipeline or "p", 3)
    with pytest.raises(SchemaMismatchError) as first_batch:
        sink.write(Batch(df, info, sink.name, txn_app_id(info.pipeline, sink.name)))
    assert str(first_batch.value) == str(checked.value).replace(
        "sink 'events':", "sink 'events', batch 3:", 1
    )
    assert first_batch.value.columns == checked.value.columns == ["id"]


def test_a_column_json_cannot_hold_is_refused_before_any_record_is_produced(
    spark: Any, kafka: Broker, topic: str
) -> None:
    sink = _opened(kafka, topic, key="order_id")
    df = spark.sql(
        "SELECT CAST(id AS BIGINT) AS order_id, map(1, 'a') AS tags, "
        "INTERVAL '1 02:03:04.000005' DAY TO SECOND AS took FROM range(3)"
    )
    info = BatchInfo(sink.pipeline or "p", 0)
    with pytest.raises(SchemaMismatchError) as first_batch:
        sink.write(Batch(df, info, sink.name, txn_app_id(info.pipeline, sink.name)))
    assert str(first_batch.value) == (
        "sink 'events', batch 0: batch column(s) cannot be written as JSON faithfully: "
        "column 'tags' (map<int,string>): a map's keys become the keys of a JSON object, "
        "which are text; cast them in the query, e.g. transform_keys(tags, (k, v) -> CAST(k "
        "AS STRING)), or write map_entries(tags) (an array of key/value objects); column "
        "'took' (interval day to second): an interval has no faithful JSON form here "
        "(written as a float of seconds, or not at all); cast it in the query, e.g. "
        "CAST(took AS STRING), or a number of a stated unit"
    )
    assert first_batch.value.columns == ["tags", "took"]
    assert _consume(kafka.bootstrap, topic, 0, 10.0, 3.0)["records"] == []
