"""Commit hooks for a PostgreSQL partition task driven by hand in a test: one holding the
partition's transaction open just before its commit, one doing nothing."""

from __future__ import annotations

import threading


class CommitGate:
    """Commit hooks holding the partition's transaction open, just before its commit, until
    :attr:`opened` is set (at most 60 s); :attr:`reached` tells the test it is there."""

    def __init__(self) -> None:
        self.reached, self.opened = threading.Event(), threading.Event()

    def before(self, partition: int, rows: int, written: int) -> None:
        self.reached.set()
        self.opened.wait(60)

    def after(self, partition: int, rows: int, written: int) -> None:
        pass


class NoCommitHooks:
    """Commit hooks that do nothing."""

    def before(self, partition: int, rows: int, written: int) -> None:
        pass

    def after(self, partition: int, rows: int, written: int) -> None:
        pass
