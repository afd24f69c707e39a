"""A partition task's input ends only where Spark ended it (:mod:`fanout.partitioned.
input_end`), without Spark: the worker's socket is a socket pair, its entry a function named
like pyspark's, the task context a stand-in."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest

from fanout.errors import FanoutError, PartitionInputError
from fanout.partitioned.input_end import InputEnd, closed_by_peer, whole_input
from fanout.partitioned.outcome import PartitionOutcome
from fanout.partitioned.shared import SharedMember, SharedPartitionTask
from fanout.partitioned.task import CommitHooks, PartitionTask


def _batches(count: int = 3) -> Iterator[pa.RecordBatch]:
    for i in range(count):
        yield pa.record_batch({"k": [i * 10 + j for j in range(10)]})


class _Task:
    def partitionId(self) -> int:
        return 0


@pytest.fixture
def in_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """``TaskContext.get()`` answers as in a Spark task."""
    from pyspark import TaskContext

    monkeypatch.setattr(TaskContext, "get", classmethod(lambda cls: _Task()))
    for name in ("PYTHON_WORKER_FACTORY_PORT", "PYTHON_WORKER_FACTORY_SOCK_PATH"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """The worker's socket and the JVM's end of it."""
    worker, jvm = socket.socketpair()
    yield worker, jvm
    worker.close()
    jvm.close()


def main(infile: Any, outfile: Any, call: Any) -> Any:
    """Stands for ``pyspark.worker.main``: the function runs below it."""
    return call()


def test_a_socket_is_closed_by_its_peer_only_at_its_end_of_file(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    worker, jvm = pair
    assert not closed_by_peer(worker.fileno())
    jvm.sendall(b"\xff\xff\xff\xfc")  # END_OF_STREAM, not yet read
    assert not closed_by_peer(worker.fileno())
    assert worker.recv(4) == b"\xff\xff\xff\xfc"  # peeked, not consumed
    jvm.close()
    assert closed_by_peer(worker.fileno())
    assert worker.getblocking()  # the worker's own socket is left as it was


def test_an_input_the_jvm_abandoned_raises_instead_of_ending(
    in_task: None, pair: tuple[socket.socket, socket.socket]
) -> None:
    worker, jvm = pair
    infile = worker.makefile("rb")
    jvm.close()
    seen: list[int] = []

    def read() -> None:
        for batch in whole_input(_batches()):
            seen.append(batch.num_rows)

    with pytest.raises(PartitionInputError, match="abandoned the task") as raised:
        main(infile, None, read)
    assert seen == [10, 10, 10]  # every batch received is handed on, then the error
    assert isinstance(raised.value, FanoutError)


def test_an_input_whose_socket_stays_open_ends(
    in_task: None, pair: tuple[socket.socket, socket.socket]
) -> None:
    worker, _jvm = pair
    infile = worker.makefile("rb")
    rows = main(infile, None, lambda: sum(b.num_rows for b in whole_input(_batches())))
    assert rows == 30


def test_a_spark_task_whose_socket_cannot_be_found_does_not_end(in_task: None) -> None:
    end = InputEnd.of_this_task()
    assert end.fd is None and end.problem is not None
    with pytest.raises(PartitionInputError, match="cannot find the socket"):
        list(whole_input(_batches()))


def test_outside_a_spark_task_nothing_is_checked() -> None:
    assert InputEnd.of_this_task() == InputEnd()
    assert sum(b.num_rows for b in whole_input(_batches())) == 30


def test_a_worker_without_the_daemon_finds_its_socket_by_the_factory_port(
    in_task: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as factory:
        port = factory.getsockname()[1]
        monkeypatch.setenv("PYTHON_WORKER_FACTORY_PORT", str(port))
        with socket.create_connection(("127.0.0.1", port)) as worker:
            jvm, _ = factory.accept()
            sockfile = worker.makefile("rwb", 65536)  # as pyspark's: no descriptor
            end = main(sockfile, sockfile, InputEnd.of_this_task)
            assert end.fd == worker.fileno()
            end.check()
            jvm.close()
            with pytest.raises(PartitionInputError, match="abandoned the task"):
                end.check()


@dataclass
class Committer:
    """Commits once its input ends; what the input raises aborts."""

    log: list[str] = field(default_factory=list)

    def write_partition(
        self, partition: int, batches: Iterator[pa.RecordBatch], hooks: Any, digest: Any
    ) -> PartitionOutcome:
        rows = 0
        try:
            for batch in batches:
                rows += batch.num_rows
        except Exception as exc:
            self.log.append(f"aborted {partition} {rows} {type(exc).__name__}")
            raise
        self.log.append(f"committed {partition} {rows}")
        return PartitionOutcome(partition, "committed", rows=rows, written=rows)


def test_a_partition_task_does_not_commit_an_abandoned_input(
    in_task: None, pair: tuple[socket.socket, socket.socket]
) -> None:
    worker, jvm = pair
    writer = Committer()
    task = PartitionTask(writer, CommitHooks("p", "s", 0))
    jvm.close()
    result = main(worker.makefile("rb"), None, lambda: list(task(_batches())))
    outcome = PartitionOutcome.from_json(result[0].column("outcome")[0].as_py())
    assert writer.log == ["aborted 0 30 PartitionInputError"]
    assert outcome.status == "failed" and outcome.failure is not None
    assert "PartitionInputError" in outcome.failure.message


def test_a_shared_task_does_not_commit_an_abandoned_input_for_any_member(
    in_task: None, pair: tuple[socket.socket, socket.socket]
) -> None:
    worker, jvm = pair
    writers = [Committer(), Committer()]
    members = tuple(
        SharedMember(PartitionTask(w, CommitHooks("p", f"s{i}", 0)), (("k", "k"),), False)
        for i, w in enumerate(writers)
    )
    jvm.close()
    with pytest.raises(PartitionInputError):
        main(worker.makefile("rb"), None, lambda: list(SharedPartitionTask(members)(_batches())))
    assert [w.log for w in writers] == [["aborted 0 30 PartitionInputError"]] * 2
