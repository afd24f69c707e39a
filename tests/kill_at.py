"""The ``fanout`` command killed (SIGKILL) at a named point of its code, as an operator's
closed terminal, an OOM kill or a CI timeout kills it.

``python -m tests.kill_at TARGET WHEN N -- ARGS...`` runs ``fanout ARGS...`` in this
process with ``TARGET`` (``package.module:Name`` or ``package.module:Class.method``)
wrapped: its ``N``-th call (1-based) kills the process ``before`` it runs or ``after`` it
returns (``WHEN``). The hook is this test module's: nothing in fanout's own code knows of
it, so production runs carry none.
"""

from __future__ import annotations

import functools
import importlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

KILLED = -signal.SIGKILL
"""A killed command's ``returncode``."""


def fanout_killed_at(
    target: str, when: str, nth: int, *args: str
) -> subprocess.CompletedProcess[str]:
    """Run ``fanout args...`` in a process of its own, killed at ``target``'s ``nth`` call
    (``when``: ``"before"`` or ``"after"`` it); its exit code and output captured."""
    return subprocess.run(
        [sys.executable, "-m", "tests.kill_at", target, when, str(nth), "--", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
    )


def _kill() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def kill_at(target: str, when: str, nth: int) -> None:
    """Wrap ``target`` in this process: its ``nth`` call (1-based) kills the process
    ``before`` it runs or ``after`` it returns (``when``)."""
    module_name, _, attr = target.partition(":")
    owner: Any = importlib.import_module(module_name)
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    original: Callable[..., Any] = getattr(owner, name)
    calls = 0

    @functools.wraps(original)
    def killing(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == nth and when == "before":
            _kill()
        result = original(*args, **kwargs)
        if calls == nth and when == "after":
            _kill()
        return result

    setattr(owner, name, killing)


def main(argv: list[str]) -> int:
    """Wrap the target, then run the ``fanout`` command line after ``--``."""
    target, when, nth, dashes, *args = argv
    if dashes != "--" or when not in ("before", "after"):
        raise SystemExit("usage: python -m tests.kill_at TARGET before|after N -- ARGS...")
    kill_at(target, when, int(nth))
    from fanout.app.cli import main as fanout_main

    return fanout_main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
