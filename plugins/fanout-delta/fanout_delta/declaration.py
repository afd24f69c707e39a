"""The Delta sink's options: the one declaration behind ``fanout plugins --options delta``,
the "did you mean" checks and the README's table."""

from __future__ import annotations

from fanout.contract.options import SinkOption

OPTIONS = (
    SinkOption(
        "path",
        "required",
        "table location: a local path, a `file:` URL (escapes decoded, as delta-rs does), or "
        "an object-store URI. A local path whose name holds a `%` followed by two hex digits "
        "is refused at `FanOut(...)`: delta-rs (1.x) creates that directory as named and then "
        "looks for the table at the decoded name",
    ),
    SinkOption("mode", "`append`", "`append` or `merge` (upsert on `keys`)"),
    SinkOption(
        "keys",
        "none",
        "merge keys; required for `merge`. Engine `rs` refuses a key of a Spark collation "
        "other than `UTF8_BINARY` (delta-rs merges by the exact string) and a key named with a "
        "backtick (its MERGE condition cannot quote one)",
    ),
    SinkOption(
        "order_by",
        "none",
        "merge: when a batch holds a key several times, the greatest value wins (nulls lose, "
        "NaN beats every number as in Spark; on a tie, the greatest value of the other "
        "columns in column order, so a replay picks the same row); without it, such a batch "
        "fails naming the key. Float keys are one key as Spark compares them: `0.0` and "
        "`-0.0`, and all NaNs (the row written keeps its own value, but a NaN key is "
        "written as the one NaN, which delta-rs' MERGE needs to match it)",
    ),
    SinkOption(
        "engine",
        "`rs`",
        "`rs` (delta-rs, no JVM jars), `spark` (delta-spark, distributed; needs the Delta "
        "jars on the cluster), `auto`",
    ),
    SinkOption(
        "write_from",
        "`auto`",
        "engine `rs`, mode `append`: `executors` (the Spark tasks write the Parquet files, "
        "the driver commits them once; no row passes through the driver), `driver` (the "
        "batch is converted to Arrow on the driver and written there; one conversion serves "
        "every Delta sink of the batch) or `auto`: `driver` on a `local[...]` master; "
        "`executors` on a cluster for a table on an object store (or on `local-cluster`), "
        "`driver` for a local path there (its executors may run on other hosts)",
    ),
    SinkOption(
        "max_merge_rows",
        "`2000000`",
        "engine `rs`, mode `merge`: a batch of more rows fails naming this option (a merge "
        "runs on the driver); `null` for no bound",
    ),
    SinkOption(
        "partition_by",
        "none",
        "partition columns of a new table (an existing table's must match); every batch "
        "must carry them. A partition value no Delta table can keep is refused by every "
        "writer alike: an empty string (Delta reads it back as null; delta-spark writes it "
        "as null), a value whose directory name `<column>=<value>`, as the engine names "
        "it, would exceed 255 bytes, which no file system holds, and with engine `rs` a "
        "date or timestamp past the year 9999 in UTC (delta-rs cannot read it back) or a "
        "negative decimal with a fractional part (delta-rs writes -1.50 as `-1.-50` and "
        "fails its commit; delta-spark writes it). "
        "Engine `rs` escapes each byte of a character other than a letter, a digit or "
        "`_.~-` as 3 bytes and writes a float in full decimal digits (`1e300`: 301; it "
        "panicked on a long name); engine `spark` names it as Spark does: 3 bytes for "
        "each control character and each of `\"#%'*/:=?\\{[]^`, any other character "
        "as its UTF-8 bytes, a float as `1.0E300` (its task failed on a long name), and "
        "a NUL character unescaped, which no name holds (refused too). So "
        "a long string is refused by both, `1e300` by `rs` only. Such a row goes to "
        "`dead_letter`, or fails the "
        "batch naming sink, batch, column and value; a merge refuses it only where it wins "
        "its key (a refused row that loses to another row of its key is superseded, see "
        "**Dead letters**)",
    ),
    SinkOption(
        "merge_schema",
        "`false`",
        "`true` lets new batch columns extend the table (added nullable, as Delta on Spark "
        "adds them: the rows already there hold no value); otherwise a batch whose schema "
        "does not fit fails naming sink, batch and columns",
    ),
    SinkOption(
        "compact_every",
        "none",
        "compact the table's small files every N batches (a delta-rs `OPTIMIZE`, taken back "
        "at once when another compaction of the same files committed first; by the next "
        "compaction, or the sink's next open, when the process was killed before that "
        "check). Compact a "
        "table from one place only: delta-rs lets another program's `OPTIMIZE` racing this "
        "one duplicate rows (see docs/architecture.md §8.1, Compaction)",
    ),
    SinkOption(
        "storage_options",
        "none",
        "passed to delta-rs (object-store credentials...). Keys, secrets, tokens and access "
        "key ids (`aws_secret_access_key`, `azure_storage_sas_token`...) and a password in a "
        "URL are masked in every error, log line and ledger row; paths, URLs and flags "
        "(`aws_web_identity_token_file`, `aws_sse_kms_key_id`...) stay readable. A number or "
        "a boolean is passed as text (`true`/`false`): delta-rs takes only text",
    ),
    SinkOption(
        "configuration",
        "none",
        "table properties set when the table is created (a number or a boolean as text, "
        "`true`/`false`)",
    ),
    SinkOption(
        "dead_letter",
        "none",
        "where merge rows with a null key, rows whose partition value no Delta table can "
        "keep (see `partition_by`), rows the table's CHECK constraints or NOT NULL columns "
        "refuse (see **Constraints**), and rows failing the sink's `where`/`select`, go "
        'instead of failing the batch: a Delta table path, or `"<kind>:<location>"` (see '
        "**Dead letters**). With a partition column of strings (or timestamps, from the "
        "executors), one more Spark job per batch finds such rows (delta-spark, or the "
        "executors' append, which then writes alone rather than in a shared job)",
    ),
    SinkOption(
        "min_txn_retention_hours",
        "`168`",
        "the shortest `delta.setTransactionRetentionDuration` the table may set (a week); "
        "see below",
    ),
)
