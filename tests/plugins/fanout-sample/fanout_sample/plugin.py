"""The ``sample-jsonl`` sink type: each micro-batch as ``<directory>/<key>.jsonl``, where
``<key>`` is the batch's :attr:`fanout.Batch.idempotency_key` token (new in a new epoch).

Idempotent: a batch is written to a temporary file in the same directory and renamed
over ``<key>.jsonl``, so writing batch N again replaces the file with the same
content, and a crash mid-write never leaves a partial file under the final name.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import ClassVar

from fanout import Batch, ConfigurationError, Guarantee, Sink, SinkContext, SinkResult, hookimpl
from fanout.contract.options import SinkOption
from fanout.contract.sink import Reads


class JsonLinesSink(Sink):
    """Writes each batch's rows as JSON lines to ``<directory>/<key token>.jsonl``.

    :param directory: where the files go; created by :meth:`open` when missing.
    """

    guarantees: ClassVar[tuple[Guarantee, ...]] = ("idempotent",)
    options = (
        SinkOption("directory", "required", "where the files go; created by `open()` if missing"),
    )

    def __init__(self, name: str, *, directory: str) -> None:
        super().__init__(name)
        self.directory = directory

    @property
    def reads(self) -> Reads:
        return "arrow"

    def open(self, context: SinkContext) -> None:
        path = Path(self.directory)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigurationError(
                f"sink {self.name!r}: cannot create directory {self.directory!r}: {exc}"
            ) from exc
        if not os.access(path, os.W_OK):
            raise ConfigurationError(
                f"sink {self.name!r}: directory {self.directory!r} is not writable"
            )

    def write(self, batch: Batch) -> SinkResult:
        rows = batch.arrow().to_pylist()
        token = batch.idempotency_key.token
        target = Path(self.directory) / f"{token}.jsonl"
        fd, temp = tempfile.mkstemp(prefix=f".{token}.", suffix=".tmp", dir=self.directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                for row in rows:
                    out.write(json.dumps(row, default=str) + "\n")
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, target)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        return SinkResult(rows=len(rows), details={"path": str(target)})


@hookimpl
def fanout_sink_types() -> dict[str, type[Sink]]:
    """Provide the ``sample-jsonl`` sink type."""
    return {"sample-jsonl": JsonLinesSink}
