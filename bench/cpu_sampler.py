"""The machine's CPU use every few milliseconds, for ``bench_three_sinks.py --timeline``.

    python bench/cpu_sampler.py OUT [--interval-ms 5]

Appends one line per sample to OUT: epoch milliseconds, then the busy and the total ticks
of every core summed, from the first line of ``/proc/stat`` (Linux). Runs until it is
terminated. A process of its own, so sampling never takes the driver's GIL; it costs
~1-2% of one core at 5 ms.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path


def ticks() -> tuple[int, int]:
    """(busy, total) ticks of every core since boot: total less idle and iowait."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:9]]
    idle = values[3] + values[4]
    total = sum(values)
    return total - idle, total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--interval-ms", type=float, default=5.0)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with args.out.open("a") as out:
        while True:
            busy, total = ticks()
            out.write(f"{time.time() * 1000:.1f} {busy} {total}\n")
            out.flush()
            time.sleep(args.interval_ms / 1000)


if __name__ == "__main__":
    raise SystemExit(main())
