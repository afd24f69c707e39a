"""``init_transactions`` is called again every slice while librdkafka times out (each call
starts its PID request again, instead of its 500 ms coordinator timer): unit tests of the
loop with a fake producer."""

from __future__ import annotations

import time

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
    monkeypatch.setattr(producer_init, "SLICE_S", 0.02)
    producer = FakeProducer([KafkaError._TIMED_OUT] * 1000)

    def slow_init(timeout: float) -> None:
        time.sleep(timeout)
        FakeProducer.init_transactions(producer, timeout)

    producer.init_transactions = slow_init  # type: ignore[method-assign]
    started = time.monotonic()
    with pytest.raises(KafkaException) as raised:
        init_transactions(producer, 0.1)
    assert raised.value.args[0].code() == KafkaError._TIMED_OUT
    assert time.monotonic() - started < 0.5
    assert 3 <= len(producer.timeouts) <= 6
    assert all(t <= 0.02 + 1e-9 for t in producer.timeouts)
