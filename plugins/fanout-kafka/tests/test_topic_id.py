"""The topic-id offset (:mod:`fanout_kafka.topic_id`): packing, comparing, and a broker
that gives no topic id."""

from __future__ import annotations

from typing import Any

import pytest
from fanout_kafka.topic_id import current_topic_id, pack_topic_id, replaced, topic_id_group


def test_the_group_is_the_sinks_own_and_no_marker_group() -> None:
    assert topic_id_group("orders@e2", "k", "t.1") == "fanout/orders@e2/k/topic-id/t.1"


def test_an_offset_tells_the_same_topic_from_one_created_again() -> None:
    offset = pack_topic_id("orders", "AaItBkUMd3CWbG1G5pduHQ")
    assert 0 <= offset < 2**63
    assert replaced(offset, "orders", "AaItBkUMd3CWbG1G5pduHQ") is False
    assert replaced(offset, "orders", "AaItBkcGc3ONnWynFRd/jw") is True


@pytest.mark.parametrize(
    ("offset", "topic", "now"),
    [
        (-1001, "orders", "AaItBkcGc3ONnWynFRd/jw"),  # nothing recorded (an older fanout)
        (pack_topic_id("payments", "x"), "orders", "y"),  # recorded for the topic before
        (pack_topic_id("orders", "x"), "orders", None),  # the broker gives no id
    ],
)
def test_it_cannot_tell_without_an_id_of_this_topic(offset: int, topic: str, now: Any) -> None:
    assert replaced(offset, topic, now) is None


class _Uuid:
    def __init__(self, high: int, low: int) -> None:
        self.high, self.low = high, low

    def get_most_significant_bits(self) -> int:
        return self.high

    def get_least_significant_bits(self) -> int:
        return self.low

    def __str__(self) -> str:
        return f"{self.high}:{self.low}"


class _Described:
    def __init__(self, topic_id: Any) -> None:
        self.topic_id = topic_id


class _Future:
    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self, timeout: float) -> Any:
        return self.value


class _Admin:
    def __init__(self, topic_id: Any) -> None:
        self.topic_id = topic_id

    def describe_topics(self, topics: Any, request_timeout: float) -> dict[str, _Future]:
        return {name: _Future(_Described(self.topic_id)) for name in topics.topic_names}


@pytest.mark.parametrize(
    ("topic_id", "expected"),
    [(None, None), (_Uuid(0, 0), None), (_Uuid(1, -2), "1:-2")],
)
def test_an_older_brokers_missing_or_zero_id_is_none(topic_id: Any, expected: Any) -> None:
    assert current_topic_id(_Admin(topic_id), "orders", 5.0) == expected


class _FlakyAdmin:
    """Describes topic ``orders`` as id ``1:-2``, after raising each of ``failures`` once
    (from the futures, as the client's do); records the offsets committed."""

    def __init__(self, failures: list[BaseException]) -> None:
        self.failures = failures
        self.committed: list[tuple[str, int]] = []

    def describe_topics(self, topics: Any, request_timeout: float) -> dict[str, Any]:
        failure = self.failures.pop(0) if self.failures else None
        return {name: _Failing(failure, _Described(_Uuid(1, -2))) for name in topics.topic_names}

    def alter_consumer_group_offsets(self, request: Any, request_timeout: float) -> Any:
        from types import SimpleNamespace

        (group,) = request
        (tp,) = group.topic_partitions
        self.committed.append((group.group_id, tp.offset))
        done = SimpleNamespace(topic_partitions=[SimpleNamespace(error=None)])
        return {group.group_id: _Future(done)}


class _Failing(_Future):
    def __init__(self, failure: BaseException | None, value: Any) -> None:
        super().__init__(value)
        self.failure = failure

    def result(self, timeout: float) -> Any:
        if self.failure is not None:
            raise self.failure
        return self.value


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param("kafka", id="describe-refused"),
        pytest.param(TimeoutError(), id="describe-timed-out"),
    ],
)
def test_an_id_the_driver_could_not_read_is_recorded_after_the_next_batch(
    monkeypatch: pytest.MonkeyPatch, failure: Any
) -> None:
    """A describe that fails after the first batch is no id from the broker: the id is
    recorded after the next batch (else a run accepted for a re-created topic leaves the
    old id, and the next healthy restart is refused), and the batch, whose partitions all
    committed, does not fail for it."""
    from types import SimpleNamespace

    from confluent_kafka import KafkaError, KafkaException
    from fanout_kafka import sink as sink_module
    from fanout_kafka.sink import KafkaSink

    if failure == "kafka":
        failure = KafkaException(KafkaError(KafkaError._TIMED_OUT, "describe timed out"))
    admin = _FlakyAdmin([failure])
    monkeypatch.setattr(sink_module.ADMINS, "client", lambda config: admin)
    sink = KafkaSink("k", bootstrap_servers="127.0.0.1:9", topic="orders")
    for batch_id in (0, 1, 2):
        sink.after_partitions(SimpleNamespace(txn_app_id="fanout/p/k", batch_id=batch_id), [])
    assert admin.committed == [("fanout/p/k/topic-id/orders", pack_topic_id("orders", "1:-2"))]


class _Ids(_FlakyAdmin):
    """Describes topic ``orders`` under each of ``ids`` in turn (the last one after)."""

    def __init__(self, *ids: _Uuid) -> None:
        super().__init__([])
        self.ids = list(ids)

    def describe_topics(self, topics: Any, request_timeout: float) -> dict[str, Any]:
        uuid = self.ids.pop(0) if len(self.ids) > 1 else self.ids[0]
        return {name: _Future(_Described(uuid)) for name in topics.topic_names}


def _batches(monkeypatch: pytest.MonkeyPatch, admin: Any, refresh_s: float, count: int) -> None:
    """``count`` batches of one ``open()`` of a Kafka sink on topic ``orders``, whose topic
    id is committed again every ``refresh_s``."""
    from types import SimpleNamespace

    from fanout_kafka import sink as sink_module
    from fanout_kafka.sink import KafkaSink

    monkeypatch.setattr(sink_module.ADMINS, "client", lambda config: admin)
    monkeypatch.setattr(KafkaSink, "topic_id_refresh_s", refresh_s, raising=False)
    sink = KafkaSink("k", bootstrap_servers="127.0.0.1:9", topic="orders")
    for batch_id in range(count):
        sink.after_partitions(SimpleNamespace(txn_app_id="fanout/p/k", batch_id=batch_id), [])


def test_a_long_run_commits_its_topic_id_again_before_the_broker_forgets_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The markers are committed every batch, the id was once a run: a run longer than
    ``offsets.retention.minutes`` (7 days by default) left markers and no id, and the next
    run's check passed a topic re-created before it."""
    group, offset = "fanout/p/k/topic-id/orders", pack_topic_id("orders", "1:-2")
    hourly = _Ids(_Uuid(1, -2))
    _batches(monkeypatch, hourly, 3600.0, 3)
    assert hourly.committed == [(group, offset)]  # within the hour: no request per batch
    due = _Ids(_Uuid(1, -2))
    _batches(monkeypatch, due, 0.0, 3)
    assert due.committed == [(group, offset)] * 3


def test_a_topic_re_created_during_the_run_keeps_the_id_of_its_first_batch(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Committed again, the id of a topic deleted and created again during the run would
    pass the next run's check: the first id is kept, and the change logged."""
    admin = _Ids(_Uuid(1, -2), _Uuid(3, 4))
    with caplog.at_level("WARNING", logger="fanout_kafka"):
        _batches(monkeypatch, admin, 0.0, 3)
    assert admin.committed == [("fanout/p/k/topic-id/orders", pack_topic_id("orders", "1:-2"))] * 3
    assert [r.getMessage() for r in caplog.records] == [
        f"sink 'k', batch {b}: topic 'orders' has id 3:4 now, not 1:-2, recorded after this "
        "run's first batch: it was deleted and created again during the run; the old id is "
        "kept in group 'fanout/p/k/topic-id/orders', so the next run's lost-target check refuses it"
        for b in (1, 2)
    ]


def _recorded(monkeypatch: pytest.MonkeyPatch, admin: _FlakyAdmin) -> None:
    """Offsets are read back as ``admin`` committed them (no broker)."""
    from fanout_kafka import membership

    def read_offsets(config: Any, topic: str, groups: list[str], timeout_s: float) -> list[int]:
        found = dict(admin.committed)
        return [found.get(group, membership.NO_OFFSET) for group in groups]

    monkeypatch.setattr(membership, "read_offsets", read_offsets)


def test_an_id_recorded_for_another_topic_is_no_record_though_the_names_digests_collide(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Option ``topic`` changed from ``payments`` to ``orders``, an empty topic of another
    id: the id recorded for ``payments`` is no record of ``orders``, even when their
    names' 20-bit digests are equal (once in 2^20 they are; it was a false refusal)."""
    from types import SimpleNamespace

    from fanout_kafka import sink as sink_module
    from fanout_kafka import topic_id
    from fanout_kafka.sink import KafkaSink

    digest = topic_id._digest
    monkeypatch.setattr(
        topic_id, "_digest", lambda text, bits: digest(text.replace("payments", "orders"), bits)
    )
    monkeypatch.setattr(topic_id, "holds_records", lambda admin, topic, timeout_s: False)
    before = _Ids(_Uuid(1, -2))
    monkeypatch.setattr(sink_module.ADMINS, "client", lambda config: before)
    _recorded(monkeypatch, before)
    payments = KafkaSink("k", bootstrap_servers="127.0.0.1:9", topic="payments")
    payments.after_partitions(SimpleNamespace(txn_app_id="fanout/p/k", batch_id=0), [])
    assert before.committed == [("fanout/p/k/topic-id/payments", pack_topic_id("orders", "1:-2"))]

    before.ids = [_Uuid(3, 4)]  # topic orders, another id
    orders = KafkaSink("k", bootstrap_servers="127.0.0.1:9", topic="orders")
    assert orders.target_replaced("p", 0, 0) is None
    # the same topic re-created is still told
    assert payments.target_replaced("p", 0, 0) is not None


def test_an_older_fanouts_group_is_read_while_this_ones_has_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Recorded by an older fanout (group ``.../topic-id``, whatever the topic), an id is
    compared on the name's bits until this version records its own."""
    from fanout_kafka import sink as sink_module
    from fanout_kafka import topic_id
    from fanout_kafka.sink import KafkaSink

    monkeypatch.setattr(topic_id, "holds_records", lambda admin, topic, timeout_s: False)
    admin = _Ids(_Uuid(3, 4))
    monkeypatch.setattr(sink_module.ADMINS, "client", lambda config: admin)
    _recorded(monkeypatch, admin)
    sink = KafkaSink("k", bootstrap_servers="127.0.0.1:9", topic="orders")
    assert sink.target_replaced("p", 0, 0) is None  # nothing recorded
    admin.committed = [("fanout/p/k/topic-id", pack_topic_id("orders", "1:-2"))]
    assert sink.target_replaced("p", 0, 0) is not None  # an older fanout's record of this topic
    admin.committed.append(("fanout/p/k/topic-id/orders", pack_topic_id("orders", "3:4")))
    assert sink.target_replaced("p", 0, 0) is None  # this version's record wins


def test_a_refusal_names_the_group_the_recorded_id_was_read_from(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An id recorded by an older fanout is read from its group, ``.../topic-id``: the
    refusal and its warning named this version's group, which holds nothing."""
    from fanout_kafka import sink as sink_module
    from fanout_kafka import topic_id
    from fanout_kafka.sink import KafkaSink

    monkeypatch.setattr(topic_id, "holds_records", lambda admin, topic, timeout_s: False)
    admin = _Ids(_Uuid(3, 4))
    monkeypatch.setattr(sink_module.ADMINS, "client", lambda config: admin)
    _recorded(monkeypatch, admin)
    sink = KafkaSink("k", bootstrap_servers="127.0.0.1:9", topic="orders", marker_topic="m")
    admin.committed = [("fanout/p/k/topic-id", pack_topic_id("orders", "1:-2"))]
    with caplog.at_level("WARNING", logger="fanout_kafka"):
        said = sink.target_replaced("p", 0, 0)
    assert said == (
        "topic 'orders' has id 3:4 now, not the one recorded when its marked batches were "
        "written (group 'fanout/p/k/topic-id' on marker topic 'm'), and holds no record"
    )
    assert [r.getMessage() for r in caplog.records] == [
        "sink 'k': topic 'orders' has id 3:4 now, not the one recorded when its marked "
        "batches were written (group 'fanout/p/k/topic-id'): it was deleted and created "
        "again since"
    ]
    admin.committed = [("fanout/p/k/topic-id/orders", pack_topic_id("orders", "1:-2"))]
    assert "(group 'fanout/p/k/topic-id/orders' on marker topic 'm')" in str(
        sink.target_replaced("p", 0, 0)
    )
