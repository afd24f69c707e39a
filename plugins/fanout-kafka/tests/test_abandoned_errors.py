"""Ending abandoned transactions (:func:`fanout_kafka.abandoned.end_transactions`) when
an id fails with an error that is not the client's ``KafkaException``: that id is a
failure (logged, redacted), the others are initialised all the same, every producer made
is closed, and the driver fails the batch as transient before it reads the markers. Up to
this version a ``RuntimeError``, ``TypeError`` or ``OSError`` escaped as it was, which the
sink does not call transient: the batch was not retried."""

from __future__ import annotations

import logging
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaException
from fanout_kafka import KafkaSink, abandoned
from kafkatools import Broker, WrappedProducer, create_topic, marker
from test_abandoned_transactions import KEPT, LEFT_OPEN, PLAN, _batch, _commit, _left_open

from fanout.contract.sink import SinkContext
from fanout.errors import TransientSinkError

SECRET = "pw-9Zk!abandoned"


class _FakeProducer:
    """A producer of :func:`end_transactions` whose behaviour its id picks: ``new``
    raises from the constructor, ``init`` from ``init_transactions``, ``close`` from
    ``close``, ``stop`` raises a ``KeyboardInterrupt``; ``made`` records each one."""

    made: dict[str, _FakeProducer] = {}

    def __init__(self, config: dict[str, Any]) -> None:
        self.transactional_id = str(config["transactional.id"])
        if self.transactional_id == "new":
            raise TypeError(f"bad setting {SECRET}")
        self.initialised = False
        self.closed = False
        _FakeProducer.made[self.transactional_id] = self

    def init_transactions(self, timeout: float) -> None:
        if self.transactional_id == "init":
            raise RuntimeError(f"client gone for {SECRET}")
        if self.transactional_id == "stop":
            raise KeyboardInterrupt
        self.initialised = True

    def close(self) -> None:
        self.closed = True
        if self.transactional_id == "close":
            raise OSError(f"socket {SECRET}")


def _settings() -> Any:
    """The settings :func:`end_transactions` uses, with a secret among the producer's."""
    return SimpleNamespace(
        sink="events", producer={"sasl.password": SECRET}, end_turns=None,
        operation_timeout_s=1.0, producer_config=lambda p: {"bootstrap.servers": "b:1"},
    )  # fmt: skip


def test_end_transactions_goes_on_past_any_error_of_one_id_and_closes_what_it_made(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``new`` fails making its producer (``TypeError``), ``init`` initialising it
    (``RuntimeError``), ``close`` only closing it (``OSError``: it was initialised, so it
    ended its transactions), ``ok`` not at all: the two first are returned with their
    errors, the others were initialised, each producer made is closed, and the log names
    each failure with its type and without the secret."""
    _FakeProducer.made = {}
    monkeypatch.setattr(abandoned, "Producer", _FakeProducer)
    with caplog.at_level(logging.DEBUG, "fanout_kafka"):
        failed = abandoned.end_transactions(_settings(), ["new", "init", "close", "ok"])
    assert {i: (type(e).__name__, str(e)) for i, e in failed.items()} == {
        "new": ("TypeError", f"bad setting {SECRET}"),
        "init": ("RuntimeError", f"client gone for {SECRET}"),
    }
    made = _FakeProducer.made
    assert {i: (p.initialised, p.closed) for i, p in made.items()} == {
        "init": (False, True), "close": (True, True), "ok": (True, True)
    }  # fmt: skip
    warned = sorted(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert warned == [
        "sink 'events': cannot initialise transactional id 'init' (to end a transaction left "
        "open under it): RuntimeError: client gone for ***",
        "sink 'events': cannot initialise transactional id 'new' (to end a transaction left "
        "open under it): TypeError: bad setting ***",
        "sink 'events': producer of transactional id 'close' not closed: OSError: socket ***",
    ]
    assert SECRET not in caplog.text


def test_end_transactions_lets_an_interrupt_through_and_closes_its_producer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ``KeyboardInterrupt`` (a ``BaseException``, not an ``Exception``) is not taken for
    one id's failure: it stops the call; the producer is still closed."""
    _FakeProducer.made = {}
    monkeypatch.setattr(abandoned, "Producer", _FakeProducer)
    with pytest.raises(KeyboardInterrupt):
        abandoned.end_transactions(_settings(), ["stop"])
    assert _FakeProducer.made["stop"].closed


def test_a_driver_error_ending_one_id_fails_the_batch_as_transient_after_ending_the_others(
    kafka: Broker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Partition 1's task was killed with its transaction open, beside partition 0's
    commit of batch 0 (on Tansu its marker is held back until that transaction ends). The
    retry's driver step fails to initialise partition 0's id with a ``RuntimeError`` (the
    secret in its text): it still ends partition 1's transaction (partition 0's marker
    now reads 1, and the killed task's producer is fenced), closes both producers, and
    fails the attempt with a :class:`TransientSinkError` the sink retries, naming the
    error without the secret. The next attempt reads the markers: partition 0 holds the
    batch."""
    topic, pipeline = f"ab-{uuid.uuid4().hex[:8]}", f"ab{uuid.uuid4().hex[:6]}"
    create_topic(kafka.bootstrap, topic, 1)
    sink = KafkaSink("events", bootstrap_servers=kafka.bootstrap, topic=topic, key="id",
                     value="v", partitions=2, producer={"sasl.password": SECRET})  # fmt: skip
    sink.open(SinkContext(pipeline))
    try:
        if sink._end_turns is None:
            pytest.skip("the driver ends abandoned transactions on Tansu only")
        assert sink.committed_partitions(_batch(pipeline), PLAN) == []  # the first attempt
        prefix = f"fanout/{pipeline}/events"
        made: list[Any] = []

        class Failing(WrappedProducer):
            """The driver's producers: partition 0's init raises a driver-side error."""

            def init_transactions(self, timeout: float) -> None:
                if self.transactional_id == f"{prefix}-{KEPT}":
                    raise RuntimeError(f"driver lost for {SECRET}")
                self.inner.init_transactions(timeout)

            def close(self) -> bool:
                self.closed = True
                return bool(self.inner.close())

        with _left_open(sink, pipeline, topic, LEFT_OPEN) as killed:
            _commit(sink, pipeline, KEPT)
            monkeypatch.setattr(abandoned, "Producer", lambda config: Failing(config, made))
            with caplog.at_level(logging.WARNING, "fanout_kafka"), \
                    pytest.raises(TransientSinkError) as caught:  # fmt: skip
                sink.committed_partitions(_batch(pipeline), PLAN)
            assert sorted((m.transactional_id, m.closed) for m in made) == [
                (f"{prefix}-{KEPT}", True), (f"{prefix}-{LEFT_OPEN}", True)
            ]  # fmt: skip
            with pytest.raises(KafkaException):  # its transaction was ended under it
                killed.commit_transaction(5)
            assert marker(kafka.bootstrap, pipeline, "events", KEPT, "__fanout_markers") == 1
        assert sink.is_transient(caught.value)
        assert str(caught.value).endswith(
            "cannot end the transactions an earlier attempt left open (to read its partition "
            "markers): RuntimeError: driver lost for ***"
        ), str(caught.value)
        warned = [r for r in caplog.records if r.name == "fanout_kafka"]
        assert [(r.levelname, r.getMessage()) for r in warned] == [
            ("WARNING", f"sink 'events': cannot initialise transactional id '{prefix}-{KEPT}' "
             "(to end a transaction left open under it): RuntimeError: driver lost for ***")
        ]  # fmt: skip
        assert SECRET not in caplog.text
        monkeypatch.undo()
        held = sink.committed_partitions(_batch(pipeline), PLAN)  # the next attempt
        assert [c.partition for c in held] == [KEPT]
    finally:
        sink.close()


def test_an_error_counting_the_partitions_beyond_the_span_fails_the_batch_as_transient(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The read of the markers beyond the partition span raising anything (here an
    ``OSError``, not the client's): no id is ended, and the batch fails as transient, its
    text typed and redacted, before any marker is read."""
    ended: list[list[str]] = []

    def beyond(settings: Any, partitions: int) -> int:
        raise OSError(f"socket {SECRET}")

    monkeypatch.setattr(abandoned, "marked_beyond", beyond)
    monkeypatch.setattr(abandoned, "end_transactions", lambda s, ids: ended.append(ids) or {})
    settings = SimpleNamespace(sink="events", producer={"sasl.password": SECRET},
                               transactional_id=lambda p: f"t-{p}")  # fmt: skip
    with pytest.raises(TransientSinkError) as failed:
        abandoned.end_abandoned_transactions(settings, 2, 7)  # type: ignore[arg-type]
    assert ended == []
    assert (failed.value.sink, failed.value.batch_id) == ("events", 7)
    text = str(failed.value)
    assert (
        "cannot end the transactions an earlier attempt left open (to read its partition "
        "markers): OSError: socket " in text
    )
    assert SECRET not in text
