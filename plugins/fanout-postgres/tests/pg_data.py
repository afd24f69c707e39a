"""Input for the postgres integration tests: JSON files, one per micro-batch, and a
stream runner (the same shape as tests/integration/streams.py, with this schema)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.integration import streams

SCHEMA = "id LONG, customer STRING, amount DOUBLE, version LONG"
EPOCH = 1_700_000_000


def row(row_id: int, version: int) -> dict[str, Any]:
    """The deterministic row of ``row_id`` as written in file ``version``."""
    return {
        "id": row_id,
        "customer": f"c{(row_id * 7 + version) % 11}",
        "amount": float((row_id * 31 + version * 17) % 1000) / 4,
        "version": version,
    }


def write_files(directory: Path, files: int, rows: int, step: int) -> list[list[dict[str, Any]]]:
    """File f holds ids ``f*step .. f*step+rows-1``: consecutive files overlap by
    ``rows - step`` ids, which later files update. Returns the rows of every file."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for f in range(files):
        chunk = [row(f * step + i, f) for i in range(rows)]
        path = directory / f"part-{f:04d}.json"
        path.write_text("\n".join(json.dumps(r) for r in chunk) + "\n")
        os.utime(path, (EPOCH + f, EPOCH + f))
        written.append(chunk)
    return written


def latest(files: list[list[dict[str, Any]]]) -> dict[int, dict[str, Any]]:
    """id -> the row of the last file holding it."""
    result: dict[int, dict[str, Any]] = {}
    for chunk in files:
        for r in chunk:
            result[r["id"]] = r
    return result


def run_stream(spark: Any, input_dir: Path, fan: Any, checkpoint: Path) -> None:
    """Run the file stream of these tests' schema through ``fan``, one file per batch."""
    streams.run_stream(spark, input_dir, fan, checkpoint, SCHEMA)
