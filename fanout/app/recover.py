"""``fanout recover``: what the ledger knows when a checkpoint is lost.

Per sink: the last committed batch, its query id and the source offsets and planning time
(Spark's ``batchTimestampMs``) recorded with it: the newest checkpoint is the one whose
``offsets/<N>`` holds them.
The sink furthest behind among those the pipeline still writes (a mark in the newest epoch
at or after its high-water mark minus one: :func:`fanout.steps.guard_text.sink_marks`)
decides where a new checkpoint must start: its batch's end offsets. Sinks whose last mark is
older (taken out of the pipeline, or of an earlier epoch) are listed apart: resuming after
them would write every later batch again to the sinks that hold it. For a Kafka source those
offsets are exactly the ``startingOffsets`` JSON of a new query; for other sources the report
says what they mean.

A sink of the pipeline without a mark in the newest epoch (the pipeline file's, with
``--config``; without it, a sink with marks in earlier epochs only) pulls the resume point
back to before the epoch's first batch when no sink holds a batch past it (the driver died in
that batch before the sink's mark), and is otherwise named with the batches a resume gives up
for it (the first batch committed without it) and the ``fanout ledger skip`` accepting that.
With ``--config`` each sink is also asked whether it holds the batch after its mark, written
but never marked (:mod:`fanout.app.recover_sinks`): its lost mark is counted (and recorded,
but with ``--no-record``) and the refusal's choice printed.

With the pipeline's spool (``--spool``), a lagging sink counts at the last batch of the
epoch the spool holds for it that the catch-up writes after the reset (settled:
:func:`fanout.steps.lag_settle.spooled_through`), with that batch's recorded offsets; a spooled
batch Spark never committed is given up at the reset and named (the new checkpoint reads
its rows again). Without it, a lagging sink counts at its last mark, and a resume there
would give it the batches waiting in the spool twice: the output says the spool was not read.

The report is recorded in the ledger (:func:`record`,
:mod:`fanout.ledger.recovery`): the next epoch starts from it, refused when a query of the
old epoch committed a batch past it meanwhile. ``--no-record`` prints it only (a look at a
healthy pipeline): a recorded report of a pipeline that goes on running refuses the next
reset until ``recover`` runs again, and an unrecorded one checks nothing. A recorded report
does not expire: a report older than the reset is refused, as a report a query ran past.
Its offsets are stale either way (a checkpoint started from them writes the batches since
twice), and a time bound would let the reset that did start from them pass unchecked; the
refusal says when the report was recorded, and running ``recover`` again clears it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fanout.app.recover_sinks import RECORDED_BY, Asked
from fanout.delta_tables.io import one_line
from fanout.errors import FanoutError, batch_ranges
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry
from fanout.ledger.gaps import skip_command
from fanout.spool.index import SpooledBatch
from fanout.steps.guard import latest_per_sink
from fanout.steps.guard_text import (
    SinkMarks,
    describe_entry,
    new_epoch_way,
    not_written_line,
    sink_marks,
)
from fanout.steps.unmarked import (
    Held,
    choice_lines,
    epoch_began,
    lacking_sinks,
    partial_lines,
)


@dataclass(frozen=True)
class Recovery:
    """The recovery facts of one pipeline."""

    pipeline: str
    latest: dict[str, LedgerEntry]
    """Per sink, its last mark, or (``from_spool``) the last batch the spool gives it."""
    spool: str | None = None
    """The spool read (``None``: not read)."""
    from_spool: dict[str, int | None] = field(default_factory=dict)
    """The sinks counted at a spooled batch, each with its last mark of that epoch."""
    given_up: dict[str, tuple[int, ...]] = field(default_factory=dict)
    """Per sink, the spooled batches of the epoch Spark never committed (given up)."""
    sinks: tuple[str, ...] | None = None
    """The pipeline file's sinks (``--config``); ``None``: not known, and the sinks with
    marks in earlier epochs only stand for them."""
    first_batch: int = 0
    """The newest epoch's first batch (:meth:`fanout.ledger.entry.Ledger.epoch_start`; 0
    when no row records it)."""
    ledger: str = "LEDGER"
    """The ledger, as the commands printed name it."""

    @property
    def lacking(self) -> dict[str, LedgerEntry | None]:
        """The pipeline's sinks without a mark (nor a spooled batch) in the newest epoch,
        each with its last mark of an earlier one (``None``: never marked)."""
        epoch = self.epoch
        if not any(e.epoch == epoch for e in self.latest.values()):
            return {}
        names = self.sinks
        if names is None:
            names = tuple(s for s, e in self.latest.items() if e.epoch != epoch)
        return {
            name: self.latest.get(name)
            for name in sorted(names)
            if name not in self.latest or self.latest[name].epoch != epoch
        }

    @property
    def marks(self) -> SinkMarks:
        """The last marks of the sinks with one in the newest epoch, split into the sinks
        the pipeline still writes and the others (:attr:`lacking` left out). With the
        pipeline file's sinks, a sink not among them is one of the others (:attr:`removed`)."""
        lacking, removed = self.lacking, self.removed
        marks = sink_marks(
            {s: e for s, e in self.latest.items() if s not in lacking and s not in removed}
        )
        return SinkMarks(marks.written, {**marks.not_written, **removed})

    @property
    def removed(self) -> dict[str, LedgerEntry]:
        """The sinks with a mark in the newest epoch that the pipeline file (``--config``)
        does not name: taken out of the pipeline, a new checkpoint writes them nothing, so
        they do not decide where it resumes (resuming before a batch the file's sinks all
        hold would write it to them twice). None without ``--config``, or when no sink of
        the file has a mark in the epoch (they would decide nothing then)."""
        if self.sinks is None:
            return {}
        epoch = self.epoch
        named = {s: e for s, e in self.latest.items() if e.epoch == epoch and s in self.sinks}
        if not named:
            return {}
        return {s: e for s, e in self.latest.items() if e.epoch == epoch and s not in self.sinks}

    @property
    def before_first(self) -> bool:
        """Whether a sink without a mark in the newest epoch pulls the resume point back
        to before the epoch's first batch: no sink holds a batch past it. (Batch f + 1 is
        planned only once every configured sink marked f: past it, a sink without a mark
        was not in the pipeline then, and the batches are given up for it instead.)"""
        written = self.marks.written
        return (
            bool(self.lacking)
            and bool(written)
            and max(e.batch_id for e in written.values()) <= self.first_batch
        )

    @property
    def epoch(self) -> int:
        """The newest epoch the ledger holds marks of."""
        return max((e.epoch for e in self.latest.values()), default=0)

    @property
    def furthest_behind(self) -> LedgerEntry | None:
        """The mark with the lowest batch id among the sinks the pipeline still writes, in
        its newest epoch: where a new checkpoint must resume. When a sink without a mark
        pulls it back (:attr:`before_first`): the batch before the epoch's first, with no
        offsets (the ledger holds none of it), named after that sink."""
        if self.before_first:
            return LedgerEntry(
                self.pipeline, min(self.lacking), self.first_batch - 1, "committed",
                epoch=self.epoch,
            )  # fmt: skip
        return self.marks.furthest_behind

    def starting_offsets(self) -> list[Any] | None:
        """Per source, Kafka ``startingOffsets`` JSON after the furthest-behind batch
        (``None`` for a source whose offsets are not Kafka's)."""
        behind = self.furthest_behind
        offsets = behind.offsets() if behind else None
        if offsets is None:
            return None
        return [offset if is_kafka_offsets(offset) else None for offset in offsets]


def is_kafka_offsets(offset: Any) -> bool:
    """Whether a recorded source offset has Kafka's shape: ``{topic: {partition: n}}``."""
    return (
        isinstance(offset, dict)
        and bool(offset)
        and all(
            isinstance(parts, dict)
            and bool(parts)
            and all(str(p).lstrip("-").isdigit() and isinstance(n, int) for p, n in parts.items())
            for parts in offset.values()
        )
    )


def recovery_of(
    pipeline: str,
    committed: Sequence[LedgerEntry],
    spooled: Sequence[SpooledBatch] | None = None,
    spool: str | None = None,
    sinks: Sequence[str] | None = None,
) -> Recovery:
    """The recovery facts from the committed entries of one pipeline and, when the spool
    at ``spool`` was read, its ``spooled`` batches; ``sinks``: the pipeline file's sinks
    (``None``: not known)."""
    from fanout.steps.lag_settle import spooled_through

    named = None if sinks is None else tuple(sinks)
    latest = latest_per_sink([e for e in committed if e.pipeline == pipeline])
    if spooled is None:
        return Recovery(pipeline, latest, sinks=named)
    batches = [b for b in spooled if b.pipeline == pipeline]
    epoch = max([e.epoch for e in latest.values()] + [b.epoch for b in batches], default=0)
    marks = {sink: e.batch_id for sink, e in latest.items() if e.epoch == epoch}
    through = spooled_through(epoch, batches, marks.get, marks)
    from_spool: dict[str, int | None] = {}
    for sink, batch_id in sorted(through.items()):
        if batch_id > marks.get(sink, -1):
            batch = next(b for b in batches if b.key == (epoch, batch_id))
            latest[sink] = _entry_of(sink, batch)
            from_spool[sink] = marks.get(sink)
    given_up: dict[str, tuple[int, ...]] = {}
    for batch in batches:
        for sink in sorted(batch.needed_by) if batch.epoch == epoch else []:
            if batch.batch_id > max(through.get(sink, -1), marks.get(sink, -1)):
                given_up[sink] = (*given_up.get(sink, ()), batch.batch_id)
    return Recovery(pipeline, latest, spool, from_spool, given_up, named)


def _entry_of(sink: str, batch: SpooledBatch) -> LedgerEntry:
    """A spooled batch as the mark the catch-up will write for ``sink``: its recorded
    query id, offsets and planning time."""
    return LedgerEntry(
        batch.pipeline, sink, batch.batch_id, "committed", query_id=batch.query_id,
        rows=batch.rows, source_offsets=batch.source_offsets, epoch=batch.epoch,
        batch_timestamp_ms=batch.batch_timestamp_ms,
    )  # fmt: skip


def _partly_line(behind: LedgerEntry, partly: Sequence[Held]) -> str:
    """What the resume point means when sinks hold part of the batch after their mark."""
    names = ", ".join(h.sink for h in partly)
    batches = ", ".join(str(h.mark + 1) for h in partly)
    return (
        f"Sink {names} holds part of batch {batches} (above): restart the old checkpoint "
        "(choice 1) if it is still there, it needs no resume point. Only for a new "
        f"checkpoint (after the skip above): resume after batch {behind.batch_id}, and "
        f"{names} gets the committed partitions' rows a second time (choice 2)."
    )


def _resume_line(behind: LedgerEntry, marks: SinkMarks, unknown: Sequence[Held] = ()) -> str:
    """Where to resume, and who gets rows a second time there (``unknown``: the sinks
    that cannot tell whether they hold the batch after their mark)."""
    ahead = sorted(s for s, e in marks.written.items() if e.batch_id > behind.batch_id)
    if not ahead:
        doubt = _doubt(behind, unknown)
        if doubt:
            return (
                f"Resume after batch {behind.batch_id}: every sink the pipeline still writes "
                f"holds it; but {doubt}"
            )
        return (
            f"Resume after batch {behind.batch_id}: every sink the pipeline still writes "
            "holds it, so nothing is written twice."
        )
    high = max(e.batch_id for e in marks.written.values())
    return (
        f"Resume after batch {behind.batch_id} (sink {behind.sink!r} is furthest behind); "
        f"{'sink' if len(ahead) == 1 else 'sinks'} {', '.join(ahead)} already "
        f"{'holds' if len(ahead) == 1 else 'hold'} batch {high} and will write its rows "
        "again (a new epoch or a new pipeline name means new transaction ids, so nothing "
        "skips them): duplicates there, unless the sink upserts by key."
        + (f" Also: {doubt}" if (doubt := _doubt(behind, unknown)) else "")
    )


def _doubt(behind: LedgerEntry, unknown: Sequence[Held]) -> str:
    """What the sinks at the resume point that cannot tell whether they hold the batch
    after it may get twice ("" when none): the resume writes that batch to them again."""
    doubtful = sorted((h for h in unknown if h.mark == behind.batch_id), key=lambda h: h.sink)
    if not doubtful:
        return ""
    names = ", ".join(h.sink for h in doubtful)
    batch = behind.batch_id + 1
    return (
        f"{'sink' if len(doubtful) == 1 else 'sinks'} {names} cannot tell whether "
        f"{'it holds' if len(doubtful) == 1 else 'they hold'} batch {batch} (above): if "
        f"{'it does' if len(doubtful) == 1 else 'one does'}, batch {batch}'s rows are "
        "written there a second time (duplicates, unless the sink upserts by key). Make "
        f"{'it' if len(doubtful) == 1 else 'them'} answer (the reason above) and run this "
        "again."
    )


STOP_FIRST = (
    "Stop every query of this pipeline before you act on this, then run it again: a batch "
    "a query still running commits after this report is not counted in it, and a new "
    "checkpoint started here would write that batch's rows again (the report is recorded "
    "in the ledger, so a new epoch started from it is refused when that happened before "
    "it started, and the old query fails naming the batch when it happens after)."
)

NOT_RECORDED = (
    "Not recorded in the ledger (--no-record): a new epoch started from these offsets is "
    "not checked for a batch a query still running commits after this report; before a "
    "reset, stop every query and run this again without --no-record."
)

STOP_FIRST_UNWRITTEN = (
    "Stop every query of this pipeline before you act on this, then run it again: a batch "
    "a query still running commits after this report is not counted in it, and a new "
    "checkpoint started here would write that batch's rows again (the ledger could not "
    "record the report, as the last line says, so a new epoch started from it is not "
    "checked for that)."
)

STOP_FIRST_UNRECORDED = (
    "Stop every query of this pipeline before you act on this, then run it again without "
    "--no-record: a batch a query still running commits after this report is not counted "
    "in it, and a new checkpoint started here would write that batch's rows again."
)

NO_SPOOL = (
    "The spool was not read (--spool): a lagging sink counts at its last mark, though the "
    "catch-up writes it the batches waiting in the spool after a reset too; if the pipeline "
    "has a spool, run this again with --spool."
)


RECORDED = (
    "Recorded in the ledger as report {number}: the next epoch ({way}) starts from it, and "
    "is refused if a batch of epoch {epoch} after it is committed first (then run this again)."
)


def recorded_text(number: int, epoch: int, config: str | None) -> str:
    """:data:`RECORDED` for report ``number`` of ``epoch``, naming how the next epoch
    starts: ``fanout run CONFIG --new-epoch`` with ``--config``, else that or ``FanOut(...,
    on_checkpoint_reset="new_epoch")`` (how the pipeline runs is not known)."""
    from fanout.errors import shell_word

    way = new_epoch_way(None if config is None else shell_word(config), in_code=False)
    return RECORDED.format(number=number, epoch=epoch, way=way)


def record(
    ledger: DeltaLedger, recovery: Recovery, config: str | None = None
) -> tuple[str | None, bool]:
    """Record ``recovery`` in ``ledger`` (:meth:`DeltaLedger.record_recovery`: what the
    next epoch started from it checks), and the line saying so (``None``: it counted no
    batch, nothing to record; ``config``: the pipeline file, ``--config``, for the command
    it names) with whether the ledger holds the report. A ledger that cannot be written
    (read-only credentials) leaves the report unrecorded (``False``): the line says what
    that costs, and the report is rendered with ``unwritten`` so it does not say it is
    recorded."""
    behind = recovery.furthest_behind
    if behind is None:
        return None, True
    counted = {s: e for s, e in recovery.latest.items() if e.epoch == behind.epoch}
    try:
        report = ledger.record_recovery(behind, counted)
    except FanoutError as exc:
        return (
            f"Not recorded in the ledger ({exc}): a new epoch started from these offsets "
            "cannot check that no batch was committed after this report."
        ), False
    return recorded_text(report.number, report.epoch, config), True


NOT_IN_FILE = (
    "not a sink of the pipeline file: a new checkpoint writes it nothing, so it does not "
    "decide where to resume"
)

NO_CONFIG = (
    "The pipeline file was not read (--config): a sink of the pipeline with no mark at all "
    "in the ledger (the driver died in its first batch before its mark, or it never got a "
    "batch) is not seen, and resuming here gives the batches before it up for it; sinks "
    "with marks in earlier epochs only count as the pipeline's. Nor were the sinks asked "
    "whether they hold a batch written but never marked (the new epoch's start asks them, "
    "and refuses it then). Run this again with --config PIPELINE.toml."
)

LOST_RECORDED = (
    "The ledger now records each lost mark (the sink holds the batch; {recorded_by}): "
    "the counts here include it, and the new epoch's start asks the sink about the batch "
    "after it."
)

LOST_NOT_RECORDED = (
    "Not recorded (--no-record): the counts here include each lost mark, the ledger does "
    "not, so a new epoch's start asks the sink about that batch again and is refused "
    "(UnmarkedBatchError); run this again without --no-record before a reset."
)

LOST_UNRECORDABLE = (
    "The lost marks could not be recorded in the ledger ({reason}): the counts here include "
    "each, the ledger does not, so a new epoch's start asks the sink about that batch again "
    "and is refused (UnmarkedBatchError), recording it then if it can."
)


def render(
    recovery: Recovery,
    *,
    recorded: bool = True,
    asked: Asked | None = None,
    unwritten: bool = False,
) -> str:
    """The text ``fanout recover`` prints (``recorded``: the report is recorded in the
    ledger; ``--no-record``: it is not, and the text says what is then not checked;
    ``asked``: the sinks' answers about the batch after their marks, with ``--config``;
    ``unwritten``: the ledger refused the report, which the line after the text says)."""
    partly = [] if asked is None else [h for h in asked.held if h.part is not None]
    unknown = [] if asked is None else [a for a in asked.answers if a.holds is None]
    lines = _facts(recovery, _asked_lines(recovery, asked, recorded), partly, unknown)
    if recovery.latest:
        stop = STOP_FIRST_UNWRITTEN if unwritten else STOP_FIRST
        lines.append(stop if recorded else STOP_FIRST_UNRECORDED)
    if recovery.spool is None and recovery.sinks is None:  # --config: the file has no spool
        lines.append(NO_SPOOL)
    if recovery.sinks is None:
        lines.append(NO_CONFIG)
    return "\n".join(lines)


def _asked_lines(recovery: Recovery, asked: Asked | None, recorded: bool) -> list[str]:
    """What the sinks answered, and for each holding a batch another sink lacks, the
    choice (the lines of :class:`fanout.UnmarkedBatchError`)."""
    if asked is None:
        return []
    lines = [
        f"Asked each sink of {asked.config}, by its own records, whether it holds the batch "
        f"after its mark in epoch {asked.epoch} (written, but never marked):"
    ]
    for answer in sorted(asked.answers, key=lambda a: a.sink):
        lines.append(f"  {answer.sink}: {_answer_text(answer)}")
    for name, why in sorted(asked.not_asked.items()):
        lines.append(f"  {name}: not asked: {why}")
    held = asked.held
    if not held:
        return lines
    if not any(h.whole for h in held):
        pass  # nothing to record: part of a batch gets no lost mark
    elif asked.unrecorded is not None:
        lines.append(LOST_UNRECORDABLE.format(reason=asked.unrecorded))
    else:
        lines.append(
            LOST_RECORDED.format(recorded_by=RECORDED_BY) if recorded else LOST_NOT_RECORDED
        )
    for h in (h for h in held if h.part is not None):
        lines += [
            f"  {line}"
            for line in partial_lines(
                recovery.pipeline, asked.epoch, recovery.ledger, h, asked.offsets[h.sink],
                asked.marks,
            )
        ]  # fmt: skip
    unknown = {a.sink for a in asked.answers if a.holds is None}
    for h in (
        h
        for h in held
        if h.whole and h.harmless is None and lacking_sinks(h.mark + 1, asked.marks, held)
    ):
        choices = choice_lines(
            recovery.pipeline, asked.epoch, recovery.ledger, h, asked.offsets[h.sink],
            asked.marks, held, unknown, refusal=False,
        )  # fmt: skip
        lines += [f"  {line}" for line in choices]
    return lines


def _answer_text(answer: Held) -> str:
    batch = answer.mark + 1
    if answer.holds is None:
        if answer.why is not None:
            return f"cannot tell whether it holds batch {batch}: {one_line(answer.why)}"
        return f"cannot tell whether it holds batch {batch} (the warning logged says why)"
    if not answer.holds and answer.replaced is not None:
        return (
            f"does not hold batch {batch}: its records say it does, but the target was "
            f"replaced since by one created again empty ({one_line(answer.replaced)})"
        )
    if not answer.holds:
        return f"does not hold batch {batch}"
    if answer.part is not None:
        return (
            f"holds part of batch {batch} ({answer.part.text()} committed"
            f"{answer.part.letters_text()}), which the ledger "
            "had no mark of: no lost mark recorded"
        )
    text = f"holds batch {batch}, which the ledger had no mark of"
    if answer.harmless is not None:
        text += f" (writing it again changes nothing there: {answer.harmless})"
    return text


def _spool_note(recovery: Recovery, sink: str) -> str:
    if sink not in recovery.from_spool:
        return ""
    mark = recovery.from_spool[sink]
    own = "no mark in the epoch" if mark is None else f"its last mark is batch {mark}"
    return f" (from the spool: {own}; the catch-up writes it the spooled batches after a reset)"


def _given_up_lines(recovery: Recovery) -> list[str]:
    return [
        f"  {sink}: batch(es) {batch_ranges(list(ids))} in the spool, never committed by "
        "Spark: given up at a reset (the new checkpoint reads their rows again)"
        for sink, ids in sorted(recovery.given_up.items())
    ]


def _lacking_line(recovery: Recovery, sink: str, last: LedgerEntry | None) -> str:
    where = (
        "no mark in the ledger"
        if last is None
        else f"last marked at batch {last.batch_id} of epoch {last.epoch}, query id {last.query_id}"
    )
    return f"{sink}: no mark in epoch {recovery.epoch} ({where})"


def _skip_command(recovery: Recovery, sink: str, through: int) -> str:
    return f"`{skip_command(recovery.ledger, recovery.pipeline, sink, through, recovery.epoch)}`"


def _before_first_lines(recovery: Recovery) -> list[str]:
    """Where to resume when a sink without a mark pulls the resume point back to before
    the epoch's first batch (:attr:`Recovery.before_first`)."""
    first, epoch = recovery.first_batch, recovery.epoch
    names = sorted(recovery.lacking)
    one = len(names) == 1
    holders = sorted(recovery.marks.written)
    removed = (
        ""
        if recovery.sinks is not None
        else f" (without --config a sink with marks in earlier epochs only counts as the "
        f"pipeline's: if {' or '.join(names)} was taken out of it, run this again with "
        "--config PIPELINE.toml)"
    )
    skips = " ".join(_skip_command(recovery, name, first) for name in names)
    return [
        f"Resume before batch {first}, epoch {epoch}'s first: {'sink' if one else 'sinks'} "
        f"{', '.join(names)} {'has' if one else 'have'} no mark in epoch {epoch} (the "
        "driver died in that batch before the mark, or never wrote it there), so resuming "
        f"after batch {first} would give that batch up for {'it' if one else 'them'}"
        f"{removed}. Start the new query where epoch {epoch} began ({epoch_began(first)}; "
        f"the ledger holds no offsets before batch {first}): "
        f"{'sink' if len(holders) == 1 else 'sinks'} {', '.join(holders)} already "
        f"{'holds' if len(holders) == 1 else 'hold'} batch {first} and will write its rows "
        "again (a new epoch means new transaction ids, so nothing skips them): duplicates "
        "there, unless the sink upserts by key.",
        f"Or give batch {first} up for {', '.join(names)}: {skips}, then run this again: "
        f"it resumes after batch {first}.",
    ]


def _unmarked_given_up_lines(recovery: Recovery, behind: LedgerEntry) -> list[str]:
    """The sinks without a mark in the epoch that a resume after ``behind`` gives its
    batches up for (batches past the epoch's first were planned without them)."""
    first, last = recovery.first_batch, behind.batch_id
    span = f"batch {first}" if first == last else f"batches {first}-{last}"
    return [
        f"{sink} gets no {span} of epoch {recovery.epoch} from a new checkpoint resuming "
        f"after batch {last}: batch {first} committed without it, so it was not in the "
        "pipeline then (added since; or taken out, then nothing is missing). To accept "
        f"that it never gets them: {_skip_command(recovery, sink, last)}."
        for sink in recovery.lacking
    ]


def _facts(
    recovery: Recovery,
    asked: list[str],
    partly: Sequence[Held] = (),
    unknown: Sequence[Held] = (),
) -> list[str]:
    """The report's lines; ``partly``: the sinks holding only part of the batch after
    their mark (the resume point printed is then for a new checkpoint only); ``unknown``:
    the sinks that cannot tell whether they hold it."""
    if not recovery.latest:
        return [
            f"pipeline {recovery.pipeline!r}: the ledger holds no committed batch",
            *_given_up_lines(recovery),
            *asked,
        ]
    marks = recovery.marks
    epoch = "" if recovery.epoch == 0 else f" (epoch {recovery.epoch})"
    lines = [f"pipeline {recovery.pipeline!r}{epoch}: last committed batch per sink"]
    for sink in sorted(marks.written):
        lines.append(f"  {describe_entry(marks.written[sink])}{_spool_note(recovery, sink)}")
    for sink, last in recovery.lacking.items():
        lines.append(f"  {_lacking_line(recovery, sink, last)}")
    removed = recovery.removed
    for sink in sorted(marks.not_written):
        entry = marks.not_written[sink]
        if sink in removed:
            lines.append(f"  {describe_entry(entry)}; {NOT_IN_FILE}")
        else:
            lines.append(f"  {not_written_line(entry, recovery.epoch)}")
    lines += _given_up_lines(recovery)
    lines += asked
    if recovery.before_first:
        return lines + _before_first_lines(recovery)
    behind = marks.furthest_behind
    assert behind is not None
    resume = _resume_line(behind, marks, unknown)
    if partly:
        lines.append(_partly_line(behind, partly))
    if not partly or not resume.endswith("nothing is written twice."):
        lines.append(resume)
    lines += _unmarked_given_up_lines(recovery, behind)
    starting = recovery.starting_offsets()
    if starting is None:
        lines.append(
            f"No source offsets were recorded for that batch: the replaced checkpoint's "
            f"offsets/{behind.batch_id} file holds them, if it is still there (one JSON line "
            "per source, after the first two lines)."
        )
        return lines
    for index, offsets in enumerate(starting):
        if offsets is None:
            lines.append(_not_kafka_line(index, behind.offsets()[index]))
        else:
            lines.append(f"Source {index} (Kafka): start a new checkpoint with")
            lines.append(f"  .option(\"startingOffsets\", '{json.dumps(offsets)}')")
    return lines


def _not_kafka_line(index: int, offsets: Any) -> str:
    """What to do with source ``index``'s recorded ``offsets`` that are not Kafka's. A file
    source's ``{"logOffset": N}`` is an index into the replaced checkpoint's file log, not a
    position a new query can be given: say where the list of files read is kept."""
    if isinstance(offsets, dict) and set(offsets) == {"logOffset"}:
        last = offsets["logOffset"]
        return (
            f"Source {index} (files): {json.dumps(offsets)} counts batches of the replaced "
            f"checkpoint's file log, sources/{index}/ (entries 0 to {last}, or the "
            "'.compact' file before them, list the files read so far). Move those files out "
            "of the input directory before starting the new query, which reads every file it "
            "finds there; if that log is gone too, the files in the directory when that "
            "batch was planned (its batchTimestampMs) were read by then, unless "
            "maxFilesPerTrigger held some back. The file source's options "
            "cleanSource=archive and sourceArchiveDir move files out once read, so a lost "
            "checkpoint leaves none to sort."
        )
    return (
        f"Source {index}: offsets {json.dumps(offsets)} are not Kafka offsets; start the new "
        "query so that it reads what comes after them."
    )
