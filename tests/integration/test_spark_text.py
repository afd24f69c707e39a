""":mod:`fanout.contract.spark_text` against the running Spark's ``CAST(x AS STRING)``, on
one wide set of values: ~2000 doubles and ~2000 floats over every magnitude (fixed edge
values, then seeded random ones, bit patterns included), and decimals of several
precisions and scales (zeros of a large scale, negatives, scale 0, 18, 37, precision 38).

Each text is Spark's, but where Spark on Java 17 prints more digits than needed (the
JDK's bug 4511638, fixed in Java 19: ``2.0E23`` as ``1.9999999999999998E23``): there
fanout writes the shortest digits, as Java 19+ does, and the test checks that Spark's text
is a longer spelling of the same value (of the column's width) in the same notation.
"""

from __future__ import annotations

import decimal
import math
import random
import struct
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa

from fanout.contract.spark_text import decimal_text, double_text, floating_text, plain_decimal

NAN, INF = float("nan"), float("inf")
DOUBLES = [  # (value, CAST(value AS STRING) as Spark 4.2 prints it) , on Java 17 and 19+ alike
    (0.0, "0.0"), (-0.0, "-0.0"), (1.0, "1.0"), (0.1, "0.1"), (1e-3, "0.001"), (1e-4, "1.0E-4"),
    (9.999e-4, "9.999E-4"), (1e7, "1.0E7"), (9999999.0, "9999999.0"), (1e20, "1.0E20"),
    (1.0e-7, "1.0E-7"), (123456789.123, "1.23456789123E8"), (2.0**53, "9.007199254740992E15"),
    (5e-324, "4.9E-324"), (1.7976931348623157e308, "1.7976931348623157E308"), (NAN, "NaN"),
    (INF, "Infinity"), (-INF, "-Infinity"), (-1e-3, "-0.001"),
    (1e7 * (1 - 2**-53), "9999999.999999998"),
]  # fmt: skip
FLOATS = [  # (a float32 as its double, CAST(CAST(value AS FLOAT) AS STRING))
    (float(np.float32(0.1)), "0.1"), (float(np.float32(1e-3)), "0.001"), (1e7, "1.0E7"),
    (16777216.0, "1.6777216E7"), (float(np.float32(3.4028235e38)), "3.4028235E38"),
    (float(np.float32(1.4e-45)), "1.4E-45"), (float(np.float32(2.8e-45)), "2.8E-45"),
    (float(np.float32(1e-4)), "1.0E-4"), (float(np.float32(3.3333333)), "3.3333333"),
    (-0.0, "-0.0"), (NAN, "NaN"), (-INF, "-Infinity"),
]  # fmt: skip
DECIMAL_TYPES = [(10, 2), (20, 10), (38, 18), (18, 18), (10, 0), (38, 0), (38, 8), (38, 37), (5, 5)]


def test_doubles_floats_and_decimals_are_spelled_as_spark_casts_them(spark: Any) -> None:
    doubles = [v for v, _ in DOUBLES] + _random_doubles(random.Random(46), 2000 - len(DOUBLES))
    _check_floating(spark, doubles, pa.float64(), [t for _, t in DOUBLES], np.float64)
    floats = [v for v, _ in FLOATS] + _random_floats(random.Random(47), 2000 - len(FLOATS))
    _check_floating(spark, floats, pa.float32(), [t for _, t in FLOATS], np.float32)
    for precision, scale in DECIMAL_TYPES:
        values = _decimals(random.Random(precision * 100 + scale), precision, scale)
        column = pa.array(values, pa.decimal128(precision, scale))
        theirs = _spark_texts(spark, column)
        assert decimal_text(column).to_pylist() == theirs, (precision, scale)
        assert [None if v is None else plain_decimal(v) for v in column.to_pylist()] == theirs


def _check_floating(
    spark: Any, values: list[float], kind: pa.DataType, fixed: list[str], width: type
) -> None:
    """The fixed values are exactly Spark's text; every value is Spark's text but for a
    longer Java 17 spelling of it."""
    column = pa.array(values, kind)
    ours = floating_text(column).to_pylist()
    theirs = _spark_texts(spark, column)
    assert ours[: len(fixed)] == theirs[: len(fixed)] == fixed
    wrong = [(v, o, t) for v, o, t in zip(values, ours, theirs, strict=True)
             if _wrong(v, o, t, width)]  # fmt: skip
    assert wrong == []


def _wrong(value: float, ours: str, theirs: str, width: type) -> bool:
    """Whether ``ours`` and Spark's text differ other than in Java 17's way: the same
    value of the column's ``width``, the same notation, Spark's with more digits."""
    if ours == theirs:
        return False
    same = width(float(ours)) == width(float(theirs)) == width(value)
    notation = ("E" in ours) == ("E" in theirs)
    return not (same and notation and _digits(theirs) > _digits(ours) and math.isfinite(value))


def _digits(text: str) -> int:
    mantissa = text.lstrip("-").split("E")[0].replace(".", "").lstrip("0")
    return len(mantissa.rstrip("0")) or 1


def _spark_texts(spark: Any, column: pa.Array) -> list[str | None]:
    table = pa.table({"id": pa.array(range(len(column)), pa.int64()), "x": column})
    frame = spark.createDataFrame(table).orderBy("id").selectExpr("CAST(x AS STRING) AS x")
    return frame.toArrow().column("x").to_pylist()


def _random_doubles(rng: random.Random, count: int) -> list[float]:
    out: list[float] = []
    while len(out) < count:
        kind = rng.random()
        if kind < 0.5:  # every magnitude, 16-17 digits
            value = rng.uniform(1, 10) * 10.0 ** rng.randint(-30, 30)
        elif kind < 0.8:  # few digits, near the plain range's edges too
            value = round(rng.uniform(0, 1000), rng.randint(0, 6)) * 10.0 ** rng.randint(-8, 8)
        else:  # any bit pattern: subnormals, huge exponents
            value = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
            if math.isnan(value):
                continue
        out.append(-value if rng.random() < 0.3 else value)
    return out


def _random_floats(rng: random.Random, count: int) -> list[float]:
    out: list[float] = []
    while len(out) < count:
        if rng.random() < 0.6:
            value = rng.uniform(1, 10) * 10.0 ** rng.randint(-40, 37)
        else:
            value = struct.unpack("<f", struct.pack("<I", rng.getrandbits(32)))[0]
            if math.isnan(value):
                continue
        value = float(np.float32(value))
        out.append(-value if rng.random() < 0.3 else value)
    return out


def _decimals(rng: random.Random, precision: int, scale: int) -> list[Decimal | None]:
    with decimal.localcontext() as context:
        context.prec = 60
        largest = Decimal(10**precision - 1).scaleb(-scale)
        tiny = Decimal(1).scaleb(-scale)
        values: list[Decimal | None] = [Decimal(0).scaleb(-scale), tiny, -tiny, largest, -largest]
        for _ in range(60):
            value = Decimal(rng.randrange(10 ** rng.randint(1, precision))).scaleb(-scale)
            values.append(-value if rng.random() < 0.3 else value)
    return [*values, None]


def test_floats_in_json_are_spelled_as_spark_s_to_json(spark: Any) -> None:
    """:func:`~fanout.contract.spark_json.spark_json` of a row (its ``float`` values widened
    by :func:`~fanout.contract.float32.widened`, as the Kafka sink and the dead letters do)
    is Spark's ``to_json`` of the same row, and so is a dead letter's JSON but for its
    spaces: ``1.0E20``, ``"NaN"``, a map key ``1.0E-4``, and a subnormal ``float`` whose
    shortest text has one digit with the two closest to its value (``1e-45``:
    ``1.4E-45``, which the double ``1e-45`` would be as ``1.0E-45``)."""
    from fanout.contract.dead_letters import letter_rows
    from fanout.contract.float32 import widened
    from fanout.contract.spark_json import COMPACT, spark_json
    from fanout.deadletters.layout import letter_json

    floats = [1.4e-45, 4.2e-45, 7e-45, -2.8e-45, 1.4e-44, 0.1, NAN, 3.4028235e38]
    doubles = [1e20, 1e-4, NAN, -INF, 5e-324, 2.0**53, 0.001, -0.0]
    table = pa.table(
        {
            "id": pa.array(range(len(floats)), pa.int64()),
            "f": pa.array(floats, pa.float32()),
            "d": pa.array(doubles, pa.float64()),
            "a": pa.array([[f, None] for f in floats], pa.list_(pa.float32())),
            "m": pa.array([[(d, f)] for d, f in zip(doubles, floats, strict=True)],
                          pa.map_(pa.float64(), pa.float32())),
        }
    )  # fmt: skip
    frame = spark.createDataFrame(table).orderBy("id").selectExpr("to_json(struct(*)) AS j")
    theirs = frame.toArrow().column("j").to_pylist()
    rows = widened(table).to_pylist()
    maps = [{"m": {double_text(k): v for k, v in row.pop("m")}} for row in rows]
    assert [
        spark_json(r | m, separators=COMPACT) for r, m in zip(rows, maps, strict=True)
    ] == theirs
    letters = [letter_json(row) for row in letter_rows(table)]
    assert [t.replace(", ", ",").replace(": ", ":") for t in letters] == theirs
