"""Every admin client the sink makes is destroyed by the sink, on the thread done with it,
never left to the garbage collector (:mod:`fanout_kafka.driver_admins`): a client the
collector destroys on librdkafka's own background thread aborts the process."""

from __future__ import annotations

import os
import socket

import pytest
from confluent_kafka import KafkaException
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
    # the error's traceback holds open()'s frames, the admin connection among them
    assert caught.value.__traceback__ is not None
    assert _librdkafka_threads() == before
