"""Checks against the brokers at ``open()``: reachable, topics present (or created),
the record size limit, and the broker's transaction timeout ceiling."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from fanout.errors import (
    ConfigurationError,
    SinkUnreachableError,
    SinkWriteError,
    TransientSinkError,
)
from fanout_kafka.driver_admins import close_admin
from fanout_kafka.options import (
    KAFKA_DEFAULT_MAX_MESSAGE_BYTES,
    TopicSpec,
    client_batch_size,
    connection_settings,
)

if TYPE_CHECKING:
    from fanout.contract.sink import SinkContext

log = logging.getLogger("fanout_kafka")


class OnceLogger:
    """Hands each distinct librdkafka log line to ``logger`` once. Brokers out of reach
    make librdkafka log every reconnect attempt (about 20 lines a second for one broker
    down), which buried the one error :meth:`Cluster.connect` raises, naming them all."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._seen: set[tuple[int, str]] = set()

    def log(self, level: int, msg: str, *args: Any) -> None:
        """What librdkafka calls (``logging.Logger.log``'s signature)."""
        text = msg % args if args else msg
        key = (level, _without_timings(text))
        if key in self._seen:
            return
        self._seen.add(key)
        self._logger.log(level, "%s", text)


_REFUSED = frozenset(
    {KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._SSL}
)
"""librdkafka's codes of brokers that answered and refused the connection's security
settings (SASL credentials or mechanism, TLS): a configuration error, not a target down."""


def _without_timings(text: str) -> str:
    """A librdkafka line less what differs between repeats of one event (``after 0ms``,
    ``, 1 identical error(s) suppressed``: librdkafka's own count of repeats it held back)."""
    return re.sub(r"\d+ms", "Nms", re.sub(r", \d+ identical error\(s\) suppressed", "", text))


class Cluster:
    """An admin connection to the brokers of one sink, for the checks at ``open()``; a
    context manager that destroys its client on leaving.

    :param sink: the sink name, for messages.
    :param bootstrap_servers: the bootstrap list, named in every connection error.
    :param producer: the producer passthrough (its security settings are used).
    :param timeout_s: how long any one check may take: never a hang.
    """

    def __init__(
        self, sink: str, bootstrap_servers: str, producer: Mapping[str, Any], timeout_s: float
    ) -> None:
        self.sink = sink
        self.bootstrap_servers = bootstrap_servers
        self.producer = producer  # whose sasl.username names the principal in refusals
        self.timeout_s = timeout_s
        self._errors: list[tuple[int, str]] = []  # librdkafka's code and text of each
        # The callback holds the list, not self: a reference cycle would leave the client
        # to the cyclic collector, which may destroy it on librdkafka's own thread (an
        # abort: fanout_kafka.driver_admins); close() destroys it in any case.
        errors = self._errors
        config: dict[str, Any] = {
            **connection_settings(producer),
            "bootstrap.servers": bootstrap_servers,
            "error_cb": lambda err: errors.append((err.code(), err.str())),
            "logger": OnceLogger(logging.getLogger("fanout_kafka.librdkafka")),
        }
        self.admin = AdminClient(config)
        self.topics: dict[str, Any] = {}
        self.cluster_id: str | None = None

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Destroy the admin client now, on this thread
        (:func:`fanout_kafka.driver_admins.close_admin`)."""
        close_admin(self.admin)

    def connect(self) -> None:
        """List the cluster's topics, or raise :class:`fanout.SinkUnreachableError` naming the
        bootstrap list and the cause (a lag sink then starts behind); a plain
        :class:`fanout.ConfigurationError` when the brokers refused the security settings
        (SASL, TLS: :data:`_REFUSED`)."""
        try:
            metadata = self.admin.list_topics(timeout=self.timeout_s)
        except KafkaException as exc:
            self.admin.poll(0)  # serves error_cb: the connection errors seen meanwhile
            # one line per distinct error: librdkafka repeats each at every reconnect,
            # differing only in its timing ("after 3ms"), which buried the cause
            distinct: dict[str, str] = {}
            for _, text in self._errors:
                distinct.setdefault(_without_timings(text), text)
            seen = "; ".join(distinct.values()) or _err_text(exc)
            if any(code in _REFUSED for code, _ in self._errors):
                # the brokers answered and refused the security settings: a mistake in
                # the options, as a refused PostgreSQL login is, not a lag at the start
                raise ConfigurationError(
                    f"Kafka sink {self.sink!r}: the Kafka brokers at "
                    f"{self.bootstrap_servers!r} refused the connection ({seen}); check the "
                    "security settings in 'producer' (security.protocol, sasl.mechanism, "
                    "sasl.username, sasl.password, ssl.*) against the brokers' listener"
                ) from exc
            # unreachable, not misconfigured (a broker down looks the same as a wrong port):
            # a lag sink starts behind, `fanout run` exits 1, as for PostgreSQL
            raise SinkUnreachableError(
                f"cannot reach the Kafka brokers at {self.bootstrap_servers!r} within "
                f"{self.timeout_s:g} s ({seen}); check 'bootstrap_servers', the network, and "
                "the security settings in 'producer' (security.protocol, sasl.*, ssl.*), "
                "and that the brokers run",
                sink=self.sink,
            ) from exc
        self.topics = dict(metadata.topics)
        self.cluster_id = metadata.cluster_id

    def partitions(self, topic: str) -> int | None:
        """The partition count of ``topic``, or ``None`` when it does not exist."""
        meta = self.topics.get(topic)
        if meta is None or meta.error is not None:
            return None
        return len(meta.partitions)

    def ensure_topic(
        self, topic: str, option: str, spec: TopicSpec | None, *, partitions: int | None = None
    ) -> int:
        """The partition count of ``topic``; creates it with ``spec`` when missing (or
        fails saying how to create it). ``partitions`` overrides ``spec.partitions``."""
        count = self.partitions(topic)
        if count is not None:
            return count
        if spec is None:
            raise self._missing(topic, option)
        count = partitions or spec.partitions or 1
        new = NewTopic(
            topic, num_partitions=count, replication_factor=spec.replication_factor,
            config=dict(spec.config),
        )  # fmt: skip
        future = self.admin.create_topics([new], operation_timeout=self.timeout_s)[topic]
        try:
            future.result(timeout=self.timeout_s)
            log.info("sink %r: created topic %r with %d partition(s)", self.sink, topic, count)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # lost a race: fine
                raise ConfigurationError(
                    f"Kafka sink {self.sink!r}: cannot create topic {topic!r} (option "
                    f"{option!r}) on {self.bootstrap_servers!r}: {_err_text(exc)}"
                ) from exc
        self.connect()
        return self.partitions(topic) or count

    def check_topic(
        self, topic: str, option: str, spec: TopicSpec | None, *, partitions: int | None = None
    ) -> str | None:
        """:meth:`ensure_topic` creating nothing (``fanout validate``): ``None`` when
        ``topic`` exists, else what it would create ("create topic ..."); raises as it does
        when the topic is missing and may not be created."""
        if self.partitions(topic) is not None:
            return None
        if spec is None:
            raise self._missing(topic, option)
        refused = self._refused(topic, option)
        if refused is not None:
            raise refused
        count = partitions or spec.partitions or 1
        return f"create topic {topic!r} (option {option!r}) with {count} partition(s)"

    def _refused(self, topic: str, option: str) -> ConfigurationError | None:
        """The refusal of a topic the listing left out because the sink's principal may
        not describe it (the broker leaves out such topics, there or not): the topic asked
        for by name (one request, only for a topic not listed). ``None`` otherwise."""
        from confluent_kafka import TopicCollection

        from fanout_kafka.readiness import NEEDS, rights_refusal, topic_unauthorized

        try:
            future = self.admin.describe_topics(
                TopicCollection([topic]), request_timeout=self.timeout_s
            )[topic]
            future.result(timeout=self.timeout_s)
        except KafkaException as exc:
            if topic_unauthorized(exc):
                return rights_refusal(self.sink, self.bootstrap_servers, self.producer, topic,
                                      option, NEEDS[option])  # fmt: skip
        except Exception as exc:  # a broker that cannot describe topics: missing, as listed
            log.debug("sink %r: cannot describe topic %r: %s", self.sink, topic, exc)
        return None

    def _missing(self, topic: str, option: str) -> ConfigurationError:
        refused = self._refused(topic, option)
        if refused is not None:
            return refused
        return ConfigurationError(
            f"Kafka sink {self.sink!r}: topic {topic!r} (option {option!r}) does not exist "
            f"on {self.bootstrap_servers!r}; create it (kafka-topics.sh --create ...) or "
            "set the option create_topic: true, or {partitions: N, replication_factor: R}"
        )

    def topic_config(self, topic: str, name: str) -> str | None:
        """One configuration value of a topic, or ``None`` when the broker does not say."""
        return self._describe(ConfigResource("topic", topic), name)

    def broker_config(self, name: str) -> str | None:
        """One configuration value of some broker, or ``None`` when it does not say."""
        metadata = self.admin.list_topics(timeout=self.timeout_s)
        for broker_id in metadata.brokers:
            value = self._describe(ConfigResource("broker", str(broker_id)), name)
            if value is not None:
                return value
        return None

    def _describe(self, resource: ConfigResource, name: str) -> str | None:
        try:
            futures = self.admin.describe_configs([resource], request_timeout=self.timeout_s)
            entries = next(iter(futures.values())).result(timeout=self.timeout_s)
        except Exception as exc:  # brokers that do not describe configs: use defaults
            log.debug("sink %r: cannot describe %s: %s", self.sink, resource, exc)
            return None
        entry = entries.get(name)
        return None if entry is None or entry.value is None else str(entry.value)


def _err_text(exc: KafkaException) -> str:
    err = exc.args[0] if exc.args else None
    return err.str() if isinstance(err, KafkaError) else str(exc)


def topic_limit(cluster: Any, topic: str, spec: TopicSpec | None = None) -> int:
    """A topic's record batch limit: its ``max.message.bytes`` (for a topic still to be
    created, the one ``spec`` creates it with), else the broker's ``message.max.bytes``,
    else Kafka's default."""
    if cluster.partitions(topic) is None:
        topic_limit = spec.config.get("max.message.bytes") if spec is not None else None
    else:
        topic_limit = cluster.topic_config(topic, "max.message.bytes")
    limit = topic_limit or cluster.broker_config("message.max.bytes")
    return int(limit) if limit else KAFKA_DEFAULT_MAX_MESSAGE_BYTES


def check_topics(
    cluster: Any,
    context: SinkContext,
    topics: Sequence[tuple[str, str, TopicSpec | None, int | None]],
    missing: list[tuple[str, str]],
) -> None:
    """``open()``'s check of each of ``topics`` (topic, option, spec, partitions): with
    ``context.checking`` (``fanout validate``) only checked, telling ``context.would``
    which would be created; the marker topic (fanout's own records, not a target) created
    if missing; a target missing that ``create_topic`` allows appended to ``missing``, to
    be created at the first write (:func:`create_missing_topics`)."""
    for topic, option, topic_spec, partitions in topics:
        if context.checking:  # fanout validate: create nothing, say what would be
            change = cluster.check_topic(topic, option, topic_spec, partitions=partitions)
            if change is not None:
                context.would(change)
        elif option == "marker_topic":  # fanout's own records, not a target
            cluster.ensure_topic(topic, option, topic_spec, partitions=partitions)
        elif cluster.check_topic(topic, option, topic_spec) is not None:
            missing.append((topic, option))


def check_transaction_timeout(cluster: Any, sink: str, transaction_timeout_ms: int) -> None:
    """Refuse a ``transaction_timeout_ms`` over the broker's
    ``transaction.max.timeout.ms`` (:class:`fanout.ConfigurationError`)."""
    ceiling = cluster.broker_config("transaction.max.timeout.ms")
    if ceiling is not None and transaction_timeout_ms > int(ceiling):
        raise ConfigurationError(
            f"Kafka sink {sink!r}: option 'transaction_timeout_ms' ({transaction_timeout_ms}) "
            f"is over the broker's transaction.max.timeout.ms ({ceiling}); lower it"
        )


def cap_batch_size(
    cluster: Any,
    sink: str,
    producer: Mapping[str, Any],
    limits: dict[str, int],
    dead_topic: str | None,
    spec: TopicSpec | None,
) -> int:
    """The record batch limit of the topics the producers write batches to (``limits``:
    the target's, by name, and a dead-letter topic's, ``dead_topic``, resolved here): the
    least. Their ``batch.size`` is capped to it
    (:func:`fanout_kafka.settings.producer_config`), saying so when it is."""
    if dead_topic is not None:
        limits[dead_topic] = topic_limit(cluster, dead_topic, spec)
    topic, limit = min(limits.items(), key=lambda item: item[1])
    wanted = client_batch_size(producer)
    if wanted > limit:
        log.info(
            "sink %r: producer batch.size %d capped to %d, the max.message.bytes of topic "
            "%r: the broker refuses a larger record batch whole, records that fit with it",
            sink, wanted, limit, topic,
        )  # fmt: skip
    return limit


def create_missing_topics(
    sink: str,
    bootstrap_servers: str,
    producer: Mapping[str, Any],
    timeout_s: float,
    to_create: list[tuple[str, str]],
    spec: TopicSpec | None,
    batch_id: int,
) -> None:
    """Create the topics ``open()`` found missing (``to_create``: topic, option), each
    removed from it once created: one admin connection.

    :raises fanout.TransientSinkError: when the brokers are out of reach or refuse the
        connection (worth a retry).
    :raises fanout.SinkWriteError: when a topic cannot be created.
    """
    with Cluster(sink, bootstrap_servers, producer, timeout_s) as cluster:
        try:
            cluster.connect()
        except ConfigurationError as exc:  # out of reach, or refused: worth a retry
            said = str(exc).removeprefix(f"sink {sink!r}: ")
            said = said.removeprefix(f"Kafka sink {sink!r}: ")
            raise TransientSinkError(said, sink=sink, batch_id=batch_id) from exc
        while to_create:
            topic, option = to_create[0]
            try:
                cluster.ensure_topic(topic, option, spec)
            except ConfigurationError as exc:
                raise SinkWriteError(str(exc), sink=sink, batch_id=batch_id) from exc
            to_create.pop(0)


def topic_missing(
    sink: str,
    bootstrap_servers: str | Sequence[str] | None,
    producer: Mapping[str, Any],
    timeout_s: float,
    topic: str | None,
) -> bool:
    """Whether ``topic`` does not exist (one metadata request; ``False`` without a topic
    or brokers)."""
    if topic is None or bootstrap_servers is None:
        return False
    servers = str(bootstrap_servers)
    with Cluster(sink, servers, producer, timeout_s) as cluster:
        cluster.connect()
        return cluster.partitions(topic) is None
