"""The catch-up's read of a missed batch (docs/architecture.md §14.4): from the spool, or
read back from the sink's backfill source and refused when that source cannot give it back
as its ledger mark says it committed it (its rows, its dead letters).

:class:`CatchUpReader` holds what it reads from, given by :class:`fanout.steps.catchup.CatchUp`
(which writes what it reads); it keeps no state of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fanout.contract.batch import BatchInfo
from fanout.errors import BackfillError
from fanout.ledger.entry import LedgerEntry
from fanout.ledger.gaps import skip_command
from fanout.observe.logs import batch_fields
from fanout.routes.batch_routes import TargetOf
from fanout.sink_spec import SinkSpec
from fanout.spool.index import BatchKey
from fanout.steps.lag import Lagging

log = logging.getLogger("fanout")


class CatchUpReader:
    """Reads the batches a lagging sink missed, for its catch-up.

    :param lagging: the lag state (the spool, the backfill sources and their marks).
    :param specs: every sink's spec (its ``lag.backfill_from``).
    :param target_of: a sink's dead-letter target (the backfill source's letters).
    :param spark: the session that reads the spool and the source's letters.
    :param ledger_location: where the ledger is, for the messages.
    """

    def __init__(
        self,
        lagging: Lagging,
        specs: Mapping[str, SinkSpec],
        target_of: TargetOf,
        spark: Any,
        ledger_location: str,
    ) -> None:
        self.lagging = lagging
        self.specs = specs
        self.target_of = target_of
        self.spark = spark
        self.ledger_location = ledger_location

    def read(self, sink: str, key: BatchKey) -> tuple[Any, BatchInfo]:
        """Batch ``key`` as ``sink``'s catch-up writes it, with its context: from the spool,
        else read back from the sink's backfill source (its rows checked against the
        source's ledger mark, :meth:`check_count`, and its dead letters read back with
        them, :meth:`letters`). :class:`LookupError` when it is neither."""
        spool = self.lagging.spool
        spooled = None if spool is None else spool.get(key)
        if spooled is not None:
            assert spool is not None
            return spool.read(self.spark, key), spooled.info()
        source = self.lagging.sources.get(sink)
        origin = self.specs[sink].lag.backfill_from
        if source is None or origin is None:
            raise LookupError(
                f"batch {key[1]} (epoch {key[0]}) is neither spooled nor backfillable"
            )
        mark = self.lagging.source_mark(sink, key)
        table = source.read(key)
        where = f"sink {origin!r} committed batch {key[1]} (epoch {key[0]})"
        self.check_count(sink, origin, key, mark, table.num_rows)
        df = self.spark.createDataFrame(table)
        count = _letter_count(mark)
        if count is None or count:
            letters = self.letters(sink, key, count, df.schema)
            if letters is not None and not table.column_names:
                raise LookupError(
                    f"{where} with {'some' if count is None else count} row(s) set aside as "
                    "dead letters, and its table has no columns yet to read them back with; "
                    "it will once the sink commits a batch"
                )
            df = df if letters is None else df.unionByName(letters)
        info = BatchInfo(self.lagging.pipeline, key[1], epoch=key[0])
        return df, info if mark is None else _info_of(mark)

    def check_count(
        self, sink: str, origin: str, key: BatchKey, mark: LedgerEntry | None, read: int
    ) -> None:
        """Refuse batch ``key`` read back from ``origin`` with ``read`` rows when its ledger
        mark records another count of rows written to its target: a read that lost some of
        the batch's rows, or took another batch's, must not be marked as the new sink's.

        The mark's ``rows`` is what the source's ``write()`` reported as written to its
        target, which :meth:`fanout.contract.sink.BackfillSource.read` gives back: for a
        Delta append, the rows of the batch's commit, without the rows set aside as dead
        letters (counted apart, in ``dead_lettered``, and checked by :meth:`letters`); a
        replay that found the batch written reports the same rows. A backfill source never
        merges (a merge keeps only the latest row per key) and is never routed (its route
        letters would be missing), and a later compaction of its table does not change
        what the batch's commit added. A mark without ``rows`` (``None``: a sink that did
        not report them, or a lost mark, :attr:`fanout.ledger.entry.LedgerEntry.lost`,
        whose counts the sink's records do not tell) cannot be compared: only the read is
        trusted then, and a lost mark says so in the log.
        """
        if mark is not None and mark.lost:
            log.warning(
                "pipeline %s, batch %s, sink %s: backfilled from %s's lost mark of the batch "
                "(recorded at a new epoch's start, without row counts): its %s row(s) read "
                "back and all its dead letters are taken, unchecked",
                self.lagging.pipeline, key[1], sink, origin, read,
                extra=batch_fields(self.lagging.pipeline, key[1], sink),
            )  # fmt: skip
        if mark is None or mark.rows is None or mark.rows == read:
            return
        what = f"committed batch {key[1]} (epoch {key[0]}) with {mark.rows} row(s)"
        where = (self.lagging.pipeline, self.ledger_location)
        if read == 0:
            raise _cannot_backfill(
                where, sink, origin, key,
                f"{what}, but its table holds no commit of it (the table replaced, or its log "
                "cleaned up)",
                f"Restore the table of {origin!r} to a version that holds the batch",
            )  # fmt: skip
        raise _cannot_backfill(
            where, sink, origin, key,
            f"{what}, but the batch's commit in its table gives back {read} row(s) (its "
            "table's log or files changed outside fanout, or a fanout bug: please report it)",
            f"Restore the table of {origin!r} to a version whose commit of the batch holds "
            "its rows",
            wrong="lack rows" if read < mark.rows else "hold rows not its own",
        )  # fmt: skip

    def letters(self, sink: str, key: BatchKey, count: int | None, schema: Any) -> Any:
        """The rows of batch ``key`` that ``sink``'s backfill source set aside as dead
        letters, read back from its dead-letter Delta table with the batch's schema: a sink
        backfilled from it receives the whole batch. The letters are written before the
        batch's commit and mark, so all ``count`` the mark records are there unless they
        were removed since: then :class:`fanout.errors.BackfillError`, nothing read.

        ``count`` ``None`` (a lost mark: unknown): whatever letters the target holds of
        the batch (``None`` when it holds none, or the source has no dead-letter target);
        a target they cannot be read back from refuses, since there may be some."""
        from pyspark.sql import functions as F

        from fanout.deadletters.delta import DeltaDeadLetters

        origin = self.specs[sink].lag.backfill_from
        assert origin is not None
        target = self.target_of(origin)
        where = f"batch {key[1]} (epoch {key[0]})"
        if count is None and target is None:
            return None
        if not isinstance(target, DeltaDeadLetters):
            what = (
                f"may have set rows of {where} aside as dead letters (its mark of the batch was "
                "recorded lost, without counts)"
                if count is None
                else f"set {count} row(s) of {where} aside as dead letters"
            )
            raise LookupError(
                f"sink {origin!r} {what}, which a backfill cannot read back from {target!r} "
                "(only from a Delta table)"
            )
        rows = target.read_rows(self.lagging.pipeline, origin, key)
        if count is None and rows.num_rows == 0:
            return None
        if count is not None and rows.num_rows != count:
            raise _letters_lost(
                (self.lagging.pipeline, self.ledger_location), sink, origin, key, count,
                rows.num_rows, target.path,
            )  # fmt: skip
        parsed = self.spark.createDataFrame(rows).select(F.from_json("row", schema).alias("r"))
        return parsed.select("r.*")


def _letter_count(mark: LedgerEntry | None) -> int | None:
    """The dead letters a backfill source's ``mark`` counts: 0 without a mark, ``None``
    (unknown) for a lost mark."""
    if mark is None:
        return 0
    return None if mark.lost else mark.dead_lettered or 0


def _letters_lost(
    where: tuple[str, str],
    sink: str,
    origin: str,
    key: BatchKey,
    count: int,
    found: int,
    table: str,
) -> BackfillError:
    """The error of a backfill batch whose source's dead letters are not all there."""
    return _cannot_backfill(
        where, sink, origin, key,
        f"set {count} row(s) of batch {key[1]} (epoch {key[0]}) aside as dead letters, but "
        f"Delta table {table} holds {found} of them (deleted, or the table replaced)",
        f"Put the letters back (restore {table} to a version that holds them)",
    )  # fmt: skip


def _cannot_backfill(
    where: tuple[str, str],
    sink: str,
    origin: str,
    key: BatchKey,
    found: str,
    way_back: str,
    *,
    wrong: str = "lack them",
) -> BackfillError:
    """The error of a backfill batch its source cannot give back as its ledger mark says
    it committed it (``where``: the pipeline and its ledger's location as commands name it;
    ``found``: what the mark says and what is there instead; ``way_back``: how to give it
    back; ``wrong``: what would be wrong with the batch read back)."""
    pipeline, ledger = where
    return BackfillError(
        f"cannot be backfilled from sink {origin!r}: its ledger mark says it {found}, so the "
        f"batch read back would {wrong}; nothing of it is written to {sink!r}, which waits "
        f"at this batch. {way_back}, or accept that {sink!r} never gets batch "
        f"{key[1]}: `{skip_command(ledger, pipeline, sink, key[1], key[0])}`, then restart",
        sink=sink,
        batch_id=key[1],
    )


def _info_of(mark: LedgerEntry) -> BatchInfo:
    """A backfill batch's context as its source sink's ledger mark recorded it."""
    return BatchInfo(
        mark.pipeline, mark.batch_id, mark.query_id, mark.offsets(), epoch=mark.epoch,
        batch_timestamp_ms=mark.batch_timestamp_ms,
    )  # fmt: skip
