"""Whether the PostgreSQL sink's table holds a batch, and whether it is the table the
batch was written to: the answers of :meth:`~fanout_postgres.sink.PostgresSink.holds_batch`
(and ``holds_batch_of``) and :meth:`~fanout_postgres.sink.PostgresSink.target_replaced`,
asked at a run's start and a new epoch's start, never per batch.

They read the sink's records in ``state_schema`` (progress marks: append;
``upsert_routes`` rows: upsert, :mod:`fanout_postgres.membership`), which outlive the
table: each answer first asks whether the table is there, and which table the records
name (its OID, migration ``0006_target_oid``; the option as written, ``target``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fanout.contract.dead_letters import DeadLetterTarget
from fanout.contract.sink import PartlyHeld
from fanout.deadletters.held import refused_rows_held
from fanout.observe.secrets import redact
from fanout_postgres.deadletter import PostgresDeadLetters, refused_held
from fanout_postgres.identifiers import TableName, parse_table
from fanout_postgres.membership import (
    REPLACED_UNDER_ITS_NAME,
    SinkRecords,
    committed_partitions,
    current_oid,
    letters_waiting,
    moved_marks,
    relation_bytes,
    tables_now,
    target_oids,
    upsert_records,
)
from fanout_postgres.plan import reflect

logger = logging.getLogger("fanout_postgres.sink")  # the sink's: its records keep that name


@dataclass(frozen=True)
class AllCommitted:
    """Every partition of the batch committed, by the records :func:`read_held` read:
    held whole once their refused rows are in the dead-letter target too
    (:func:`letters_held`)."""

    partitions: int
    """How many partitions committed it."""
    count: int | None
    """The partition count the records agree on (``None``: they disagree, or record none)."""
    waiting: int
    """The refused rows they keep or count that no PostgreSQL table holds."""
    unknown: bool
    """Upsert rows of an older fanout left some uncounted (:func:`letters_held`)."""


@dataclass(frozen=True)
class BatchLetters:
    """Where the refused rows of one batch are looked for once its every partition
    committed: the sink's dead-letter target ``dead``, under sink ``records_of``'s records
    of batch ``batch_id`` of ``epoch`` of ``pipeline`` (another name than the sink's own
    when it asks for a name it had before)."""

    dead: DeadLetterTarget | None
    pipeline: str
    epoch: int
    batch_id: int
    records_of: str
    logged_as: str
    """The sink's own name, in the log."""
    secrets: Callable[[], Sequence[str]]
    """What to redact in the log (the sink's ``secret_values``, asked only when logging)."""


def target_gone(conn: Any, table: TableName | None) -> bool:
    """Whether the table is missing (nothing created it since: ``open()`` does not)."""
    return table is not None and reflect(conn, table) is None


def read_held(
    conn: Any,
    records: SinkRecords,
    dead: DeadLetterTarget | None,
    name: str,
    scope: str,
    batch_id: int,
) -> bool | PartlyHeld | AllCommitted | None:
    """What the records of sink ``name`` (the sink's own, or, by ``holds_batch_of``, those
    of another name, first matched to this table by OID) say of batch ``batch_id`` of
    pipeline scope ``scope``: the answer (a missing table holds nothing; another's records
    of another table, ``False``, of an older fanout, ``None``; the sink's own naming a
    table moved since, ``None``: :func:`moved`; some partitions, :class:`PartlyHeld`), or
    :class:`AllCommitted` with the refused rows waiting for ``dead`` (append: a second
    query). Records of the other mode answer when the mode's own hold none of it
    (:func:`other_mode`). The sink's ``holds_batch`` documents the whole answer."""
    if target_gone(conn, records.table):
        return False
    if name != records.sink:
        table = records.table
        assert table is not None  # target_gone said it is there
        oids = set(target_oids(conn, records.state_schema, records.mode, scope, name,
                               batch_id).values())  # fmt: skip
        if current_oid(conn, table.quoted()) not in oids:
            return None if oids == {None} else False
    mode: str = records.mode
    if name == records.sink and moved(conn, records, scope, batch_id):
        return None
    read = _records(conn, records.state_schema, dead, mode, scope, name, batch_id)
    if not read[1] and name == records.sink:  # none: written in the other mode?
        other = other_mode(conn, records, scope, batch_id, said=True)
        if other is not None:
            mode, read = other, _records(conn, records.state_schema, dead, other, scope, name,
                                         batch_id)  # fmt: skip
    counts, partitions, waiting, unknown = read
    count = counts.pop() if len(counts) == 1 else None
    held = _held(len(partitions), count)
    if held is not True:
        return held
    if mode == "append":
        waiting = sum(letters_waiting(conn, records.state_schema, scope, name,
                                      batch_id).values())  # fmt: skip
    return AllCommitted(len(partitions), count, waiting, unknown)


def letters_held(committed: AllCommitted, letters: BatchLetters) -> bool | PartlyHeld | None:
    """The answer for a batch whose every partition committed (:func:`read_held`): held
    whole once the rows they refused are in the dead-letter target (``letters.dead``),
    which, when it can tell (``read_rows``: a Delta table), is asked how many it holds of
    the batch; fewer, or a target that cannot tell or none, is a :class:`PartlyHeld` naming
    them. Upsert rows of an older fanout count none: :func:`_uncounted_letters`."""
    if committed.unknown:
        return _uncounted_letters(letters)
    waiting = committed.waiting
    if waiting and _letters_kept(letters) < waiting:
        return PartlyHeld(committed.partitions, committed.count, letters=waiting)
    return True


def _records(
    conn: Any,
    state_schema: str,
    dead: DeadLetterTarget | None,
    mode: str,
    scope: str,
    name: str,
    batch_id: int,
) -> tuple[set[int | None], set[int], int, bool]:
    """The partition counts and partitions sink ``name``'s records of ``mode`` (progress
    marks: append; ``upsert_routes`` rows: upsert) hold of the batch, with upsert's
    refused rows waiting for the dead-letter target and whether an older fanout's rows
    left some uncounted (append's waiting letters: read once the batch is held whole,
    :func:`read_held`). One query."""
    if mode == "append":
        marks = committed_partitions(conn, state_schema, scope, name, batch_id)
        return {m.partitions for m in marks}, {m.partition for m in marks}, 0, False
    recorded = upsert_records(conn, state_schema, scope, name, batch_id)
    unknown = any(r.refused is None for r in recorded.values())
    if unknown and isinstance(dead, PostgresDeadLetters):
        unknown = not refused_held(conn, dead.table, scope, name, batch_id)
    waiting = sum(r.waiting for r in recorded.values())
    return {r.partitions for r in recorded.values()}, set(recorded), waiting, unknown


def other_mode(
    conn: Any, records: SinkRecords, scope: str, batch_id: int, *, said: bool
) -> str | None:
    """The other mode than the sink's ``mode`` now when its records (progress marks:
    append; ``upsert_routes`` rows: upsert) hold the sink's batch ``batch_id``, the
    sink's own mode's records holding none (its callers read those first): ``mode``
    switched between runs, after the batch was marked, and the batch's rows are in
    the table all the same; ``said``: logged, saying what the switch means for the
    batches after it. ``None``: they hold none of it either. One query, asked by
    :func:`read_held` and :func:`replaced` only when the mode's own records hold none of
    the batch. Up to this version those read the mode's own records only, and a switch
    between runs read as a table created again empty (docs/architecture.md §8.2, "A mode
    switched between runs")."""
    other = "upsert" if records.mode == "append" else "append"
    if not target_oids(conn, records.state_schema, other, scope, records.sink, batch_id):
        return None
    if said:
        then = (
            "appends each row of its later batches: a key the table holds already is "
            "a second row, or under a unique index a refused row (kept in the "
            "dead-letter target; without one its batch fails, naming the row)"
            if records.mode == "append"
            else "upserts its later batches by key"
        )  # fmt: skip
        logger.warning(
            "sink %r: batch %d (%s) was written in %s mode, and the sink is in %s mode "
            "now: option 'mode' switched since; the table holds the batch by its %s "
            "records, and the sink %s",
            records.sink, batch_id, scope, other, records.mode, other, then,
        )  # fmt: skip
    return other


def moved(conn: Any, records: SinkRecords, scope: str, batch_id: int) -> bool:
    """In ``holds_batch``: whether the sink's progress marks (upsert: its
    ``upsert_routes`` rows, from migration ``0008_upsert_routes_target``) of the batch
    recorded another table than the sink's now
    (:func:`~fanout_postgres.membership.moved_marks`: ``table`` moved since), logged.
    They say nothing of the table named now: "cannot tell" (``None``), so a checkpoint
    reset's start writes the batch into it (not refused, no lost mark recorded for a
    batch it lacks) and a run's lost-target check lets a moved table pass as before
    (:func:`replaced` still names an empty one)."""
    table = records.table
    assert table is not None  # target_gone said it is there
    found = moved_marks(conn, records.state_schema, scope, records.sink, batch_id,
                        table.quoted(), records.mode)  # fmt: skip
    if found is None:
        return False
    logger.warning(
        "sink %r: its %s of batch %d (partition(s) %s) name table %s (OID %d), not %s, "
        "its table now: option 'table' moved since; they cannot tell whether %s holds "
        "the batch",
        records.sink, "progress marks" if records.mode == "append" else "upsert_routes rows",
        batch_id, found.partitions, found.table, found.oid, table, table,
    )  # fmt: skip
    return True


def _uncounted_letters(letters: BatchLetters) -> bool | None:
    """Upsert, every partition committed, some by an older fanout, whose rows count no
    refused row (before migration ``0007_upsert_routes_refused``): held whole without a
    dead-letter target (nothing can wait for one) or when the target holds refused rows
    of the batch (a Delta table's ``read_rows``: the driver writes a batch's in one
    write, after every partition; a ``postgres:`` table, read by :func:`read_held`:
    the partitions wrote them in their transactions); else ``None``, logged: it cannot
    tell a batch that refused none from one whose refused rows never reached the
    target, so no lost mark is recorded for it (its replay would skip them) and a
    reset is not refused for it either."""
    dead, epoch, batch_id = letters.dead, letters.epoch, letters.batch_id
    if dead is None or _letters_kept(letters) > 0:
        return True
    text = (
        f"its upsert_routes rows of epoch {epoch} were written by an older fanout, which "
        f"counted no refused row, and {dead.describe()} holds none of the batch: "
        "cannot tell whether it refused none or the driver never wrote them there"
    )
    masked = redact(text, letters.secrets())
    logger.warning("sink %r, batch %d: %s", letters.logged_as, batch_id, masked)
    return None


def _letters_kept(letters: BatchLetters) -> int:
    """How many refused rows of the batch the dead-letter target holds
    (:func:`fanout.deadletters.held.refused_rows_held`: 0 when it cannot tell, or
    there is none, or the read fails, logged: the batch then counts as part held)."""
    key = (letters.epoch, letters.batch_id)
    return refused_rows_held(letters.dead, letters.pipeline, letters.records_of, key,
                             secrets=letters.secrets(), logger=logger)  # fmt: skip


def replaced(conn: Any, records: SinkRecords, table: TableName, scope: str, batch_id: int
             ) -> str | None:  # fmt: skip
    """Why ``table`` is not the one the batch's records name
    (:meth:`~fanout_postgres.sink.PostgresSink.target_replaced`), logged; ``None`` when it
    is, or cannot tell."""
    state_schema, sink = records.state_schema, records.sink
    mode: str = records.mode
    oids = target_oids(conn, state_schema, mode, scope, sink, batch_id)
    if not oids:  # none: written in the other mode? (switched between runs)
        mode = other_mode(conn, records, scope, batch_id, said=False) or mode
        oids = target_oids(conn, state_schema, mode, scope, sink, batch_id)
    now = current_oid(conn, table.quoted())
    gone = {p for p, oid in oids.items() if oid is not None and oid != now}
    if not gone:
        return None
    # the recorded table still there under the same name in another schema: the name
    # resolves to another table than it did (the search path changed), not a copy
    gone_oids = {oid for p, oid in oids.items() if p in gone and oid is not None}
    elsewhere = sorted(
        found
        for found in tables_now(conn, gone_oids).values()
        if parse_table(found).name == table.name
    )
    if relation_bytes(conn, table.quoted()) > 0:
        if elsewhere:
            logger.warning(
                "sink %r: table %s (OID %s) is not the table batch %d was written to, "
                "%s, which is still there: the name %s resolves to another table than "
                "then (the search path changed: the URL's options, or the role's or "
                "database's search_path?); the sink writes into %s now",
                sink, table, now, batch_id, ", ".join(elsewhere), table.name, table,
            )  # fmt: skip
            return None
        logger.info(
            "sink %r: table %s (OID %s) is not the table batch %d was written to (OID "
            "%s), but holds rows (restored from a dump?): its records answer",
            sink, table, now, batch_id,
            ", ".join(sorted({str(oids[p]) for p in gone})),
        )  # fmt: skip
        return None
    # their records name the table: moved, not created again? (an upsert's from 0008)
    found_moved = moved_marks(conn, state_schema, scope, sink, batch_id, table.quoted(), mode)
    if found_moved is not None:
        logger.warning(
            "sink %r: table %s (OID %s), empty, is not table %s (OID %d), which "
            "partition(s) %s of batch %d were written to: option 'table' moved since",
            sink, table, now, found_moved.table, found_moved.oid, found_moved.partitions,
            batch_id,
        )  # fmt: skip
        return (
            f"partition(s) {', '.join(str(p) for p in found_moved.partitions)} of batch "
            f"{batch_id} were written to table {found_moved.table} (OID {found_moved.oid}; "
            f"their records in state_schema), and the sink's option 'table' names {table} "
            f"now (OID {now}), which holds no row: the table was moved, not created "
            f"again, and the batches written before stay in {found_moved.table}"
        )
    logger.warning(
        "sink %r: table %s (OID %s), empty, is not the table partition(s) %s of batch "
        "%d were written to (OID %s): renamed away or dropped, and created again since",
        sink, table, now, sorted(gone), batch_id,
        ", ".join(sorted({str(oids[p]) for p in gone})),
    )  # fmt: skip
    return (
        f"table {table} has OID {now} now, not "
        f"{', '.join(sorted({str(oids[p]) for p in gone}))}, which partition(s) "
        f"{', '.join(str(p) for p in sorted(gone))} of batch {batch_id} were written to "
        f"(their records in state_schema), and holds no row: {REPLACED_UNDER_ITS_NAME} "
        "since (accepted, a batch the old table took whose ledger mark was lost is "
        "written whole into this one at its replay)"
        + (
            f"; or the search path changed (the URL's options, or the role's or "
            f"database's search_path): the table written to is {', '.join(elsewhere)}, "
            f"still there; set the search path back, or option table to it, and restart"
            if elsewhere else ""
        )
    )  # fmt: skip


def _held(committed: int, partitions: int | None) -> bool | PartlyHeld:
    """``holds_batch``'s answer for ``committed`` of ``partitions`` partitions (``None``:
    the records disagree on the count, or record none, so the whole cannot be told)."""
    if committed == 0:
        return False
    if partitions is not None and committed >= partitions:
        return True
    return PartlyHeld(committed, partitions)
