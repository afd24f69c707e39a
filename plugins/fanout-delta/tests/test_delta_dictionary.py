"""Which columns the executors' Delta writer dictionary-encodes
(:mod:`fanout.delta_tables.dictionary`): a column is hashed on a random probe of the
file's first rows first, and counted whole only when the probe repeats. No Spark.

The call must be the one counting the whole sample makes; the probe only spares the
columns that are nearly all distinct from being counted whole.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from fanout.delta_tables import dictionary
from fanout.delta_tables.datafiles import FileWriter
from fanout.delta_tables.dictionary import PROBE_ROWS, SAMPLE_ROWS, dictionary_columns
from fanout.delta_tables.distributed import delta_schema

ROWS = 25_000


def mixed_table() -> pa.Table:
    """Columns on both sides of the call, some of them placed to fool a probe that is not
    random (a prefix, a stride)."""
    rng = random.Random(11)
    twice = [i // 2 for i in range(SAMPLE_ROWS)]  # the sample exactly half distinct,
    rng.shuffle(twice)  # each value twice: the fewest repeats a probe can meet
    return pa.table(
        {
            "id": pa.array(range(ROWS), pa.int64()),
            "amount": [rng.random() * 1000 for _ in range(ROWS)],
            "customer": [f"cust_{rng.randrange(50_000):05d}" for _ in range(ROWS)],
            "twice": pa.array(twice + list(range(10**6, 10**6 + ROWS - SAMPLE_ROWS))),
            "cyclic": pa.array([i % 5_000 for i in range(ROWS)], pa.int32()),  # a prefix of
            # 2,048 rows is all distinct; the sample is a quarter distinct
            "status": [rng.choice(["new", "paid", "shipped"]) for _ in range(ROWS)],
            "mostly_null": [None if i % 10 < 7 else i for i in range(ROWS)],
            "point": [{"x": i} for i in range(ROWS)],  # nested: no hashing, plain
        }
    )


def whole_sample_call(table: pa.Table) -> list[str]:
    """The call made by counting every row of the sample."""
    sample = table.slice(0, SAMPLE_ROWS)
    chosen = []
    for name in sample.column_names:
        column = sample.column(name)
        if pa.types.is_struct(column.type):
            continue
        if pc.count_distinct(column, mode="all").as_py() * 2 <= sample.num_rows:
            chosen.append(name)
    return chosen


def test_the_probe_makes_the_whole_samples_call(tmp_path):
    table = mixed_table()
    expected = ["twice", "cyclic", "status", "mostly_null"]
    assert whole_sample_call(table) == expected

    assert dictionary_columns(table) == expected

    writer = FileWriter(str(tmp_path), delta_schema(table.schema))
    (written,) = writer.write(iter(table.to_batches(max_chunksize=10_000)))
    column_chunks = pq.ParquetFile(tmp_path / written.path).metadata.row_group(0)
    encoded = {
        column_chunks.column(i).path_in_schema
        for i in range(column_chunks.num_columns)
        if "RLE_DICTIONARY" in column_chunks.column(i).encodings
    }
    assert encoded == set(expected)
    assert pq.read_table(tmp_path / written.path).to_pydict() == table.to_pydict()


@pytest.fixture()
def counted(monkeypatch) -> list[int]:
    """The length of every column :mod:`~fanout.delta_tables.dictionary` counts the
    distinct values of, in order."""
    lengths: list[int] = []
    count = dictionary._distinct

    def recording(column):
        lengths.append(len(column))
        return count(column)

    monkeypatch.setattr(dictionary, "_distinct", recording)
    return lengths


def test_only_columns_whose_probe_repeats_are_counted_whole(counted):
    dictionary_columns(mixed_table())

    probe, whole = PROBE_ROWS, SAMPLE_ROWS
    assert counted == [
        probe,  # id: no repeat
        probe,  # amount
        probe,  # customer: ~35 repeats, below the threshold
        probe, whole,  # twice: ~105 repeats
        probe, whole,  # cyclic
        probe, whole,  # status
        probe, whole,  # mostly_null
        probe,  # point: cannot be hashed, plain
    ]  # fmt: skip


def test_a_sample_no_larger_than_a_probe_is_counted_whole(counted):
    table = mixed_table().slice(0, PROBE_ROWS)

    assert whole_sample_call(table) == ["status", "mostly_null"]  # its 2,048 cyclic: distinct
    assert dictionary_columns(table) == ["status", "mostly_null"]
    assert counted == [PROBE_ROWS] * 8
