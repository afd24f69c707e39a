"""The end of Spark Connect's foreachBatch process: the ``FanOut`` built there from its
pickle is closed, not killed with it (docs/architecture.md §15).

When a Connect query ends (``query.stop()``, its failure, its session's end) the server's
listener stops the query's Python runner: ``Process.destroy()`` on the foreachBatch process
(SIGTERM, never followed by SIGKILL) and its socket closed. Python's default SIGTERM ends a
process at once, without ``finally`` blocks or ``atexit``: the FanOut closed nothing. In
that process only (:func:`watch`), SIGTERM is handled in the main thread, where pyspark
runs the batches:

- inside a ``FanOut.__call__`` (from the first line of its ``try`` to its ``finally``:
  :func:`call_entered`, :func:`call_left`),
  :class:`WorkerTerminated` (a ``SystemExit``) unwinds the batch as any ``BaseException``
  does (invariant 4): the sinks' writes running in other threads end whole, each marked
  after its own write as always; the attempt cut in the main thread is recorded as failed,
  never marked; the FanOut closes before the error leaves its call, and the process exits.
  Nothing commits half a batch: a sink's own transaction is committed by its write or not
  at all. Never a close from the handler there: the interrupted frame may hold a lock the
  close needs (the ledger's, the Connect client's), and the close would wait for it forever;
- between batches (pyspark's loop waits on its socket for the next one), the FanOut is
  closed there and then, and :class:`WorkerTerminated` ends the process (status 143,
  SIGTERM's) through the exit below;
- while a FanOut of the process is closing or closed (a failed batch's close, or at exit),
  nothing: the process is ending already, and Spark's second SIGTERM must not cut a close.

At the exit, :func:`_at_exit` runs first of the ``atexit`` callbacks and closes every watched
FanOut. With no SIGTERM handled, that is all: the exit goes on as Python's (its status, the
other callbacks, the finalization), SIGTERM's default action back, so a SIGTERM from here on
ends the process as it would have without fanout. Once one was handled, the process must
not outlive the exit: the interpreter's finalization, after ``atexit``, has been seen to wait
forever on a lock taken in a gRPC callback (the Connect client's channel), which Spark's
SIGTERM used to cut short and which a handled SIGTERM no longer does. So the other
callbacks (coverage's, a tracer's, ``logging``'s) are run there, each once, then
``os._exit(143)``. Running them from a callback is safe only when none has run yet:
CPython keeps the ones already run in its list until the whole pass ends, and
``atexit._run_exitfuncs()`` would run those again. So :func:`_at_exit` is registered again as
the last one (the first to run) when the exit begins, and runs the others only when the
count of callbacks shows none registered after it; otherwise it ends the process without
them (logged), as a kill would. These ``atexit`` and ``threading`` internals are the same
on CPython 3.11, 3.12 and 3.13 (``tests/unit/test_worker_end.py`` passed on 3.11.7, 3.12.1
and 3.13.0); 3.14 keeps the callbacks in a list (python/cpython#126907): not checked.

A handler runs only when the main thread is back in Python; whatever that thread does then
(a write that swallows the exit, a non-daemon thread the exit waits for), a timer the
handler starts ends the process :data:`GRACE_S` after the first SIGTERM, as the default
action would have at once. For a main thread that never gets back to Python (a call that
never returns), the signal's own wake-up byte (``signal.set_wakeup_fd``, written by the
C-level handler) wakes a thread that does the same, while that fd is still this module's
(an event loop may set its own, or clear it, later).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
import time
import weakref
from types import FrameType
from typing import Any

log = logging.getLogger("fanout")

WORKER_ENV = "SPARK_CONNECT_LOCAL_URL"
"""Set by Spark's ``StreamingPythonRunner`` in the environment of the Python processes it
starts beside a Connect server (the foreachBatch and listener workers), and nowhere else."""
GRACE_S = 60.0
"""How long after the first SIGTERM the process may take to close and exit before it is
ended anyway (exit status 128 + SIGTERM): a close waits up to 30 s for a catch-up write
and :data:`fanout.steps.timeout.CLOSE_WAIT_S` for abandoned writes."""
EXIT_STATUS = 128 + signal.SIGTERM
"""The exit status a shell gives a process SIGTERM ended."""


class WorkerTerminated(SystemExit):
    """Spark ended the foreachBatch process (SIGTERM): the batch in progress, if any, is
    cut, and the process exits once its ``FanOut`` is closed."""

    def __init__(self) -> None:
        super().__init__(EXIT_STATUS)

    def __str__(self) -> str:
        return (
            "Spark ended this foreachBatch process (SIGTERM: the query stopped or failed); "
            "the batch in progress, if any, was cut before its marks: the query's restart "
            "runs it again"
        )


_watched: list[weakref.ref[Any]] = []
_lock = threading.Lock()
_installed = False
_raised = False
_signalled = False
_calls: list[int] = []
"""The thread of each ``FanOut.__call__`` running now (:func:`call_entered`). A list's
``append`` and ``remove`` are one step each under the GIL: no lock the handler could find
held by the frame it interrupted."""
_last_count: int | None = None
"""``atexit._ncallbacks()`` just after :func:`_at_exit` was registered (again) as the last."""


def watch(fan: Any) -> bool:
    """Close ``fan`` (a ``FanOut`` built from its pickle) when Spark ends this process, if
    this is a foreachBatch process beside a Connect server (:data:`WORKER_ENV`) and this is
    its main thread. Installs the handler once, and only where SIGTERM still has its
    default action and no wake-up fd is set: a handler or fd set by other code is kept,
    and the process then ends as that code says (logged). At the process's exit every
    watched FanOut is closed first (:func:`_at_exit`). Returns whether ``fan`` is watched."""
    global _installed
    if WORKER_ENV not in os.environ or threading.current_thread() is not threading.main_thread():
        return False
    with _lock:
        if not _installed:
            if not _install():
                return False
            _installed = True
        _watched.append(weakref.ref(fan))
    return True


def call_entered() -> None:
    """A ``FanOut.__call__`` begins (the first line of its ``try``): until its
    :func:`call_left`, a SIGTERM unwinds it (:class:`WorkerTerminated`), never closes from
    the handler."""
    _calls.append(threading.get_ident())


def call_left() -> None:
    """The ``FanOut.__call__`` of this thread that began last ends (its ``finally``).
    Nothing when its :func:`call_entered` never counted it (a SIGTERM handled inside the
    ``try`` before the append): the handler's own error goes on, not a ``ValueError``."""
    try:
        _calls.remove(threading.get_ident())
    except ValueError:
        pass


def _install() -> bool:
    """SIGTERM's handler, the exit's callbacks and the thread the handler's wake-up byte
    wakes; ``False`` (nothing changed) when SIGTERM or the wake-up fd already belongs to
    other code."""
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        log.info(
            "SIGTERM has a handler in this foreachBatch process: fanout leaves it; the "
            "FanOut is closed at the end of its process only if that handler exits normally"
        )
        return False
    read, write = os.pipe()
    os.set_blocking(write, False)
    earlier = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    if earlier != -1:  # another's (an event loop's): put it back
        signal.set_wakeup_fd(earlier)
        os.close(read)
        os.close(write)
        log.info(
            "a signal wake-up fd is set in this foreachBatch process: fanout leaves SIGTERM "
            "to its default (the FanOut is not closed when Spark ends the process)"
        )
        return False
    signal.signal(signal.SIGTERM, _terminated)
    _register_last()  # after the first FanOut's own close: runs before it
    # CPython's hook called as the exit begins (concurrent.futures uses it); without it
    # the callbacks registered after this one make _at_exit end the exit without the rest
    begins = getattr(threading, "_register_atexit", None)
    if begins is not None:
        begins(_exit_begins)
    name = "fanout-worker-end"
    threading.Thread(target=_end_after_grace, args=(read,), name=name, daemon=True).start()
    return True


def _register_last() -> None:
    """Register :func:`_at_exit` (again) as the last ``atexit`` callback: the exit's
    first."""
    global _last_count
    atexit.unregister(_at_exit)
    atexit.register(_at_exit)
    _last_count = atexit._ncallbacks()


def _exit_begins() -> None:
    """The interpreter's exit begins (``threading``'s shutdown: before the non-daemon
    threads are joined and the ``atexit`` callbacks run): :func:`_at_exit` made the first
    callback again, after any registered since."""
    _register_last()


def _terminated(signum: int, frame: FrameType | None) -> None:
    """SIGTERM's handler (main thread): unwind a ``FanOut.__call__`` running
    (:class:`WorkerTerminated`, once), close and end between batches, nothing while a close
    runs or ran; the grace starts at the first."""
    global _raised, _signalled
    if not _signalled:
        _signalled = True
        _start_grace()
    fans = _alive()
    if _raised or any(vars(fan).get("_closed", False) for fan in fans):
        return
    log.warning(
        "Spark ended this foreachBatch process (SIGTERM: its query stopped or failed): "
        "closing the FanOut built here, then exiting; a batch in progress is cut before "
        "its marks and runs again at the query's restart"
    )
    if not _calls:  # outside every FanOut call: no frame of fanout's holds a lock
        _close(fans)
    _raised = True
    raise WorkerTerminated


def _alive() -> list[Any]:
    """The watched FanOuts not yet collected."""
    return [fan for ref in _watched if (fan := ref()) is not None]


def _close(fans: list[Any]) -> None:
    """Close each of ``fans`` (a second close does nothing), an error logged."""
    for fan in fans:
        try:
            fan.close()
        except Exception:
            log.exception("pipeline %s: closing this FanOut as its process ends failed",
                          fan.pipeline)  # fmt: skip


def _at_exit() -> None:
    """The exit's first ``atexit`` callback: close every watched FanOut; once a SIGTERM was
    handled, run the other callbacks and end the process (module docstring)."""
    _close(_alive())
    if not _signalled:
        if signal.getsignal(signal.SIGTERM) is _terminated:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if not _signalled:  # else one was handled before the default was back
            return
    if _last_count == atexit._ncallbacks():  # none registered after this one: none ran
        atexit.unregister(_at_exit)
        atexit._run_exitfuncs()
    else:
        log.warning(
            "this foreachBatch process ends (Spark's SIGTERM) without the atexit callbacks "
            "registered before fanout's: others registered after it have run already, and "
            "running the rest from here would run those twice"
        )
        logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed stream: nothing to flush
            pass
    os._exit(EXIT_STATUS)


def _start_grace() -> None:
    """End the process :data:`GRACE_S` from now, from a daemon thread."""
    timer = threading.Timer(GRACE_S, _end_now)
    timer.name, timer.daemon = "fanout-worker-grace", True
    try:
        timer.start()
    except RuntimeError:  # too late in the exit for a thread: the exit is ending it
        log.warning("no thread to end this foreachBatch process after its grace")


def _end_after_grace(read: int) -> None:
    """Wait for SIGTERM's wake-up byte, then end the process :data:`GRACE_S` later."""
    while True:
        woke = os.read(read, 64)
        if not woke:
            return
        if signal.SIGTERM in woke:  # other signals' bytes come through too
            break
    time.sleep(GRACE_S)
    _end_now()


def _end_now() -> None:
    """End the process at its grace's end, logged."""
    log.error(
        "this foreachBatch process was still running %g s after Spark's SIGTERM (a close "
        "or a write that did not end): ended now, as a kill would",
        GRACE_S,
    )
    os._exit(EXIT_STATUS)


__all__ = [
    "EXIT_STATUS",
    "GRACE_S",
    "WORKER_ENV",
    "WorkerTerminated",
    "call_entered",
    "call_left",
    "watch",
]
