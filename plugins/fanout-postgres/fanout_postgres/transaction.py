"""The statements of one partition transaction of the PostgreSQL sink: COPY into the target or
a staging table, the upsert or insert, rows the server refuses set aside (by COPY line or by
bisection with savepoints), dead letters, and the partition's record: append's progress
mark, upsert's ``upsert_routes`` row.

Upsert: a key's winner is chosen among all the batch's rows of the key,
refused or not. A row refused before the ``INSERT`` (by the executor's checks or by the
staging COPY) is staged all the same, its unstorable values as NULL, and held; once every
row is staged, one statement removes the held rows and every row of a key a held row wins
(:meth:`PartitionTransaction._settle`): a refused winner is dead-lettered (or fails the
partition) and its key keeps its value in the target, a refused row that lost is
superseded. A row refused by the ``INSERT`` (a CHECK, a foreign key) was its key's winner
already. Without ``order_by`` no row of a key outranks another, and a key held twice fails
the partition, refused rows counted, as at the ``INSERT``. No statement is added when no
row is refused."""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fanout.errors import SinkWriteError, TransientSinkError
from fanout.observe.secrets import NO_SECRETS, SinkSecrets
from fanout.partitioned.membership import MemberDigest
from fanout.partitioned.outcome import PartitionOutcome
from fanout_postgres import binary
from fanout_postgres.deadletter import KEPT_IN, letters_lock
from fanout_postgres.direct import HELD, REFUSED
from fanout_postgres.encode import (
    Check,
    CopyStream,
    Reject,
    Rows,
    blank_cell,
    blank_too_long,
    cell_json,
    cells_json,
    drop_rows,
    jsonb_safe,
    precheck,
    row_at_line,
    row_json,
    to_csv,
    value_text,
)
from fanout_postgres.identifiers import quote
from fanout_postgres.plan import WritePlan
from fanout_postgres.sqlstate import (
    MarkConflict,
    RowRejected,
    classify,
    copy_position,
    reason_of,
    sqlstate_of,
)
from fanout_postgres.statements import (
    EPOCH_FENCE,
    ROW,
    epoch_fence_lock,
    forget_fence_sql,
    forget_marks_advice,
    forget_routes_sql,
    restarted,
)

if TYPE_CHECKING:
    pass


COLUMN_TYPES_SQL = (
    "SELECT n.name, format_type(a.atttypid, a.atttypmod), "
    "cardinality(CAST(%(keys)s AS text[])) = 0 OR EXISTS (SELECT FROM pg_index x "
    "WHERE x.indrelid = to_regclass(%(table)s) AND x.indisunique AND x.indpred IS NULL "
    'AND x.indexprs IS NULL AND ARRAY(SELECT k.attname::text COLLATE "C" FROM pg_attribute k '
    "WHERE k.attrelid = x.indrelid AND k.attnum = ANY (x.indkey) ORDER BY 1) "
    '= ARRAY(SELECT u COLLATE "C" FROM unnest(CAST(%(keys)s AS text[])) u ORDER BY 1)), '
    "({later}) "
    "FROM unnest(CAST(%(names)s AS text[])) WITH ORDINALITY AS n(name, i) "
    "LEFT JOIN pg_attribute a ON a.attrelid = to_regclass(%(table)s) AND a.attname = n.name "
    "AND NOT a.attisdropped ORDER BY n.i"
)
"""The types of the written columns now, and (upsert, ``keys``) whether a unique index on
exactly the keys is still there: checked after the rows are written, while the
transaction's lock on the table keeps an ``ALTER TABLE`` waiting. ``{later}``: upsert, a
later batch of the sink already committed (:attr:`Statements.later_batch`), else ``NULL``,
asked in the same round trip."""
CONSTRAINT_COLUMNS_SQL = (
    "SELECT a.attname FROM pg_constraint c JOIN pg_attribute a ON a.attrelid = c.conrelid "
    "AND a.attnum = ANY (c.conkey) WHERE c.conrelid = to_regclass(%(table)s) "
    "AND c.conname = %(name)s ORDER BY array_position(c.conkey, a.attnum)"
)
"""The columns of a constraint of the target (a foreign key's own columns in its order,
those a CHECK reads in table order): the columns of a row an ``INSERT`` refused, when the
server names none."""
IMMEDIATE = "SET CONSTRAINTS ALL IMMEDIATE"
"""Run first in every partition transaction: a ``DEFERRABLE INITIALLY DEFERRED`` constraint
(a foreign key, a unique index) is then checked at the end of each statement, where a
refused row is isolated and dead-lettered like any other, not at the commit, which would
fail the whole partition at every attempt (and let a direct COPY repeat a key)."""
KEEP_MARKS = 100
"""Progress marks older than this many batches are pruned (Spark replays only the last)."""


@dataclass(frozen=True)
class BatchMeta:
    """The batch as a partition task sees it."""

    pipeline: str
    batch_id: int
    query_id: str | None
    fingerprint: str | None = None
    """Append: the partitioning's fingerprint, recorded in each progress mark."""
    route: str | None = None
    """The batch's route (:func:`fanout.partitioned.replay_route.route_mark`: ``<fingerprint>
    <route>``, the identity's for a batch built outside fanout), recorded with each
    partition's rows: append in its progress mark, upsert in ``upsert_routes``; a replay
    under another is refused (:func:`fanout.partitioned.replay_route.check_routes`)."""
    kept_elsewhere: tuple[tuple[int, str], ...] = ()
    """The partitions whose refused rows of the batch an earlier dead-letter target of the
    sink holds (its ``dead_letter`` moved since an attempt: :attr:`fanout.Batch.earlier`),
    each with that target: a ``postgres:`` table the sink has now gets none of them, and
    the partition's records name that target in ``kept_in``."""

    def elsewhere(self, partition: int) -> str | None:
        """The earlier target holding ``partition``'s refused rows, if one does."""
        return next((target for p, target in self.kept_elsewhere if p == partition), None)


class PartitionTransaction:
    """The statements of one partition transaction."""

    def __init__(
        self,
        cur: Any,
        plan: WritePlan,
        meta: BatchMeta,
        partition: int,
        rows: Rows,
        digest: MemberDigest,
        *,
        direct: bool = False,
        secrets: SinkSecrets = NO_SECRETS,
    ) -> None:
        self.cur, self.plan, self.meta, self.partition = cur, plan, meta, partition
        self.secrets = secrets  # masked in a refused row's reason (_detail)
        self.direct = direct  # upsert: try a COPY straight into the target first (direct.py)
        self.counters: dict[str, int] = {}
        self.rows = rows
        self.digest = digest
        self.server_version = int(getattr(cur.connection, "server_version", 0) or 0)
        self.table = pa.table({})  # every row (target names + ROW), once all are taken
        self.sql = plan.statements
        self.rejects: list[Reject] = []
        # upsert: a refused row takes part in choosing its key's winner (see
        # _hold); held here until the stage's dedupe says whether it won its key
        self.dedupes = bool(self.sql.drop_refused)
        self.key_checks: tuple[Check, ...] = tuple(c for c in plan.checks if c.column in plan.keys)
        self.held: dict[int, Reject] = {}
        self.dropped: list[int] = []  # rows _settle removed from the stage
        self.key = {
            "pipeline": meta.pipeline,
            "sink": plan.sink,
            "batch_id": meta.batch_id,
            "partition": partition,
        }

    def run(self) -> PartitionOutcome:
        """Write the partition in the connection's open transaction (the caller commits);
        the outcome to report once it committed."""
        if self.sql.route_record:  # upsert: the route, committed with the rows, if they are
            self.cur.execute(f"{IMMEDIATE}; {self.sql.route_record}", self._route_params())
        elif self.sql.fence_check:  # append: closed by a later epoch? (no round trip more)
            lock = epoch_fence_lock(self.meta.pipeline, self.plan.sink)
            params = {**self.key, "fence_lock": lock}
            self.cur.execute(f"{IMMEDIATE}; {self.sql.fence_check}", params)
            (fenced,) = self.cur.fetchone()
            if fenced:
                self._refuse_fenced()
        else:
            self.cur.execute(IMMEDIATE, {})
        if self.plan.mode == "append":
            claimed = self._claim()
            if claimed is not None:
                self.rows.table()  # take the rest of the input; nothing to write
                return claimed
            if self._copy_into_target():
                changed = self.table.num_rows - len(self.rejects)
            else:
                self.cur.execute(self.sql.create_stage, {})
                self._copy(self.sql.copy_stage, self._checked(), with_row=True)
                changed = self._write()
        elif self.direct and self._copy_directly():
            changed = self.table.num_rows - len(self.rejects)
        else:
            self.cur.execute(self.sql.create_stage, {})
            if not self._stream(self.sql.copy_stage, self.sql.copy_stage_binary, with_row=True):
                self._copy(self.sql.copy_stage, self._checked(), with_row=True)
            self._settle()
            changed = self._write()
        self._check_types()
        rows = self.table.num_rows - len(self.rejects)
        elsewhere = self.meta.elsewhere(self.partition)  # kept by an earlier target
        # the driver hands them over after the partitions: to the target it writes, or
        # (an upsert's partition an earlier target holds, which a postgres: table skips)
        # to that earlier target (fanout.deadletters.moved.replace_held)
        driver = self.plan.dead_letter == "driver"
        driver = driver or (elsewhere is not None and self.plan.mode != "append")
        outcome = PartitionOutcome(
            self.partition,
            "committed",
            rows=rows,
            written=rows,
            dead_lettered=len(self.rejects),
            letters=tuple(self._dead_letters()) if driver else (),
            counters={"changed": changed, **self.counters},
        )
        if self.plan.dead_letter == "postgres" and elsewhere is None:
            self._write_dead_letters()
        if self.plan.mode != "append" and self.rejects:
            # so holds_batch can tell refused rows the driver has yet to write to the
            # dead-letter target from none (the replay refuses them again: no rows kept)
            kept_in = self.sql.dead_table if self.plan.dead_letter == "postgres" else None
            kept_in = elsewhere or kept_in
            self.cur.execute(
                self.sql.route_refused,
                {**self.key, "refused": len(self.rejects), "kept_in": kept_in},
            )
        if self.plan.mode == "append":
            kept = self._dead_letters()  # so a replay that skips still knows its rejects
            if self.plan.dead_letter == "postgres":  # and that they are in that table
                kept = [{**d, KEPT_IN: elsewhere or self.sql.dead_table} for d in kept]
            self.cur.execute(
                self.sql.mark_update,
                {
                    **self.key,
                    "rows": rows,
                    "rejects": json.dumps(kept or None),
                    "fingerprint": self.meta.fingerprint,
                    "input_rows": self.digest.rows,
                    "input_checksum": self.digest.checksum,
                    "route": self.meta.route,
                    "target_table": self.plan.target or self.plan.table,
                },
            )
            self.cur.execute(
                self.sql.mark_prune, {**self.key, "keep_from": self.meta.batch_id - KEEP_MARKS}
            )
        return outcome

    def _route_params(self) -> dict[str, Any]:
        """Upsert: the parameters of :attr:`Statements.route_record`."""
        keep_from = self.meta.batch_id - KEEP_MARKS
        return {
            **self.key,
            "route": self.meta.route,
            "partitions": self.plan.partitions,
            "target": self.plan.table,
            "target_table": self.plan.target or self.plan.table,
            "keep_from": keep_from,
        }

    def _check_types(self) -> None:
        """The written columns still have the types the plan was made for: an ``ALTER
        TABLE ... TYPE`` committed since may have made the rows land as other values (a
        binary field read as another type, a value cast and rounded); and, upsert, a unique
        index on the keys is still there (without one the direct ``COPY`` appends keys the
        table holds). Else the partition rolls back, and the batch is retried (transient)
        under a plan made anew. Upsert, first: no later batch of the sink committed
        (:meth:`_refuse_straggler`), asked in the same round trip."""
        planned = self.plan.column_types
        later_sql = self.sql.later_batch
        if not planned:
            if later_sql:
                self.cur.execute(later_sql, self.key)
                (later,) = self.cur.fetchone()
                self._refuse_straggler(later)
            return
        names = [target for _, target in self.plan.columns]
        keys = list(self.plan.keys) if self.plan.mode == "upsert" else []
        params = {"names": names, "table": self.plan.target, "keys": keys, **self.key}
        self.cur.execute(COLUMN_TYPES_SQL.format(later=later_sql or "NULL"), params)
        rows = self.cur.fetchall()
        self._refuse_straggler(rows[0][3] if rows else None)
        found_rows = [row[:3] for row in rows]
        if not all(keyed for *_, keyed in found_rows):
            # without it a COPY into the table appends a key that is there already
            raise TransientSinkError(
                f"table {self.plan.table} no longer has a unique index on the keys "
                f"({', '.join(quote(k) for k in keys)}) it was planned with; nothing of this "
                "partition was written, and the batch is retried under a plan made for the "
                "table as it is now (which refuses keys without one)",
                sink=self.plan.sink,
                batch_id=self.meta.batch_id,
            )
        now = [(name, found or "missing") for name, found, _ in found_rows]
        changed = [
            f"{quote(name)} {was} is now {found}"
            for (name, found), was in zip(now, planned, strict=True)
            if found != was
        ]
        if changed:
            raise TransientSinkError(
                f"table {self.plan.table} changed while the batch was written: "
                f"{', '.join(changed)}; nothing of this partition was written, and the "
                "batch is retried under a plan made for the table as it is now",
                sink=self.plan.sink,
                batch_id=self.meta.batch_id,
            )

    def _refuse_straggler(self, later: int | None) -> None:
        """Upsert: roll the partition back when a later batch of the sink committed
        (``later``, its id; :data:`~fanout_postgres.statements.EPOCH_FENCE` when a later
        epoch began writing the sink): this attempt is a straggler (a speculative copy Spark did not
        take, a task of an executor it gave up on, a killed task still running), whose
        rows would overwrite the later batch's values of their keys. Asked after the rows
        are written: a later batch that wrote one of its keys first has committed by then
        (this transaction waited for its row lock or unique index entry), and one that
        writes them after waits for this transaction and overwrites them."""
        if later == EPOCH_FENCE:
            raise SinkWriteError(
                f"partition {self.partition} rolled back: {self.plan.state_schema}."
                "upsert_routes records that a later epoch of the pipeline (a checkpoint "
                "reset was accepted since) began writing this sink to "
                f"{self.plan.table}, and this partition's rows would have overwritten "
                "that epoch's values of their keys. A task of the query the reset "
                "replaced, or an attempt Spark no longer waits for, ends so, and its "
                f"outcome is discarded. If {restarted(ledger_too=True)}, those records "
                "are an earlier run's: restore the ledger and checkpoint, or, only if the "
                "table is meant to be written again, delete them: "
                + forget_routes_sql(self.plan.state_schema, self.meta.pipeline, self.plan.sink),
                sink=self.plan.sink,
                batch_id=self.meta.batch_id,
            )
        if later is None:
            return
        raise SinkWriteError(
            f"partition {self.partition} rolled back: {self.plan.state_schema}.upsert_routes "
            f"says batch {later}, after this one, is committed to {self.plan.table}, and "
            "this partition's rows would have overwritten that batch's values of their "
            "keys. An attempt Spark no longer waits for (the slower of a speculative pair, "
            "a task of an executor it gave up on) ends so, and its outcome is discarded. "
            f"If this batch is the pipeline's newest ({restarted(ledger_too=True)}; the "
            "driver refuses that "
            "before writing, unless the earlier run committed that batch meanwhile), "
            "those records are an earlier run's: restore the ledger and checkpoint, or, "
            "only if the table is meant to be written again, delete them: "
            + forget_routes_sql(self.plan.state_schema, self.meta.pipeline, self.plan.sink),
            sink=self.plan.sink,
            batch_id=self.meta.batch_id,
        )

    def _refuse_fenced(self) -> None:
        """Append: roll the partition back before it writes, its scope closed by a later
        epoch (the scope's :data:`~fanout_postgres.statements.EPOCH_FENCE` mark, looked up
        under the scope's fence lock): a checkpoint reset was accepted since, and the new
        epoch, which asked the sink whether it holds this batch after that fence, reads
        this batch's input again: this partition's rows would be appended a second time."""
        raise SinkWriteError(
            f"partition {self.partition} rolled back before writing: "
            f"{self.plan.state_schema}.progress records that a later epoch of the pipeline "
            "(a checkpoint reset was accepted since) closed this batch's epoch for this "
            f"sink, and reads its input again: appended to {self.plan.table} now, this "
            "partition's rows would be there twice. A task of the query the reset replaced "
            "ends so, and its outcome is discarded. If the new epoch's start never "
            "completed (its process died while it asked the sinks; a refused start lifts "
            "the fence itself) and this is the old checkpoint started again to complete "
            "the batch, lift it: "
            + _lift_command(self.meta.pipeline)
            + ", or by hand: "
            + forget_fence_sql(
                self.plan.state_schema, self.meta.pipeline, self.plan.sink, "append"
            ),
            sink=self.plan.sink,
            batch_id=self.meta.batch_id,
        )

    def _stream(self, sql: str, binary_sql: str, *, with_row: bool, whole: bool = False) -> bool:
        """COPY the rows while Spark delivers them, checking each chunk on the way; in
        binary when every column allows it (``binary_sql``), else as CSV (``sql``).
        False when the server refused a row (with ``whole``, also the COPY as a whole,
        for any error but a transient one): the savepoint undid the streamed rows, and
        the caller copies them through the isolating path."""

        def prepare(chunk: pa.Table) -> pa.Table:
            good = self._set_aside(chunk, staged=with_row)
            return good if with_row else good.drop_columns([ROW])

        encode = self._binary_encoder(with_row)
        if encode is None:
            stream = CopyStream(self.rows, prepare)
        else:
            sql = binary_sql
            stream = CopyStream(self.rows, prepare, encode, binary.HEADER, binary.TRAILER)
        self.cur.execute("SAVEPOINT fanout_stream", {})
        try:
            self.cur.copy_expert(sql, stream, size=1 << 20)
            self.cur.execute("RELEASE SAVEPOINT fanout_stream", {})
        except Exception as exc:
            if isinstance(stream.error, RowRejected):
                raise stream.error from None
            self.cur.execute("ROLLBACK TO SAVEPOINT fanout_stream", {})
            if stream.error is not None and not isinstance(stream.error, _Restage):
                raise stream.error from None
            kind = classify(exc)
            if stream.error is None and (kind == "transient" or (kind == "fatal" and not whole)):
                raise
            self.table = self.rows.table()
            self.rejects.clear()
            self.held.clear()
            return False
        self.table = self.rows.table()
        self._sort_rejects()
        return True

    def _copy_directly(self) -> bool:
        """Upsert: COPY the rows straight into the target, for partitions whose keys are
        all new (:mod:`fanout_postgres.direct`); counted for the driver's policy."""
        held = self._copy_into_target()
        self.counters[HELD if held else REFUSED] = 1
        return held

    def _copy_into_target(self) -> bool:
        """COPY the rows straight into the target. False when the server refused a row
        (upsert: a key already there or twice here; any other row fault) or the COPY
        itself (a table with row-level security takes no ``COPY FROM``): the savepoint
        undid the copy and the caller stages the same rows and inserts them."""
        copy_target, binary_sql = self.sql.copy_target, self.sql.copy_target_binary
        return self._stream(copy_target, binary_sql, with_row=False, whole=True)

    def _binary_encoder(self, with_row: bool) -> binary.Encoder | None:
        schema = self.rows.schema  # write_partition took the first chunk already
        if schema is None:
            return None
        kinds = [*self.plan.wire_kinds, "int4"]
        if not with_row:
            schema, kinds = schema.remove(schema.get_field_index(ROW)), kinds[:-1]
        return binary.encoder_for(schema, kinds)

    def _checked(self) -> pa.Table:
        """Every row to stage after the executor's own checks (see :meth:`_set_aside`)."""
        return self._set_aside(self.table)

    def _set_aside(self, table: pa.Table, *, staged: bool = True) -> pa.Table:
        """``table`` (rows with :data:`ROW`) after the executor's own checks: a row failing
        one is recorded and left out, or, upsert, held (:meth:`_hold`)
        and staged with its too long values as NULL. Not ``staged`` (a direct COPY into
        the target), such a row raises :class:`_Restage`: it may win its key over a row
        of the COPY."""
        found = precheck(table, self.plan.checks)
        if not found:
            return table
        if self.dedupes and not staged:
            raise _Restage()
        numbers = table.column(ROW)
        keyless = {r.row for r in precheck(table, self.key_checks)} if self.dedupes else None
        out = []
        for at in found:
            reject = Reject(int(numbers[at.row].as_py()), at.reason, at.column, at.sqlstate)
            if keyless is None or at.row in keyless:
                self._reject(reject)
                out.append(at.row)
            else:
                self._hold(reject)
        kept = drop_rows(table, out)
        return blank_too_long(kept, self.plan.checks) if self.dedupes else kept

    def _hold(self, reject: Reject) -> None:
        """Upsert: keep a refused row in the stage, to choose its key's
        winner among all the batch's rows of the key, refused or not; :meth:`_settle`
        decides. Rows refused in a key column have no key to compete for: they are
        rejected at once (:meth:`_reject`)."""
        self.held.setdefault(reject.row, reject)

    def _settle(self) -> None:
        """Upsert, once every row is staged: remove the held rows from the stage, and (with
        ``order_by``) every row of a key whose winner is a held row (the key keeps its value
        in the target). A held row that won its key is rejected; one that lost to another
        row of its key was superseded and is not (it would never have been written).
        Without ``order_by``, a key occurring twice among the staged rows, held ones
        included, fails the partition naming the key, as the ``INSERT`` would."""
        if self.held:
            if not self.sql.write_unique:  # no order_by: the held rows' keys must be unique
                self.cur.execute(self.sql.duplicate_probe, {})
                if self.cur.fetchone() is not None:
                    raise RowRejected(self._duplicate_detail())
            self.cur.execute(self.sql.drop_refused, {"refused": sorted(self.held)})
            removed = self.cur.fetchall()
            self.dropped = sorted(int(row) for row, _ in removed)
            held, self.held = self.held, {}
            for row in sorted(int(row) for row, won in removed if won):
                self._reject(held[row])
        self._sort_rejects()

    def _sort_rejects(self) -> None:
        self.rejects.sort(key=lambda r: r.row)

    # -- append -----------------------------------------------------------------------

    def _claim(self) -> PartitionOutcome | None:
        """Insert this partition's mark; ``None`` when claimed, else the earlier commit's
        outcome (the partition is skipped). A concurrent attempt holding the same mark
        makes this wait for its commit or rollback."""
        self.cur.execute(
            self.sql.mark_insert,
            {
                **self.key,
                "partitions": self.plan.partitions,
                "query_id": self.meta.query_id,
                "target": self.plan.table,
                "rows": 0,
            },
        )
        if self.cur.fetchone() is not None:
            return None
        self.cur.execute(self.sql.mark_select, self.key)
        partitions, query_id, rows, rejects = self.cur.fetchone()
        if partitions != self.plan.partitions or (
            query_id and self.meta.query_id and query_id != self.meta.query_id
        ):
            raise MarkConflict(
                f"fanout's progress table ({self.plan.state_schema}.progress) already marks "
                f"batch {self.meta.batch_id} partition {self.partition} as committed by "
                f"query {query_id} with {partitions} partitions; this is query "
                f"{self.meta.query_id} with {self.plan.partitions}. Nothing of this "
                "partition was written. If option 'partitions' changed mid-batch, restore "
                f"it until the batch completes. Else {restarted(ledger_too=False)}: restore "
                "the ledger and checkpoint, or give the pipeline a new name. "
                + forget_marks_advice(
                    self.plan.state_schema, self.meta.pipeline, self.plan.sink, self.plan.table
                )
            )
        kept = list(rejects or [])
        pending = [d for d in kept if not d.get(KEPT_IN)]
        elsewhere = self.meta.elsewhere(self.partition)
        if pending and self.plan.dead_letter == "postgres" and elsewhere is not None:
            # an earlier target of the sink holds them (its dead_letter moved since the
            # driver wrote them there): none into this table, and the mark says where
            held = [{**d, KEPT_IN: d.get(KEPT_IN) or elsewhere} for d in kept]
            self.cur.execute(self.sql.mark_rejects, {**self.key, "rejects": json.dumps(held)})
        elif pending and self.plan.dead_letter == "postgres":
            self._keep_skipped(kept)
        return PartitionOutcome(
            self.partition,
            "skipped",
            rows=int(rows),
            dead_lettered=len(kept),
            letters=tuple(pending) if self.plan.dead_letter == "driver" else (),
        )

    def _keep_skipped(self, kept: list[dict[str, Any]]) -> None:
        """A skipped partition's refused rows that no PostgreSQL table holds yet (its
        commit left them to the driver, for a target the sink no longer has) go into the
        sink's dead-letter table now, in this transaction, and its mark says so: a later
        replay under yet another target does not write them twice."""
        lock = letters_lock(self.meta.pipeline, self.plan.sink, self.meta.batch_id, self.partition)
        self.cur.execute("SELECT pg_advisory_xact_lock(%(lock)s)", {"lock": lock})
        self.cur.execute(self.sql.dead_delete, self.key)
        self.cur.executemany(
            self.sql.dead_insert,
            [
                {
                    **self.key,
                    "target": self.plan.table,
                    "reason": d["reason"],
                    "column_name": d.get("column"),
                    "value": d.get("value"),
                    "row": None if d.get("row") is None else jsonb_safe(d["row"]),
                }
                for d in kept
            ],
        )
        held = [{**d, KEPT_IN: self.sql.dead_table} for d in kept]
        self.cur.execute(self.sql.mark_rejects, {**self.key, "rejects": json.dumps(held)})

    # -- copy and write ----------------------------------------------------------------

    def _copy(self, sql: str, table: pa.Table, *, with_row: bool) -> None:
        """COPY ``table``; a row refused with a line number is set aside and the rest
        copied again (upsert: held, and copied again with the refused
        value as NULL, see :meth:`_hold`)."""
        segments = [(0, table.num_rows)]
        blanked: set[tuple[int, str]] = set()
        while segments:
            start, end = segments.pop()
            if start >= end:
                continue
            part = table.slice(start, end - start)
            payload = part if with_row else part.drop_columns([ROW])
            self.cur.execute("SAVEPOINT fanout_copy", {})
            try:
                self.cur.copy_expert(sql, io.BytesIO(to_csv(payload)))
                self.cur.execute("RELEASE SAVEPOINT fanout_copy", {})
            except Exception as exc:
                self.cur.execute("ROLLBACK TO SAVEPOINT fanout_copy", {})
                if classify(exc) != "data":
                    raise
                line, column = copy_position(exc, [t for _, t in self.plan.columns])
                at = None if line is None else row_at_line(payload, line)
                if at is None:
                    raise
                bad = start + at
                row = int(table.column(ROW)[bad].as_py())
                if column is None and sqlstate_of(exc) in ("22P05", "22021"):
                    column = _untranslatable(table, bad, reason_of(exc))
                reject = Reject(row, reason_of(exc), self._column(column), sqlstate_of(exc))
                if self.dedupes and with_row and self._holds(table, reject, blanked):
                    # staged again with the value as NULL, to compete for its key
                    assert reject.column is not None
                    blanked.add((row, reject.column))
                    self._hold(reject)
                    table = blank_cell(table, bad, reject.column)
                    segments.extend([(bad, end), (start, bad)])
                    continue
                self._reject(self.held.pop(row, reject))  # a held row keeps its first reason
                segments.extend([(bad + 1, end), (start, bad)])

    def _holds(self, table: pa.Table, reject: Reject, blanked: set[tuple[int, str]]) -> bool:
        """Whether a row the stage's COPY refused can be staged with the refused value as
        NULL: not when the value is a key (or no column is named, or blanking it did not
        help)."""
        column = reject.column
        return (
            column is not None
            and column in table.column_names
            and column not in self.plan.keys
            and (reject.row, column) not in blanked
        )

    def _write(self) -> int:
        """Insert/upsert the staged rows; bisect with savepoints when a row is refused."""
        n = self.table.num_rows
        statements = [self.sql.write_from_stage]
        staged = drop_rows(self.table, self.dropped) if self.dropped else self.table
        unique = _unique(staged, self.plan.keys)
        if self.sql.write_unique and unique:
            # no key twice here by Arrow's equality: skip the sort of DISTINCT ON; should the
            # server's equality differ (citext, numeric scale), it raises 21000 and the
            # deduplicating statement runs instead
            statements.insert(0, self.sql.write_unique)
        merge = self.sql.write_merge if unique and self.server_version >= 150000 else ""
        for statement in [merge, *statements] if merge else statements:
            self.cur.execute("SAVEPOINT fanout_write", {})
            try:
                self.cur.execute(statement, {"lo": 0, "hi": n})
                changed = max(int(self.cur.rowcount), 0)
                self.cur.execute("RELEASE SAVEPOINT fanout_write", {})
                return changed
            except Exception as exc:
                self.cur.execute("ROLLBACK TO SAVEPOINT fanout_write", {})
                if statement is merge and classify(exc) != "transient":
                    # a key inserted meanwhile by another session (MERGE does not wait and
                    # update like ON CONFLICT), a table MERGE cannot write (rules), or a
                    # row's fault: ON CONFLICT decides, as it would have without MERGE
                    continue
                if getattr(exc, "pgcode", None) == "21000":
                    if statement != self.sql.write_from_stage:
                        continue
                    raise RowRejected(self._duplicate_detail()) from exc
                if classify(exc) != "data":
                    raise
                break
        self.cur.execute(self.sql.create_winners, {})
        return self._bisect(0, n)

    def _bisect(self, lo: int, hi: int) -> int:
        self.cur.execute("SAVEPOINT fanout_part", {})
        try:
            self.cur.execute(self.sql.write_from_winners, {"lo": lo, "hi": hi})
            changed = max(int(self.cur.rowcount), 0)
            self.cur.execute("RELEASE SAVEPOINT fanout_part", {})
            return changed
        except Exception as exc:
            self.cur.execute("ROLLBACK TO SAVEPOINT fanout_part", {})
            if classify(exc) != "data":
                raise
            if lo == hi:
                self._reject(self._refused_at_insert(lo, exc))
                return 0
        mid = (lo + hi) // 2
        return self._bisect(lo, mid) + self._bisect(mid + 1, hi)

    # -- rejects -----------------------------------------------------------------------

    def _refused_at_insert(self, row: int, exc: BaseException) -> Reject:
        """Row ``row`` refused by the ``INSERT`` (a CHECK, a foreign key, another unique
        index): at the column the server names, else at the constraint's columns."""
        named = getattr(getattr(exc, "diag", None), "column_name", None)
        columns = [self._column(c) for c in ([named] if named else self._constraint_columns(exc))]
        found = [c for c in columns if c is not None]
        if len(found) > 1:
            return Reject(row, reason_of(exc), None, sqlstate_of(exc), columns=tuple(found))
        return Reject(row, reason_of(exc), found[0] if found else None, sqlstate_of(exc))

    def _constraint_columns(self, exc: BaseException) -> list[str]:
        """The columns of the constraint that refused a row (a foreign key, a CHECK), which
        the server names no column for; none when it names no constraint."""
        name = getattr(getattr(exc, "diag", None), "constraint_name", None)
        if not name:
            return []
        self.cur.execute(CONSTRAINT_COLUMNS_SQL, {"table": self.plan.target, "name": name})
        return [row[0] for row in self.cur.fetchall()]

    def _column(self, name: str | None) -> str | None:
        if name is None:
            return None
        name = name.strip()
        for _, target in self.plan.columns:
            if target == name or f'"{target}"' == name:
                return target
        return name

    def _reject(self, reject: Reject) -> None:
        self.rejects.append(reject)
        if self.plan.dead_letter is None:
            raise RowRejected(self._detail(reject))

    def _detail(self, reject: Reject) -> dict[str, Any]:
        sources = self.plan.sources
        if self.table.num_rows == 0:  # refused while streaming: gather the rows first
            self.table = self.rows.table()
        if reject.columns:
            return self._detail_of_columns(reject)
        return {
            "reason": self.secrets.mask(reject.reason),
            "sqlstate": reject.sqlstate,
            "column": sources.get(reject.column or "", reject.column),
            "target_column": reject.column,
            "value": value_text(self.table, reject.row, reject.column),  # ROW = position
            "value_json": cell_json(self.table, reject.row, reject.column),  # another target's
            "row": row_json(self.table, reject.row, sources),
            "partition": self.partition,
        }

    def _detail_of_columns(self, reject: Reject) -> dict[str, Any]:
        """:meth:`_detail` of a row a constraint over several columns refused: ``column``
        names them all (``"starts_at, ends_at"``, the batch's names), ``value`` is the JSON
        object of their values in the row (``{"starts_at": ..., "ends_at": ...}``)."""
        sources = self.plan.sources
        values = cells_json(self.table, reject.row, reject.columns, sources)
        return {
            "reason": self.secrets.mask(reject.reason),
            "sqlstate": reject.sqlstate,
            "column": ", ".join(sources.get(c, c) for c in reject.columns),
            "target_column": ", ".join(reject.columns),
            "value": jsonb_safe(values),
            "value_json": values,
            "row": row_json(self.table, reject.row, sources),
            "partition": self.partition,
        }

    def _dead_letters(self) -> list[dict[str, Any]]:
        return [self._detail(r) for r in self.rejects]

    def _write_dead_letters(self) -> None:
        # another attempt at this partition may be writing the same records: one at a time
        lock = letters_lock(self.meta.pipeline, self.plan.sink, self.meta.batch_id, self.partition)
        self.cur.execute("SELECT pg_advisory_xact_lock(%(lock)s)", {"lock": lock})
        self.cur.execute(self.sql.dead_delete, self.key)
        if self.rejects:
            self.cur.executemany(
                self.sql.dead_insert,
                [
                    {
                        **self.key,
                        "target": self.plan.table,
                        "reason": d["reason"],
                        "column_name": d["column"],
                        "value": d["value"],
                        "row": jsonb_safe(d["row"]),
                    }
                    for d in self._dead_letters()
                ],
            )

    def _duplicate_detail(self) -> dict[str, Any]:
        self.cur.execute(self.sql.duplicate_probe, {})
        found = self.cur.fetchone()
        keys = dict(zip(self.plan.keys, found[:-1], strict=True)) if found else {}
        return {
            "reason": f"key {json.dumps(keys, default=str)} occurs {found[-1] if found else 2} "
            "times in this batch; set option 'order_by' to the column deciding which row "
            "wins (ON CONFLICT DO UPDATE cannot affect a row twice in one statement)",
            "sqlstate": "21000",
            "column": None,
            "value": None,
            "value_json": None,
            "row": None,
            "partition": self.partition,
        }


class _Restage(Exception):
    """A direct COPY met a refused row (upsert): the rows are staged."""


def _untranslatable(table: pa.Table, position: int, reason: str) -> str | None:
    """The column of a row a COPY refused with 22P05 (a character the database's encoding
    has not) or 22021 (bytes that are not UTF-8, which a Spark string may hold): the server
    names the bytes, not the column (it converts whole lines)."""
    found = re.search(r"byte sequence (?:for encoding \S+ )?((?:0x[0-9a-f]{2} ?)+)", reason)
    if found is None:
        return None
    sequence = bytes(int(b, 16) for b in found.group(1).split())
    for name in table.column_names:
        column = table.column(name)
        if name == ROW or not (
            pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
        ):
            continue
        value = column.slice(position, 1).cast(pa.large_binary())[0].as_py()
        if value is not None and sequence in value:
            return name
    return None


def _unique(table: pa.Table, keys: tuple[str, ...]) -> bool:
    """Whether no key occurs twice in ``table`` (by Arrow's equality)."""
    if not keys or table.num_rows == 0:
        return True
    if len(keys) == 1:
        column = table.column(keys[0])
        if column.null_count == 0 and pa.types.is_integer(column.type):
            # a sort is ~6x faster than count_distinct's hash table on integer keys
            ordered = np.sort(column.to_numpy())
            return not bool((ordered[1:] == ordered[:-1]).any())
        return int(pc.count_distinct(column, mode="all").as_py()) == table.num_rows
    return int(table.group_by(list(keys)).aggregate([]).num_rows) == table.num_rows


def _lift_command(scope: str) -> str:
    """The ``fanout ledger lift-fence`` that lifts the fence closing ``scope`` (a
    pipeline's scope, :func:`fanout.contract.batch.pipeline_scope`): of the start of the
    epoch after it."""
    _, at, number = scope.rpartition("@e")
    epoch = int(number) if at and number.isdigit() else 0
    return (
        f"`fanout ledger lift-fence --config PIPELINE.toml --epoch {epoch + 1}` "
        "(PIPELINE.toml: the pipeline's file)"
    )
