"""Shared fixtures of the unit tests: no JVM, no Spark, no services.

The fakes themselves (FakeFrame, RecordingSink, ...) are in fakes.py.
"""

from __future__ import annotations

import pytest

from fanout.ledger.memory import MemoryLedger
from tests.unit.fakes import FakeFrame


@pytest.fixture
def frame() -> FakeFrame:
    return FakeFrame()


@pytest.fixture
def memory_ledger() -> MemoryLedger:
    return MemoryLedger()
