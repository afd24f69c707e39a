"""``fanout demo``'s progress lines (:class:`fanout.app.demo.run.Progress`): the sinks'
hooks run in the sinks' own threads, and each line must come out whole."""

from __future__ import annotations

import sys
import threading

import pytest

from fanout.app.demo.run import Progress
from fanout.contract.batch import BatchInfo
from fanout.contract.sink import SinkResult


class Meeting:
    """A stdout whose every ``write`` waits (up to 0.3 s) until two writers are in it, and
    only then keeps its text: two threads each writing a line in two calls (its text, its
    newline) then interleave them, text, text, newline, newline."""

    def __init__(self) -> None:
        self.written: list[str] = []
        self._meet = threading.Barrier(2, timeout=0.3)

    def write(self, text: str) -> int:
        try:
            self._meet.wait()
        except threading.BrokenBarrierError:
            pass  # alone: the other writer waits for this one (or never came)
        self.written.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_two_sinks_done_at_once_print_two_whole_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, ``print`` wrote each line's text and its newline in two calls: two sinks'
    threads finishing together printed ``...bronze: 3 rows...[...] latest: 3 rows...``
    on one line, then an empty one."""
    out = Meeting()
    monkeypatch.setattr(sys, "stdout", out)
    progress = Progress()
    info = BatchInfo("p", 7, "q")
    threads = [
        threading.Thread(
            target=progress.fanout_sink_done, args=(info, name, SinkResult(rows=3), 0.012)
        )
        for name in ("bronze", "latest")
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    lines = "".join(out.written).splitlines()
    assert [line[:2] for line in lines] == ["[ ", "[ "], lines  # "[   0.0s] ..."
    assert sorted(line[10:] for line in lines) == [
        "  bronze: 3 rows in 12 ms",
        "  latest: 3 rows in 12 ms",
    ]
