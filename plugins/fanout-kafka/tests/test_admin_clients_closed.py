"""Every admin client the sink makes is destroyed by the sink, on the thread done with it,
never left to the garbage collector (:mod:`fanout_kafka.driver_admins`): a client the
collector destroys on librdkafka's own background thread aborts the process."""

from __future__ import annotations

import os
import socket
import time
from types import TracebackType

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from fanout_kafka import KafkaSink
from fanout_kafka.driver_admins import DriverAdmins

from fanout import ConfigurationError
from fanout.contract.sink import SinkContext


def _librdkafka_threads() -> int:
    """This process's threads librdkafka started (they name themselves ``rdk:...``)."""
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                names.append(comm.read().strip())
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    return sum(name.startswith("rdk:") for name in names)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_last_release_destroys_the_client_though_something_still_holds_it() -> None:
    admins = DriverAdmins()
    config = {"bootstrap.servers": f"127.0.0.1:{_closed_port()}", "log_level": 0}
    client = admins.client(config)  # as a traceback or a late thread may still hold it
    admins.hold(config)
    admins.hold(config)
    admins.release(config)
    with pytest.raises(KafkaException):  # one holder left: still usable (nothing there)
        client.list_topics(timeout=0.2)
    admins.release(config)
    assert not admins.holds(config)
    with pytest.raises(RuntimeError, match="Handle has been closed"):
        client.list_topics(timeout=0.2)


def test_a_failed_open_leaves_no_client_behind_while_its_error_is_kept() -> None:
    sink = KafkaSink(
        "events", bootstrap_servers=f"127.0.0.1:{_closed_port()}", topic="t",
        open_timeout_s=0.5,
    )  # fmt: skip
    before = _librdkafka_threads()
    with pytest.raises(ConfigurationError, match="cannot reach the Kafka brokers") as caught:
        sink.open(SinkContext("p"))
    # the error's traceback holds open()'s frames, the admin connection among them: each
    # client it holds is destroyed
    held = _clients_held_by(caught.value.__traceback__)
    assert len(held) >= 1
    for client in held:
        with pytest.raises(RuntimeError, match="Handle has been closed"):
            client.list_topics(timeout=0.2)
    # and no other client of it is left running: its threads gone. Another test's client
    # still alive in this process may start a broker thread meanwhile (seen once in CI:
    # 12 against 11), so the count is asked again for a while, never allowed to stay above
    assert _threads_back_to(before, within_s=5.0) <= before


def _clients_held_by(traceback: TracebackType | None) -> list[AdminClient]:
    """The admin clients the frames of ``traceback`` hold in their local variables."""
    held: list[AdminClient] = []
    while traceback is not None:
        for value in traceback.tb_frame.f_locals.values():
            if isinstance(value, AdminClient) and not any(value is c for c in held):
                held.append(value)
            for inner in getattr(value, "__dict__", {}).values():  # an object holding one
                if isinstance(inner, AdminClient) and not any(inner is c for c in held):
                    held.append(inner)
        traceback = traceback.tb_next
    return held


def _threads_back_to(count: int, within_s: float) -> int:
    deadline = time.monotonic() + within_s
    while (now := _librdkafka_threads()) > count and time.monotonic() < deadline:
        time.sleep(0.05)
    return now
