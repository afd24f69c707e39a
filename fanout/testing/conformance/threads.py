"""The thread :meth:`fanout.Sink.write` runs on: not the one that ran
:meth:`fanout.Sink.open`. A ``FanOut`` of several sinks writes each in a thread of a pool
made for the batch, so a client bound to the thread that created it (a ``sqlite3``
connection) made in ``open()`` fails every write there, though a ``FanOut`` of that sink
alone (writing on the caller's thread) works. The kit's ``FanOut`` writes off
``open()``'s thread in every check (:class:`~fanout.testing.conformance.kit.OffThreadFanOut`);
this check compares a write on ``open()``'s thread with one off it, to say why.

The contract: docs/writing-sinks.md, ``write(batch)``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fanout.errors import BatchFailedError
from fanout.testing.conformance.case import NAME, SinkUnderTest
from fanout.testing.conformance.kit import Kit, _assert_ids


class ThreadChecks(Kit):
    """``write()`` off the thread of ``open()`` (module docstring)."""

    def test_write_runs_on_another_thread_than_open(
        self, spark: Any, under_test: SinkUnderTest, tmp_path: Path
    ) -> None:
        """Batch 0 written on the thread that ran ``open()``, then batch 1 on another (a
        thread of its own, as a ``FanOut`` of several sinks writes each sink): both land.
        A write failing only off ``open()``'s thread fails the check saying so."""
        fan = self._fan(under_test, str(tmp_path / "ledger"))
        fan.process_on_open_thread(self._batch(spark, [(1, "a")]), self._info(0))
        try:
            fan.process(self._batch(spark, [(2, "b")]), self._info(1))
        except BatchFailedError as failed:
            pytest.fail(
                "write() of batch 1, called on another thread than the one that ran open() "
                "(a FanOut of several sinks writes each in a thread of a pool made for the "
                f"batch), failed: {failed.failures[NAME]!r}; batch 0, written on open()'s "
                "thread, did not. A client bound to the thread that created it (a sqlite3 "
                "connection) cannot be made in open() and used in write(): make it in "
                "write() (one per write, or one per thread, e.g. in a threading.local), "
                "as docs/writing-sinks.md says (write(batch))"
            )
        _assert_ids(under_test, [1, 2], "after batch 0 (written on open()'s thread) and batch 1")
