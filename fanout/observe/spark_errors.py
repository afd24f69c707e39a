"""Keeping PySpark quiet about the errors fanout provokes on purpose (bisecting a route
for its failing rows, analyzing an expression before the batch's columns exist)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_SPARK_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")


@contextmanager
def quiet_spark_errors() -> Iterator[None]:
    """Keep PySpark from logging every error this thread provokes on purpose (each
    bisection step would log a full query context and stack trace at ERROR)."""
    thread = threading.get_ident()

    def other_threads(record: logging.LogRecord) -> bool:
        return record.thread != thread

    try:  # PySpark's own logger class: its calls pass keywords a plain Logger refuses
        from pyspark.logger import PySparkLogger

        loggers: list[logging.Logger] = [PySparkLogger.getLogger(n) for n in _SPARK_LOGGERS]
    except ImportError:
        loggers = []
    for logger in loggers:
        logger.addFilter(other_threads)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(other_threads)
