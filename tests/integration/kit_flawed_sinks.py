"""Sinks of the kind a plugin author writes by mistake, for the tests that the conformance
suite fails them with a message saying what is wrong: one JSON-lines file per batch, named
by the batch's idempotency token (correct) or by its batch id alone (epoch-blind), one file
every batch appends to (no idempotency), a correct one reporting a row too many, ones whose
``holds_batch`` ignores the epoch or answers a part for a whole batch, ones that refuse
a null key or a new column without naming the column, or drop a null key's row (or count
it dead-lettered and never hand it to the dead-letter target, or not again on a replay),
one
calling a rewrite harmless that holds the rows twice, one naming a deterministic column
the batch lacks, ones fencing an epoch wrong (one refusing the fenced write with a
BaseException), one letting its SQLite driver refuse a new column and one refusing it by a
SchemaMismatchError naming none, ones whose ``holds_batch`` answers ``False`` or ``True``
for every batch, one using in ``write()`` a SQLite connection made in ``open()`` (bound to
that thread), and an upsert by ``id`` doing both right."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from pathlib import Path
from typing import Any, ClassVar

from fanout import (
    Batch,
    ConfigurationError,
    IdempotencyKey,
    PartlyHeld,
    SchemaMismatchError,
    Sink,
    SinkContext,
    SinkResult,
    SinkWriteError,
    StableColumns,
    hookimpl,
    txn_app_id,
)
from fanout.contract.dead_letters import DeadLetter
from fanout.contract.sink import Guarantee, Reads


class TokenFiles(Sink):
    """One file per batch named by ``batch.idempotency_key.token``: a replay replaces it."""

    guarantees: ClassVar[tuple[Guarantee, ...]] = ("idempotent",)

    def __init__(self, name: str, *, directory: str, columns: list[str] | None = None) -> None:
        super().__init__(name)
        self.directory = directory
        self.columns = columns  # given: a batch with another column is refused

    @property
    def reads(self) -> Reads:
        return "arrow"

    def open(self, context: SinkContext) -> None:
        Path(self.directory).mkdir(parents=True, exist_ok=True)

    def file_name(self, batch: Batch) -> str:
        """The batch's file."""
        return f"{batch.idempotency_key.token}.jsonl"

    def write(self, batch: Batch) -> SinkResult:
        for column in batch.arrow().column_names:
            if self.columns is not None and column not in self.columns:
                raise SchemaMismatchError(
                    f"column {column!r} is not one of {', '.join(self.columns)}",
                    sink=self.name,
                    batch_id=batch.batch_id,
                    columns=[column],
                )
        rows = batch.arrow().to_pylist()
        final = Path(self.directory) / self.file_name(batch)
        tmp = final.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
        os.replace(tmp, final)
        return SinkResult(rows=len(rows))


class GuaranteesLeftEmpty(TokenFiles):
    """Writes as :class:`TokenFiles` does, and declares ``guarantees = ()``: at-least-once."""

    guarantees: ClassVar[tuple[Guarantee, ...]] = ()


class BatchIdFiles(TokenFiles):
    """Names a batch's file by its batch id alone: a new epoch's batch 0 replaces the old's."""

    def file_name(self, batch: Batch) -> str:
        return f"{batch.sink_name}-{batch.batch_id}.jsonl"


class AppendingFile(TokenFiles):
    """Appends every batch to one file, replays included."""

    def write(self, batch: Batch) -> SinkResult:
        rows = batch.arrow().to_pylist()
        with (Path(self.directory) / "all.jsonl").open("a") as file:
            file.write("".join(json.dumps(row) + "\n" for row in rows))
        return SinkResult(rows=len(rows))


class CountsOneTooFew(TokenFiles):
    """Writes correctly, reports a row fewer than the batch holds (one more than it holds
    fanout itself refuses: SinkResultError)."""

    def write(self, batch: Batch) -> SinkResult:
        return SinkResult(rows=max(super().write(batch).rows - 1, 0))


class WritesOnEmpty(TokenFiles):
    """Writes a row of its own (id -1) for an empty batch."""

    def write(self, batch: Batch) -> SinkResult:
        if batch.arrow().num_rows == 0:
            with (Path(self.directory) / "empty.jsonl").open("a") as file:
                file.write(json.dumps({"id": -1}) + "\n")
            return SinkResult(rows=0)
        return super().write(batch)


class HoldsByBatchId(TokenFiles):
    """Answers ``holds_batch`` by the batch id alone: a batch of another epoch reads held."""

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool:
        return any(Path(self.directory).glob(f"*~{batch_id:012d}.jsonl"))


class HoldsByAFileNeverWritten(TokenFiles):
    """Answers ``holds_batch`` by a file named by the batch id, which ``write()`` never
    makes (it names files by token): ``False`` for every batch, also one it holds."""

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool:
        return (Path(self.directory) / f"{epoch}-{batch_id}.jsonl").exists()


class HoldsEveryBatch(TokenFiles):
    """Answers ``holds_batch`` ``True`` once its directory holds any batch's file, whatever
    batch is asked about."""

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool:
        return any(Path(self.directory).glob("*.jsonl"))


class HoldsAPart(TokenFiles):
    """Answers ``PartlyHeld`` for a batch it wrote whole in one file."""

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool | PartlyHeld:
        written = any(Path(self.directory).glob(f"*~{batch_id:012d}.jsonl"))
        return PartlyHeld(1, 1) if written else False


class IdentityBlind(TokenFiles):
    """Implements ``target_replaced`` but never tells a re-created target (always ``None``)."""

    def target_replaced(self, pipeline: str, epoch: int, batch_id: int) -> str | None:
        return None


class ReplacedWhenEmpty(TokenFiles):
    """Says its target was re-created whenever it holds no row: no identity recorded, so
    a target that is simply empty (an empty batch written to it) reads as replaced."""

    def target_replaced(self, pipeline: str, epoch: int, batch_id: int) -> str | None:
        files = Path(self.directory).glob("*.jsonl")
        return None if any(f.read_text().strip() for f in files) else "it holds no row"


class RecordsAlwaysGone(TokenFiles):
    """Implements ``records_gone`` but says its records are gone about a batch it holds."""

    def records_gone(self, pipeline: str, epoch: int, batch_id: int) -> str | None:
        return "its records are gone"


class NullKeyUnnamed(TokenFiles):
    """Refuses a batch with a null ``id`` without naming the column."""

    def write(self, batch: Batch) -> SinkResult:
        if None in batch.arrow().column("id").to_pylist():
            raise SinkWriteError("a row has no key", sink=self.name, batch_id=batch.batch_id)
        return super().write(batch)


class NullKeyDropped(TokenFiles):
    """Drops the rows with a null ``id`` without a word."""

    def write(self, batch: Batch) -> SinkResult:
        rows = [row for row in batch.arrow().to_pylist() if row["id"] is not None]
        (Path(self.directory) / self.file_name(batch)).write_text(
            "".join(json.dumps(row) + "\n" for row in rows)
        )
        return SinkResult(rows=len(rows))


class NullKeyCountedTwice(TokenFiles):
    """Sets a row with a null ``id`` aside, but counts it in ``rows`` as well as in
    ``dead_lettered`` (fanout refuses the sum: SinkResultError)."""

    def write(self, batch: Batch) -> SinkResult:
        result = super().write(batch)
        nulls = batch.arrow().column("id").null_count
        return SinkResult(rows=result.rows, dead_lettered=nulls)


class NullKeyDeadLettered(TokenFiles):
    """Sets a row with a null ``id`` aside: commits the others with a record of it, then
    hands it to its ``dead_letter`` target; a replay finding the batch committed hands the
    recorded rows over again (the target keeps them once)."""

    def __init__(self, name: str, *, directory: str, dead_letter: str | None = None) -> None:
        super().__init__(name, directory=directory)
        self.dead_letter = dead_letter
        self.letters: Any = None

    def open(self, context: SinkContext) -> None:
        super().open(context)
        self.letters = context.dead_letters

    def write(self, batch: Batch) -> SinkResult:
        final = Path(self.directory) / self.file_name(batch)
        record = final.with_suffix(".refused.json")
        if final.exists():  # committed by an earlier attempt
            refused = json.loads(record.read_text())
            self.hand_over_again(batch, refused)
            rows = len(final.read_text().splitlines())
            return SinkResult(rows, dead_lettered=len(refused), already_written=True)
        rows = batch.arrow().to_pylist()
        refused = [row for row in rows if self.refuses(row)]
        record.write_text(json.dumps(refused))
        final.write_text("".join(json.dumps(row) + "\n" for row in rows if row not in refused))
        self.hand_over(batch, refused)
        return SinkResult(rows=len(rows) - len(refused), dead_lettered=len(refused))

    def refuses(self, row: dict[str, Any]) -> bool:
        """Whether the target refuses the row: its ``id`` is null."""
        return row["id"] is None

    def hand_over(self, batch: Batch, refused: list[dict[str, Any]]) -> None:
        """Writes the refused rows to the dead-letter target, after the commit."""
        letters = [DeadLetter(row, "refused", column="id") for row in refused]
        if letters:
            self.letters.write(batch, letters, source="refused")

    def hand_over_again(self, batch: Batch, refused: list[dict[str, Any]]) -> None:
        """A replay's: the same."""
        self.hand_over(batch, refused)


class NullKeyLettersUnwritten(NullKeyDeadLettered):
    """Counts a row with a null ``id`` as dead-lettered, and never hands it over."""

    def hand_over(self, batch: Batch, refused: list[dict[str, Any]]) -> None:
        """Nothing: the mistake."""


class NullKeyLettersNotHandedAgain(NullKeyDeadLettered):
    """Hands a null ``id``'s row over after its commit, but a replay finding the batch
    committed does not: a kill between the commit and the hand-over loses it."""

    def hand_over_again(self, batch: Batch, refused: list[dict[str, Any]]) -> None:
        """Nothing: the mistake."""


class RefusedNotHandedAgain(NullKeyLettersNotHandedAgain):
    """As :class:`NullKeyLettersNotHandedAgain`, for rows whose ``v`` is ``"refused"``."""

    def refuses(self, row: dict[str, Any]) -> bool:
        """Whether the target refuses the row: its ``v`` is ``"refused"``."""
        return bool(row["v"] == "refused")


class DriverRefusesNewColumn(TokenFiles):
    """Inserts each batch into a SQLite table of ``id`` and ``v`` too (a connection per
    write), letting the driver refuse a new column: ``sqlite3.OperationalError`` ("table t
    has no column named extra"), which fanout wraps as a ``SinkWriteError``."""

    def write(self, batch: Batch) -> SinkResult:
        table = batch.arrow()
        db = sqlite3.connect(Path(self.directory) / "rows.db", isolation_level=None)
        try:
            db.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER, v TEXT)")
            names = ", ".join(table.column_names)
            marks = ", ".join("?" for _ in table.column_names)
            db.executemany(f"INSERT INTO t ({names}) VALUES ({marks})",
                           [tuple(row.values()) for row in table.to_pylist()])  # fmt: skip
        finally:
            db.close()
        return super().write(batch)


class ConnectsInOpen(TokenFiles):
    """Connects to its SQLite progress database in ``open()`` and uses that connection in
    ``write()``: a ``sqlite3`` connection serves only the thread that created it."""

    def open(self, context: SinkContext) -> None:
        super().open(context)
        self.db = sqlite3.connect(Path(self.directory) / "progress.db", isolation_level=None)
        self.db.execute("CREATE TABLE IF NOT EXISTS progress (token TEXT PRIMARY KEY)")

    def write(self, batch: Batch) -> SinkResult:
        token = batch.idempotency_key.token
        self.db.execute("INSERT OR IGNORE INTO progress VALUES (?)", (token,))
        return super().write(batch)

    def close(self) -> None:
        self.db.close()


class NewColumnUnnamed(TokenFiles):
    """Refuses a batch with a column beyond ``id`` and ``v`` without naming it."""

    def write(self, batch: Batch) -> SinkResult:
        if batch.arrow().column_names != ["id", "v"]:
            raise SinkWriteError("unexpected columns", sink=self.name, batch_id=batch.batch_id)
        return super().write(batch)


class NewColumnMismatchUnnamed(TokenFiles):
    """Refuses a batch with a column beyond ``id`` and ``v`` by a ``SchemaMismatchError``
    naming no column."""

    def write(self, batch: Batch) -> SinkResult:
        if batch.arrow().column_names != ["id", "v"]:
            raise SchemaMismatchError(
                "unexpected columns", sink=self.name, batch_id=batch.batch_id, columns=[]
            )
        return super().write(batch)


UPSERT_REASON = "an upsert by id: each id keeps the row written last"


class UpsertFile(TokenFiles):
    """Upserts every batch by ``id`` into one file: a rewrite of a batch is harmless, and
    ``id`` is the batch column it upserts by."""

    def write(self, batch: Batch) -> SinkResult:
        rows = batch.arrow().to_pylist()
        path = Path(self.directory) / "state.jsonl"
        held = {r["id"]: r for r in read_rows(Path(self.directory))} if path.exists() else {}
        held.update({row["id"]: row for row in rows})
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(row) + "\n" for row in held.values()))
        os.replace(tmp, path)
        return SinkResult(rows=len(rows))

    def harmless_rewrite(self) -> str | None:
        return UPSERT_REASON

    def deterministic_columns(self) -> StableColumns | None:
        return StableColumns(["id"], "upserts by")


class RewriteClaimedHarmless(TokenFiles):
    """Says a rewrite is harmless, yet a new epoch's token names a file of its own: the
    rows are then held twice."""

    def harmless_rewrite(self) -> str | None:
        return UPSERT_REASON


class StableByTargetName(TokenFiles):
    """Names, as its deterministic column, the target's name of the key (``order_key``),
    not the batch's (``id``)."""

    def deterministic_columns(self) -> StableColumns | None:
        return StableColumns(["order_key"], "upserts by")


class SecretQuoted(TokenFiles):
    """Quotes its ``token`` in the ConfigurationError its ``open()`` raises, and does not
    declare it a secret."""

    def __init__(self, name: str, *, directory: str, token: str | None = None) -> None:
        super().__init__(name, directory=directory)
        self.token = token

    def open(self, context: SinkContext) -> None:
        if self.token is not None:
            raise ConfigurationError(f"sink {self.name!r}: token {self.token} refused")
        super().open(context)


class SecretDeclared(SecretQuoted):
    """The same, declaring the token a secret: fanout masks it."""

    def secret_values(self) -> list[str]:
        return [self.token] if self.token else []


class SecretLogged(SecretDeclared):
    """Declares its token, and logs it at ``open()``: a real run's redacting handler
    (``fanout run``'s, ``RedactFilter``) masks it, the FanOut having registered it."""

    def open(self, context: SinkContext) -> None:
        logging.getLogger("fanout.kit_flawed").warning("opening with token %s", self.token)
        super().open(context)


class SecretLoggedEarly(SecretDeclared):
    """Declares its token, and logs it in its constructor, before the FanOut building it
    knows its secrets: a real run's log shows it."""

    def __init__(self, name: str, *, directory: str, token: str | None = None) -> None:
        super().__init__(name, directory=directory, token=token)
        logging.getLogger("fanout.kit_flawed").warning("built with token %s", token)


class ChecksByCreating(TokenFiles):
    """Sets read_only_check, yet its open() creates the directory under fanout validate too."""

    read_only_check = True


class ChecksReadOnly(TokenFiles):
    """Sets read_only_check and keeps it: under context.checking it only says what it would."""

    read_only_check = True

    def open(self, context: SinkContext) -> None:
        if context.checking:
            context.would(f"create directory {self.directory}")
        else:
            super().open(context)


class ChecksByRemovingItsLock(ChecksReadOnly):
    """Keeps a lock file in its directory while it runs, and its open() removes a stale one,
    under fanout validate too (validating a running pipeline took its writer's lock)."""

    def open(self, context: SinkContext) -> None:
        (Path(self.directory) / "_lock").unlink(missing_ok=True)
        super().open(context)

    def write(self, batch: Batch) -> SinkResult:
        (Path(self.directory) / "_lock").touch()
        return super().write(batch)


class HoldsByToken(TokenFiles):
    """Answers ``holds_batch`` by the batch's file, named by its idempotency token."""

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool:
        token = IdempotencyKey(txn_app_id(pipeline, self.name, epoch), batch_id).token
        return (Path(self.directory) / f"{token}.jsonl").exists()


class RecordsOutliveTarget(HoldsByToken):
    """Keeps its records in a directory beside the target and answers by them alone: a
    deleted target still reads held."""

    def records(self) -> Path:
        """The directory of its records, beside the target's."""
        return Path(f"{self.directory}.records")

    def write(self, batch: Batch) -> SinkResult:
        result = super().write(batch)
        self.records().mkdir(exist_ok=True)
        (self.records() / batch.idempotency_key.token).touch()
        return result

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool:
        token = IdempotencyKey(txn_app_id(pipeline, self.name, epoch), batch_id).token
        return (self.records() / token).exists()


class ProblemsReadOnly(TokenFiles):
    """Reports a standing problem when its directory holds a ``_damaged`` file, reading
    only."""

    def standing_problems(self) -> tuple[str, ...]:
        damaged = Path(self.directory) / "_damaged"
        return (f"directory {self.directory}: damaged",) if damaged.exists() else ()


class ProblemsAlways(TokenFiles):
    """Reports a standing problem of every target, a healthy one too."""

    def standing_problems(self) -> tuple[str, ...]:
        return ("the directory may be damaged",)


class ProblemsByCreating(ProblemsReadOnly):
    """Creates its directory to look into it when ``fanout status`` asks."""

    def standing_problems(self) -> tuple[str, ...]:
        Path(self.directory).mkdir(parents=True, exist_ok=True)
        return super().standing_problems()


class SecretLearntAtOpen(SecretQuoted):
    """Declares its token only once ``open()`` ran: a FanOut's errors are masked (it asks
    again after a failed open), what ``fanout validate`` prints before it opens it is not."""

    def __init__(self, name: str, *, directory: str, token: str | None = None) -> None:
        super().__init__(name, directory=directory, token=token)
        self.opened_token: str | None = None

    def open(self, context: SinkContext) -> None:
        self.opened_token = self.token
        super().open(context)

    def secret_values(self) -> list[str]:
        return [self.opened_token] if self.opened_token else []


class SecretAsText(SecretQuoted):
    """Returns its token itself from ``secret_values``, not a list holding it."""

    def secret_values(self) -> str:  # type: ignore[override]
        return self.token or ""


class FencedByFile(TokenFiles):
    """Fences an epoch with a file ``_fence-<epoch>`` its writes of that epoch refuse on;
    the lift removes it, saying whether it was there."""

    def fence_file(self, epoch: int) -> Path:
        """The file fencing ``epoch``."""
        return Path(self.directory) / f"_fence-{epoch}"

    def write(self, batch: Batch) -> SinkResult:
        if self.fence_file(batch.info.epoch).exists():
            raise SinkWriteError(f"epoch {batch.info.epoch} is fenced", sink=self.name,
                                 batch_id=batch.batch_id)  # fmt: skip
        return super().write(batch)

    def fence_earlier_epochs(self, pipeline: str, epoch: int) -> None:
        for earlier in range(epoch):
            self.fence_file(earlier).touch()

    def lift_epoch_fence(self, pipeline: str, epoch: int) -> bool | None:
        fence = self.fence_file(epoch - 1)
        there = fence.exists()
        fence.unlink(missing_ok=True)
        return there


class LiftSaysLifted(FencedByFile):
    """Says it lifted a fence whether there was one or not."""

    def lift_epoch_fence(self, pipeline: str, epoch: int) -> bool | None:
        super().lift_epoch_fence(pipeline, epoch)
        return True


class LiftLeavesFence(FencedByFile):
    """Says it lifted the fence, and leaves it."""

    def lift_epoch_fence(self, pipeline: str, epoch: int) -> bool | None:
        return self.fence_file(epoch - 1).exists()


class FenceLeavesOpen(FencedByFile):
    """Fences nothing: a write of the epoch it was to close commits."""

    def fence_earlier_epochs(self, pipeline: str, epoch: int) -> None:
        return None


class FencedEpoch(BaseException):
    """A fence's refusal derived from BaseException, not Exception (so that no ``except
    Exception`` in the sink swallows it): the mistake."""


class FenceRaisesBaseException(FencedByFile):
    """Refuses a fenced write with :class:`FencedEpoch`: fanout lets it go up as raised,
    no BatchFailedError."""

    def write(self, batch: Batch) -> SinkResult:
        if self.fence_file(batch.info.epoch).exists():
            raise FencedEpoch(f"epoch {batch.info.epoch} is fenced")
        return super().write(batch)


def read_rows(directory: Path) -> list[dict[str, Any]]:
    """Every row of every file of ``directory``."""
    return [
        json.loads(line)
        for path in sorted(directory.glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]


@hookimpl
def fanout_sink_types() -> dict[str, type[Sink]]:
    """The flawed sink types, and the correct one."""
    return {"token_files": TokenFiles, "batch_id_files": BatchIdFiles,
            "guarantees_left_empty": GuaranteesLeftEmpty,
            "appending_file": AppendingFile, "counts_one_too_few": CountsOneTooFew,
            "writes_on_empty": WritesOnEmpty, "holds_by_batch_id": HoldsByBatchId,
            "holds_a_part": HoldsAPart, "holds_by_a_file_never_written": HoldsByAFileNeverWritten,
            "holds_every_batch": HoldsEveryBatch,
            "driver_refuses_new_column": DriverRefusesNewColumn,
            "new_column_mismatch_unnamed": NewColumnMismatchUnnamed,
            "connects_in_open": ConnectsInOpen, "identity_blind": IdentityBlind,
            "replaced_when_empty": ReplacedWhenEmpty, "records_always_gone": RecordsAlwaysGone,
            "null_key_unnamed": NullKeyUnnamed,
            "null_key_dropped": NullKeyDropped, "null_key_counted_twice": NullKeyCountedTwice,
            "null_key_dead_lettered": NullKeyDeadLettered,
            "null_key_letters_unwritten": NullKeyLettersUnwritten,
            "null_key_letters_not_handed_again": NullKeyLettersNotHandedAgain,
            "refused_not_handed_again": RefusedNotHandedAgain,
            "new_column_unnamed": NewColumnUnnamed, "upsert_file": UpsertFile,
            "rewrite_claimed_harmless": RewriteClaimedHarmless,
            "stable_by_target_name": StableByTargetName, "secret_quoted": SecretQuoted,
            "secret_declared": SecretDeclared, "secret_logged": SecretLogged,
            "secret_logged_early": SecretLoggedEarly, "checks_by_creating": ChecksByCreating,
            "checks_read_only": ChecksReadOnly,
            "checks_by_removing_its_lock": ChecksByRemovingItsLock, "holds_by_token": HoldsByToken,
            "records_outlive_target": RecordsOutliveTarget,
            "problems_read_only": ProblemsReadOnly, "problems_always": ProblemsAlways,
            "problems_by_creating": ProblemsByCreating,
            "secret_learnt_at_open": SecretLearntAtOpen, "secret_as_text": SecretAsText,
            "fenced_by_file": FencedByFile, "lift_says_lifted": LiftSaysLifted,
            "lift_leaves_fence": LiftLeavesFence,
            "fence_leaves_open": FenceLeavesOpen,
            "fence_raises_base_exception": FenceRaisesBaseException}  # fmt: skip
