"""``init_transactions`` is called again every slice while librdkafka times out (each call
starts its PID request again, instead of its 500 ms coordinator timer): unit tests of the
loop with a fake producer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException
from fanout_kafka import producer_init
from fanout_kafka.producer_init import SLICE_S, init_transactions


class FakeProducer:
    """Answers each ``init_transactions`` call with the next scripted error, then succeeds."""

    def __init__(self, errors: list[int]) -> None:
        self.errors = list(errors)
        self.timeouts: list[float] = []

    def init_transactions(self, timeout: float) -> None:
        self.timeouts.append(timeout)
        if self.errors:
            raise KafkaException(KafkaError(self.errors.pop(0)))


def test_a_timed_out_call_is_made_again_in_slices_until_it_succeeds() -> None:
    producer = FakeProducer([KafkaError._TIMED_OUT, KafkaError._TIMED_OUT])
    init_transactions(producer, 60.0)
    assert producer.timeouts == [SLICE_S, SLICE_S, SLICE_S]


def test_another_error_raises_at_once() -> None:
    producer = FakeProducer([KafkaError._FENCED])
    with pytest.raises(KafkaException) as raised:
        init_transactions(producer, 60.0)
    assert raised.value.args[0].code() == KafkaError._FENCED
    assert producer.timeouts == [SLICE_S]


def test_the_callers_timeout_bounds_the_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a clock of the test's own (each call waits its whole slice, as librdkafka does
    when it times out): exactly four slices of 0.25 s in a 1 s timeout, then the timeout
    raises. A loaded machine's sleeps made the wall-clock version count 2 to 6."""
    monkeypatch.setattr(producer_init, "SLICE_S", 0.25)
    clock = SimpleNamespace(now=100.0)
    monkeypatch.setattr(producer_init, "time", SimpleNamespace(monotonic=lambda: clock.now))
    producer = FakeProducer([KafkaError._TIMED_OUT] * 1000)

    def slow_init(timeout: float) -> None:
        clock.now += timeout
        FakeProducer.init_transactions(producer, timeout)

    producer.init_transactions = slow_init  # type: ignore[method-assign]
    with pytest.raises(KafkaException) as raised:
        init_transactions(producer, 1.0)
    assert raised.value.args[0].code() == KafkaError._TIMED_OUT
    assert producer.timeouts == [0.25] * 4
    assert clock.now == 101.0
