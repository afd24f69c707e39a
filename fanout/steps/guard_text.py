"""The texts of the checkpoint guard's refusals (:mod:`fanout.steps.guard`) and the facts they
share with ``fanout recover``: what happened, what the ledger knows per sink, how to
proceed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC

from fanout.contract.batch import BatchInfo
from fanout.contract.plans import describe_plan
from fanout.errors import shell_word
from fanout.ledger.entry import LedgerEntry

NEW_PIPELINE = (
    "  2. Or start from a new checkpoint whose source begins right after the offsets of "
    "the sink furthest behind above (e.g. as Kafka startingOffsets), under a new "
    "pipeline name so the sinks' transaction ids start afresh; sinks further ahead then "
    "receive their last batches again."
)


def new_epoch_way(config: str | None, *, in_code: bool = True) -> str:
    """How to start a new epoch: ``fanout run CONFIG --new-epoch`` for the pipeline file
    ``config``, ``FanOut(..., on_checkpoint_reset="new_epoch")`` for a ``FanOut`` built in
    code (``in_code``), both when neither is known (``fanout recover`` without
    ``--config``)."""
    if config is not None:
        return f"`fanout run {config} --new-epoch`"
    code = 'FanOut(..., on_checkpoint_reset="new_epoch")'
    if in_code:
        return code
    return f"`fanout run PIPELINE.toml --new-epoch` for a pipeline file, {code} in code"


def new_epoch_line(config: str | None) -> str:
    """Choice 3 of a refused reset: continue under a new epoch, as the pipeline runs
    (``config``: its pipeline file, ``None``: a ``FanOut`` built in code)."""
    return (
        "  3. Or, accepting that the new query's batches are written as new data even where "
        f"they repeat old input, continue under a new epoch: {new_epoch_way(config)}"
        + (" (this run only: later runs refuse resets again)." if config is not None else ".")
    )


def describe_entry(entry: LedgerEntry) -> str:
    """A sink's last committed batch: ``<sink>: batch N, query id Q, source offsets ...``."""
    plan = describe_plan(entry.offsets(), entry.batch_timestamp_ms, recorded=True)
    return f"{entry.sink}: batch {entry.batch_id}, query id {entry.query_id}, {plan}"


@dataclass(frozen=True)
class SinkMarks:
    """Each sink's last mark, split by whether the pipeline still writes the sink.

    ``written``: the sinks with a mark (or, lagging, a spooled batch) at or after the
    high-water mark of the newest epoch minus one. Spark plans batch N+1 only after
    committing N, and fanout lets batch N commit only once every configured sink marked it
    or lags with it in the spool, so every sink the pipeline writes holds one of the last two
    batches (the last may be marked by some sinks only: a crash between two marks). The
    sink furthest behind among them decides where a new checkpoint resumes.
    ``not_written``: the others: sinks taken out of the pipeline (their old marks would make
    a recovery write every later batch again to the sinks that hold it), or marks of an
    earlier epoch.
    """

    written: dict[str, LedgerEntry]
    not_written: dict[str, LedgerEntry]

    @property
    def furthest_behind(self) -> LedgerEntry | None:
        """The written sink with the lowest batch id: a new checkpoint resumes after it."""
        if not self.written:
            return None
        return min(self.written.values(), key=lambda e: (e.batch_id, e.sink))


def sink_marks(
    latest: Mapping[str, LedgerEntry], spooled: Mapping[str, int] | None = None
) -> SinkMarks:
    """:class:`SinkMarks` of each sink's last mark (``latest``); ``spooled``: the last batch
    the spool holds for each lagging sink, which counts as written."""
    if not latest:
        return SinkMarks({}, {})
    epoch = max(entry.epoch for entry in latest.values())

    def reached(entry: LedgerEntry) -> int:
        return max(entry.batch_id, (spooled or {}).get(entry.sink, entry.batch_id))

    high = max(reached(e) for e in latest.values() if e.epoch == epoch)
    written = {
        sink: entry
        for sink, entry in latest.items()
        if entry.epoch == epoch and reached(entry) >= high - 1
    }
    others = {sink: entry for sink, entry in latest.items() if sink not in written}
    return SinkMarks(written, others)


def not_written_line(entry: LedgerEntry, epoch: int) -> str:
    """A sink the pipeline no longer writes: ``<sink>: not written since batch N ...``."""
    where = f" of epoch {entry.epoch}" if entry.epoch != epoch else ""
    return (
        f"{entry.sink}: not written since batch {entry.batch_id}{where} (query id "
        f"{entry.query_id}): removed from the pipeline? It does not decide where to resume"
    )


@dataclass(frozen=True)
class LedgerFacts:
    """What every refusal of the guard tells besides the batch: each sink's last mark and
    the command that prints these facts again.

    ``latest``: each sink's last committed entry in the epoch; ``ledger``: the pipeline's
    ledger as commands name it (:func:`fanout.ledger.entry.ledger_location`), so the
    command runs as printed; ``spooled``: the last batch the spool holds for each lagging
    sink (it counts as written, at that batch); ``spool``: the spool as commands name it;
    ``config``: the pipeline file (``fanout run``'s), which names both (and the sinks,
    which ``fanout recover --config`` asks); ``None``: a ``FanOut`` built in code.
    """

    latest: Mapping[str, LedgerEntry]
    ledger: str
    spooled: Mapping[str, int] | None = None
    spool: str | None = None
    config: str | None = None

    def sink_lines(self) -> list[str]:
        """Each sink's last committed batch, the sinks the pipeline still writes first
        (:func:`sink_marks`); none when the ledger holds no mark."""
        if not self.latest:
            return []
        spooled = self.spooled or {}
        marks = sink_marks(self.latest, spooled)
        lines = ["Last committed batch per sink (from the ledger):"]
        for sink in sorted(marks.written):
            line = f"  - {describe_entry(self.latest[sink])}"
            through = spooled.get(sink)
            if through is not None and through > self.latest[sink].batch_id:
                line += (
                    f"; it lags, and its batches up to {through} wait in the spool (they "
                    f"reach it from there: count it at batch {through})"
                )
            lines.append(line)
        epoch = max((e.epoch for e in marks.written.values()), default=0)
        for sink in sorted(marks.not_written):
            lines.append(f"  - {not_written_line(marks.not_written[sink], epoch)}")
        return lines

    def still_running_lines(self, info: BatchInfo, query: str | None) -> list[str]:
        """What the refusal of ``info`` means when the query whose batches the ledger holds
        (``query``; ``None``: the newest mark's, of another query than ``info``'s) was not
        replaced but still runs: two queries of one pipeline on two checkpoints (two
        ``fanout run`` of pipeline files of one name, or two ``FanOut`` queries in code).
        The ledger cannot tell the two apart; the newest mark's time lets the operator.
        The first of the ways on (after "How to proceed:"); none when no query is known."""
        others = [
            e for e in self.latest.values()
            if e.query_id != info.query_id and (query is None or e.query_id == query)
        ]  # fmt: skip
        newest = max(
            (e for e in others if e.finished_at is not None),
            key=lambda e: e.finished_at,  # type: ignore[arg-type, return-value]
            default=None,
        )
        if query is None:
            if newest is None or newest.query_id is None:
                return []
            query = newest.query_id
        if newest is None or newest.finished_at is None:
            last = "it has no mark yet"
        else:
            at = newest.finished_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
            last = f"its newest mark: batch {newest.batch_id} by sink {newest.sink}, at {at}"
        return [
            f"  0. First, if query {query} still runs ({last}), this is no reset but the "
            "pipeline running twice, on two checkpoints: stop this query (it wrote nothing) "
            "and leave that one be. The ways below take the pipeline from it, and a new "
            "epoch started while it runs may leave the batch it has in flight in the sinks "
            "twice."
        ]

    def recover_line(self, info: BatchInfo) -> str:
        """The ``fanout recover`` command that prints these facts again."""
        if self.config is not None:
            return (
                f"  `fanout recover --config {self.config}` prints these facts again, with "
                "Kafka startingOffsets, and asks each sink whether it holds a batch written "
                "but never marked."
            )
        with_spool = "" if self.spool is None else f" --spool {self.spool}"
        return (
            f"  `fanout recover --ledger {self.ledger} --pipeline {shell_word(info.pipeline)}"
            f"{with_spool}` "
            "prints these facts again, with Kafka startingOffsets."
        )

    def refusal(self, info: BatchInfo, what: Sequence[str], ways: Sequence[str]) -> str:
        """A refusal's text: ``what`` happened, each sink's last mark, ``How to proceed:``
        the numbered ``ways``, then the ``fanout recover`` command."""
        lines = [*what, *self.sink_lines(), "How to proceed:", *ways, self.recover_line(info)]
        return "\n".join(lines)


RESTART_NEW_PIPELINE = NEW_PIPELINE.replace(
    "Or start from a new", "Or delete this checkpoint and start a new"
)
"""Choice 2 where the checkpoint Spark runs on must go: :data:`NEW_PIPELINE`, deleting it."""


def reset_message(info: BatchInfo, facts: LedgerFacts) -> str:
    """The refusal of a reset: what happened, what the ledger knows per sink, how to
    proceed."""
    what = (
        f"pipeline {info.pipeline!r}: checkpoint reset detected. Spark handed batch "
        f"{info.batch_id} of query {info.query_id}, but the ledger holds batches of this "
        "pipeline committed at or after it by another query id: the checkpoint was deleted "
        "or replaced. fanout refuses to write, because the sinks would silently skip these "
        "batches or write them twice."
    )
    ways = [
        *facts.still_running_lines(info, None),
        "  1. Restore the original checkpoint directory and restart the query; nothing is "
        "lost or duplicated.",
        NEW_PIPELINE,
        new_epoch_line(facts.config),
    ]
    return facts.refusal(info, [what], ways)


def by_hand_message(info: BatchInfo, marks: Sequence[LedgerEntry], facts: LedgerFacts) -> str:
    """The refusal of a query's batch where the ledger holds only marks of a ``FanOut``
    called by hand (no query id, no source offsets): the sinks would skip the query's
    batches. A new epoch writes them."""
    held = "; ".join(
        f"batch {batch}: {'sink' if len(sinks) == 1 else 'sinks'} {', '.join(sorted(sinks))}"
        for batch, sinks in sorted(_sinks_per_batch(marks).items())
    )
    what = (
        f"pipeline {info.pipeline!r}: Spark handed batch {info.batch_id} of query "
        f"{info.query_id}, but the ledger's marks of this pipeline at or after it ({held}) "
        "have no query id and no source offsets: a FanOut called outside a streaming query "
        "(fo(df, batch_id) on a plain DataFrame, in a test or a notebook) wrote them into "
        "this ledger. fanout refuses to write, because the sinks holding them would skip "
        "this query's batches."
    )
    once = " (this run only: later runs refuse resets again)" if facts.config else ""
    ways = [
        "  1. Continue this query under a new epoch, its batches written as new data "
        f"beside the hand-written ones: {new_epoch_way(facts.config)}{once}.",
        "  2. Or run this query under a pipeline name of its own (a new name: no marks), "
        "and keep calls by hand out of this ledger (a ledger or pipeline name for them).",
    ]
    return facts.refusal(info, [what], ways)


def _sinks_per_batch(marks: Sequence[LedgerEntry]) -> dict[int, set[str]]:
    found: dict[int, set[str]] = {}
    for mark in marks:
        found.setdefault(mark.batch_id, set()).add(mark.sink)
    return found


def rollback_message(
    info: BatchInfo, high: int, same_batch: Sequence[LedgerEntry], facts: LedgerFacts
) -> str:
    """The refusal of a rolled-back checkpoint: the batch as Spark planned it now and as the
    ledger recorded it, the later batches the ledger holds, each sink's last batch, and how
    to proceed. ``high`` is the pipeline's high-water mark, ``same_batch`` the ledger's
    committed rows of ``info.batch_id``."""
    cause = (
        f"the ledger holds later batches of this pipeline (up to batch {high})"
        if high > info.batch_id
        else "the ledger recorded that batch of this pipeline as planned differently"
    )
    what = [
        f"pipeline {info.pipeline!r}: checkpoint rolled back. Spark handed batch "
        f"{info.batch_id} of query {info.query_id}, but {cause}: the checkpoint was restored "
        "from a backup or lost its newest offsets/ and commits/ files, so Spark planned the "
        "batch again from the end of the batch before it. The sinks holding the batch would "
        "skip it and lose the rows it holds now; fanout refuses to write.",
        f"  Spark re-planned batch {info.batch_id}: "
        + describe_plan(info.source_offsets, info.batch_timestamp_ms, recorded=False),
    ]
    plans: dict[str, list[str]] = {}
    for entry in same_batch:
        plan = describe_plan(entry.offsets(), entry.batch_timestamp_ms, recorded=True)
        plans.setdefault(plan, []).append(entry.sink)
    for plan, sinks in plans.items():
        label = "sink" if len(sinks) == 1 else "sinks"
        what.append(
            f"  the ledger recorded batch {info.batch_id}: {plan}, committed by {label} "
            + ", ".join(sorted(sinks))
        )
    if high > info.batch_id:
        what.append(
            f"  the ledger holds later batches of this pipeline: up to batch {high} (Spark "
            f"plans batch {info.batch_id + 1} only after committing batch {info.batch_id})"
        )
    ways = [
        f"  1. Restore the newest checkpoint (the one whose offsets/{high} holds the offsets "
        f"and planning time the ledger recorded for batch {high} above) and restart the "
        "query; nothing is lost or duplicated.",
        RESTART_NEW_PIPELINE,
        "  3. Or delete this checkpoint and, accepting that the new query's batches are "
        "written as new data even where they repeat old input, start the new one under a "
        f"new epoch: {new_epoch_way(facts.config)}. It does not apply to this checkpoint "
        "itself: its re-planned batches overlap batches the sinks already hold, so a new "
        "epoch would write those rows twice.",
    ]
    return facts.refusal(info, what, ways)


def owner_message(info: BatchInfo, owner: str, high: int | None, facts: LedgerFacts) -> str:
    """The refusal of a batch of another query id than the one its epoch belongs to: what
    happened, what the ledger knows per sink, how to proceed."""
    held = (
        "no batch of it is marked committed yet (sinks may hold batches written before a crash)"
        if high is None
        else f"the ledger holds its batches up to batch {high}"
    )
    what = (
        f"pipeline {info.pipeline!r}: checkpoint reset detected. Spark handed batch "
        f"{info.batch_id} of query {info.query_id}, but epoch {info.epoch} of this pipeline "
        f"belongs to query {owner} ({held}): the checkpoint was deleted or replaced. fanout "
        "refuses to write, because the sinks would skip the batch ids the other query wrote "
        "or write the same input twice."
    )
    ways = [
        *facts.still_running_lines(info, owner),
        f"  1. Restore the checkpoint of query {owner} (the one epoch {info.epoch} belongs "
        "to) and restart the query; nothing is lost or duplicated.",
        NEW_PIPELINE,
        new_epoch_line(facts.config),
    ]
    return facts.refusal(info, [what], ways)


def superseded_message(info: BatchInfo, owned: int, owner: str | None, facts: LedgerFacts) -> str:
    """The refusal of a batch of a query that owned an earlier epoch (``owned``) than the
    pipeline's current one, whose query is ``owner``: an old checkpoint was restored after a
    reset was accepted under a new epoch. No new epoch may take it."""
    what = (
        f"pipeline {info.pipeline!r}: old checkpoint restored. Spark handed batch "
        f"{info.batch_id} of query {info.query_id}, whose batches are epoch {owned} of this "
        f"pipeline, but the pipeline continues under epoch {info.epoch}"
        + ("" if owner is None else f" (query {owner})")
        + ", started when a checkpoint reset was accepted. fanout refuses to write, also "
        'under on_checkpoint_reset="new_epoch": the later query already wrote the input '
        "this checkpoint would plan next, so a new epoch would write it twice."
    )
    ways = [
        "  1. Restore the newest checkpoint"
        + ("" if owner is None else f" (of query {owner})")
        + " and restart the query; nothing is lost or duplicated.",
        RESTART_NEW_PIPELINE,
    ]
    return facts.refusal(info, [what], ways)
