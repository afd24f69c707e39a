"""Reads of Delta tables for the assertions of the Delta plugin's tests.

They read with delta-rs' own engine (:func:`fanout.delta_tables.io.read_delta`), never
``DeltaTable.to_pyarrow_table()``, whose Arrow I/O threads can abort the interpreter as it
exits (see :mod:`fanout.delta_tables.io`)."""

from __future__ import annotations

from pathlib import Path

from fanout.delta_tables.io import read_delta


def ids(path: Path | str) -> list[int]:
    """The ``id`` of every row of the Delta table at ``path``, sorted (repeats kept)."""
    return sorted(read_delta(str(path), columns=["id"]).column("id").to_pylist())
