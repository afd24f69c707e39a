"""The end of a partition task's input: proof that Spark ended it, before a writer commits.

Spark feeds a ``mapInArrow`` function its partition over the Python worker's socket, as one
Arrow IPC stream, and computes that input while it feeds it. When the JVM fails on the way
(an expression's error, a shuffle fetch failure, the task killed or its job cancelled), it
stops feeding, fails the task and closes the socket. What reached the worker ends where a
batch ends (the JVM sends whole buffers of whole Arrow messages), and pyarrow's stream
reader takes the end of the file there for the end of the stream: the function's iterator
simply ends, as if the partition were whole. A writer that commits once its input ends
would commit part of the partition; the retried task, or the replay, then finds that
partition committed (a skipped partition missing rows, or a replay refused as
"rows moved").

A whole input is followed on the socket by the worker protocol's end-of-stream marker, and
the JVM keeps the socket open until it has read the function's results (it needs them). So
once the iterator has ended, the socket at its end of file means the JVM gave up on the
task, and nothing else does. :func:`whole_input` looks, without reading anything, before it
lets the iterator end, and raises :class:`fanout.errors.PartitionInputError` instead: the
writer's transaction rolls back (what its input raises fails the partition).

The socket is the one ``pyspark.worker.main`` reads (its ``infile``), found on the calling
thread's stack; a worker started without pyspark's daemon reads a file object without a
descriptor, and its socket is found by the address it connected to. Outside a Spark task
there is nothing to check. In a Spark task whose socket cannot be found, the input fails
too: an end that cannot be proven whole is not committed.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fanout.errors import PartitionInputError

if TYPE_CHECKING:
    import pyarrow as pa

WORKER_ENTRY = "main"
"""The function of pyspark's Python worker that runs a task (``main(infile, outfile)``)."""


@dataclass(frozen=True)
class InputEnd:
    """Where this task's input comes from: the worker's socket descriptor, or why it is
    unknown.

    :param fd: the descriptor of the socket the JVM feeds (``None``: not checked).
    :param problem: why a Spark task's socket could not be found (the end then fails).
    """

    fd: int | None = None
    problem: str | None = None

    @classmethod
    def of_this_task(cls) -> InputEnd:
        """The running task's input, found from the calling thread (the one pyspark's
        worker called the ``mapInArrow`` function on); nothing to check outside Spark."""
        from pyspark import TaskContext

        if TaskContext.get() is None:
            return cls()
        fd = _worker_socket_fd(sys._getframe(1))
        if fd is None:
            return cls(problem="cannot find the socket the Spark task's input comes from")
        return cls(fd)

    def check(self) -> None:
        """Raise :class:`PartitionInputError` unless the input ended where Spark ended it.

        :raises PartitionInputError: the JVM closed the socket (it abandoned the task), or
            the socket of a Spark task could not be found.
        """
        if self.problem is not None:
            raise PartitionInputError(
                f"{self.problem}: the partition's input may be cut short, so it is not "
                "committed (fanout.partitioned.input_end)"
            )
        if self.fd is not None and closed_by_peer(self.fd):
            raise PartitionInputError(
                "the partition's input ended because Spark abandoned the task (an error "
                "computing its rows, a fetch failure, the task killed or cancelled): the "
                "rows received are only part of the partition, so none is committed"
            )

    def guard(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``batches``, then :meth:`check` before they end."""
        yield from batches
        self.check()


def whole_input(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A ``mapInArrow`` function's input that ends only where Spark ended the partition:
    cut short by the JVM, it raises :class:`PartitionInputError` instead of ending. Call
    it on the thread pyspark called the function on (the socket is found there, now)."""
    return InputEnd.of_this_task().guard(batches)


def closed_by_peer(fd: int) -> bool:
    """Whether the other end of the socket ``fd`` closed its side: its read end is at end
    of file (or the connection was reset, or ``fd`` is no connected socket). Reads
    nothing and never waits."""
    dontwait = getattr(socket, "MSG_DONTWAIT", None)
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return True
    try:
        if dontwait is None:  # Windows: ask select whether a read would wait
            import select

            readable, _, _ = select.select([sock], [], [], 0)
            if not readable:
                return False
        return sock.recv(1, socket.MSG_PEEK | (dontwait or 0)) == b""
    except BlockingIOError:
        return False  # open, nothing to read yet
    except OSError:
        return True
    finally:
        sock.close()


def _worker_socket_fd(frame: Any) -> int | None:
    """The descriptor of the socket pyspark's worker reads its task from: ``infile`` of
    the worker's entry on the stack above ``frame``, else the socket connected to the
    worker factory's address (a worker started without the daemon)."""
    while frame is not None:
        if frame.f_code.co_name == WORKER_ENTRY:
            infile = frame.f_locals.get("infile")
            if infile is not None:
                try:
                    return int(infile.fileno())
                except (AttributeError, OSError, ValueError):
                    break  # socket.makefile's pair has no descriptor
        frame = frame.f_back
    return _factory_socket_fd()


def _factory_socket_fd() -> int | None:
    """The descriptor of this process's socket connected to the address pyspark's worker
    (started without the daemon) connects to (``PYTHON_WORKER_FACTORY_PORT`` or
    ``_SOCK_PATH``)."""
    import gc

    path = os.environ.get("PYTHON_WORKER_FACTORY_SOCK_PATH")
    port = os.environ.get("PYTHON_WORKER_FACTORY_PORT")
    if not path and not port:
        return None
    for candidate in gc.get_objects():
        if not isinstance(candidate, socket.socket) or candidate.fileno() < 0:
            continue
        try:
            peer = candidate.getpeername()
        except OSError:
            continue
        if (path and peer == path) or (
            port and isinstance(peer, tuple) and len(peer) >= 2 and str(peer[1]) == port
        ):
            return candidate.fileno()
    return None
