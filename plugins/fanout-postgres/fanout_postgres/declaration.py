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
        "expanded first, then parsed. A password written in the URL itself must escape an "
        "`@` (`%40`): one not escaped is refused when the sink opens (exit 2), not taken "
        "for the host.",
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
        "Upsert: the column(s) deciding which row of a key wins when one batch holds "
        "the key more than once (greatest wins, NULLs last; on a tie, the greatest "
        "value of each other column in table column order, `json` and unknown types "
        "compared as text; rows still tied then go to the greatest text, in byte order, "
        "of each column whose type's `=` is coarser than its text — unconstrained "
        "`numeric` `1.0`/`1.00`, `real`/`double precision` `-0`/`0`, `citext` case, "
        "`interval`, `jsonb`, `numrange`, arrays and domains of them, a column under a "
        "nondeterministic collation — in table column order, keys included, so which "
        "spelling of a `citext` key is written is decided too — never the arrival "
        "order, which a replay may change). **Required whenever a batch can hold a key "
        "twice** (at-least-once upstream, CDC, several updates per trigger); without it "
        "such a batch fails naming the duplicated key. A refused row takes part in the "
        'choice: when it wins, its key keeps its value in the table (see "A refused row '
        'still counts for its key" in plugins/fanout-postgres/README.md).',
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
        "`timestamptz` / `timestamp` (NTZ), `bytea`, `jsonb` for arrays/maps/structs). "
        "Created at the run's first write, not at `open()` nor again by a later batch: a run "
        "the lost-target check refuses leaves none.",
    ),
    SinkOption(
        "partitions",
        "`4`",
        "Write partitions per batch = transactions, each on a connection of its own "
        "(kept for the worker's next partition: `connection_idle_s`). Keep it fixed per "
        "sink (append marks are per partition; a change while a batch is half committed "
        'is refused on the driver before anything is written: see "Stable partitions" '
        "in the main README). For throughput, match the task slots your executors have: "
        "the partitions then run in one wave. With `local[2]`, 2 partitions upsert the "
        "benchmark's 1M rows in a median 5.06 s, against 5.41 s with 4 and 6.17 s with "
        "3.",
    ),
    SinkOption(
        "dead_letter",
        "none",
        "Where refused rows (and rows failing the sink's `where`/`select`) go instead "
        'of failing the batch: `"postgres:<table>"`, a table in the same database '
        '(`"postgres:ops.rejects"`; written in the partition\'s transaction, created '
        "when missing; records: pipeline, sink, batch_id, partition (-1 for route "
        "rows), target, reason, column_name, value (text), row (`jsonb`: fanout's "
        "dead-letter JSON, as in a Delta table), rejected_at, route (route rows: the "
        "route's fingerprint and text, added to an older table when the sink opens)), "
        "or a Delta table path (fanout's one dead-letter layout, `details.target` "
        'naming the table). See "Bad rows never vanish" in '
        "plugins/fanout-postgres/README.md.",
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
        "Session settings of every write connection (`set_config`), added to the "
        "defaults (a setting of the same name replaces its default): e.g. "
        "`statement_timeout`, `lock_timeout`, `TimeZone`. Each is tried when the sink "
        "opens (a name or value the server refuses fails there); `synchronous_commit` "
        "`off` is refused, since a server crash could then lose rows the ledger records "
        "as written: in this option, and as the connections' effective value (`SHOW "
        "synchronous_commit`, set for the server, database or role) at `open()` and on "
        'each new write connection; `settings: {synchronous_commit: "on"}` overrides '
        "such a default. A `search_path` here is the write connections' only: a `table` or "
        "`postgres:` dead-letter table named without a schema is resolved once, on the "
        "driver, by the URL's search path (set it for every connection with "
        "`?options=-csearch_path%3Dapp`, or name the schema), and written there, qualified. "
        "Up to this version a `postgres:` dead-letter table was looked up by the partitions "
        "under this `search_path`: created by the driver in `public`, not found there, and "
        "every partition refusing a row failed at every attempt (or, with a table of that "
        "name in its schema, wrote there); `open()` now logs a warning for each name this "
        "`search_path` would resolve elsewhere than the URL's.",
    ),
    SinkOption(
        "connection_idle_s",
        "`60`",
        "How long a Spark Python worker keeps a write connection open after a partition "
        "committed, for its next partition of this sink (at most two per worker; "
        "checked with one statement before reuse). `0`: one connection per partition, "
        "closed at its end. Each partition was a new backend on the server: ~2 ms of "
        "server CPU on a local socket, a TLS handshake and a SCRAM exchange on most "
        "real servers.",
    ),
)
