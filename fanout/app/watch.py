"""``fanout status --watch``: the status redrawn every few seconds until Ctrl-C.

On a terminal each refresh clears the screen first, like ``watch``; into a file or a pipe
the refreshes follow one another, separated by a blank line. ``count`` bounds the number
of refreshes (scripts and tests); Ctrl-C ends the loop quietly, as the way to stop it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TextIO

CLEAR_SCREEN = "\x1b[H\x1b[2J"


def watch(
    render: Callable[[], str],
    *,
    title: str,
    interval_s: float,
    out: TextIO,
    count: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Write ``render()`` under a header line every ``interval_s`` seconds, ``count`` times
    (``None``: until Ctrl-C). Returns the exit code: 0, also after Ctrl-C. An exception
    ``render`` raises ends the loop and propagates."""
    terminal = out.isatty()
    shown = 0
    try:
        while count is None or shown < count:
            text = render()  # before clearing: the old picture stays until the new one is ready
            now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")
            if terminal:
                out.write(CLEAR_SCREEN)
            elif shown:
                out.write("\n")
            out.write(f"{title}: {now} UTC, every {interval_s:g}s; Ctrl-C stops\n\n{text}\n")
            out.flush()
            shown += 1
            if count is None or shown < count:
                sleep(interval_s)
    except KeyboardInterrupt:
        out.write("\n")
        out.flush()
    return 0
