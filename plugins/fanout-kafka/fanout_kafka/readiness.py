"""What ``fanout validate`` asks of the brokers for a Kafka sink beyond the checks every
``open()`` makes (:mod:`fanout_kafka.admin`: reachable, the topics there or creatable, the
transaction timeout ceiling): what a run would otherwise fail on only at its first batch,
or later, in the middle of the stream.

- The topics' partitions: each has a leader (a write to one without waits out the
  transaction and fails the batch).
- The rights of the sink's principal on its topics, where the broker says (KIP-430: the
  operations it allows, asked with the topic's description): DESCRIBE and WRITE on the
  target and dead-letter topics, and READ too on the marker topic (the sink reads its
  ``transactional_id_prefix`` record there, :mod:`fanout_kafka.former_ids`). A topic the
  principal may not even describe is refused by name, not said to be missing. A broker
  that does not say (no authorizer; Tansu has no ACLs) passes.
- The rights of the sink's principal on its marker groups (consumer groups
  ``fanout/<pipeline>...``, KIP-430 authorized operations of one of them): DESCRIBE (the
  driver and the tasks read the markers) and READ (the partitions' transactions and the
  driver commit them). A group the principal may not describe is refused; a broker that
  does not say passes.
- Transactions: a transactional producer of id ``<prefix>#validate`` initialises (a
  transaction coordinator answers, the principal may use ids of the sink's prefix and
  write idempotently), then is closed; no transaction is begun, so none is left to abort.
  It leaves no record in any topic partition (so no producer state there either); the
  transaction coordinator keeps the id in ``__transaction_state`` in state ``Empty`` (its
  producer id and epoch) until its expiration task, run every
  ``transaction.remove.expired.transaction.cleanup.interval.ms`` (1 hour by default),
  finds its last update older than ``transactional.id.expiration.ms`` (7 days by
  default), and writes its tombstone: at most about 7 days and 1 hour after the last
  ``fanout validate`` (Kafka's ``TransactionStateManager.enableTransactionalIdExpiration``;
  ids in states ``Empty``, ``CompleteCommit`` and ``CompleteAbort`` expire alike). No client
  call checks the right without that state: ``InitProducerId`` is the request that needs
  WRITE on the id; ``FindCoordinator`` and ``DescribeTransactions`` need only DESCRIBE and
  confluent-kafka 2.16's admin client has neither; ``DescribeAcls`` needs DESCRIBE on the
  cluster, which a pipeline's principal rarely has. Not ``<prefix>-<p>``: that would fence
  a running pipeline's partition (abort its open transaction); nor ``<prefix>#route-0``,
  which would fence a running route letters write and is a new id too for a sink without
  a ``kafka:`` dead-letter topic.
- Marker groups of the current epoch gone (:func:`markers_gone`): with the ledger's last
  mark of the sink given (:attr:`fanout.SinkContext.last_mark`), a warning when no marker
  group of that epoch is left on the marker topic.

Each refusal is a :class:`fanout.ConfigurationError` naming the sink, the option and what
to do, without the producer settings' secrets (:func:`fanout_kafka.options.secret_values`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fanout.errors import ConfigurationError
from fanout.observe.secrets import redact
from fanout_kafka.options import secret_values

# ``cluster`` below is a :class:`fanout_kafka.admin.Cluster`, typed ``Any``: that module
# imports this one (a topic the principal may not describe, :meth:`Cluster._refused`)

NEEDS: Mapping[str, tuple[str, ...]] = {
    "topic": ("DESCRIBE", "WRITE"),
    "dead_letter": ("DESCRIBE", "WRITE"),
    "marker_topic": ("DESCRIBE", "READ", "WRITE"),
}
"""The operations the sink's principal needs on each topic, by the option naming it."""

GROUP_NEEDS: tuple[str, ...] = ("DESCRIBE", "READ")
"""The operations the sink's principal needs on its marker groups."""

_WHY = {
    "topic": "the partitions' transactions write its records",
    "dead_letter": "refused records are written there",
    "marker_topic": "the markers commit there, and the sink reads and writes its "
    "transactional_id_prefix record there",
}

VALIDATE_SUFFIX = "#validate"
"""The transactional id ``fanout validate`` initialises: ``<prefix>#validate``."""


def principal(producer: Mapping[str, Any]) -> str:
    """How ``kafka-acls.sh`` names the sink's principal: ``User:<sasl.username>`` when the
    settings give one (a name, not a secret), else a placeholder."""
    user = producer.get("sasl.username")
    return f"User:{user}" if user else "User:<the sink's principal>"


def rights_refusal(
    sink: str, bootstrap_servers: str, producer: Mapping[str, Any], topic: str, option: str,
    lacking: Sequence[str],
) -> ConfigurationError:  # fmt: skip
    """The refusal of topic ``topic`` (option ``option``) whose operations ``lacking`` the
    sink's principal may not perform."""
    flags = " ".join(f"--operation {op.capitalize()}" for op in lacking)
    return ConfigurationError(
        f"Kafka sink {sink!r}: the brokers at {bootstrap_servers!r} do not allow the sink's "
        f"principal {', '.join(lacking)} on topic {topic!r} (option {option!r}), which a run "
        f"needs ({_WHY[option]}); grant them (kafka-acls.sh --add --allow-principal "
        f"{principal(producer)} {flags} --topic {topic}), or name a topic it may use"
    )


def topic_unauthorized(exc: BaseException) -> bool:
    """Whether ``exc`` is the broker's refusal to describe a topic to the principal."""
    from confluent_kafka import KafkaError, KafkaException

    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def lacking_operations(allowed: Sequence[Any] | None, option: str) -> list[str]:
    """The operations of :data:`NEEDS` for ``option`` not in ``allowed`` (the topic's
    authorized operations); none when the broker did not say (``None``) or allows ALL."""
    return _lacking(allowed, NEEDS[option])


def _lacking(allowed: Sequence[Any] | None, needed: Sequence[str]) -> list[str]:
    """The operations of ``needed`` not in ``allowed``; none when ``allowed`` is ``None``
    (the broker did not say) or holds ALL."""
    if allowed is None:
        return []
    names = {getattr(op, "name", str(op)) for op in allowed}
    if "ALL" in names:
        return []
    return [op for op in needed if op not in names]


def group_refusal(
    sink: str, bootstrap_servers: str, producer: Mapping[str, Any], group: str, prefix: str,
    lacking: Sequence[str],
) -> ConfigurationError:  # fmt: skip
    """The refusal of marker group ``group`` (one of those prefixed ``prefix``) whose
    operations ``lacking`` the sink's principal may not perform."""
    flags = " ".join(f"--operation {op.capitalize()}" for op in lacking)
    return ConfigurationError(
        f"Kafka sink {sink!r}: the brokers at {bootstrap_servers!r} do not allow the sink's "
        f"principal {', '.join(lacking)} on consumer group {group!r}, one of its marker "
        f"groups (every group prefixed {prefix!r}), which a run needs (each partition's "
        "transaction commits its marker there, and the markers are read before every "
        f"batch); grant them (kafka-acls.sh --add --allow-principal {principal(producer)} "
        f"{flags} --group {prefix} --resource-pattern-type prefixed)"
    )


def group_unauthorized(exc: BaseException) -> bool:
    """Whether ``exc`` is the broker's refusal to describe a group to the principal."""
    from confluent_kafka import KafkaError, KafkaException

    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return isinstance(error, KafkaError) and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED


def check_group_rights(cluster: Any, producer: Mapping[str, Any], group: str, prefix: str) -> None:
    """The rights of the sink's principal on its marker groups, asked of ``group`` (one of
    them; the grant is for every group prefixed ``prefix``) where the broker says
    (:data:`GROUP_NEEDS`); one describe request.

    :raises fanout.ConfigurationError: naming the group, the prefix and the grant."""
    from confluent_kafka import KafkaException

    try:
        futures = cluster.admin.describe_consumer_groups(
            [group], include_authorized_operations=True, request_timeout=cluster.timeout_s
        )
        described = futures[group].result(timeout=cluster.timeout_s)
    except KafkaException as exc:
        if group_unauthorized(exc):
            raise group_refusal(cluster.sink, cluster.bootstrap_servers, producer, group,
                                prefix, GROUP_NEEDS) from None  # fmt: skip
        return  # a broker that cannot describe groups: it does not say
    error = getattr(described, "error", None)
    if error is not None and group_unauthorized(KafkaException(error)):
        raise group_refusal(cluster.sink, cluster.bootstrap_servers, producer, group, prefix,
                            GROUP_NEEDS)  # fmt: skip
    lacking = _lacking(getattr(described, "authorized_operations", None), GROUP_NEEDS)
    if lacking:
        raise group_refusal(cluster.sink, cluster.bootstrap_servers, producer, group, prefix,
                            lacking)  # fmt: skip


def check_partitions(cluster: Any, topic: str, option: str) -> None:
    """Each partition of ``topic`` (present) has a leader.

    :raises fanout.ConfigurationError: naming the partitions without one."""
    meta = cluster.topics.get(topic)
    if meta is None:
        return
    leaderless = sorted(
        p for p, info in meta.partitions.items() if info.leader < 0 or info.error is not None
    )
    if leaderless:
        raise ConfigurationError(
            f"Kafka sink {cluster.sink!r}: partition(s) {', '.join(map(str, leaderless))} of "
            f"topic {topic!r} (option {option!r}) have no leader on "
            f"{cluster.bootstrap_servers!r}: a transaction writing to them would time out; "
            f"check the brokers (kafka-topics.sh --describe --topic {topic}) and validate again"
        )


def check_topic_rights(
    cluster: Any, producer: Mapping[str, Any], topics: Sequence[tuple[str, str]]
) -> None:
    """The rights of the sink's principal on each of ``topics`` (``(topic, option)``) that
    exists, where the broker says (:data:`NEEDS`); one describe request for them all.

    :raises fanout.ConfigurationError: naming the topic, the option and the grant."""
    from confluent_kafka import KafkaException, TopicCollection

    present = [(t, o) for t, o in topics if cluster.partitions(t) is not None]
    if not present:
        return
    names = list(dict.fromkeys(t for t, _ in present))
    try:
        futures = cluster.admin.describe_topics(
            TopicCollection(names), include_authorized_operations=True,
            request_timeout=cluster.timeout_s,
        )  # fmt: skip
    except KafkaException:
        return  # a broker that cannot describe topics: open()'s metadata found them
    for topic, option in present:
        try:
            described = futures[topic].result(timeout=cluster.timeout_s)
        except KafkaException as exc:
            if topic_unauthorized(exc):
                raise rights_refusal(cluster.sink, cluster.bootstrap_servers, producer, topic,
                                     option, NEEDS[option]) from None  # fmt: skip
            continue  # the broker does not say
        lacking = lacking_operations(described.authorized_operations, option)
        if lacking:
            raise rights_refusal(cluster.sink, cluster.bootstrap_servers, producer, topic,
                                 option, lacking)  # fmt: skip


def transaction_refusal(
    sink: str, bootstrap_servers: str, producer: Mapping[str, Any], prefix: str,
    error: Any, timeout_s: float,
) -> ConfigurationError:  # fmt: skip
    """The refusal of a transactional producer that could not initialise (librdkafka's
    ``error``, a :class:`confluent_kafka.KafkaError`), saying what to do for each cause."""
    from confluent_kafka import KafkaError

    code = error.code() if hasattr(error, "code") else None
    said = redact(f"{error.name()}: {error.str()}" if code is not None else str(error),
                  secret_values(producer))  # fmt: skip
    tid = f"{prefix}{VALIDATE_SUFFIX}"
    head = (
        f"Kafka sink {sink!r}: a transactional producer (id {tid!r}) cannot initialise on "
        f"{bootstrap_servers!r} ({said}), so a run's first batch would fail; "
    )
    if code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
        fix = (
            f"the sink's partitions write under the ids {prefix}-<p> (option "
            f"'transactional_id_prefix'): grant its principal WRITE and DESCRIBE on "
            f"transactional ids prefixed {prefix!r} (kafka-acls.sh --add --allow-principal "
            f"{principal(producer)} --operation Write --operation Describe --transactional-id "
            f"{prefix} --resource-pattern-type prefixed), or set transactional_id_prefix to "
            "one it may use"
        )
    elif code == KafkaError.CLUSTER_AUTHORIZATION_FAILED:
        fix = (
            "the brokers require IDEMPOTENT_WRITE on the cluster of transactional producers "
            f"(brokers before Kafka 2.8): grant it (kafka-acls.sh --add --allow-principal "
            f"{principal(producer)} --operation IdempotentWrite --cluster)"
        )
    elif code == KafkaError.INVALID_TRANSACTION_TIMEOUT:
        fix = (
            "option 'transaction_timeout_ms' is over the brokers' "
            "transaction.max.timeout.ms; lower it"
        )
    elif code in (KafkaError.UNSUPPORTED_VERSION, KafkaError._UNSUPPORTED_FEATURE):
        fix = (
            "the brokers do not support transactions (Kafka 0.11 or later, with the "
            "transaction state topic); option 'bootstrap_servers' must name such brokers"
        )
    elif code in (
        KafkaError._TIMED_OUT, KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    ):  # fmt: skip
        fix = (
            f"no transaction coordinator answered within {timeout_s:g} s: the brokers need "
            "the transaction state topic (__transaction_state), which a cluster with fewer "
            "brokers than transaction.state.log.replication.factor (3 by default) or "
            "transaction.state.log.min.isr cannot make; lower them on the brokers, or raise "
            "option 'open_timeout_s' when the brokers are only slow"
        )
    else:
        fix = "check the brokers' logs and the security settings in option 'producer'"
    return ConfigurationError(head + fix)


def check_transactions(
    sink: str,
    bootstrap_servers: str,
    producer: Mapping[str, Any],
    prefix: str,
    transaction_timeout_ms: int,
    timeout_s: float,
    end_turns: str | None = None,
) -> None:
    """A transactional producer of id ``<prefix>#validate`` initialises within
    ``timeout_s`` (with Tansu's turns, ``end_turns``: :mod:`fanout_kafka.turns`).

    :raises fanout.ConfigurationError: :func:`transaction_refusal`."""
    from confluent_kafka import KafkaException, Producer

    from fanout_kafka.producer_init import init_transactions
    from fanout_kafka.settings import producer_config
    from fanout_kafka.turns import turn

    config = producer_config(producer, bootstrap_servers, f"{prefix}{VALIDATE_SUFFIX}",
                             transaction_timeout_ms)  # fmt: skip
    client = Producer(config)
    try:
        with turn(end_turns):
            init_transactions(client, timeout_s)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else exc
        raise transaction_refusal(sink, bootstrap_servers, producer, prefix, error,
                                  timeout_s) from None  # fmt: skip
    finally:
        client.close()  # no transaction begun: nothing to abort


def check_ready(
    cluster: Any,
    topics: Sequence[tuple[str, str]],
    *,
    sink: str,
    pipeline: str,
    bootstrap_servers: str,
    producer: Mapping[str, Any],
    prefix: str,
    transaction_timeout_ms: int,
    timeout_s: float,
    end_turns: str | None,
) -> None:
    """``fanout validate``'s checks beyond a run's ``open()``, for sink ``sink`` and its
    ``topics`` (topic, option): the topics' partitions have leaders
    (:func:`check_partitions`), the principal's rights on them and on its marker groups
    where the broker says (:func:`check_topic_rights`, :func:`check_group_rights`), and a
    transactional producer of the sink's prefix initialises (:func:`check_transactions`).

    :raises fanout.ConfigurationError: at the first that fails."""
    from fanout_kafka.markers import marker_group

    for topic, option in topics:
        check_partitions(cluster, topic, option)
    check_topic_rights(cluster, producer, topics)
    check_group_rights(cluster, producer, marker_group(pipeline, sink, 0),
                       f"fanout/{pipeline}")  # fmt: skip
    check_transactions(
        sink, bootstrap_servers, producer, prefix, transaction_timeout_ms, timeout_s, end_turns,
    )  # fmt: skip


def markers_gone(
    admin_config: Mapping[str, Any], *, marker_topic: str, pipeline: str, sink: str,
    partitions: int, last_mark: tuple[int, int], topic: str, timeout_s: float,
) -> str | None:  # fmt: skip
    """Why a run would not find the sink's marker groups of the ledger's current epoch
    (``last_mark``: that epoch and the sink's last mark in it): none of them holds a marker
    (read as :meth:`fanout_kafka.KafkaSink.holds_batch` reads them), so the brokers expired
    them (``offsets.retention.minutes`` after their last commit) or someone deleted them.
    ``None`` when some marker is there."""
    from fanout.contract.batch import pipeline_scope
    from fanout_kafka.markers import marker_group, span_group
    from fanout_kafka.membership import held_partitions

    epoch, batch_id = last_mark
    scope = pipeline_scope(pipeline, epoch)
    held = held_partitions(admin_config, marker_topic, lambda p: marker_group(scope, sink, p),
                           batch_id, partitions, timeout_s,
                           span_group=span_group(scope, sink))  # fmt: skip
    if held != (0, 0):
        return None
    return (
        f"no marker group of epoch {epoch} is left on marker topic {marker_topic!r} "
        f"(groups {marker_group(scope, sink, 0)!r} ...), while the ledger marks batch "
        f"{batch_id} written by this sink: the brokers deleted them offsets.retention.minutes "
        "after their last commit (the pipeline was idle longer than that), or someone "
        f"deleted them. A run cannot tell then whether topic {topic!r} holds its marked "
        "batches, and a batch a killed run wrote after its last mark would be written "
        "again. A run commits the markers it finds again at its first batch: run the "
        "pipeline within offsets.retention.minutes (or raise it on the brokers), and do "
        f"not delete the consumer groups prefixed 'fanout/{pipeline}'"
    )


__all__ = [
    "GROUP_NEEDS",
    "NEEDS",
    "VALIDATE_SUFFIX",
    "check_group_rights",
    "check_partitions",
    "check_ready",
    "check_topic_rights",
    "check_transactions",
    "group_refusal",
    "group_unauthorized",
    "lacking_operations",
    "markers_gone",
    "principal",
    "rights_refusal",
    "topic_unauthorized",
    "transaction_refusal",
]
