"""Counting the py4j round trips a block of test code makes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import py4j.clientserver


@contextmanager
def round_trips() -> Iterator[list[int]]:
    """Count the py4j commands this thread sends in the block. py4j's finalizer thread sends
    a release command for every JVM object proxy Python has freed, whenever it gets to them
    (76 in one CI run, freed by earlier tests): no round trip of the code under test."""
    counted = [0]
    send = py4j.clientserver.ClientServerConnection.send_command
    me = threading.get_ident()

    def counting(self: Any, command: str) -> Any:
        if threading.get_ident() == me:
            counted[0] += 1
        return send(self, command)

    py4j.clientserver.ClientServerConnection.send_command = counting  # type: ignore[method-assign]
    try:
        yield counted
    finally:
        py4j.clientserver.ClientServerConnection.send_command = send  # type: ignore[method-assign]
