"""Dates and timestamps as the text the sink writes, from their stored integers: the core's
:mod:`fanout.contract.far_dates` (dead letters write them alike).

Spark holds dates and timestamps outside Python's years 1-9999; turned into Python objects
they raise ``OverflowError``. The sink writes every date and timestamp from the integers
Arrow stores instead (:mod:`fanout_kafka.vector` column-wise), and :func:`python_safe`
rewrites the columns holding such years into text before the row-by-row encoder turns the
table into Python values: a string and a date are the same JSON (quoted text) and the same
key or header bytes.
"""

from __future__ import annotations

from fanout.contract.far_dates import date_text, python_safe, timestamp_text

__all__ = ["date_text", "python_safe", "timestamp_text"]
