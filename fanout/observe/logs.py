"""Structured, redacted logging.

fanout's log records carry ``pipeline``, ``batch_id`` and ``sink`` attributes where they
apply (``logger.info(..., extra=batch_fields(...))``). :class:`JsonFormatter` writes them as
one JSON object per line; :class:`RedactFilter` masks every secret a sink declared
(:meth:`fanout.Sink.secret_values`) in whatever a handler emits. ``fanout run`` installs
both; an application embedding fanout can add them to its own handlers::

    handler.addFilter(fanout.observe.logs.RedactFilter())
    handler.setFormatter(fanout.observe.logs.JsonFormatter())
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TextIO

from fanout.observe.secrets import redact, redact_printed

FIELDS = ("pipeline", "batch_id", "sink", "attempt")

_secrets: set[str] = set()
_secrets_lock = threading.Lock()


def register_secrets(values: Iterable[str]) -> None:
    """Remember secret values so every :class:`RedactFilter` masks them from now on."""
    with _secrets_lock:
        _secrets.update(v for v in values if v)


def known_secrets() -> list[str]:
    """The secret values registered so far."""
    with _secrets_lock:
        return list(_secrets)


@contextmanager
def secrets_apart() -> Iterator[None]:
    """The registry emptied for the block and put back as it was after it: the block's
    :class:`RedactFilter` masks what the block registers only, as in a process of its own
    (the conformance kit's secret check: a secret another test registered would hide one a
    sink fails to declare)."""
    with _secrets_lock:
        before = set(_secrets)
        _secrets.clear()
    try:
        yield
    finally:
        with _secrets_lock:
            _secrets.clear()
            _secrets.update(before)


def batch_fields(
    pipeline: str, batch_id: int | None = None, sink: str | None = None, **more: Any
) -> dict[str, Any]:
    """The ``extra`` of a log call about one pipeline, batch and sink."""
    return {"pipeline": pipeline, "batch_id": batch_id, "sink": sink, **more}


class RedactFilter(logging.Filter):
    """Masks every registered secret in a record's message and exception text."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite the record in place; never drops it."""
        secrets = known_secrets()
        if not secrets:
            return True
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
            record.exc_text = None
        record.msg, record.args = redact(message, secrets), None
        return True


class RedactingStream:
    """A text stream that masks the registered secrets in what is written to it before
    passing it to ``stream`` (the CLI's stdout and stderr, which no log handler filters), as
    :func:`fanout.observe.secrets.redact_printed` masks them; anything else is the wrapped
    stream's."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        """Write ``text`` masked; returns ``len(text)``, as the caller wrote it."""
        secrets = known_secrets()
        self.stream.write(redact_printed(text, secrets) if secrets else text)
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the batch fields."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON line."""
        data: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                data[name] = value
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


class Py4jEchoFilter(logging.Filter):
    """Drops py4j's traceback of an exception raised in foreachBatch: Spark raises it to the
    caller as the query's exception, and fanout has logged it with its context."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep every other record."""
        return not str(record.msg).startswith(
            "There was an exception while executing the Python Proxy"
        )


class StderrHandler(logging.StreamHandler):
    """A stream handler writing to ``sys.stderr`` as it is when each record is emitted, not
    as it was when the handler was made: a program (or a test) that swaps ``sys.stderr``
    after configuring fanout's logs, and closes the stream it swapped in, does not leave a
    handler writing into a closed stream (``--- Logging error ---`` from a later record,
    such as one logged by a write still running in its thread)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        """The current ``sys.stderr``."""
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        """Ignored: the handler always follows ``sys.stderr``."""


def configure(level: str = "INFO", fmt: str = "text", stream: Any = None) -> logging.Handler:
    """Route fanout's logs (and Spark's py4j noise at WARNING) to one redacting handler,
    writing to ``stream`` or, without one, to whatever ``sys.stderr`` is at each record."""
    handler = logging.StreamHandler(stream) if stream is not None else StderrHandler()
    handler.addFilter(RedactFilter())
    handler.setFormatter(
        JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.getLogger("py4j").setLevel(logging.WARNING)
    handler.addFilter(Py4jEchoFilter())
    return handler
