"""The driver's Kafka admin clients: one per connection configuration, shared by the sinks
that use it, and destroyed when the last of them closes.

The driver reads the partition markers before every batch (:mod:`fanout_kafka.membership`).
A new client per batch spent ~50 ms connecting, so a client is kept between batches. Kept
for the driver's life, as it was, a client outlived its sinks: a driver that closed a
FanOut and went on (a notebook, a test run, the benchmark's runs against a fresh broker
each) kept every one, and a client whose brokers went away keeps reconnecting, on
librdkafka's threads, for as long as the process lives. A sink holds its configuration's
client from ``open()`` to ``close()``; the last ``close()`` destroys it.

Every admin client fanout makes is destroyed by fanout, on the thread that is done with it
(:func:`close_admin`), never left to the garbage collector. An admin client runs Python on
librdkafka's own background thread (its futures' callbacks, its ``logger``); a client left
in a reference cycle (an exception's traceback keeps one easily) is destroyed by whichever
thread the cyclic collector runs on, and when that is the client's own background thread
librdkafka aborts the process ("rd_kafka_destroy() called from librdkafka owned thread"):
a driver killed by ``SIGABRT``, seen in this project's test runs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from fanout_kafka.options import connection_settings

Key = tuple[tuple[str, str], ...]


def admin_config(producer: Mapping[str, Any], bootstrap_servers: str) -> dict[str, Any]:
    """The driver's admin client settings: the producer's connection settings, the brokers."""
    return {**connection_settings(producer), "bootstrap.servers": bootstrap_servers}


def close_admin(client: Any) -> None:
    """Destroy ``client`` now, on this thread (its threads end; a request still pending
    never completes, and a later call raises ``RuntimeError``). Closing twice is harmless."""
    client.__exit__(None, None, None)  # confluent-kafka's only way to destroy an admin client


def _key(config: Mapping[str, Any]) -> Key:
    return tuple(sorted((str(k), str(v)) for k, v in config.items()))


class DriverAdmins:
    """Admin clients by configuration, each with the number of open sinks holding it
    (thread-safe; lives on the driver only: sinks are pickled without it)."""

    def __init__(self) -> None:
        self._clients: dict[Key, Any] = {}
        self._holders: dict[Key, int] = {}
        self._lock = threading.Lock()

    def client(self, config: Mapping[str, Any]) -> Any:
        """The admin client of ``config``, made on first use."""
        from confluent_kafka.admin import AdminClient

        key = _key(config)
        with self._lock:
            if key not in self._clients:
                # librdkafka's own log lines (a broker gone away) go to Python logging
                settings: dict[str, Any] = {
                    **config,
                    "logger": logging.getLogger("fanout_kafka.librdkafka"),
                }
                self._clients[key] = AdminClient(settings)
            return self._clients[key]

    def hold(self, config: Mapping[str, Any]) -> None:
        """A sink uses ``config``'s client until it calls :meth:`release`."""
        key = _key(config)
        with self._lock:
            self._holders[key] = self._holders.get(key, 0) + 1

    def release(self, config: Mapping[str, Any]) -> None:
        """A sink no longer uses ``config``'s client; the last one out destroys it now, on
        this thread (:func:`close_admin`), even if other code still has a reference to it."""
        key = _key(config)
        with self._lock:
            left = self._holders.get(key, 0) - 1
            if left > 0:
                self._holders[key] = left
                return
            self._holders.pop(key, None)
            client = self._clients.pop(key, None)
        if client is not None:  # outside the lock: destroying waits for the client's threads
            close_admin(client)

    def holds(self, config: Mapping[str, Any]) -> bool:
        """Whether a client of ``config`` is kept."""
        with self._lock:
            return _key(config) in self._clients


ADMINS = DriverAdmins()
"""This driver's admin clients."""
