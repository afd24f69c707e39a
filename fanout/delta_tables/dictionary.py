"""Which columns of a Parquet data file to dictionary-encode, judged on the file's first
rows (:func:`dictionary_columns`).

The Parquet writer would otherwise dictionary-encode every column and give up only once a
column's dictionary outgrows its page limit, having hashed every value until then: on
mostly-unique columns (ids, timestamps, amounts) that costs about 40% of the encoding time
and makes the file no smaller. parquet-mr makes the same call on a column's first page.

Counting the distinct values of the whole sample costs about as much as encoding the file,
and most of it goes to the columns that are all distinct. So each column is first hashed
on a probe, :data:`PROBE_ROWS` rows spread at random over the sample: a column whose probe
barely repeats is written plain without counting the rest (see :data:`PROBE_REPEATS` for
why that is the call the whole sample would make).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

SAMPLE_ROWS = 20_000
"""Rows of a file's first row group whose distinct values decide which columns are
dictionary-encoded: those at most half distinct."""

PROBE_ROWS = 2_048
"""Rows of the sample, chosen at random (with a fixed seed, so the same rows give the same
call), that each column is hashed on first."""

PROBE_REPEATS = 52
"""At most this many repeated values in a column's probe: the column is written plain
without counting the whole sample.

For the sample to be at most half distinct, its values must repeat, and they repeat least
in the probe when each value is there exactly twice: then a probe of 2,048 of 20,000 rows
holds both rows of ~105 values (standard deviation ~10), and a smaller sample more. This
threshold is half that: a sample at most half distinct passes it with a probability below
1e-7, and only when it is nearly half distinct (one a third distinct repeats ~200 times).
A wrong call chooses only the encoding: the file holds the same rows either way."""


def dictionary_columns(table: pa.Table) -> list[str]:
    """The columns of a file worth dictionary-encoding: those whose first
    :data:`SAMPLE_ROWS` values are at most half distinct. Nested columns (no hashing)
    are never chosen."""
    import pyarrow as pa

    sample = table.slice(0, SAMPLE_ROWS)
    rows = sample.num_rows
    probe = _probe(rows)
    chosen = []
    for name in sample.column_names:
        column = sample.column(name)
        try:
            if probe is not None and _repeats(column.take(probe)) <= PROBE_REPEATS:
                continue
            distinct = _distinct(column)
        except pa.ArrowNotImplementedError:  # a type without hashing (nested): plain
            continue
        if distinct * 2 <= rows:
            chosen.append(name)
    return chosen


def _distinct(column: pa.ChunkedArray | pa.Array) -> int:
    """The number of distinct values in ``column``, a null counting as one."""
    import pyarrow.compute as pc

    return int(pc.count_distinct(column, mode="all").as_py())


def _repeats(probe: pa.ChunkedArray | pa.Array) -> int:
    """Rows of ``probe`` whose value an earlier row holds already."""
    return len(probe) - _distinct(probe)


@functools.lru_cache(maxsize=8)
def _probe(rows: int) -> pa.Array | None:
    """The probe's row indices in a sample of ``rows`` rows (ascending), or ``None`` when
    the sample is no larger than a probe (it is counted whole)."""
    if rows <= PROBE_ROWS:
        return None
    import numpy as np
    import pyarrow as pa

    picked = np.random.default_rng(0).choice(rows, PROBE_ROWS, replace=False)
    return pa.array(np.sort(picked))
