"""The refusals of ``fanout validate``'s readiness checks of a Kafka sink
(:mod:`fanout_kafka.readiness`) that the test broker cannot produce (Tansu has no ACLs):
each names the sink, the option and the grant or fix, never the SASL password. The
broker's answers are stand-ins here; the checks it can exercise are in
``test_validate_readiness.py``."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AclOperation
from fanout_kafka import readiness
from fanout_kafka.admin import Cluster

from fanout.errors import ConfigurationError

SECRET = "s3cr3t-pw"
PRODUCER = {"sasl.username": "etl", "sasl.password": SECRET, "security.protocol": "SASL_SSL"}
SERVERS = "b1:9093"


def _refusal(code: int, text: str = "refused") -> str:
    error = KafkaError(code, f"{text} (password {SECRET})")
    return str(readiness.transaction_refusal("events", SERVERS, PRODUCER, "fanout/p/events",
                                             error, 10))  # fmt: skip


def test_a_transactional_id_the_principal_may_not_use() -> None:
    assert _refusal(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED) == (
        "Kafka sink 'events': a transactional producer (id 'fanout/p/events#validate') cannot "
        "initialise on 'b1:9093' (TRANSACTIONAL_ID_AUTHORIZATION_FAILED: refused (password "
        "***)), so a run's first batch would fail; the sink's partitions write under the ids "
        "fanout/p/events-<p> (option 'transactional_id_prefix'): grant its principal WRITE "
        "and DESCRIBE on transactional ids prefixed 'fanout/p/events' (kafka-acls.sh --add "
        "--allow-principal User:etl --operation Write --operation Describe --transactional-id "
        "fanout/p/events --resource-pattern-type prefixed), or set transactional_id_prefix to "
        "one it may use"
    )


@pytest.mark.parametrize(
    ("code", "fix"),
    [
        (KafkaError.CLUSTER_AUTHORIZATION_FAILED, "--operation IdempotentWrite --cluster)"),
        (KafkaError.INVALID_TRANSACTION_TIMEOUT, "option 'transaction_timeout_ms' is over"),
        (KafkaError.UNSUPPORTED_VERSION, "option 'bootstrap_servers' must name such brokers"),
        (KafkaError._TIMED_OUT, "no transaction coordinator answered within 10 s"),
        (KafkaError.COORDINATOR_NOT_AVAILABLE, "transaction.state.log.replication.factor"),
        (KafkaError._TRANSPORT, "check the brokers' logs and the security settings in option "
                                "'producer'"),
    ],
)  # fmt: skip
def test_each_cause_says_what_to_do_without_the_password(code: int, fix: str) -> None:
    said = _refusal(code)
    assert said.startswith(
        "Kafka sink 'events': a transactional producer (id 'fanout/p/events#validate') "
        "cannot initialise on 'b1:9093' ("
    )
    assert fix in said
    assert SECRET not in said


def _described(result: Any) -> Future[Any]:
    future: Future[Any] = Future()
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)
    return future


def _cluster(answers: dict[str, Any], listed: tuple[str, ...]) -> Any:
    """A :class:`fanout_kafka.admin.Cluster` whose listing holds ``listed`` (one partition
    each, led by broker 1) and whose topic descriptions are ``answers``."""
    cluster = Cluster.__new__(Cluster)
    cluster.sink, cluster.bootstrap_servers, cluster.producer = "events", SERVERS, PRODUCER
    cluster.timeout_s = 5
    part = SimpleNamespace(leader=1, error=None)
    cluster.topics = {t: SimpleNamespace(error=None, partitions={0: part}) for t in listed}
    cluster.admin = SimpleNamespace(
        describe_topics=lambda topics, **kw: {t: _described(answers[t]) for t in topics.topic_names}
    )
    return cluster


UNAUTHORIZED = KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "no"))


def test_a_topic_the_principal_may_not_describe_is_refused_by_name() -> None:
    cluster = _cluster({"orders": UNAUTHORIZED}, listed=("orders",))
    with pytest.raises(ConfigurationError) as caught:
        readiness.check_topic_rights(cluster, PRODUCER, [("orders", "topic")])
    assert str(caught.value) == (
        "Kafka sink 'events': the brokers at 'b1:9093' do not allow the sink's principal "
        "DESCRIBE, WRITE on topic 'orders' (option 'topic'), which a run needs (the "
        "partitions' transactions write its records); grant them (kafka-acls.sh --add "
        "--allow-principal User:etl --operation Describe --operation Write --topic orders), "
        "or name a topic it may use"
    )


def test_an_unlisted_topic_the_principal_may_not_describe_is_not_called_missing() -> None:
    """The broker leaves such a topic out of the listing: it was said not to exist."""
    cluster = _cluster({"orders": UNAUTHORIZED}, listed=())
    with pytest.raises(ConfigurationError, match="do not allow the sink's principal DESCRIBE"):
        cluster.check_topic("orders", "topic", None)
    unknown = KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, "none"))
    missing = _cluster({"orders": unknown}, listed=())
    with pytest.raises(ConfigurationError, match="'orders' \\(option 'topic'\\) does not exist"):
        missing.check_topic("orders", "topic", None)


def test_the_marker_topic_needs_read_where_the_broker_says() -> None:
    ops = [AclOperation.DESCRIBE, AclOperation.WRITE]
    cluster = _cluster(
        {"t": SimpleNamespace(authorized_operations=ops),
         "m": SimpleNamespace(authorized_operations=ops)},
        listed=("t", "m"),
    )  # fmt: skip
    with pytest.raises(ConfigurationError) as caught:
        readiness.check_topic_rights(cluster, PRODUCER, [("t", "topic"), ("m", "marker_topic")])
    assert "do not allow the sink's principal READ on topic 'm' (option 'marker_topic')" in str(
        caught.value
    )
    assert "--operation Read --topic m)" in str(caught.value)
    assert SECRET not in str(caught.value)


def test_a_broker_that_does_not_say_passes() -> None:
    assert readiness.lacking_operations(None, "marker_topic") == []
    assert readiness.lacking_operations([AclOperation.ALL], "marker_topic") == []
    assert readiness.lacking_operations([AclOperation.READ], "topic") == ["DESCRIBE", "WRITE"]
    cluster = _cluster({"t": SimpleNamespace(authorized_operations=None)}, listed=("t",))
    readiness.check_topic_rights(cluster, PRODUCER, [("t", "topic")])


def test_a_partition_without_a_leader_is_named() -> None:
    cluster = _cluster({}, listed=("t",))
    cluster.topics["t"].partitions[1] = SimpleNamespace(leader=-1, error=None)
    with pytest.raises(ConfigurationError) as caught:
        readiness.check_partitions(cluster, "t", "topic")
    assert str(caught.value) == (
        "Kafka sink 'events': partition(s) 1 of topic 't' (option 'topic') have no leader on "
        "'b1:9093': a transaction writing to them would time out; check the brokers "
        "(kafka-topics.sh --describe --topic t) and validate again"
    )


GROUP = "fanout/p/events/p0"


def _grouped(answer: Any) -> Any:
    """A cluster whose description of :data:`GROUP` (asked with its authorized
    operations) is ``answer``."""
    cluster = _cluster({}, listed=())

    def describe(groups: list[str], **kw: Any) -> dict[str, Future[Any]]:
        assert kw["include_authorized_operations"] is True
        return {g: _described(answer) for g in groups}

    cluster.admin = SimpleNamespace(describe_consumer_groups=describe)
    return cluster


def test_marker_groups_the_principal_may_not_describe_are_refused_with_the_grant() -> None:
    denied = KafkaException(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED, "no"))
    with pytest.raises(ConfigurationError) as caught:
        readiness.check_group_rights(_grouped(denied), PRODUCER, GROUP, "fanout/p")
    assert str(caught.value) == (
        "Kafka sink 'events': the brokers at 'b1:9093' do not allow the sink's principal "
        "DESCRIBE, READ on consumer group 'fanout/p/events/p0', one of its marker groups "
        "(every group prefixed 'fanout/p'), which a run needs (each partition's transaction "
        "commits its marker there, and the markers are read before every batch); grant them "
        "(kafka-acls.sh --add --allow-principal User:etl --operation Describe --operation "
        "Read --group fanout/p --resource-pattern-type prefixed)"
    )
    assert SECRET not in str(caught.value)


def test_marker_groups_need_read_where_the_broker_says() -> None:
    described = SimpleNamespace(authorized_operations=[AclOperation.DESCRIBE])
    with pytest.raises(ConfigurationError) as caught:
        readiness.check_group_rights(_grouped(described), PRODUCER, GROUP, "fanout/p")
    said = str(caught.value)
    assert "do not allow the sink's principal READ on consumer group 'fanout/p/events/p0'" in said
    assert said.endswith("--operation Read --group fanout/p --resource-pattern-type prefixed)")
    for allowed in (None, [AclOperation.ALL], [AclOperation.DESCRIBE, AclOperation.READ]):
        readiness.check_group_rights(
            _grouped(SimpleNamespace(authorized_operations=allowed)), PRODUCER, GROUP, "fanout/p"
        )
    other = KafkaException(KafkaError(KafkaError._TRANSPORT, "down"))
    readiness.check_group_rights(_grouped(other), PRODUCER, GROUP, "fanout/p")  # does not say
