"""Checks against the brokers at ``open()``: reachable, topics present (or created),
the record size limit, and the broker's transaction timeout ceiling."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from fanout.errors import ConfigurationError, SinkUnreachableError
from fanout_kafka.driver_admins import close_admin
from fanout_kafka.options import TopicSpec, connection_settings

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
