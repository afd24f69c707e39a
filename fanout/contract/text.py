"""Spark strings that are not UTF-8. A Spark string holds any bytes (``CAST(binary AS
STRING)``, a file read with another encoding) and Arrow hands them to a sink unchecked:
each sink that writes text finds them with :func:`holds_invalid_utf8` and refuses their
rows (naming the column and the bytes) rather than writing them or failing bare."""

from __future__ import annotations

from typing import Any


def holds_invalid_utf8(column: Any) -> bool:
    """Whether an Arrow array or chunked array holds, at any depth, a string value that is
    not valid UTF-8 (one full validation of each chunk)."""
    import pyarrow as pa

    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    try:
        for chunk in chunks:
            chunk.validate(full=True)
    except pa.ArrowInvalid:
        return True
    return False


__all__ = ["holds_invalid_utf8"]
