"""Print how fast this machine runs a fixed piece of Python work, so a CI time can be read
against the machine it ran on (the same suite took 1189 s on one machine and 1748 s on one
~1.5x slower, nothing else running; nothing in the log told them apart).

The work: a pure-Python loop and a SHA-256 over a fixed buffer, timed once alone and once
in two processes at the same time (CI runs two pytest workers on two cores: a machine that
shares its cores shows it there). Wall seconds; lower is faster.
"""

from __future__ import annotations

import hashlib
import time
from concurrent.futures import ProcessPoolExecutor

LOOP = 20_000_000
BUFFER = b"fanout" * 2_000_000
HASHES = 60


def work(_: int = 0) -> float:
    """The fixed work's wall time, in seconds."""
    started = time.perf_counter()
    total = 0
    for n in range(LOOP):
        total += n & 7
    for _round in range(HASHES):
        hashlib.sha256(BUFFER).digest()
    return time.perf_counter() - started


def main() -> None:
    """Print one line: the work alone, and the slower of two run side by side."""
    alone = min(work() for _ in range(2))
    with ProcessPoolExecutor(2) as pool:
        side_by_side = max(pool.map(work, range(2)))
    print(
        f"machine speed: fixed work {alone:.2f} s alone, {side_by_side:.2f} s two at once "
        "(lower is faster; CI times compare across runs only at similar values)"
    )


if __name__ == "__main__":
    main()
