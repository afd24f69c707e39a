"""The explicit acknowledgement that a sink never gets some batches (docs/architecture.md
§14.1): ``fanout ledger skip``.

fanout refuses to write a sink past batches it never received
(:class:`fanout.MissedBatchesError`). When they cannot be given back to it (no spool holds
them, no ``backfill_from`` source), the operator may accept the loss: :func:`skip_batches`
records a mark for the sink at the last batch it will never get, so the next batch writes
it again. The mark says so in its ``error`` column; it carries the plan (query id, offsets,
planning time) of another sink's mark of that batch when one exists, so the checkpoint
guard reads it like any mark.

A skip acknowledges batches that are gone, never rows still there: given the pipeline's
spool, it refuses a ``through`` past a batch the spool still holds for the sink, unless
told to give them up too (``release_spooled``: a sink removed for good), which releases
them from the spool at once. A skip made without the spool cannot see them: the pipeline
keeps the batches it gave up in the spool, neither written nor released, and its start-up
names them with the command that releases them (:meth:`fanout.steps.lag.Lagging.given_up`).
Likewise, given the sink's ``backfill_from`` source, it refuses a ``through`` past a batch
that source holds for the sink (its ledger marks it committed, not skipped: what the
backfill reads), unless told to give them up too (``give_up_backfill``).

The epoch defaults to the pipeline's current one while it is its only one (epoch 0).
After a checkpoint reset, a sink may still miss batches of an older epoch (it lags, or
backfills, from before the reset): it gets those first, and a skip meant for them, made in
the current epoch, would give up the current epoch's batches instead. The ledger cannot
always tell (a sink with no mark in an older epoch may not have been configured then, or
may have lagged from its first batch), so once the pipeline has more than one epoch a skip
without an explicit epoch is refused (:class:`OlderEpochSkipError`), naming the sink's
oldest missing batch of an older epoch where the ledger (and the spool, and the backfill
source, when given) shows one (:func:`older_epoch_missed`); an explicit epoch is always
taken as given.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fanout.contract.locations import command_location
from fanout.errors import ConfigurationError, SinkRecordsGoneError, batch_ranges, shell_word
from fanout.ledger.entry import Ledger, LedgerEntry, now_utc

if TYPE_CHECKING:
    from fanout.spool.index import BatchKey
    from fanout.spool.table import Spool

SKIPPED = "skipped"
"""How the ``error`` column of a skip's mark begins."""


def is_skip(entry: LedgerEntry) -> bool:
    """Whether ``entry`` is the mark of :func:`skip_batches`, not of a write."""
    return entry.status == "committed" and says_skipped(entry.error)


def says_skipped(error: str | None) -> bool:
    """Whether a committed mark's ``error`` column is :func:`skip_batches`' (a ledger row
    read as a dict, as ``fanout status`` reads them)."""
    return (error or "").startswith(f"{SKIPPED}:")


LEDGER_UNKNOWN = "LEDGER"
"""What a command names as ``--ledger`` where fanout does not know the ledger (a sink opened
outside a :class:`fanout.FanOut` or ``fanout recover``: ``SinkContext.ledger`` is ``None``),
as ``PIPELINE.toml`` stands for an unknown pipeline file: a word to replace, said so by
:func:`ledger_note` after the command (the earlier ``<the pipeline's ledger>``, pasted into
a shell, was a redirection from a file of that name and an unbalanced quote)."""


def ledger_note(ledger: str | None) -> str:
    """What follows a printed command naming ``--ledger`` (``ledger``: as the command names
    it, ``None``: unknown): nothing where fanout names the ledger; else what
    :data:`LEDGER_UNKNOWN` stands for and why fanout cannot name it, so that the user can."""
    if ledger is not None:
        return ""
    return (
        f" ({LEDGER_UNKNOWN}: the location of the pipeline's ledger, its pipeline.ledger or "
        "the ledger its FanOut is given; fanout cannot name it here, the sink having been "
        "opened outside a FanOut, without SinkContext.ledger)"
    )


def skip_command(ledger: str | None, pipeline: str, sink: str, through: int, epoch: int) -> str:
    """The ``fanout ledger skip`` that records ``sink``'s batches of ``epoch`` through
    ``through`` as given up (:func:`skip_batches`), every value inline: what an error
    prints for a batch the sink cannot complete.

    :param ledger: the ledger as the command names it
        (:func:`fanout.ledger.entry.ledger_location`, ``SinkContext.ledger``); ``None``:
        unknown, named :data:`LEDGER_UNKNOWN` (the message then adds :func:`ledger_note`)."""
    return (
        f"fanout ledger skip --ledger {LEDGER_UNKNOWN if ledger is None else ledger} "
        f"--pipeline {shell_word(pipeline)} --sink {shell_word(sink)} --through {through} "
        f"--epoch {epoch}"
    )


def release_command(
    ledger: str, pipeline: str, sink: str, through: int, epoch: int, spool: str
) -> str:
    """The ``fanout ledger skip`` that gives up ``sink``'s batches of ``epoch`` through
    ``through`` and releases what ``spool`` keeps of them: what fanout names wherever it
    finds batches kept for a sink that will not write them.

    :param ledger: the ledger as the command names it: its location through
        :func:`fanout.contract.locations.command_location` (or an in-memory ledger's name).
    :param spool: the spool's location, named absolute (``command_location``)."""
    return (
        f"{skip_command(ledger, pipeline, sink, through, epoch)} "
        f"--spool {command_location(spool)} --release-spooled"
    )


def status_command(ledger: str, pipeline: str, spool: str) -> str:
    """The ``fanout status`` that lists a pipeline's sinks behind, each ``lagging`` or
    ``catching up`` until the spool keeps nothing for it (without ``--spool`` a lagging
    sink reads ``stopped``; once every sink is live the table has no state column).

    :param ledger: the ledger as the command names it (as :func:`release_command`'s).
    :param spool: the spool's location."""
    return (
        f"fanout status --ledger {ledger} --pipeline {shell_word(pipeline)} "
        f"--spool {command_location(spool)}"
    )


def mark_weight(skip: bool, lost: bool = False) -> int:
    """Of a sink's committed marks of one batch, how far each is believed (the highest
    wins, wherever fanout reads two marks of a batch): a write's own mark (2) over a lost
    mark (1: the sink's own records hold the rows, their counts unknown; the batch's own
    mark replaces it, docs/architecture.md §5, "A batch in flight") over a skip's (0),
    one made while the write ran (:func:`written_beside_skip`). ``skip``: the mark is a
    :func:`skip_batches`' (:func:`is_skip`, :func:`says_skipped`); ``lost``: a lost mark
    (:attr:`fanout.ledger.entry.LedgerEntry.lost`)."""
    return 0 if skip else 1 if lost else 2


def entry_weight(entry: LedgerEntry) -> int:
    """:func:`mark_weight` of a committed ledger entry."""
    return mark_weight(is_skip(entry), entry.lost)


def held_by_skip(batch_id: int, marks: Iterable[tuple[int, bool]]) -> bool:
    """Whether a sink's mark holds batch ``batch_id`` only by a :func:`skip_batches`:
    its first committed mark at or after the batch (``marks``: each mark's batch id, and
    whether it is a skip's), the one believed at that batch (:func:`mark_weight`), is a
    skip's. The pipeline keeps such a batch in the spool
    (:meth:`fanout.steps.lag.Lagging.given_up`) and ``fanout status`` names it."""
    ranked = sorted((b, -mark_weight(skip), skip) for b, skip in marks if b >= batch_id)
    return ranked[0][2] if ranked else False


def written_beside_skip(entry: LedgerEntry, marks: Iterable[tuple[int, bool]]) -> bool:
    """Whether ``entry``, a sink's mark its ledger finds already held (the sink's
    transaction at or past its batch), is nonetheless recorded: a write's own mark (no
    ``error``, not lost) of a batch the sink's marks (``marks``: each mark's batch id of the
    epoch, and whether it is a skip's) hold only by a skip, :func:`held_by_skip`. That is
    a :func:`skip_batches` that landed between the sink's write of the batch and its mark
    (an operator's skip while the pipeline runs): the sink holds the rows the skip's mark
    says it never got. The mark is then recorded beside the skip's, the sink's transaction
    left at the skip's batch (marks stay monotone), so the batch counts as written: its
    rows in ``fanout status``, a ``backfill_from`` it can give, a spooled copy released
    like any the sink holds. A batch the sink's own mark already holds is marked once."""
    return entry.error is None and not entry.lost and held_by_skip(entry.batch_id, marks)


@dataclass(frozen=True)
class Skipped:
    """What :func:`skip_batches` did: the sink's mark before and after, in ``epoch``."""

    sink: str
    epoch: int
    before: int | None
    through: int
    recorded: bool
    """``False`` when the sink's mark already held ``through`` (no mark written)."""
    released: tuple[int, ...] = ()
    """The batches of ``epoch`` released from the spool for the sink (``release_spooled``)."""
    backfill_held: tuple[int, ...] = ()
    """The batches of ``epoch`` the sink's backfill source held that the mark gave up
    (``give_up_backfill``)."""


def skip_batches(
    ledger: Ledger,
    pipeline: str,
    sink: str,
    through: int,
    epoch: int | None = None,
    *,
    spool: Spool | None = None,
    release_spooled: bool = False,
    backfill_from: str | None = None,
    give_up_backfill: bool = False,
) -> Skipped:
    """Record that ``sink`` of ``pipeline`` will never receive the batches of ``epoch``
    (default: the pipeline's current epoch) after its mark, through ``through``.

    Refuses (:class:`fanout.ConfigurationError`) a batch no sink of the pipeline has
    committed in that epoch, unless a failed attempt's row shows that it ran
    (:func:`_failed_row_allows`): the acknowledgement is of batches that ran, never of
    future ones (a mark past the pipeline's high-water mark would make the checkpoint guard
    refuse the next batch as a rolled-back checkpoint).

    :param spool: the pipeline's spool (opened), when it has one: a ``through`` at or past
        a batch it still holds for ``sink`` after its mark is refused, naming them.
    :param release_spooled: give those batches up too (a sink removed for good): they
        are released from ``spool`` for ``sink`` at once, after the mark is recorded (also
        when the mark already held ``through``: the way to release what a skip made
        without the spool left there).
    :param backfill_from: ``sink``'s backfill source (its ``backfill_from``), when it has
        one: a ``through`` at or past a batch the source's ledger marks committed (not
        skipped) after ``sink``'s mark is refused, naming them: the backfill would give
        them to ``sink``.
    :param give_up_backfill: give those batches up too (the mark is recorded past them).

    Without ``epoch``, refuses (:class:`OlderEpochSkipError`, before anything is written)
    when the pipeline's current epoch is not 0: the current epoch's batches may not be the
    ones ``sink`` misses first, and a skip of them would give up rows it is still to get.
    The refusal names the sink's oldest missing batch of an older epoch where one is known
    (:func:`older_epoch_missed`)."""
    if through < 0:
        raise ConfigurationError(f"pipeline {pipeline!r}, sink {sink!r}: --through must be >= 0")
    if release_spooled and spool is None:
        raise ConfigurationError(
            f"pipeline {pipeline!r}, sink {sink!r}: --release-spooled releases batches from "
            "the spool: give it with --spool (in Python: spool=)"
        )
    view = ledger.lookup(pipeline, [sink])
    if epoch is None and view.epoch > 0:
        missed = older_epoch_missed(
            ledger, pipeline, sink, view.epoch, spool=spool, backfill_from=backfill_from
        )
        unmarked = (
            () if missed is not None else _unmarked_epochs(ledger, pipeline, sink, view.epoch)
        )
        raise OlderEpochSkipError(pipeline, sink, through, missed, view.epoch, unmarked)
    epoch = view.epoch if epoch is None else epoch
    before = ledger.last_committed(pipeline, [sink], epoch).get(sink)
    if before is not None and before >= through:
        released = _release(spool, sink, epoch, through) if release_spooled else ()
        return Skipped(sink, epoch, before, before, recorded=False, released=released)
    if spool is not None and not release_spooled:
        _refuse_held(spool, pipeline, sink, epoch, before, through)
    backfill_held: tuple[int, ...] = ()
    if backfill_from is not None:
        backfill_held = _backfill_held(ledger, pipeline, backfill_from, epoch, before, through)
        if backfill_held and not give_up_backfill:
            _refuse_backfill(pipeline, sink, backfill_from, epoch, before, through, backfill_held)
    same = [e for e in ledger.committed_entries(pipeline, through, epoch) if e.sink != sink]
    if not same and not _failed_row_allows(ledger, pipeline, sink, through, epoch):
        raise ConfigurationError(
            f"pipeline {pipeline!r}, sink {sink!r}: no other sink of the pipeline committed "
            f"batch {through} of epoch {epoch} or a later one, no failed attempt names a "
            f"later batch, and batch {through} was not refused to this sink as a replay it "
            "cannot tell it holds; skip only batches that ran, through the batch before the "
            "one refused (or the replayed batch refused because the sink cannot tell whether "
            "it holds it, when it does)"
        )
    plan = next((e for e in same if e.batch_id == through), None)
    first = 0 if before is None else before + 1
    ledger.mark_committed(
        LedgerEntry(
            pipeline,
            sink,
            through,
            "committed",
            query_id=plan.query_id if plan else None,
            rows=0,
            finished_at=now_utc(),
            source_offsets=plan.source_offsets if plan else None,
            error=f"{SKIPPED}: batches {first}-{through} were never written to this sink "
            "(fanout ledger skip)",
            epoch=epoch,
            batch_timestamp_ms=plan.batch_timestamp_ms if plan else None,
        )
    )
    released = _release(spool, sink, epoch, through) if release_spooled else ()
    return Skipped(
        sink, epoch, before, through, recorded=True, released=released,
        backfill_held=backfill_held,
    )  # fmt: skip


def _failed_row_allows(ledger: Ledger, pipeline: str, sink: str, through: int, epoch: int) -> bool:
    """Whether a failed attempt's row shows that a skip of ``sink`` through ``through``
    acknowledges batches that ran, when no other sink's mark does: a row of a later batch
    (Spark ran ``through`` before it: a gap's refusal records one when no sink marked the
    batch before it, a ledger restored from an older copy), or the replay check's refusal
    of ``through`` itself to ``sink`` (:class:`fanout.SinkRecordsGoneError`, recorded for
    the sink: its target may hold the batch, :mod:`fanout.steps.replay`). Not another row
    of ``through``: a gap's refusal of it was before any sink got it (its skip ends at the
    batch before), and a skip through it would mark a batch the sink never got. Two
    filtered scans at most, in the command only."""
    if ledger.failed_batches(pipeline, through + 1, epoch):
        return True
    refused = f"{SinkRecordsGoneError.__name__}:"
    return through in ledger.failed_batches(pipeline, through, epoch, sink=sink, error=refused)


class OlderEpochSkipError(ConfigurationError):
    """A skip without an explicit epoch, refused: the pipeline has more than one epoch
    (its current one, which the skip would have defaulted to, is not 0), and the sink may
    miss a batch of an older one (:func:`skip_batches`). :attr:`epoch` and
    :attr:`batch_id` name its oldest missing batch of an older epoch where the ledger shows
    one, else they are the current epoch and ``None`` (and ``unmarked`` names the older
    epochs the sink has no mark in, where the ledger cannot tell; none: it shows the sink
    missing nothing older). Its :attr:`reason` is the message
    without the way on, which ``fanout ledger skip`` names as the command with
    ``--epoch``."""

    def __init__(
        self,
        pipeline: str,
        sink: str,
        through: int,
        missed: BatchKey | None,
        current: int,
        unmarked: Sequence[int] = (),
    ) -> None:
        self.current = current
        self.epoch: int = current if missed is None else missed[0]
        self.batch_id: int | None = None if missed is None else missed[1]
        self.older = missed is not None
        """Whether the ledger shows a batch of an older epoch the sink misses."""
        if missed is None:
            head = (
                f"pipeline {pipeline!r}, sink {sink!r}: the pipeline has more than one epoch "
                f"(its current one is {current}, the one a skip without an epoch acts in)"
            )
            if unmarked:
                epochs = ", ".join(map(str, unmarked))
                self.reason = (
                    f"{head}, and the ledger cannot tell whether the sink still misses "
                    f"batches of epoch {epochs} (it has no mark there: it may not have been "
                    "in the pipeline then, or it may have lagged from that epoch's first "
                    f"batch), which it gets before epoch {current}'s: a skip of epoch "
                    f"{current}'s batches through {through} would lose their rows to it; "
                    "nothing was recorded"
                )
            else:
                self.reason = (
                    f"{head}; the ledger shows no batch of an older epoch the sink still "
                    "misses, but a skip without an epoch is taken only while the pipeline "
                    "has one, so that none typed for an older epoch's batches gives up "
                    f"epoch {current}'s instead; nothing was recorded"
                )
            super().__init__(
                f"{self.reason}. Give the epoch: epoch={current} skips epoch {current}'s "
                "batches; an older epoch's number skips that epoch's"
            )
            return
        self.reason = (
            f"pipeline {pipeline!r}, sink {sink!r}: the oldest batch it misses is batch "
            f"{self.batch_id} of epoch {self.epoch}, before the pipeline's current epoch "
            f"{current}, the one a skip without an epoch acts in: this skip would record "
            f"epoch {current}'s batches through {through} as never written to it (it gets "
            f"them after epoch {self.epoch}'s: their rows lost to it) and leave batch "
            f"{self.batch_id} of epoch {self.epoch} missing; nothing was recorded"
        )
        super().__init__(
            f"{self.reason}. Give the epoch: epoch={self.epoch} skips epoch {self.epoch}'s "
            f"batches; epoch={current} skips epoch {current}'s anyway"
        )


def older_epoch_missed(
    ledger: Ledger,
    pipeline: str,
    sink: str,
    current: int,
    *,
    spool: Spool | None = None,
    backfill_from: str | None = None,
) -> BatchKey | None:
    """The oldest batch ``(epoch, batch id)`` of an epoch before ``current`` that ``sink``
    misses, or ``None``: a batch of such an epoch after the sink's mark in it (or none, for
    a batch the ``spool`` holds for it or its ``backfill_from`` source's ledger marks
    committed, not skipped) that is settled by the ledger and the spool
    (:func:`fanout.spool.settled.settled_on_record`: a batch given up with its checkpoint is
    missed by no sink). Of the ledger's marks: past the sink's mark of an epoch, another
    sink's mark, or a batch the spool holds. A sink without a mark in an older epoch misses
    nothing of it that the ledger can tell (it may not have been configured then): only the
    spool and the backfill source, when given, say so. One scan of the ledger's marks."""
    from fanout.spool.settled import settled_on_record

    entries = [e for e in ledger.committed_entries(pipeline) if e.epoch < current]
    marks: dict[int, dict[str, int]] = {}
    for entry in entries:
        of_epoch = marks.setdefault(entry.epoch, {})
        of_epoch[entry.sink] = max(of_epoch.get(entry.sink, -1), entry.batch_id)
    spooled = [] if spool is None else spool.batches()
    candidates = {(e, of_epoch[sink] + 1) for e, of_epoch in marks.items() if sink in of_epoch}
    candidates.update(
        (e.epoch, e.batch_id)
        for e in entries
        if e.sink == backfill_from and not is_skip(e)
        and e.batch_id > marks[e.epoch].get(sink, -1)
    )  # fmt: skip
    candidates.update(
        b.key
        for b in spooled
        if b.epoch < current and sink in b.needed_by
        and b.batch_id > marks.get(b.epoch, {}).get(sink, -1)
    )  # fmt: skip
    for epoch, batch_id in sorted(candidates):
        of_epoch = marks.get(epoch, {})
        origin = None if backfill_from is None else of_epoch.get(backfill_from)

        def backfilled(name: str, batch_id: int = batch_id, origin: int | None = origin) -> bool:
            return name == sink and origin is not None and origin >= batch_id

        if settled_on_record((epoch, batch_id), spooled, of_epoch.get, of_epoch, backfilled):
            return (epoch, batch_id)
    return None


def _unmarked_epochs(ledger: Ledger, pipeline: str, sink: str, current: int) -> tuple[int, ...]:
    """The epochs before ``current`` some sink has a mark in and ``sink`` none (what the
    refusal of a skip without an epoch says the ledger cannot tell about). Read on that
    refusal only."""
    marked: dict[int, bool] = {}
    for entry in ledger.committed_entries(pipeline):
        if entry.epoch < current:
            marked[entry.epoch] = marked.get(entry.epoch, False) or entry.sink == sink
    return tuple(sorted(epoch for epoch, has in marked.items() if not has))


def _release(spool: Spool | None, sink: str, epoch: int, through: int) -> tuple[int, ...]:
    """Remove ``sink``'s index rows of the batches of ``epoch`` through ``through`` from
    ``spool`` (its mark holds them now); a batch's rows go with its last index row."""
    assert spool is not None
    keys = [b.key for b in spool.needed_by(sink) if b.epoch == epoch and b.batch_id <= through]
    spool.remove({key: [sink] for key in keys})
    return tuple(batch_id for _, batch_id in keys)


def _refuse_held(
    spool: Spool, pipeline: str, sink: str, epoch: int, before: int | None, through: int
) -> None:
    """Refuse a skip through ``through`` when ``spool`` holds batches of ``epoch`` for
    ``sink`` after its mark ``before``, at or before ``through``: their rows are there."""
    held = sorted(
        b.batch_id
        for b in spool.needed_by(sink)
        if b.epoch == epoch and (before is None or b.batch_id > before) and b.batch_id <= through
    )
    if not held:
        return
    mark, in_epoch, earlier = _refusal_parts(epoch, before, held[0])
    raise ConfigurationError(
        f"pipeline {pipeline!r}, sink {sink!r}: the spool at {spool.path} still holds "
        f"batch(es) {batch_ranges(held)}{in_epoch} for it (after {mark}): a skip through "
        f"{through} would give their rows up. Either {earlier}let it catch up from them first "
        "(start the pipeline with the sink configured: it is given the held batches before "
        "a gap, in order, then refused at the gap), then skip only what it never got; or, "
        "to give them up too (the sink removed for good), add --release-spooled (in Python: "
        "release_spooled=True)"
    )


def _refusal_parts(epoch: int, before: int | None, first_held: int) -> tuple[str, str, str]:
    """The pieces a refused skip's message names: the sink's mark, the epoch (when not 0),
    and the skip that stops before the first held batch (when one can)."""
    mark = "no mark" if before is None else f"its mark {before}"
    in_epoch = f" of epoch {epoch}" if epoch else ""
    earlier = (
        f"skip only the batches before them (--through {first_held - 1}); "
        if first_held - 1 > (-1 if before is None else before)
        else ""
    )
    return mark, in_epoch, earlier


def _backfill_held(
    ledger: Ledger, pipeline: str, origin: str, epoch: int, before: int | None, through: int
) -> tuple[int, ...]:
    """The batches of ``epoch`` after ``before`` through ``through`` that ``origin``'s
    ledger marks committed and not skipped: those a backfill from it gives back
    (:meth:`fanout.steps.lag_backfill.BackfillMarks.missed` reads the same marks)."""
    first = 0 if before is None else before + 1
    return tuple(
        sorted(
            e.batch_id
            for e in ledger.committed_entries(pipeline, first, epoch)
            if e.sink == origin and e.epoch == epoch and e.batch_id <= through and not is_skip(e)
        )
    )


def _refuse_backfill(
    pipeline: str, sink: str, origin: str, epoch: int, before: int | None, through: int,
    held: tuple[int, ...],
) -> None:  # fmt: skip
    """Refuse a skip through ``through`` past batches ``held`` that ``sink``'s backfill
    source ``origin`` holds: their rows exist and the backfill would deliver them."""
    mark, in_epoch, earlier = _refusal_parts(epoch, before, held[0])
    raise ConfigurationError(
        f"pipeline {pipeline!r}, sink {sink!r}: its backfill source {origin!r} holds "
        f"batch(es) {batch_ranges(list(held))}{in_epoch} for it (its ledger marks them "
        f"committed; after {mark}): a skip through {through} would give up rows that exist "
        f"and can be delivered. Either {earlier}let it catch up from them first (start the "
        f"pipeline with the sink configured: the backfill gives it {origin!r}'s batches, in "
        "order), then skip only what it never got; or, to give them up anyway, add "
        "--give-up-backfill (in Python: give_up_backfill=True)"
    )
