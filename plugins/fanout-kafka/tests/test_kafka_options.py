"""The Kafka sink's option checks: no broker needed."""

from __future__ import annotations

import pickle

import pytest
from fanout_kafka import KafkaSink
from fanout_kafka.options import (
    TopicSpec,
    check_producer_settings,
    connection_settings,
    parse_create_topic,
    secret_values,
)
from fanout_kafka.plugin import fanout_sink_types

from fanout.contract.sink import SinkContext
from fanout.errors import ConfigurationError, SchemaMismatchError
from fanout.hooks.registry import load_registry
from fanout.testing import RecordingSink, open_sink


@pytest.mark.parametrize(
    ("setting", "reason"),
    [
        ({"enable.idempotence": False}, "enable.idempotence=false breaks transactions"),
        ({"enable.idempotence": "false"}, "enable.idempotence=false breaks transactions"),
        ({"acks": 1}, "acks=1 breaks transactions"),
        ({"acks": "0"}, "acks='0' breaks transactions"),
        ({"request.required.acks": 1}, "acks=1 breaks transactions"),
        ({"max.in.flight.requests.per.connection": 6}, "ordering guarantee (at most 5)"),
        ({"retries": 0}, "retries=0 breaks the idempotent producer"),
        ({"transactional.id": "x"}, "set 'transactional_id_prefix' instead"),
        ({"bootstrap.servers": "h:1"}, "use the sink option 'bootstrap_servers'"),
        ({"transaction.timeout.ms": 1000}, "use the sink option 'transaction_timeout_ms'"),
        ({"isolation.level": "read_uncommitted"}, "isolation.level is a consumer setting"),
    ],
)
def test_settings_that_break_transactions_are_rejected_with_the_reason(
    setting: dict[str, object], reason: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        check_producer_settings("k", setting)
    assert str(caught.value).startswith("Kafka sink 'k': producer setting") or (
        "Kafka sink 'k'" in str(caught.value)
    )
    assert reason in str(caught.value)


@pytest.mark.parametrize("producer", ["linger.ms=20", ["linger.ms", 20]])
def test_a_producer_that_is_not_a_mapping_is_named(producer: object) -> None:
    """dict(producer) raised a bare ValueError ("dictionary update sequence element #0 has
    length 1; 2 is required"), naming neither the sink nor the option."""
    with pytest.raises(ConfigurationError) as caught:
        KafkaSink("k", bootstrap_servers="h:1", topic="t", producer=producer)  # type: ignore[arg-type]
    assert str(caught.value) == (
        "Kafka sink 'k': option 'producer' must be a mapping of librdkafka settings "
        f"({{'linger.ms': 20, ...}}), got {type(producer).__name__}"
    )


def test_passthrough_settings_are_kept() -> None:
    settings = {"acks": "all", "linger.ms": 20, "compression.type": "zstd", "sasl.password": "pw"}
    assert check_producer_settings("k", settings) == settings


def test_secret_values_are_the_credentials_and_keys_only() -> None:
    producer = {
        "sasl.username": "alice",
        "sasl.password": "s3cret",
        "ssl.key.password": "kp",
        "ssl.keystore.password": "ksp",
        "ssl.key.pem": "-----BEGIN KEY-----",
        "sasl.oauthbearer.client.id": "fanout-client",
        "sasl.oauthbearer.client.secret": "tok",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "linger.ms": 5,
    }
    assert secret_values(producer) == [
        "alice", "s3cret", "kp", "ksp", "-----BEGIN KEY-----", "fanout-client", "tok"
    ]  # fmt: skip
    sink = KafkaSink("k", bootstrap_servers="h:1", topic="t", producer=producer)
    assert list(sink.secret_values()) == secret_values(producer)


def test_every_credential_setting_of_librdkafka_is_a_secret() -> None:
    """The credential-bearing settings of librdkafka's CONFIGURATION.md beyond the
    password ones; paths to key files are no secrets."""
    producer = {
        "sasl.oauthbearer.assertion.private.key.passphrase": "pp",
        "sasl.oauthbearer.assertion.private.key.pem": "-----BEGIN PRIVATE KEY-----",
        "sasl.oauthbearer.client.credentials.client.id": "cc-id",
        "sasl.oauthbearer.client.credentials.client.secret": "cc-secret",
        "sasl.oauthbearer.extensions": "logicalCluster=lkc-1,identityPoolId=pool-2",
        "sasl.oauthbearer.config": "principal=admin",
        "sasl.jaas.config": 'PlainLoginModule required username="u" password="p";',
        "sasl.oauthbearer.assertion.private.key.file": "/etc/kafka/assertion.key",
        "sasl.kerberos.keytab": "/etc/krb5.keytab",
    }
    assert secret_values(producer) == [
        "pp", "-----BEGIN PRIVATE KEY-----", "cc-id", "cc-secret",
        "logicalCluster=lkc-1,identityPoolId=pool-2", "principal=admin",
        'PlainLoginModule required username="u" password="p";',
    ]  # fmt: skip


def test_a_sasl_username_is_masked_in_logs_and_errors() -> None:
    from fanout.observe.secrets import masked_error, redact

    producer = {"sasl.username": "orders-svc", "sasl.password": "pw-1"}
    sink = KafkaSink("k", bootstrap_servers="h:1", topic="t", producer=producer)
    said = "SASL authentication failed for user orders-svc (password pw-1)"
    assert redact(said, sink.secret_values()) == (
        "SASL authentication failed for user *** (password ***)"
    )
    refused = RuntimeError("SASL authentication failed for user orders-svc")
    masked = masked_error(refused, sink.secret_values(), ConfigurationError)
    assert masked is not None  # None: nothing to mask, the error would be shown as it is
    assert str(masked) == "RuntimeError: SASL authentication failed for user ***"


def test_connection_settings_keep_security_and_drop_producer_tuning() -> None:
    producer = {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "linger.ms": 5,
                "compression.type": "lz4", "ssl.ca.location": "/ca"}  # fmt: skip
    assert connection_settings(producer) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "ssl.ca.location": "/ca",
    }


def test_dead_letter_kinds_a_topic_for_kafka_sinks_only() -> None:
    from fanout_kafka.deadletter import KafkaDeadLetters
    from fanout_kafka.plugin import fanout_dead_letter_kinds, kafka_target

    assert fanout_dead_letter_kinds() == {"kafka": kafka_target}
    sink = KafkaSink("k", bootstrap_servers="h:1", topic="t")
    target = kafka_target("orders-dlq", sink)
    assert isinstance(target, KafkaDeadLetters) and (target.kind, target.topic) == (
        "kafka", "orders-dlq",
    )  # fmt: skip
    with pytest.raises(ConfigurationError, match="Kafka topic name"):
        kafka_target("bad name", sink)
    with pytest.raises(ConfigurationError, match="this sink has none"):
        kafka_target("orders-dlq", RecordingSink("other"))


def test_create_topic_spec() -> None:
    assert parse_create_topic("k", False) is None
    assert parse_create_topic("k", True) == TopicSpec()
    spec = parse_create_topic(
        "k", {"partitions": 6, "replication_factor": 3, "config": {"retention.ms": 1000}}
    )
    assert spec == TopicSpec(6, 3, {"retention.ms": "1000"})
    with pytest.raises(ConfigurationError, match="unknown keys"):
        parse_create_topic("k", {"partition": 6})
    with pytest.raises(ConfigurationError, match="positive integer"):
        parse_create_topic("k", {"partitions": 0})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topic": "t"}, "option 'bootstrap_servers' is required"),
        ({"bootstrap_servers": "h:1"}, "option 'topic' is required"),
        ({"bootstrap_servers": "h:1", "topic": "a b"}, "option 'topic' must be a Kafka topic"),
        ({"bootstrap_servers": "h:1", "topic": "t\n"}, "option 'topic' must be a Kafka topic"),
        ({"bootstrap_servers": "h:1", "topic": "t", "partitions": 0}, "'partitions' must be"),
        ({"bootstrap_servers": "h:1", "topic": "t", "key": []}, "option 'key' must be"),
        ({"bootstrap_servers": "h:1", "topic": "t", "marker_topic": "t"}, "must differ"),
        ({"bootstrap_servers": "h:1", "topic": "t", "dead_letter": "kafka:t"}, "not be the topic"),
        ({"bootstrap_servers": "h:1", "topic": "t", "transaction_timeout_ms": -1}, "positive"),
    ],
)
def test_bad_options_fail_at_open_before_any_connection(
    options: dict[str, object], message: str
) -> None:
    sink = KafkaSink("k", **options)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=message) as caught:
        open_sink(sink, "p")
    assert "Kafka sink 'k'" in str(caught.value)


def test_unknown_librdkafka_setting_is_a_configuration_error() -> None:
    sink = KafkaSink("k", bootstrap_servers="127.0.0.1:1", topic="t",
                     producer={"no.such.setting": 1}, open_timeout_s=1)  # fmt: skip
    with pytest.raises(ConfigurationError, match="invalid producer settings.*no.such.setting"):
        sink.open(SinkContext("p"))


def test_the_kafka_type_comes_from_the_entry_point_and_sinks_pickle() -> None:
    assert fanout_sink_types() == {"kafka": "fanout_kafka.sink:KafkaSink"}  # imported when used
    registry = load_registry()
    kafka = registry.sink_types()["kafka"]
    assert kafka.sink_class is KafkaSink
    assert kafka.plugin.distribution == "fanout-kafka"
    assert kafka.guarantees == ("transactional",)
    sink = KafkaSink("k", bootstrap_servers=["a:1", "b:2"], topic="t", key=["x", "y"])
    assert sink.bootstrap_servers == "a:1,b:2"
    clone = pickle.loads(pickle.dumps(sink))
    assert (clone.name, clone.topic, clone.key) == ("k", "t", ["x", "y"])


class RetentionCluster:
    """A cluster whose brokers report ``offsets.retention.minutes`` (or nothing)."""

    def __init__(self, minutes: str | None) -> None:
        self.minutes = minutes

    def broker_config(self, name: str) -> str | None:
        assert name == "offsets.retention.minutes"
        return self.minutes


ASSUMED = (
    "; fanout assumes Kafka's default, 10080 minutes (7 days), as the window to restart a "
    "query that failed in the middle of a batch before the partitions it had committed are "
    "written again, and renews the partition markers every 60 minutes while batches run: a "
    "shorter retention on the brokers shortens that window"
)
UNREPORTED = (
    "sink 'events': the brokers do not report offsets.retention.minutes (describe_configs "
    "refused or not answered: grant the sink's principal DESCRIBE_CONFIGS on the cluster so "
    "it can read it)" + ASSUMED
)


def unusable(value: str) -> str:
    """What ``open()`` says of brokers reporting ``value``, no positive number."""
    return (
        f"sink 'events': the brokers report an unusable value of offsets.retention.minutes, "
        f"{value!r} (not a positive number of minutes: check the setting on the brokers)" + ASSUMED
    )


@pytest.fixture
def nothing_said(monkeypatch: pytest.MonkeyPatch) -> None:
    """No unusable retention warned of yet in this process (each warned once)."""
    from fanout_kafka import renewal

    monkeypatch.setattr(renewal, "_UNUSABLE_SAID", set())


@pytest.mark.parametrize(
    ("minutes", "tansu", "level", "text"),
    [
        ("60", False, "WARNING", "forgets partition markers 60 minute(s) (0.0 days)"),
        ("20160", False, "INFO", "forgets partition markers 20160 minute(s) (14.0 days)"),
        ("20160.0", False, "INFO", "forgets partition markers 20160 minute(s) (14.0 days)"),
        (None, False, "WARNING", UNREPORTED),
        ("x", False, "WARNING", unusable("x")),
        ("0", False, "WARNING", unusable("0")),
        ("-5", False, "WARNING", unusable("-5")),
        ("abc", False, "WARNING", unusable("abc")),
        (None, True, "INFO", "the broker (Tansu) does not report offsets.retention.minutes"),
    ],
)
@pytest.mark.usefixtures("nothing_said")
def test_open_says_how_long_markers_last(
    caplog: pytest.LogCaptureFixture, minutes: str | None, tansu: bool, level: str, text: str
) -> None:
    """A retention the brokers do not report (``describe_configs`` refused, or no value)
    is warned of, naming the setting, the 7 days assumed and the hourly renewal; one they
    report that is no positive number of minutes, as an unusable value (it was said "not
    reported"); on Tansu (which reports none and expires no offset) it is only said."""
    from fanout_kafka import KafkaSink

    sink = KafkaSink("events", bootstrap_servers="127.0.0.1:1", topic="t")
    sink._end_turns = "/tmp/turns" if tansu else None  # as open() sets it on Tansu
    with caplog.at_level("INFO", logger="fanout_kafka"):
        sink._warn_marker_retention(RetentionCluster(minutes))
    (record,) = [r for r in caplog.records if "sink 'events'" in r.getMessage()]
    assert record.levelname == level
    assert text in record.getMessage()


@pytest.mark.usefixtures("nothing_said")
def test_an_unusable_retention_is_warned_of_once_per_process_brokers_and_value(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Managed Kafka often refuses ``describe_configs`` for good, and a query restarted in
    a loop opens its sinks again and again: the warning came at every ``open()``. Now once
    per process, brokers and value, at info level after; other brokers, or another value
    from the same brokers, are warned of once too."""
    from fanout_kafka import KafkaSink

    def said(bootstrap: str, minutes: str | None) -> tuple[str, str]:
        caplog.clear()
        sink = KafkaSink("events", bootstrap_servers=bootstrap, topic="t")
        with caplog.at_level("INFO", logger="fanout_kafka"):
            sink._warn_marker_retention(RetentionCluster(minutes))
        (record,) = caplog.records
        return record.levelname, record.getMessage()

    assert said("a:1", None) == ("WARNING", UNREPORTED)
    assert said("a:1", None) == ("INFO", UNREPORTED)  # open() again: a restart loop
    assert said("a:1", None) == ("INFO", UNREPORTED)
    assert said("b:1,c:1", None) == ("WARNING", UNREPORTED)  # other brokers
    assert said("a:1", "0") == ("WARNING", unusable("0"))  # another answer
    assert said("a:1", "0") == ("INFO", unusable("0"))
    assert said("b:1,c:1", None) == ("INFO", UNREPORTED)


class _Schema:
    def fieldNames(self) -> list[str]:
        return ["order_id", "region", "amount"]


def test_the_partitioning_fanout_may_share_is_the_key_columns_or_the_whole_row() -> None:
    from fanout.contract.partitions import BatchPartitioning

    keyed = KafkaSink("k", bootstrap_servers="h:1", topic="t", key=["region", "order_id"],
                      partitions=6)  # fmt: skip
    assert keyed.batch_partitioning(_Schema()) == BatchPartitioning(6, ("region", "order_id"))
    keyless = KafkaSink("k", bootstrap_servers="h:1", topic="t", partitions=3)
    assert keyless.batch_partitioning(_Schema()) == BatchPartitioning(
        3, ("order_id", "region", "amount")
    )


def test_one_header_column_given_as_a_string_is_checked_as_one_column() -> None:
    from pyspark.sql import types as T

    sink = KafkaSink("k", bootstrap_servers="h:1", topic="t", key="id", headers="trace_id")
    id_ = T.StructField("id", T.LongType())
    sink._check_columns(T.StructType([id_, T.StructField("trace_id", T.StringType())]), 7)
    with pytest.raises(SchemaMismatchError) as missing:
        sink._check_columns(T.StructType([id_]), 7)
    assert "column(s) 'trace_id' named by option 'headers' are not in" in str(missing.value)


LIBRDKAFKA_CREDENTIAL_PROPERTIES = """
client.dns.lookup client.id client.rack enable.sasl.oauthbearer.unsecure.jwt
enable.ssl.certificate.verification https.ca.location https.ca.pem oauthbearer_token_refresh_cb
sasl.kerberos.keytab sasl.kerberos.kinit.cmd sasl.kerberos.min.time.before.relogin
sasl.kerberos.principal sasl.kerberos.service.name sasl.mechanism sasl.mechanisms
sasl.oauthbearer.assertion.algorithm sasl.oauthbearer.assertion.claim.aud
sasl.oauthbearer.assertion.claim.exp.seconds sasl.oauthbearer.assertion.claim.iss
sasl.oauthbearer.assertion.claim.jti.include sasl.oauthbearer.assertion.claim.nbf.seconds
sasl.oauthbearer.assertion.claim.sub sasl.oauthbearer.assertion.file
sasl.oauthbearer.assertion.jwt.template.file sasl.oauthbearer.assertion.private.key.file
sasl.oauthbearer.assertion.private.key.passphrase sasl.oauthbearer.assertion.private.key.pem
sasl.oauthbearer.client.credentials.client.id sasl.oauthbearer.client.credentials.client.secret
sasl.oauthbearer.client.id sasl.oauthbearer.client.secret sasl.oauthbearer.config
sasl.oauthbearer.extensions sasl.oauthbearer.grant.type
sasl.oauthbearer.metadata.authentication.type sasl.oauthbearer.method sasl.oauthbearer.scope
sasl.oauthbearer.sub.claim.name sasl.oauthbearer.token.endpoint.url sasl.password sasl.username
ssl.ca.certificate.stores ssl.ca.location ssl.ca.pem ssl.certificate.location
ssl.certificate.pem ssl.certificate.verify_cb ssl.cipher.suites ssl.crl.location ssl.curves.list
ssl.endpoint.identification.algorithm ssl.engine.id ssl.engine.location ssl.key.location
ssl.key.password ssl.key.pem ssl.keystore.location ssl.keystore.password ssl.providers
ssl.sigalgs.list ssl_ca ssl_certificate ssl_engine_callback_data ssl_key
"""
"""Every property of librdkafka 2.16 (``rd_kafka_conf_properties_show``) whose name has sasl,
ssl, https, oauth, token, key, secret, password, client, cert or pem in it."""


def test_of_librdkafka_s_properties_the_credentials_are_secret_and_places_are_not() -> None:
    """Paths, the token endpoint URL, public certificates and callbacks stay readable
    (``token`` masked ``sasl.oauthbearer.token.endpoint.url``, ``ssl.key``
    ``ssl.key.location`` and ``ssl.keystore.location``)."""
    names = LIBRDKAFKA_CREDENTIAL_PROPERTIES.split()
    assert secret_values({name: name for name in names}) == [
        "sasl.kerberos.principal",
        "sasl.oauthbearer.assertion.private.key.passphrase",
        "sasl.oauthbearer.assertion.private.key.pem",
        "sasl.oauthbearer.client.credentials.client.id",
        "sasl.oauthbearer.client.credentials.client.secret",
        "sasl.oauthbearer.client.id",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.config",
        "sasl.oauthbearer.extensions",
        "sasl.password",
        "sasl.username",
        "ssl.key.password",
        "ssl.key.pem",
        "ssl.keystore.password",
        "ssl_key",
    ]


def test_the_token_endpoint_is_readable_and_a_password_in_it_is_not() -> None:
    producer = {
        "sasl.oauthbearer.token.endpoint.url": "https://idp.example/oauth2/token",
        "ssl.key.location": "/etc/kafka/client.key",
        "key.serializer": "org.apache.kafka.common.serialization.StringSerializer",
    }
    assert secret_values(producer) == []
    producer["sasl.oauthbearer.token.endpoint.url"] = "https://fanout:t0k%2Fen@idp.example/token"
    assert secret_values(producer) == ["t0k%2Fen", "t0k/en"]


def test_a_one_letter_sasl_username_leaves_the_sink_s_log_lines_readable(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``sasl.username`` ``u`` turned "minutes" into "min***tes" in every line."""
    import logging

    from fanout.observe import logs
    from fanout.observe.secrets import redact

    sink = KafkaSink("events", bootstrap_servers="127.0.0.1:1", topic="t",
                     producer={"sasl.username": "u", "sasl.password": "pw"})  # fmt: skip
    monkeypatch.setattr(logs, "_secrets", set())
    logs.register_secrets(sink.secret_values())
    with caplog.at_level("INFO", logger="fanout_kafka"):
        caplog.handler.addFilter(logs.RedactFilter())
        sink._warn_marker_retention(RetentionCluster("60"))
    (record,) = [r for r in caplog.records if "sink 'events'" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith(
        "sink 'events': the broker forgets partition markers 60 minute(s) (0.0 days) after "
        "their last commit (offsets.retention.minutes): restart"
    )
    refused = "SASL authentication failed for user u after 2 minutes (user=u, password=pw)"
    assert redact(refused, sink.secret_values()) == (
        "SASL authentication failed for user *** after 2 minutes (user=***, password=***)"
    )


@pytest.mark.parametrize(
    "header",
    ["fanout.pipeline", "fanout.sink", "fanout.batch_id", "fanout.error", "fanout.topic",
     "fanout.record_bytes", "fanout.column", "fanout.value"],
)  # fmt: skip
def test_a_header_column_named_like_a_fixed_header_is_refused_at_open(header: str) -> None:
    """Up to this version the record carried the fixed header and the column's under one
    name (a letter to a ``kafka:`` dead-letter topic, the column's and the letter's): a
    consumer reading the first got the wrong value. Refused before any connection."""
    sink = KafkaSink("k", bootstrap_servers="h:1", topic="t", headers=["trace_id", header])
    with pytest.raises(ConfigurationError) as caught:
        open_sink(sink, "p")
    assert str(caught.value) == (
        f"Kafka sink 'k': option 'headers' names column(s) {header!r}, which fanout writes "
        "as headers itself (fanout.pipeline, fanout.sink, fanout.batch_id, fanout.error, "
        "fanout.topic, fanout.record_bytes, fanout.column, fanout.value): each record would "
        "carry two headers of that name, and a consumer reading the first would get the "
        "wrong value. Rename the column in the query or the sink's select (e.g. "
        f"{header.replace('.', '_')!r}) and list the new name in 'headers'"
    )


def test_header_columns_of_other_names_pass_the_option_checks() -> None:
    """``fanout.batch`` and ``Fanout.sink`` are not fanout's (header names are
    case-sensitive): the checks go on to the connection, which fails here."""
    sink = KafkaSink("k", bootstrap_servers="127.0.0.1:1", topic="t", open_timeout_s=0.5,
                     headers=["fanout.batch", "Fanout.sink"])  # fmt: skip
    with pytest.raises(ConfigurationError) as caught:
        open_sink(sink, "p")
    assert "option 'headers'" not in str(caught.value)
