"""The Kafka sink's options: the one declaration behind ``fanout plugins --options kafka``,
the "did you mean" checks and the README's table."""

from __future__ import annotations

from fanout.contract.options import SinkOption

OPTIONS = (
    SinkOption("bootstrap_servers", "required", "`host:port[,host:port]` (or a list)"),
    SinkOption(
        "topic",
        "required",
        "the target topic. Change it between batches only: a batch half written to another "
        "topic is refused (`KafkaMarkerError`, naming both) until it is set back and the "
        "batch completes",
    ),
    SinkOption(
        "key",
        "none (keyless)",
        "a column, or a list of columns (key = JSON array of their values). A null key "
        "column is a bad record. Keyless, every column is hashed into partitions, so a map "
        "or variant column (Spark cannot hash one) is refused before the first batch.",
    ),
    SinkOption(
        "value",
        '`"json"`',
        "`json`: the whole row as compact JSON (dates ISO 8601; a `timestamp`, nested "
        "too, in UTC with `+00:00` whatever Spark's session time zone, as the "
        "PostgreSQL sink writes it into `json`/`jsonb` — up to this version it carried "
        "the session zone's offset, e.g. `+05:30`, in values, keys and headers — and a "
        "`timestamp_ntz` without offset; decimals as text, bytes base64, NaN and "
        'infinities as the strings `"NaN"`, `"Infinity"`, `"-Infinity"`, as Spark\'s '
        "`to_json` writes them; maps with string keys as objects; maps with other keys, "
        'intervals and variants are refused before the first record: see "JSON values" '
        "in plugins/fanout-kafka/README.md); or the name of a string/binary column sent "
        "as is (null = tombstone)",
    ),
    SinkOption(
        "headers",
        "`true`",
        "`fanout.pipeline`, `fanout.sink`, `fanout.batch_id` on every record; `false`: none "
        "(warned at open in a pipeline: a sink renamed after a crash in its first batch of an "
        "epoch is then not caught, docs/architecture.md §8.3); "
        "a list of columns: those plus one header per column (a column named like a header "
        "fanout writes, `fanout.batch_id`, `fanout.error`..., is refused at open: the record "
        "would carry the name twice)",
    ),
    SinkOption(
        "producer",
        "`{}`",
        "librdkafka settings passed through (SASL, SSL, compression, linger, batch size...). "
        "Rejected with the reason: `enable.idempotence=false`, `acks` other than `all`/`-1`, "
        "`max.in.flight.requests.per.connection > 5`, `retries=0`, and the settings the sink "
        "owns (`bootstrap.servers`, `transactional.id`, `transaction.timeout.ms`). Unknown "
        "names and bad values are reported by librdkafka at `open()`. Passwords, passphrases, "
        "keys, tokens, `sasl.username`, `sasl.kerberos.principal`, the OAuth client ids, "
        "`sasl.oauthbearer.config`, "
        "`sasl.oauthbearer.extensions` and `sasl.jaas.config` are returned by "
        "`secret_values()`, so fanout masks them in every error, log line and ledger row; "
        "paths (`ssl.key.location`), the token endpoint URL (a password in it is masked) "
        "and public certificates stay readable.",
    ),
    SinkOption(
        "transactional_id_prefix",
        "`fanout/<pipeline>/<sink>`",
        "partition `p` uses `<prefix>-<p>`; must be unique per sink on the cluster (two "
        "sinks of one pipeline on the same prefix are refused when the `FanOut` is built and "
        "by `fanout validate`). The default was `fanout-<pipeline>-<sink>` up to this "
        "version (ambiguous): see "
        '"Transactional ids" in plugins/fanout-kafka/README.md for the upgrade',
    ),
    SinkOption(
        "marker_topic",
        "`__fanout_markers`",
        "one partition, created if missing. Change it between batches only: a batch half "
        "written with its markers in another topic is refused (`KafkaMarkerError`) until it "
        "is set back and the batch completes",
    ),
    SinkOption(
        "partitions",
        "`4`",
        "fixed number of write partitions = transactional producers per batch",
    ),
    SinkOption(
        "transaction_timeout_ms",
        "`60000`",
        "at most the broker's `transaction.max.timeout.ms` (checked at `open()` when the "
        "broker says it). A partition whose transaction runs longer is aborted and fails "
        "the batch, not retried, saying to raise this or `partitions`",
    ),
    SinkOption(
        "dead_letter",
        "none",
        "where bad records (and rows failing the sink's `where`/`select`) go instead of "
        'failing the batch: `"kafka:<topic>"` (written in the same transaction as the '
        "partition; route rows in a transaction of their own), or a Delta table path "
        "(fanout's one dead-letter layout; written once the partition committed, which "
        "names them in a journal, so a record is in the topic or the table, never both or "
        "neither)",
    ),
    SinkOption(
        "create_topic",
        "`false`",
        "create missing target / dead-letter topics: `true` (broker defaults) or "
        "`{partitions, replication_factor, config}`; created at the first write, not at "
        "`open()`: a run the lost-target check refuses leaves none",
    ),
    SinkOption(
        "order_by",
        "none",
        "column(s) ordering a partition's records (per-key order inside one batch)",
    ),
    SinkOption("open_timeout_s", "`10`", "how long `open()` waits for the brokers"),
    SinkOption(
        "max_record_bytes",
        "resolved",
        "a record's size as librdkafka counts it (key, value, headers with their length "
        "varints, 36 bytes of framing); default: topic `max.message.bytes`, else broker "
        "`message.max.bytes`, else Kafka's 1048588, less the 61-byte record batch header; "
        "capped by the producer's own `message.max.bytes` (librdkafka: 1000000)",
    ),
)
