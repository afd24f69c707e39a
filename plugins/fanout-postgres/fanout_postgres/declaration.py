"""The PostgreSQL sink's options: the one declaration behind ``fanout plugins --options
postgres``, the "did you mean" checks and the README's table."""

from __future__ import annotations

from fanout.contract.options import SinkOption

OPTIONS = (
    SinkOption(
        "url",
        "required",
        "SQLAlchemy URL (`postgresql://` or `postgresql+psycopg2://`). Any part may be "
        "`${ENV_VAR}` (or `${VAR:-default}`), expanded on the driver *after* parsing, so a "
        "password needs no URL escaping. A `url` starting with `${` names the whole URL: "
        "expanded first, then parsed.",
        expands_env=True,
    ),
    SinkOption(
        "table",
        "required",
        '`"orders"`, `"schema.orders"`, `["schema", "orders"]`; a part may be double-quoted '
        '(`"my.schema"."t"`). Names are taken literally and case-sensitively, never as SQL; '
        "longer than 63 bytes is an error (PostgreSQL would truncate silently).",
    ),
    SinkOption(
        "keys",
        "the primary key",
        "Upsert keys. Must be exactly the columns of a primary key, unique constraint or "
        "non-partial unique index (`ON CONFLICT` needs one; the error says so). In append "
        "mode they only choose the hash partitioning.",
    ),
    SinkOption(
        "mode",
        "`upsert`",
        "`upsert` (guarantee `idempotent`) or `append` (guarantee `transactional`).",
    ),
    SinkOption(
        "order_by",
        "none",
        "Upsert: the column(s) deciding which row of a key wins when one batch holds the key "
        "more than once (greatest wins, NULLs last; on a tie, the greatest value of each "
        "other column in table column order, `json` and unknown types compared as text — "
        "never the arrival order, which a replay may change). **Required whenever a batch "
        "can hold a key twice** (at-least-once upstream, CDC, several updates per trigger); "
        "without it such a batch fails naming the duplicated key.",
    ),
    SinkOption(
        "columns",
        "all batch columns, same names",
        'A list selects columns; `{"batch_col": "target_col"}` selects and renames.',
    ),
    SinkOption(
        "create_table",
        "`false`",
        "Create a missing table from the batch schema, `keys` as primary key (`bigint`, "
        "`integer`, `double precision`, `numeric(p,s)`, `text`, `boolean`, `date`, "
        "`timestamptz` / `timestamp` (NTZ), `bytea`, `jsonb` for arrays/maps/structs).",
    ),
    SinkOption(
        "partitions",
        "`4`",
        "Write partitions per batch = transactions, each on a connection of its own "
        "(kept for the worker's next partition: `connection_idle_s`). Keep it fixed per sink "
        "(append marks are per partition; a change while a batch is half committed is "
        "refused on the driver before anything is written: see "
        "[Stable partitions](#stable-partitions)).",
    ),
    SinkOption(
        "dead_letter",
        "none",
        "Where refused rows (and rows failing the sink's `where`/`select`) go instead of "
        'failing the batch: `"postgres:<table>"`, a table in the same database '
        '(`"postgres:ops.rejects"`; written in the partition\'s transaction, created when '
        "missing; records: pipeline, sink, batch_id, partition (-1 for route rows), target, "
        "reason, column_name, value, row (JSON), rejected_at, route (route rows: the "
        "route's fingerprint and text, added to an older table when the sink opens)), or a "
        "Delta table path "
        "(fanout's one dead-letter layout, `details.target` naming the table).",
    ),
    SinkOption(
        "migrate",
        "`true`",
        "Apply fanout's migrations at `open()`. With `false`, both modes require them at "
        "head (`fanout migrate --url URL`; upsert since revision 0004, for its route records).",
    ),
    SinkOption(
        "state_schema",
        "`fanout`",
        "The schema holding the tables fanout owns (a name without `.`, which Alembic "
        "would read as `<database>.<schema>`).",
    ),
    SinkOption(
        "batch_schema",
        "none",
        "The batches' Spark schema (`StructType` or DDL string): with it, column mapping, "
        "types and `create_table` are checked at `open()`, before the stream starts. Without "
        "it they are checked on the driver when the first batch (of each new schema) "
        "arrives, before any row is written.",
    ),
    SinkOption(
        "settings",
        '`{"temp_buffers": "128MB", "work_mem": "64MB"}`',
        "Session settings of every write connection (`set_config`), added to the defaults "
        "(a setting of the same name replaces its default): e.g. `statement_timeout`, "
        "`lock_timeout`, `TimeZone`.",
    ),
    SinkOption(
        "connection_idle_s",
        "`60`",
        "How long a Spark Python worker keeps a write connection open after a partition "
        "committed, for its next partition of this sink (at most two per worker; checked "
        "with one statement before reuse). `0`: one connection per partition, closed at "
        "its end.",
    ),
)
