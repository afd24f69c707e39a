"""The first write's read of the topic's end (:mod:`fanout_kafka.renamed`) ends within the
sink's ``open_timeout_s`` as a whole: its rounds, its tries again after an error that may
pass, their pauses and the markers' reads share one deadline. Each try was given the whole
``open_timeout_s`` again (and the markers' read its own 60 s), so a broker that stopped
answering held a sink's first batch for three times the time it was given, plus pauses."""

from __future__ import annotations

import socket
import time

import pytest

from fanout.errors import TransientSinkError


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_tail_read_and_its_tries_again_end_within_open_timeout_s() -> None:
    """A real client against a port nothing listens on (a broker stopped between the
    restart's open and its first write): every try fails with ``_TRANSPORT`` once the time
    it is given passes; the read is refused as transient once ``open_timeout_s`` passes
    (before: 3 tries of 2 s each and 0.75 s of pauses, about 6.8 s)."""
    from fanout_kafka import KafkaSink
    from fanout_kafka.driver_admins import admin_config

    bootstrap = f"127.0.0.1:{_free_port()}"
    sink = KafkaSink("events", bootstrap_servers=bootstrap, topic="orders", open_timeout_s=2)
    config = {**admin_config(sink.producer, bootstrap), "log_level": 0}
    started = time.monotonic()
    with pytest.raises(TransientSinkError) as caught:
        sink._read_tail(config, "orders", "p", 0, 4, {"events"}, None, started + 2)
    took = time.monotonic() - started
    assert took < 4.0, took  # the 2 s given, and a margin for a loaded machine
    text = str(caught.value)
    assert text.startswith(
        "sink 'events', batch 4: cannot write batch 4, this sink's first write to topic "
        "'orders' in the epoch: the read of the topic's end"
    )
    assert "within its open_timeout_s=2 s with an error worth trying again" in text
    assert "_TRANSPORT" in text or "_TIMED_OUT" in text
    assert "restart it once the brokers answer" in text


def test_a_tail_read_with_no_time_left_cannot_tell_and_reads_nothing() -> None:
    """A deadline already passed (the rounds before it used the time up): no request is
    sent, and the answer is "cannot tell" with the option to raise, as for a read that did
    not end in time (the caller warns, :meth:`fanout_kafka.KafkaSink._refuse_vanished_writer`)."""
    from fanout_kafka import KafkaSink
    from fanout_kafka.driver_admins import admin_config

    bootstrap = f"127.0.0.1:{_free_port()}"
    sink = KafkaSink("events", bootstrap_servers=bootstrap, topic="orders", open_timeout_s=2)
    config = {**admin_config(sink.producer, bootstrap), "log_level": 0}
    started = time.monotonic()
    writers, held, unread = sink._read_tail(config, "orders", "p", 0, 4, set(), None, started)
    assert (writers, held) == (None, {})
    assert "not all read within its open_timeout_s=2 s: raise it to read them" in unread
    assert time.monotonic() - started < 0.5
