"""Column-wise encoding gives exactly the bytes of the row-by-row path, value for value,
including the values Arrow formats differently from Python (which Python then formats)."""

from __future__ import annotations

import datetime as dt
import decimal
import random

import pyarrow as pa
import pytest
from fanout_kafka import vector
from fanout_kafka.records import BadRecord, Encoder, Record, batch_headers

from fanout.contract.float32 import widened

N = 3000


EDGE_MICROS = [
    -30_610_224_000_000_001,  # 0999-12-31T23:59:59.999999
    -30_610_224_000_000_000,  # 1000-01-01T00:00:00
    -30_610_223_999_999_999,
    253_402_300_799_999_999,  # 9999-12-31T23:59:59.999999
    253_402_300_799_000_000,
    -1_000_000,
    -999_999,
    -1,
    0,
    1,
    1_000_000,
]
EDGE_DAYS = [-354_286, -354_285, 2_932_896, 2_932_895, -1, 0, 1]


def _cycle(values: list[int]) -> list[int]:
    return [values[i % len(values)] for i in range(N)]


def _table() -> pa.Table:
    rng = random.Random(11)
    return pa.table(
        {
            "id": pa.array(range(N), pa.int64()),
            "name": pa.array(
                [f"c-{i % 50}" if i % 13 else f'quo"te\\ \n\t{i} é ☃' for i in range(N)]
            ),
            "amount": pa.array([i / 7 if i % 5 else float(i) for i in range(N)]),
            "wide": pa.array([rng.uniform(-1, 1) * 10 ** rng.randint(-9, 19) for _ in range(N)]),
            "zero": pa.array([0.0, -0.0, 1e-4, 9.999e-5, 1e16, 9999999999999998.0] * (N // 6)),
            "small": pa.array([i / 3 for i in range(N)], pa.float32()),
            "qty": pa.array([i % 100 if i % 11 else None for i in range(N)], pa.int32()),
            "flag": pa.array([None if i % 9 == 0 else bool(i % 2) for i in range(N)]),
            "at": pa.array(
                [
                    1_700_000_000_000_000 + i * 999_999 - 10**15 * (i % 3) - (i % 2)
                    for i in range(N)
                ],
                pa.timestamp("us", tz="UTC"),
            ),
            "wall": pa.array(
                [
                    -62_135_596_800_000_000 + (i % 1000) * 10**13 if i % 7 == 0 else i
                    for i in range(N)
                ],
                pa.timestamp("us"),
            ),
            "day": pa.array([dt.date(1, 1, 1) + dt.timedelta(days=i * 997) for i in range(N)]),
            # the first and last values written column-wise (years 1000 and 9999), whole
            # seconds, and fractions before 1970
            "edge": pa.array(_cycle(EDGE_MICROS), pa.timestamp("us", tz="UTC")),
            "edge_wall": pa.array(_cycle(EDGE_MICROS), pa.timestamp("us")),
            "edge_day": pa.array(_cycle(EDGE_DAYS), pa.date32()),
            # with nulls: quoted values joined per column, not beside the row's constants
            "maybe_name": pa.array([None if i % 4 == 0 else f'n"{i}\\' for i in range(N)]),
            "maybe_at": pa.array(
                [None if i % 5 == 0 else v for i, v in enumerate(_cycle(EDGE_MICROS))],
                pa.timestamp("us", tz="UTC"),
            ),
            "maybe_day": pa.array(
                [None if i % 3 == 0 else v for i, v in enumerate(_cycle(EDGE_DAYS))], pa.date32()
            ),
            "nothing": pa.nulls(N),
        }
    )


def _encoder(key_columns: tuple[str, ...] | None, **options: object) -> Encoder:
    settings: dict[str, object] = {
        "value_column": None,
        "header_columns": (),
        "headers": batch_headers("p", "s", 3),
        "max_record_bytes": 1_000_000,
    }
    settings.update(options)
    return Encoder(key_columns, **settings)  # type: ignore[arg-type]


@pytest.mark.parametrize("keys", [("id",), ("name",), ("id", "at", "amount"), None])
def test_column_wise_bytes_equal_row_by_row_bytes(keys: tuple[str, ...] | None) -> None:
    table = _table()
    enc = _encoder(keys)
    batches = table.to_batches(max_chunksize=700)
    assert vector.json_rows(table) is not None  # every column has a column-wise form
    # a float32 is its shortest text's double in both (fanout.contract.float32)
    expected = enc.encode_all(widened(table).to_pylist())
    assert enc.encode_arrow(batches) == expected
    assert len(expected[0]) == N


def test_bad_records_are_found_and_explained_as_row_by_row() -> None:
    table = pa.table(
        {
            "id": pa.array([1, None, 3, 4], pa.int64()),
            "v": pa.array(["a", "b", "x" * 400, "d"]),
        }
    )
    enc = _encoder(("id",), max_record_bytes=300)
    good, bad = enc.encode_arrow(table.to_batches())
    assert (good, bad) == enc.encode_all(table.to_pylist())
    assert [r.key for r in good] == [b"1", b"4"]
    assert [type(b) for b in bad] == [BadRecord, BadRecord]
    assert "null key" in bad[0].reason
    assert bad[1].reason.startswith("record of 502 bytes (key '3') is over the sink's limit of 300")


def test_a_value_column_and_types_without_a_column_wise_form() -> None:
    table = pa.table(
        {
            "id": pa.array(["k1", "k2", None]),
            "payload": pa.array([b"\x00\x01", None, b"z"]),
            "price": pa.array([decimal.Decimal("1.50"), None, decimal.Decimal("1E-7")]),
        }
    )
    assert vector.json_fragments(table.column("price")) is None
    assert vector.json_rows(table) is None
    by_column = _encoder(("id",), value_column="payload")
    assert by_column.encode_arrow(table.to_batches()) == by_column.encode_all(table.to_pylist())
    whole_row = _encoder(None)  # falls back to row by row, same result
    assert whole_row.encode_arrow(table.to_batches()) == whole_row.encode_all(table.to_pylist())


def test_column_wise_records_are_records_in_row_order() -> None:
    table = pa.table({"id": pa.array([7, 8, 9], pa.int64()), "s": pa.array(["a", "b", "c"])})
    enc = _encoder(("id",))
    good, bad = enc.encode_arrow(table.to_batches(max_chunksize=2))
    assert bad == []
    assert [type(r) for r in good] == [Record, Record, Record]  # built by tuple.__new__
    assert [(r.key, r.value) for r in good] == [
        (b"7", b'{"id":7,"s":"a"}'),
        (b"8", b'{"id":8,"s":"b"}'),
        (b"9", b'{"id":9,"s":"c"}'),
    ]
    assert good[0].headers == list(batch_headers("p", "s", 3))
    # librdkafka's count: key, value, each header's name and value with a 1-byte length
    # varint apiece (lengths under 64), 36 bytes of framing
    assert good[0].size == 1 + 16 + sum(len(k) + len(v) + 2 for k, v in good[0].headers) + 36


def test_nan_and_infinities_are_written_as_spark_writes_them_valid_json() -> None:
    import json

    nan, inf = float("nan"), float("inf")
    table = pa.table(
        {
            "id": pa.array([1, 2, 3, 4], pa.int64()),
            "amount": pa.array([nan, inf, -inf, 2.5]),
            "small": pa.array([nan, 1.5, -inf, None], pa.float32()),
        }
    )
    enc = _encoder(("id",))
    good, bad = enc.encode_arrow(table.to_batches())
    assert (good, bad) == enc.encode_all(table.to_pylist())
    assert bad == []
    assert [r.value for r in good] == [
        b'{"id":1,"amount":"NaN","small":"NaN"}',
        b'{"id":2,"amount":"Infinity","small":1.5}',
        b'{"id":3,"amount":"-Infinity","small":"-Infinity"}',
        b'{"id":4,"amount":2.5,"small":null}',
    ]

    def strict(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    assert [json.loads(r.value, parse_constant=strict)["amount"] for r in good][-1] == 2.5


def test_dates_and_timestamps_python_cannot_hold_are_written_as_spark_writes_them() -> None:
    """Spark holds years outside Python's 1-9999 (here 0000-12-31, -0001-11-28 and
    +10000-01-01, as Spark's ``to_json`` writes them); ``to_pylist`` raised
    ``OverflowError`` for them. Column-wise and row by row (a zoned timestamp other than
    UTC, a nested one) give the same text, from the stored integers."""
    first = -719_162  # 0001-01-01 in days since 1970
    day_micros = 86_400_000_000
    days = [first - 1, first - 400, 2_932_897, 0, None]
    micros = [first * day_micros - 1, (first - 400) * day_micros, 2_932_897 * day_micros + 123,
              0, None]  # fmt: skip
    table = pa.table(
        {
            "id": pa.array(range(5), pa.int64()),
            "d": pa.array(days, pa.date32()),
            "t": pa.array(micros, pa.timestamp("us", tz="UTC")),
            "n": pa.array(micros, pa.timestamp("us")),
        }
    )
    enc = _encoder(("id",))
    good, bad = enc.encode_arrow(table.to_batches())
    assert bad == []
    assert [r.value for r in good] == [
        b'{"id":0,"d":"0000-12-31","t":"0000-12-31T23:59:59.999999+00:00",'
        b'"n":"0000-12-31T23:59:59.999999"}',
        b'{"id":1,"d":"-0001-11-28","t":"-0001-11-28T00:00:00+00:00","n":"-0001-11-28T00:00:00"}',
        b'{"id":2,"d":"+10000-01-01","t":"+10000-01-01T00:00:00.000123+00:00",'
        b'"n":"+10000-01-01T00:00:00.000123"}',
        b'{"id":3,"d":"1970-01-01","t":"1970-01-01T00:00:00+00:00","n":"1970-01-01T00:00:00"}',
        b'{"id":4,"d":null,"t":null,"n":null}',
    ]
    # the row-by-row path: a zone other than UTC, the values nested, dates as the key
    zone = pa.timestamp("us", tz="Asia/Kolkata")
    nested = pa.table(
        {
            "id": table.column("d"),
            "s": pa.StructArray.from_arrays(
                [table.column("t").combine_chunks().cast(zone), table.column("d").combine_chunks()],
                names=["at", "day"],
            ),
            "a": pa.array([[v] for v in days], pa.list_(pa.date32())),
            "m": pa.array([[("k", v)] for v in days], pa.map_(pa.string(), pa.date32())),
        }
    )
    by_row = _encoder(("id",))
    good, bad = by_row.encode_arrow(nested.to_batches())
    assert [b.reason.split(" in row")[0] for b in bad] == ["null key: key column(s) 'id' are null"]
    assert [(r.key, r.value) for r in good][:3] == [
        (b"0000-12-31", b'{"id":"0000-12-31","s":{"at":"0000-12-31T23:59:59.999999+00:00",'
                        b'"day":"0000-12-31"},"a":["0000-12-31"],"m":{"k":"0000-12-31"}}'),
        (b"-0001-11-28", b'{"id":"-0001-11-28","s":{"at":"-0001-11-28T00:00:00+00:00",'
                         b'"day":"-0001-11-28"},"a":["-0001-11-28"],"m":{"k":"-0001-11-28"}}'),
        (b"+10000-01-01", b'{"id":"+10000-01-01","s":{"at":"+10000-01-01T00:00:00.000123+00:00",'
                          b'"day":"+10000-01-01"},"a":["+10000-01-01"],"m":{"k":"+10000-01-01"}}'),
    ]  # fmt: skip
    assert [r.value for r in good][3:] == [
        b'{"id":"1970-01-01","s":{"at":"1970-01-01T00:00:00+00:00","day":"1970-01-01"},'
        b'"a":["1970-01-01"],"m":{"k":"1970-01-01"}}'
    ]
