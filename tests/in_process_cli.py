"""``fanout`` commands run in the test's process and SparkSession: the :func:`fanout_cli`
fixture, registered by the root conftest for the core's tests and each plugin's."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest


@dataclass(frozen=True)
class Ran:
    """What a ``fanout`` command run by :func:`fanout_cli` did: its exit code and what it
    printed (secrets masked, as the command prints them)."""

    returncode: int
    stdout: str
    stderr: str


Cli = Callable[..., Ran]
"""The type of :func:`fanout_cli`: ``fanout_cli("recover", "--ledger", ...)``."""


@pytest.fixture
def fanout_cli(spark: Any, capsys: pytest.CaptureFixture[str]) -> Iterator[Callable[..., Ran]]:
    """``fanout ARGS...`` in the test's process (``fanout.app.cli.main``, what the console
    script's ``sys.exit`` returns), on the test process's SparkSession: no Spark start.
    For a test that proves what a command prints and the code it exits with, not how a
    process ends (a signal, a kill, the interpreter's exit: those keep a subprocess).

    After the test, it asserts the commands left nothing behind that would leak into the
    next test: the shared session still running (a ``fanout run`` must not stop it), no
    streaming query active, no thread started by them still alive; and it puts back the
    root logger's handlers and level, which ``main`` replaces with its own, and the
    session's settings a pipeline file's ``[spark.conf]`` changed (Spark applies them to
    the session it returns)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    threads = set(threading.enumerate())
    settings = dict(spark.conf.getAll)

    def command(*args: str) -> Ran:
        capsys.readouterr()  # what the test printed before is not the command's
        code = main([str(arg) for arg in args])
        out, err = capsys.readouterr()
        return Ran(code, out, err)

    from fanout.app.cli import main

    yield command
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    for key, value in dict(spark.conf.getAll).items():
        if key not in settings:
            spark.conf.unset(key)
        elif value != settings[key]:
            spark.conf.set(key, settings[key])
    assert spark.sparkContext._jsc is not None, "a command stopped the tests' SparkSession"
    active = [query.name or str(query.id) for query in spark.streams.active]
    assert active == [], f"a command left streaming queries active: {active}"
    left = _new_threads(threads)
    assert left == [], f"a command left threads running: {left}"


def _new_threads(before: set[threading.Thread], wait_s: float = 5.0) -> list[str]:
    """The names of the threads alive now that were not in ``before``, given ``wait_s``
    to end (a daemon thread finishing its last log line); py4j's, which serve the shared
    session's callbacks for the whole process, do not count."""
    started = [thread for thread in set(threading.enumerate()) - before if not _py4j(thread)]
    for thread in started:
        thread.join(timeout=wait_s)
    return sorted(thread.name for thread in started if thread.is_alive())


def _py4j(thread: threading.Thread) -> bool:
    target = getattr(thread, "_target", None)
    module = getattr(target, "__module__", "") or type(thread).__module__
    return module.startswith("py4j")
