"""Option checks of the Kafka sink that need no broker: names, producer settings, targets.

Every function raises :class:`fanout.ConfigurationError` naming the sink, the option and
what to do, so a bad configuration fails when the ``FanOut`` is built.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fanout.errors import ConfigurationError
from fanout.observe.secrets import secret_option_values

TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
"""Kafka's legal topic names (match with ``fullmatch``: ``$`` lets a trailing newline in)."""

KAFKA_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588
"""Kafka's default ``message.max.bytes`` (broker) / ``max.message.bytes`` (topic)."""

LIBRDKAFKA_DEFAULT_MESSAGE_MAX_BYTES = 1_000_000
"""librdkafka's default client-side ``message.max.bytes``."""

OWNED_SETTINGS: Mapping[str, str] = {
    "bootstrap.servers": "use the sink option 'bootstrap_servers'",
    "metadata.broker.list": "use the sink option 'bootstrap_servers'",
    "transactional.id": "the sink derives it as <transactional_id_prefix>-<partition>; "
    "set 'transactional_id_prefix' instead",
    "transaction.timeout.ms": "use the sink option 'transaction_timeout_ms'",
}
"""Producer settings the sink owns, with what to use instead."""

SECRET_WORDS = (
    "password",  # sasl.password, ssl.key.password, ssl.keystore.password
    "passphrase",  # sasl.oauthbearer.assertion.private.key.passphrase
    "secret",  # sasl.oauthbearer.client.secret, ...client.credentials.client.secret
    "token",  # none in librdkafka 2.16 holds one; a future one will be masked
    "key.pem",  # ssl.key.pem, sasl.oauthbearer.assertion.private.key.pem
    "sasl.oauthbearer.config",
    "sasl.oauthbearer.extensions",  # key=value pairs sent to the broker with the token
    "sasl.jaas.config",  # Java-style config: holds password="..."
    "ssl.key",  # ssl.key.password, ssl.key.pem, ssl_key (not ssl.keystore.location)
    "sasl.username",  # half of a credential: masked like the password
    "sasl.kerberos.principal",  # Kerberos's user name: masked like sasl.username
    "sasl.oauthbearer.client.id",
    "sasl.oauthbearer.client.credentials.client.id",
)
"""Words of the producer settings whose values are secrets (scrubbed from every error, log
line, status and ledger row fanout shows): passwords, passphrases, keys, tokens, and the user
and client names they go with. Matched against whole parts of a setting's name
(:func:`fanout.observe.secrets.secret_option_values`); checked against the properties of
librdkafka 2.16. Where a credential is found stays readable: paths (``ssl.key.location``,
``ssl.keystore.location``, ``sasl.kerberos.keytab``, ``...assertion.private.key.file``), the
token endpoint (``sasl.oauthbearer.token.endpoint.url``, a password in it masked), public
certificates (``ssl.ca.pem``, ``ssl.certificate.pem``)."""

CONNECTION_PREFIXES = (
    "security.",
    "sasl.",
    "ssl.",
    "ssl_",
    "enable.ssl",
    "socket.",
    "broker.",
    "client.",
    "reconnect.",
    "enable.sparse.connections",
    "api.version",
    "metadata.",
    "topic.metadata",
    "connections.max.idle.ms",
    "resolve.",
    "debug",
)
"""Settings shared by the producer, the admin client and the marker consumer."""


def secret_values(producer: Mapping[str, Any]) -> list[str]:
    """The values of the producer settings that hold secrets (passwords, keys, tokens)."""
    return secret_option_values(producer, SECRET_WORDS)


def connection_settings(producer: Mapping[str, Any]) -> dict[str, Any]:
    """The part of the producer settings that says how to reach and authenticate to the
    brokers, for the admin client and the marker consumer."""
    return {k: v for k, v in producer.items() if k.startswith(CONNECTION_PREFIXES)}


def check_producer_settings(sink: str, producer: Mapping[str, Any]) -> dict[str, Any]:
    """The producer passthrough, checked: settings that break transactions are rejected
    with the reason. Returns a plain ``dict`` with string keys."""
    if not isinstance(producer, Mapping):
        raise ConfigurationError(
            f"Kafka sink {sink!r}: option 'producer' must be a mapping of librdkafka "
            f"settings, got {type(producer).__name__}"
        )
    settings = {str(k): v for k, v in producer.items()}
    for key, instead in OWNED_SETTINGS.items():
        if key in settings:
            raise ConfigurationError(
                f"Kafka sink {sink!r}: producer setting {key!r} is set by the sink: {instead}"
            )
    idempotence = settings.get("enable.idempotence")
    if idempotence is not None and str(idempotence).lower() in ("false", "0", "no"):
        raise ConfigurationError(
            f"Kafka sink {sink!r}: producer setting enable.idempotence=false breaks "
            "transactions: a transactional producer is idempotent (remove the setting)"
        )
    acks = settings.get("acks", settings.get("request.required.acks"))
    if acks is not None and str(acks).lower() not in ("all", "-1"):
        raise ConfigurationError(
            f"Kafka sink {sink!r}: producer setting acks={acks!r} breaks transactions: "
            "a transactional producer needs acks=all (remove the setting)"
        )
    in_flight = settings.get("max.in.flight.requests.per.connection", settings.get("max.in.flight"))
    if in_flight is not None and _as_int(in_flight, 0) > 5:
        raise ConfigurationError(
            f"Kafka sink {sink!r}: producer setting max.in.flight.requests.per.connection="
            f"{in_flight!r} breaks the idempotent producer's ordering guarantee (at most 5)"
        )
    retries = settings.get("retries", settings.get("message.send.max.retries"))
    if retries is not None and _as_int(retries, 1) == 0:
        raise ConfigurationError(
            f"Kafka sink {sink!r}: producer setting retries=0 breaks the idempotent "
            "producer, which must retry (remove the setting)"
        )
    if str(settings.get("isolation.level", "read_committed")) != "read_committed":
        raise ConfigurationError(
            f"Kafka sink {sink!r}: isolation.level is a consumer setting; the sink's marker "
            "lookups always use read_committed (remove it from 'producer')"
        )
    settings.pop("isolation.level", None)
    return settings


@dataclass(frozen=True)
class TopicSpec:
    """How the sink creates a missing topic (option ``create_topic``)."""

    partitions: int | None = None
    replication_factor: int = -1
    config: Mapping[str, str] = field(default_factory=dict)


def parse_create_topic(sink: str, value: Any) -> TopicSpec | None:
    """``False``/``None``: never create; ``True``: create with the broker's defaults; a
    mapping with ``partitions``, ``replication_factor`` and ``config``."""
    if value is None or value is False:
        return None
    if value is True:
        return TopicSpec()
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"Kafka sink {sink!r}: option 'create_topic' must be true, false or a mapping "
            f"with 'partitions', 'replication_factor' and 'config', got {value!r}"
        )
    unknown = set(value) - {"partitions", "replication_factor", "config"}
    if unknown:
        raise ConfigurationError(
            f"Kafka sink {sink!r}: option 'create_topic' has unknown keys "
            f"{sorted(unknown)}; valid: partitions, replication_factor, config"
        )
    partitions = value.get("partitions")
    if partitions is not None and not _positive_int(partitions):
        raise ConfigurationError(
            f"Kafka sink {sink!r}: create_topic.partitions must be a positive integer, "
            f"got {partitions!r}"
        )
    replication = value.get("replication_factor", -1)
    if not isinstance(replication, int) or isinstance(replication, bool) or replication == 0:
        raise ConfigurationError(
            f"Kafka sink {sink!r}: create_topic.replication_factor must be a positive "
            f"integer (or -1 for the broker's default), got {replication!r}"
        )
    config = {str(k): str(v) for k, v in (value.get("config") or {}).items()}
    limit = config.get("max.message.bytes")
    if limit is not None and not (limit.isdigit() and int(limit) > 0):
        # open() sizes the records of a topic still to be created by it
        raise ConfigurationError(
            f"Kafka sink {sink!r}: create_topic.config 'max.message.bytes' must be a "
            f"positive integer (bytes), got {limit!r}"
        )
    return TopicSpec(partitions, replication, config)


def check_topic_name(sink: str, option: str, name: Any) -> str:
    """A legal Kafka topic name, or a configuration error naming the option."""
    if not isinstance(name, str) or not TOPIC_NAME.fullmatch(name) or name in (".", ".."):
        raise ConfigurationError(
            f"Kafka sink {sink!r}: option {option!r} must be a Kafka topic name "
            f"(1-249 of A-Z a-z 0-9 . _ -), got {name!r}"
        )
    return name


def columns(sink: str, option: str, value: Any) -> tuple[str, ...] | None:
    """One column name or a non-empty list of them, as a tuple (``None`` stays ``None``)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if (
        not isinstance(value, Sequence)
        or not value
        or not all(isinstance(c, str) and c for c in value)
    ):
        raise ConfigurationError(
            f"Kafka sink {sink!r}: option {option!r} must be a column name or a non-empty "
            f"list of column names, got {value!r}"
        )
    return tuple(value)


def check_header_columns(sink: str, header_columns: Sequence[str]) -> None:
    """Refuse a header column named like a header fanout writes itself
    (:data:`fanout_kafka.records.FIXED_HEADERS`): the record would carry two headers of
    that name, and a consumer reading the first one would get the wrong value."""
    from fanout_kafka.records import FIXED_HEADERS

    clashing = [c for c in header_columns if c in FIXED_HEADERS]
    if clashing:
        named = ", ".join(map(repr, clashing))
        raise ConfigurationError(
            f"Kafka sink {sink!r}: option 'headers' names column(s) {named}, which fanout "
            f"writes as headers itself ({', '.join(FIXED_HEADERS)}): each record would carry "
            "two headers of that name, and a consumer reading the first would get the wrong "
            "value. Rename the column in the query or the sink's select (e.g. "
            f"{clashing[0].replace('.', '_')!r}) and list the new name in 'headers'"
        )


LIBRDKAFKA_DEFAULT_BATCH_SIZE = 1_000_000
"""librdkafka's default ``batch.size``: the bytes of records it packs into one record batch."""


def client_batch_size(producer: Mapping[str, Any]) -> int:
    """The producer's own ``batch.size`` (librdkafka's default when unset)."""
    return _as_int(producer.get("batch.size"), LIBRDKAFKA_DEFAULT_BATCH_SIZE)


def client_max_message_bytes(producer: Mapping[str, Any]) -> int:
    """The producer's own record size limit (librdkafka's ``message.max.bytes``)."""
    return _as_int(producer.get("message.max.bytes"), LIBRDKAFKA_DEFAULT_MESSAGE_MAX_BYTES)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _as_int(value: Any, default: int) -> int:
    if value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def check_sink_options(
    sink: str,
    *,
    bootstrap_servers: Any,
    topic: Any,
    marker_topic: Any,
    partitions: Any,
    transaction_timeout_ms: Any,
    value: Any,
    headers: Any,
    key: Any,
    order_by: Any,
    dead_letter: Any,
    dead_topic: str | None,
    create_topic: Any,
    max_record_bytes: Any,
    open_timeout_s: Any,
) -> None:
    """The options of Kafka sink ``sink`` as given (``open()``'s first check):
    ``bootstrap_servers`` and ``topic`` there, the topic names legal and distinct (a
    dead-letter topic, ``dead_topic``, too), the counts positive, the columns named well,
    ``create_topic`` parsed (:func:`parse_create_topic`)."""

    def error(message: str) -> ConfigurationError:
        return ConfigurationError(f"Kafka sink {sink!r}: {message}")

    if not isinstance(bootstrap_servers, str) or not bootstrap_servers.strip():
        raise error("option 'bootstrap_servers' is required (host:port[,host:port])")
    if topic is None:
        raise error("option 'topic' is required")
    check_topic_name(sink, "topic", topic)
    check_topic_name(sink, "marker_topic", marker_topic)
    if marker_topic == topic:
        raise error("options 'topic' and 'marker_topic' must differ")
    counts = {"partitions": partitions, "transaction_timeout_ms": transaction_timeout_ms}
    for option, count in counts.items():
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise error(f"option {option!r} must be a positive integer, got {count!r}")
    if not isinstance(value, str) or not value:
        raise error(f"option 'value' must be 'json' or a column name, got {value!r}")
    if not isinstance(headers, bool):
        check_header_columns(sink, columns(sink, "headers", headers) or ())
    columns(sink, "key", key)
    columns(sink, "order_by", order_by)
    if dead_letter is not None and not isinstance(dead_letter, str):
        raise error("option 'dead_letter' must be a string: 'kafka:<topic>' or a path")
    if dead_topic is not None and dead_topic in (topic, marker_topic):
        raise error("option 'dead_letter' must not be the topic or the marker topic")
    parse_create_topic(sink, create_topic)
    limit = max_record_bytes
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise error(f"option 'max_record_bytes' must be a positive integer, got {limit!r}")
    if not isinstance(open_timeout_s, int | float) or open_timeout_s <= 0:
        raise error("option 'open_timeout_s' must be a positive number of seconds")
