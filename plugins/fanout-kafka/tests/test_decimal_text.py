"""A decimal is written as the text Spark's ``CAST(d AS STRING)`` gives it (plain, with
its scale), as the PostgreSQL sink writes one: Python's ``str`` wrote small values in
exponent form (``0E-10``, ``1.000E-7``), in values, keys and headers alike."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pyarrow as pa
from fanout_kafka.records import Encoder

VALUES = [Decimal("0E-10"), Decimal("1E-7"), Decimal("-123.4500000000")]


def test_a_decimal_is_plain_text_with_its_scale(spark: Any) -> None:
    column = pa.array(VALUES, pa.decimal128(20, 10))
    batch = pa.RecordBatch.from_arrays([column, pa.array([[v] for v in VALUES])], ["d", "n"])
    good, bad = Encoder(("d",), None, ("d",), (), 10_000).encode_arrow([batch])
    texts = ["0.0000000000", "0.0000001000", "-123.4500000000"]
    assert bad == []
    assert [(r.key, r.value, r.headers) for r in good] == [
        (t.encode(), f'{{"d":"{t}","n":["{t}"]}}'.encode(), [("d", t.encode())]) for t in texts
    ]
    df = spark.createDataFrame([(v,) for v in VALUES], "d DECIMAL(20,10)")
    assert [r[0] for r in df.selectExpr("CAST(d AS STRING)").collect()] == texts
