"""Before a new epoch starts: the batch a sink wrote but never marked.

A reset resumes after the last *marked* batch. A sink that committed batch ``m + 1`` of the
replaced epoch and lost its mark ``m + 1`` (the driver killed between the write and the
mark, or the query stopped mid-batch) would get that batch's rows again from the new epoch,
under new idempotency keys. The ledger cannot see it; the sink's own records can
(:meth:`fanout.Sink.holds_batch`; one that says it does, and implements
:meth:`fanout.Sink.target_replaced`, is asked that too: a reason means the target was
re-created empty since, and it holds nothing). :func:`refuse_unmarked` asks each sink once,
when an epoch starts (never on the per-batch path), records the mark the sink lost (the ledger then
tells the truth, and ``fanout recover`` counts the sink there), and refuses the start with
:class:`fanout.UnmarkedBatchError` before anything of the new epoch is written. The next
start asks about the batch after the recorded mark, so the operator's choice (resume after
the batch, or before it and accept it twice in that sink) goes through ``fanout recover``.

A sink without a mark in the replaced epoch is asked about the epoch's first batch (the
driver died in it). A sink whose rewrite of the batch is harmless
(:meth:`fanout.Sink.harmless_rewrite`: an unconditional upsert by key) does not refuse:
its lost mark is recorded all the same, and a warning logged.

Before the answer that counts, each sink about to be asked closes the replaced epoch to its
writes still in flight (:func:`fence_epochs`, :meth:`fanout.Sink.fence_earlier_epochs`): a
task of the replaced query committing the batch after the question would be read again by
the new epoch. The sinks are asked once before that too: a start that question refuses is
refused with nothing fenced (no commit in a user's Delta table, no Kafka producer fenced,
no PostgreSQL fence row, and a query of the replaced epoch still running, a second
checkpoint started by mistake beside it, keeps writing). Only a start it does not refuse is
fenced and asked again (a write in flight may have landed in between); one refused then
lifts its fences (:func:`lift_fences`), and so does one the ledger refuses after
(:class:`fanout.ZombieBatchError`, ``Admission.start_refused``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial

from fanout.contract.batch import BatchInfo
from fanout.contract.sink import PartlyHeld, Sink, lift_by_hand
from fanout.errors import SinkRecordsGoneError, SinkTimeoutError, UnmarkedBatchError, shell_word
from fanout.ledger.entry import (
    REWRITTEN,
    Ledger,
    LedgerEntry,
    ledger_location,
    now_utc,
    refused_query,
)
from fanout.ledger.gaps import SKIPPED, skip_command
from fanout.observe.logs import batch_fields
from fanout.observe.secrets import redact
from fanout.steps.holds import (
    CannotTell,
    NoAnswer,
    Warn,
    answers_records_gone,
    answers_target_replaced,
    bounded,
    gone_reason,
    holds_answer,
    replaced_reason,
)
from fanout.steps.lost_target import (
    RESTORE_RECORDS,
    gone_passes,
    last_kept,
    target_text,
    written_marks,
)

log = logging.getLogger("fanout")


@dataclass(frozen=True)
class Held:
    """A sink's answer about the batch after its mark ``mark``: ``True`` holds it (all of
    it, or only ``part``), ``False`` does not, ``None`` cannot tell."""

    sink: str
    mark: int
    holds: bool | None
    hint: str | None = None
    harmless: str | None = None
    part: PartlyHeld | None = None
    """Set when the sink holds only some of the batch's partitions
    (:class:`fanout.PartlyHeld`): no lost mark is recorded for it."""
    why: str | None = None
    """Why the sink cannot tell (``holds`` ``None``): its ``holds_batch``'s error."""
    replaced: str | None = None
    """Why the sink does not hold the batch its records say it holds (``holds``
    ``False``): :meth:`fanout.Sink.target_replaced`'s reason, the target there not the one
    they were written to."""

    @property
    def whole(self) -> bool:
        """Whether the sink holds the whole batch (its lost mark may be recorded)."""
        return bool(self.holds) and self.part is None


def refuse_unmarked(
    info: BatchInfo,
    ledger: Ledger,
    sinks: Mapping[str, Sink],
    spooled: Callable[[int], Mapping[str, int]] | None = None,
    timeouts: Mapping[str, float] | None = None,
    unopened: Mapping[str, BaseException] | None = None,
    before_fence: Callable[[], None] | None = None,
    accepted: Collection[str] = (),
) -> list[Sink]:
    """Raise :class:`fanout.UnmarkedBatchError` when a sink holds, by its own records, the
    batch after its last mark of ``info.epoch`` (the epoch ``info``'s query is about to
    replace), after recording that mark in the ledger. ``sinks``: the open sinks;
    ``spooled``: per sink, the last batch of an epoch the spool holds for it (a lagging
    sink's spooled batches are written after the reset under the old epoch's keys, by the
    catch-up, so holding one is no duplicate). ``timeouts``: the sinks with
    ``write_timeout_s``, whose answer is waited for that long (:func:`ask`).
    ``unopened``: the sinks that could tell (their type answers ``holds_batch``) but whose
    ``open()`` failed (``on_failure="lag"``), each with its error: one that would be asked
    refuses the start (:func:`_refuse_unasked`). When a sink to be asked fences, every sink
    is asked once before the fences, and a refusal then fences nothing; otherwise each
    sink asked is fenced (:func:`fence_epochs`) and asked (again); returns the sinks fenced
    (a refusal after them lifts them first). ``before_fence``: called after the question
    before the fences, when there are any to make: raises to refuse the start with nothing
    fenced (the ledger's own checks of the start, ``Admission.check_start``).
    ``accepted``: the sinks of ``accept_lost_targets``, whose records found gone
    (:func:`refuse_records_gone`) do not refuse the start (a warning)."""
    epoch = info.epoch
    bounds = timeouts or {}
    in_spool = {} if spooled is None else spooled(epoch)
    if unopened:
        _refuse_unasked(info, ledger, unopened, in_spool)
    marks = ledger.last_committed(info.pipeline, sinks, epoch)
    before = before_start(ledger, info.pipeline, epoch, marks)
    asked = [
        name
        for name, m in sorted(marks.items())
        if in_spool.get(name, -1) <= (before if m is None else m)
    ]
    question = partial(
        _ask_every_sink, info, ledger, sinks, marks, before, asked, in_spool, accepted=accepted
    )
    to_fence = {name: sinks[name] for name in asked if fences(sinks[name])}
    held_back: list[tuple[object, ...]] = []
    try:
        if to_fence:  # asked first: a start refused then fences (and lifts) nothing
            question(bounds, first=held_back)
            if before_fence is not None:
                before_fence()
        fenced = fence_epochs(info, to_fence, bounds, ledger)
    except BaseException:  # no second question: the first's warnings are the start's
        _say(held_back)
        raise
    try:  # asked (again) once fenced: a write in flight may have landed since
        question(bounds)
    except BaseException:
        lift_fences(info, fenced, bounds, ledger)
        raise
    return fenced


def _ask_every_sink(
    info: BatchInfo,
    ledger: Ledger,
    sinks: Mapping[str, Sink],
    marks: Mapping[str, int | None],
    before: int,
    asked: Sequence[str],
    in_spool: Mapping[str, int],
    bounds: Mapping[str, float],
    *,
    first: list[tuple[object, ...]] | None = None,
    accepted: Collection[str] = (),
) -> None:
    """:func:`refuse_unmarked`'s question: ask each sink of ``asked`` about the batch after
    its mark, record the lost marks, and refuse the start when one holds it. ``first``
    given: the question before the fences (:func:`fence_epochs`), which only refuses: a
    start it would not refuse records nothing and warns of no harmless rewrite then (the
    question asked again once the sinks are fenced does, once), since a write in flight
    may land before the fence. Its warnings of a sink that cannot tell (its
    ``holds_batch`` raising, :func:`fanout.steps.holds.holds_answer`) are held back in
    ``first`` then, said only when it refuses (or, by :func:`refuse_unmarked`, when no
    second question follows): once per start."""
    try:
        _ask_each(info, ledger, sinks, marks, before, asked, in_spool, bounds, first, accepted)
    except BaseException:  # a refusal: no second question follows
        if first is not None:
            _say(first)
        raise


def _say(held_back: list[tuple[object, ...]]) -> None:
    """Log the warnings a question held back (:func:`_ask_every_sink`)."""
    for args in held_back:
        log.warning(*args)
    held_back.clear()


def _ask_each(
    info: BatchInfo,
    ledger: Ledger,
    sinks: Mapping[str, Sink],
    marks: Mapping[str, int | None],
    before: int,
    asked: Sequence[str],
    in_spool: Mapping[str, int],
    bounds: Mapping[str, float],
    first: list[tuple[object, ...]] | None,
    accepted: Collection[str] = (),
) -> None:
    """:func:`_ask_every_sink`'s questions and what follows from their answers."""
    epoch = info.epoch
    warn = None if first is None else (lambda *args: first.append(args))
    unmarked = {n: in_spool.get(n, before) for n in marks}
    _refuse_restart(info, ledger, sinks, marks, unmarked, bounds, warn)
    asks = unmarked_asks(before, marks)
    answers = []
    for name in asked:
        mark = marks[name]
        turns = asks if mark is None else (mark,)
        answers.append(
            ask_in_turn(sinks[name], info.pipeline, epoch, turns, bounds.get(name), warn)
        )
    refuse_records_gone(info, ledger, sinks, marks, answers, bounds, accepted)
    held = [a for a in answers if a.holds]
    if not held:
        return
    held = _needed_rewrites(held, marks, sinks, in_spool)
    if first is not None and all(h.harmless is not None for h in held):
        return
    offsets = {h.sink: recorded_offsets(ledger, info.pipeline, epoch, h.mark + 1) for h in held}
    owner = ledger.epoch_owners(info.pipeline).get(epoch)
    for h in held:
        if h.whole:  # a mark of part of a batch would make its replay skip the rest
            ledger.mark_committed(_lost_mark(info, h, owner, offsets[h.sink]))
    refused = [h for h in held if h.harmless is None]
    for h in held:
        if h.harmless is not None:
            _warn_rewrite(info, h)
    if refused:
        raise UnmarkedBatchError(_message(info, ledger, held, refused, answers, marks, offsets))


def refuse_records_gone(
    info: BatchInfo,
    ledger: Ledger,
    sinks: Mapping[str, Sink],
    marks: Mapping[str, int | None],
    answers: Sequence[Held],
    bounds: Mapping[str, float],
    accepted: Collection[str] = (),
) -> None:
    """Refuse the start with :class:`fanout.SinkRecordsGoneError` when a sink that said it
    does not hold the batch after its mark has lost its own records of its last mark that
    wrote rows, its target still holding rows (:meth:`fanout.Sink.records_gone`): its
    "does not hold" is then no answer, and the new epoch would write that batch a second
    time if it was written and never marked. Asked only of a sink answering that hook with
    a mark in the epoch and a ``False`` (one ledger scan of the epoch's marks each); one of
    ``accepted`` is logged instead."""
    for answer in answers:
        sink, mark = sinks[answer.sink], marks.get(answer.sink)
        if answer.holds is not False or mark is None or not answers_records_gone(sink):
            continue
        written = last_kept(written_marks(ledger, info.pipeline, info.epoch, sink.name, mark,
                                          info.query_id, sinks))  # fmt: skip
        if written is None:
            continue
        gone = gone_reason(sink, info.pipeline, info.epoch, written, bounds.get(sink.name))
        then = (
            f"epoch {info.epoch + 1} starts, and batch {mark + 1}, if it was written and never "
            "marked, is written a second time"
        )
        if gone is None or gone_passes(sink, info.pipeline, info.epoch, written, gone,
                                       sink.name in accepted, then):  # fmt: skip
            continue
        raise SinkRecordsGoneError(
            _gone_message(info, sink, written, mark + 1, gone),
            sink=sink.name,
            batch_id=mark + 1,
        )


def _gone_message(info: BatchInfo, sink: Sink, written: int, batch: int, gone: str) -> str:
    """The refusal of a new epoch's start by :func:`refuse_records_gone`."""
    new = info.epoch + 1
    return redact(
        f"pipeline {info.pipeline!r}: query {info.query_id} cannot start epoch {new}: the "
        f"records sink {sink.name!r} keeps of batch {written} of epoch {info.epoch}, which the "
        f"ledger marks written to {target_text(sink)}, are gone, and the target still holds "
        f"rows: {gone}. Without them its answer that it does not hold batch {batch} (the "
        "batch after its mark, written perhaps and never marked: the driver killed in "
        "between) tells nothing, and the new epoch would write that batch a second time. "
        f"Nothing was written under epoch {new}.\n"
        f"Ways on: {RESTORE_RECORDS}, then start this query again: the sink is asked "
        "again with them. Or, when they cannot be restored and the target holds no row of "
        f"batch {batch}, start it with `--accept-lost-target {shell_word(sink.name)}` "
        f"(FanOut(accept_lost_targets=[{sink.name!r}])): epoch {new} starts, and the next "
        "run's check accepts the records gone too.",
        sink.secret_values(),
    )


def fences(sink: Sink) -> bool:
    """Whether ``sink``'s type closes earlier epochs to its writes in flight
    (overrides :meth:`fanout.Sink.fence_earlier_epochs`)."""
    return type(sink).fence_earlier_epochs is not Sink.fence_earlier_epochs


_RESTART = "restart that checkpoint"
"""What the operator does after lifting a fence by hand, in the core's refusals."""


def fence_epochs(
    info: BatchInfo,
    sinks: Mapping[str, Sink],
    bounds: Mapping[str, float],
    ledger: Ledger | None = None,
) -> list[Sink]:
    """Before a new epoch's sinks are asked whether they hold the replaced epoch's batch
    after their mark: have each of ``sinks`` that fences (:func:`fences`) close the epochs
    before the new one to its writes still in flight (a task of the replaced query still
    running, :meth:`fanout.Sink.fence_earlier_epochs`), so that none commits the batch
    after the question, to be read again by the new epoch and written twice. In turn, each
    bounded by its ``write_timeout_s`` (``bounds``); one that raises or does not answer in
    time refuses the start, after the fences already made are lifted (unless ``ledger``
    says another query started the epoch, :func:`lift_fences`). One that raised is lifted
    too: it may have closed some of its records before it failed (a scope, a partition),
    and the replaced epoch's checkpoint, which the next start may be refused to, would meet
    them. One that did not answer in time is not (nor one whose wait was interrupted while
    it ran): its call may still be fencing, and would close again what a lift opened; the
    refusal says a fence may be left and names the lift by hand
    (:func:`fanout.contract.sink.lift_by_hand`). The sinks fenced."""
    new = info.epoch + 1
    done: list[Sink] = []
    for name, sink in sinks.items():
        if not fences(sink):
            continue
        returned = threading.Event()  # the fence ended (returned or raised)
        try:
            call = bounded(
                sink, info.pipeline, partial(_ended, returned, sink.fence_earlier_epochs,
                                             info.pipeline, new),
                bounds.get(name), hook="fence",
            )  # fmt: skip
        except BaseException:  # it may have fenced part of its records: lifted too, unless
            # the wait for it was interrupted (KeyboardInterrupt) while it still runs
            lift_fences(info, [*done, sink] if returned.is_set() else done, bounds, ledger)
            raise
        if isinstance(call, NoAnswer):  # still fencing, perhaps: a lift could be overtaken
            lift_fences(info, done, bounds, ledger)
            raise SinkTimeoutError(
                f"could not close epoch {info.epoch} to its writes still in flight within "
                f"its write_timeout_s={bounds[name]:g} s (fence_earlier_epochs() did not "
                f"return): epoch {new} does not start, since a task of the replaced query "
                "could then commit a batch the new epoch reads again. Find what holds the "
                "sink's target (a transaction of that query left open, a stalled "
                "connection) and restart the query, or raise write_timeout_s. The fence "
                "may still complete (it was not lifted, since a lift could be overtaken by "
                f"it): a restart of epoch {info.epoch}'s checkpoint may then be refused by "
                f"the sink; {lift_by_hand(repr(info.pipeline), new, _RESTART)}",
                sink=name,
            )
        done.append(sink)
    return done


def _ended(ended: threading.Event, call: Callable[[str, int], None], pipeline: str,
           epoch: int) -> None:  # fmt: skip
    """``call(pipeline, epoch)``, then ``ended`` set, whether it returned or raised."""
    try:
        call(pipeline, epoch)
    finally:
        ended.set()


def lift_fences(
    info: BatchInfo,
    fenced: Sequence[Sink],
    bounds: Mapping[str, float],
    ledger: Ledger | None = None,
) -> None:
    """The start of ``info``'s new epoch was refused: have each sink of ``fenced`` open
    the replaced epoch again (:meth:`fanout.Sink.lift_epoch_fence`), whose checkpoint the
    refusal may say to restart. What fails is logged: the refusal stands. Nothing is
    lifted when ``ledger`` records that another query started that epoch meanwhile (two
    starts at once: the fence is the same record, and that query, running the epoch,
    relies on it), nor when the ledger cannot tell (:func:`_epoch_taken`)."""
    new = info.epoch + 1
    if fenced and ledger is not None and _epoch_taken(info, ledger):
        return
    for sink in fenced:
        try:
            call = bounded(
                sink, info.pipeline, partial(sink.lift_epoch_fence, info.pipeline, new),
                bounds.get(sink.name), hook="lift-fence",
            )  # fmt: skip
            lifted = not isinstance(call, NoAnswer)
            why = "it did not return within write_timeout_s"
        except Exception as exc:
            lifted, why = False, f"{type(exc).__name__}: {redact(str(exc), sink.secret_values())}"
        if not lifted:
            log.warning(
                "pipeline %s, sink %s: epoch %s was refused, but the fence closing epoch "
                "%s to writes still in flight could not be lifted (%s): a restart of "
                "that epoch's checkpoint is refused by the sink until it is; %s",
                info.pipeline, sink.name, new, info.epoch, why,
                lift_by_hand(repr(info.pipeline), new, _RESTART),
                extra=batch_fields(info.pipeline, info.batch_id, sink.name),
            )  # fmt: skip


def _epoch_taken(info: BatchInfo, ledger: Ledger) -> bool:
    """Whether the epoch after ``info``'s was started (by another query: this one's start
    was refused) or the ledger cannot say: then the fences stay, logged. A read of the
    epoch rows, on a refused start only."""
    new = info.epoch + 1
    try:
        taken = ledger.epoch_start(info.pipeline, new) is not None
        why = f"another query started epoch {new} meanwhile and relies on them"
    except Exception as exc:
        taken = True  # the type only: a ledger's error may spell its location's secrets
        why = f"the ledger cannot tell whether epoch {new} started: {type(exc).__name__}"
    if taken:
        log.warning(
            "pipeline %s: epoch %s's start was refused; the sinks' fences closing epoch %s "
            "to writes still in flight stay (%s). A restart of epoch %s's checkpoint is "
            "refused by those sinks; each refusal says how to lift its fence by hand",
            info.pipeline, new, info.epoch, why, info.epoch,
            extra=batch_fields(info.pipeline, info.batch_id),
        )  # fmt: skip
    return taken


def _refuse_unasked(
    info: BatchInfo,
    ledger: Ledger,
    unopened: Mapping[str, BaseException],
    in_spool: Mapping[str, int],
) -> None:
    """Refuse the start when a sink of ``unopened`` would be asked about a batch (not held
    for it by the spool): it cannot be, and a lagging sink that cannot be opened now is
    opened again later, at the new epoch's first batch or by the catch-up, which would then
    write the new epoch's re-read of that batch to it a second time."""
    epoch = info.epoch
    marks = ledger.last_committed(info.pipeline, unopened, epoch)
    before = before_start(ledger, info.pipeline, epoch, marks)
    unasked = {
        name: mark
        for name, mark in sorted(marks.items())
        if in_spool.get(name, -1) <= (before if mark is None else mark)
    }
    if not unasked:
        return
    lines = [
        f"pipeline {info.pipeline!r}: query {info.query_id} cannot start epoch {epoch + 1}: "
        + "; ".join(_unasked_line(name, mark, epoch) for name, mark in unasked.items())
        + f". Nothing was written under epoch {epoch + 1}."
    ]
    lines += [
        f"Start the query again once sink {name} can be opened (its error: "
        f"{type(unopened[name]).__name__}: {unopened[name]}): it is then asked. Or start it "
        f"without the sink (it then gets nothing of epoch {epoch + 1})."
        for name in unasked
    ]
    raise UnmarkedBatchError("\n".join(lines))


def _unasked_line(name: str, mark: int | None, epoch: int) -> str:
    """Why sink ``name`` (``mark``: its last mark in ``epoch``) refuses the start unasked."""
    what = (
        f"a batch of epoch {epoch} (it has no mark in that epoch)"
        if mark is None
        else f"batch {mark + 1} of epoch {epoch} (the batch after its mark {mark})"
    )
    return (
        f"sink {name} could not be opened, so it was not asked whether it holds {what} by "
        "its own records: the driver may have died between its write of that batch and its "
        f"mark, and epoch {epoch + 1} would write the batch's rows to it again"
    )


def _needed_rewrites(
    held: list[Held], marks: Mapping[str, int | None], sinks: Mapping[str, Sink],
    in_spool: Mapping[str, int],
) -> list[Held]:  # fmt: skip
    """``held``, where a harmless rewrite stays harmless only when the new epoch must write
    the batch anyway: some sink lacks it (no mark of it, does not hold it, has not spooled
    it), or every sink's rewrite is harmless. Otherwise every sink holds the batch and
    ``fanout recover`` (without ``--config``), counting the held sink at its mark before,
    said to resume before it: the new epoch would write it again to a sink that marked it
    (an append: its rows twice). Refused as before, the lost mark recorded, ``fanout
    recover`` then resumes after it."""
    all_harmless = all(sink.harmless_rewrite() is not None for sink in sinks.values())

    def lacking(batch: int) -> bool:
        holding = {h.sink for h in held if h.whole and h.mark + 1 == batch}
        return any(
            (mark is None or mark < batch)
            and name not in holding
            and in_spool.get(name, -1) < batch
            for name, mark in marks.items()
        )

    return [
        h if h.harmless is None or (h.whole and (all_harmless or lacking(h.mark + 1)))
        else replace(h, harmless=None)
        for h in held
    ]  # fmt: skip


def before_start(ledger: Ledger, pipeline: str, epoch: int, marks: Mapping[str, int | None]) -> int:
    """The batch before ``epoch``'s first, which a sink without a mark in it is asked
    about as its mark: the driver may have died in the epoch's first batch after such a
    sink committed it. The first batch is the one the epoch's ``epoch`` row records (a new
    epoch need not start at batch 0); without one (epoch 0 of an older ledger), 0: a new
    checkpoint's first batch. Read only when some sink has no mark."""
    if all(mark is not None for mark in marks.values()):
        return -1
    first = ledger.epoch_start(pipeline, epoch)
    return (0 if first is None else first) - 1


def unmarked_asks(before: int, marks: Mapping[str, int | None]) -> tuple[int, ...]:
    """The marks a sink without one in the epoch is asked after, in turn (about the batch
    after each, :func:`ask_in_turn`); ``before``: the batch before the epoch's first
    (:func:`before_start`). No sink has a mark in the epoch: ``before`` (the driver died in
    its first batch). Else the others' highest mark ``h`` and ``h - 1``, then ``before``: a
    sink without a mark while others marked a batch joined the pipeline since the epoch
    began (or came back), and the driver died in ``h + 1`` after it wrote it, or in ``h``
    between its write and its mark. Asked about the epoch's first batch first, a Delta sink
    (its answer: that batch or a later one) had its lost mark recorded at a batch it never
    got."""
    high = max((m for m in marks.values() if m is not None), default=None)
    if high is None:
        return (before,)
    return tuple(dict.fromkeys((high, high - 1, before)))


def ask_in_turn(
    sink: Sink,
    pipeline: str,
    epoch: int,
    marks: Sequence[int],
    timeout_s: float | None = None,
    warn: Warn | None = None,
) -> Held:
    """``sink``'s answer about the batch after each of ``marks`` in turn (:func:`ask`): the
    first it holds (all or part), else its answer about the last, ``None`` when it could
    not tell about one (said through ``warn``, when given)."""
    answers = []
    for mark in marks:
        answer = ask(sink, pipeline, epoch, mark, timeout_s, warn)
        if answer.holds:
            return answer
        answers.append(answer)
    unknown = [a for a in answers if a.holds is None]
    if unknown:
        return replace(answers[-1], holds=None, why=unknown[0].why)
    return answers[-1]


def _warn_rewrite(info: BatchInfo, held: Held) -> None:
    """Log that ``held.sink`` gets a batch it holds again, harmlessly (its lost mark was
    recorded), instead of refusing the start."""
    log.warning(
        "pipeline %s, sink %s: holds batch %s of epoch %s by its own records without its "
        "ledger mark (the driver died between the write and the mark); the ledger now "
        "records the lost mark. Epoch %s starts anyway and may write that batch's rows to "
        "the sink again, which changes nothing: %s",
        info.pipeline, held.sink, held.mark + 1, info.epoch, info.epoch + 1, held.harmless,
        extra=batch_fields(info.pipeline, held.mark + 1, held.sink),
    )  # fmt: skip


def _lost_mark(info: BatchInfo, held: Held, owner: str | None, offsets: str | None) -> LedgerEntry:
    """The mark ``held.sink`` lost, recorded at the start of ``info``'s query."""
    recorded = _rewritten(info) if held.harmless is not None else _refused(info)
    return lost_mark(info.pipeline, info.epoch, held, owner, offsets, recorded)


def lost_mark(
    pipeline: str,
    epoch: int,
    held: Held,
    owner: str | None,
    offsets: str | None,
    recorded: str,
) -> LedgerEntry:
    """The mark ``held.sink`` lost: batch ``held.mark + 1`` of ``epoch``, by the epoch's
    query ``owner``; its ``error`` begins with ``recorded`` (who recorded it, starting with
    :data:`fanout.ledger.entry.LOST_MARK`). Its ``rows`` and ``dead_lettered`` stay null:
    the sink's records do not tell them (:func:`fanout.ledger.entry.is_lost_mark` tells
    readers)."""
    why = "the sink's own records hold the batch, its mark was lost"
    if held.harmless is not None:
        error = f"{recorded}: {why}; writing it again changes nothing: {held.harmless}"
    else:
        error = f"{recorded}: {why}"
    return LedgerEntry(
        pipeline,
        held.sink,
        held.mark + 1,
        "committed",
        query_id=owner,
        finished_at=now_utc(),
        source_offsets=offsets,
        error=error,
        epoch=epoch,
    )


def _refused(info: BatchInfo) -> str:
    """How a lost mark recorded at the refusal of ``info``'s query begins."""
    return refused_query(info.query_id, info.epoch)


def _rewritten(info: BatchInfo) -> str:
    """How a lost mark recorded at the start of ``info``'s query begins, when the sink
    holding the batch takes it again harmlessly (:meth:`fanout.Sink.harmless_rewrite`)."""
    return f"{REWRITTEN}: recorded when query {info.query_id} asked to start epoch {info.epoch + 1}"


def _refuse_restart(
    info: BatchInfo,
    ledger: Ledger,
    sinks: Mapping[str, Sink],
    marks: Mapping[str, int | None],
    unmarked: Mapping[str, int],
    bounds: Mapping[str, float],
    warn: Warn | None = None,
) -> None:
    """Refuse ``info``'s query when a start of it was refused before for the batch every
    sink now counts (each sink's mark at or past it) and a sink that lost its mark of it
    still holds it: the query's checkpoint starts before that batch (it was refused for
    re-reading it), so it would write the batch to that sink a second time. The next
    ``fanout recover`` resumes after the batch (nothing made the refusal's choice 1 of
    resuming before it), and the restarted query, asked about the batch after, passed.

    ``unmarked``: where a sink without a mark in the epoch counts (its last spooled batch,
    else the batch before the epoch's first): the refusal's choice 1 for a sink that held
    the epoch's first batch resumes at the epoch's start, which such a sink keeps below it."""
    counted = {name: unmarked[name] if mark is None else mark for name, mark in marks.items()}
    if info.query_id is None or not counted:
        return
    batch = min(counted.values())
    at_batch = [  # a lost mark the old batch's own mark replaced since names the refusal too
        entry
        for entry in ledger.committed_entries_with_replaced(info.pipeline, batch, info.epoch)
        if entry.batch_id == batch and counted.get(entry.sink) == batch
    ]
    lost = sorted({e.sink for e in at_batch if (e.error or "").startswith(_refused(info))})
    if not lost:
        return
    wrote = sorted(  # a held sink's own mark is of the copy its lost mark counted
        {
            e.sink
            for e in at_batch
            if not e.lost and not (e.error or "").startswith(SKIPPED) and e.sink not in lost
        }
    )
    if wrote:  # removing the lost mark's copy cannot help these
        offsets = recorded_offsets(ledger, info.pipeline, info.epoch, batch)
        raise UnmarkedBatchError(_wrote_message(info, ledger, lost, wrote, batch, offsets))
    asked = (
        ask(sinks[name], info.pipeline, info.epoch, batch - 1, bounds.get(name), warn)
        for name in lost
    )
    # every sink counts the batch: the rewrite is harmless only when it is for every sink
    all_harmless = all(sink.harmless_rewrite() is not None for sink in sinks.values())
    held = [h for h in asked if h.holds and (h.harmless is None or not all_harmless)]
    if held:
        offsets = recorded_offsets(ledger, info.pipeline, info.epoch, batch)
        raise UnmarkedBatchError(_restart_message(info, ledger, held, batch, offsets))


def _marked(marks: Mapping[str, int | None], batch: int) -> bool:
    """Whether a sink's ledger mark (before any lost mark was recorded) reaches ``batch``."""
    return any(mark is not None and mark >= batch for mark in marks.values())


def _after(batch: int, offsets: str | None) -> str:
    """Where a new checkpoint resuming after ``batch`` starts."""
    return (
        f"the source offsets of batch {batch}: {offsets}"
        if offsets
        else f"the source offsets of batch {batch}, which the ledger does not hold (no sink "
        f"marked it): the replaced checkpoint's offsets/{batch} file holds them (one JSON "
        "line per source, after the first two lines)"
    )


def _wrote_message(
    info: BatchInfo, ledger: Ledger, lost: list[str], wrote: list[str], batch: int,
    offsets: str | None,
) -> str:  # fmt: skip
    """The refusal of a refused query started again when sinks ``wrote`` marked the batch
    it was refused for: its checkpoint starts before that batch, so they would get it twice
    whatever became of the lost marks' copies (:func:`_refuse_restart`)."""
    epoch, pipeline = info.epoch, info.pipeline
    return (
        f"pipeline {pipeline!r}: query {info.query_id} cannot start epoch {epoch + 1}: it was "
        f"refused before because sink {', '.join(lost)} held batch {batch} of epoch {epoch} "
        f"unmarked, so its checkpoint starts before that batch, and sink {', '.join(wrote)} "
        f"wrote and marked batch {batch}: started again, this query would write batch "
        f"{batch}'s rows a second time there. Nothing was written under epoch {epoch + 1}. "
        f"Start a new checkpoint (not this one) that reads what comes after "
        f"{_after(batch, offsets)} (`fanout recover --ledger {ledger_location(ledger)} "
        f"--pipeline {shell_word(pipeline)}` resumes after it; if a copy of batch {batch} was "
        "removed from a sink since, that sink lacks the batch: give it to it by hand)."
    )


def _restart_message(
    info: BatchInfo, ledger: Ledger, held: list[Held], batch: int, offsets: str | None
) -> str:
    """The refusal of a refused query started again (:func:`_refuse_restart`)."""
    epoch, pipeline, names = info.epoch, info.pipeline, ", ".join(h.sink for h in held)
    where = _after(batch, offsets)
    lines = [
        f"pipeline {pipeline!r}: query {info.query_id} cannot start epoch {epoch + 1}: it was "
        f"refused before because sink {names} held batch {batch} of epoch {epoch} unmarked, "
        f"so its checkpoint starts before that batch; every sink now counts batch {batch} "
        f"(`fanout recover --ledger {ledger_location(ledger)} --pipeline {shell_word(pipeline)}` "
        "resumes "
        f"after it), and {names} still holds it: started again, this query would write batch "
        f"{batch}'s rows a second time there. Nothing was written under epoch {epoch + 1}.",
        f"Start a new checkpoint (not this one) that reads what comes after {where}. Or "
        f"remove {names}'s copy of batch {batch} so that the sink's own records no longer "
        "hold it (a Delta table: a restore to a version before the batch's commit), and "
        "start this query again: it passes, and writes the batch once."
        + "".join(f" {h.sink}: {h.hint}" for h in held if h.hint is not None),
    ]
    return "\n".join(lines)


def answers_holds_batch(sink: Sink) -> bool:
    """Whether ``sink``'s type answers :meth:`fanout.Sink.holds_batch` (overrides it): one
    that does not cannot tell, opened or not."""
    return type(sink).holds_batch is not Sink.holds_batch


def ask(
    sink: Sink,
    pipeline: str,
    epoch: int,
    mark: int,
    timeout_s: float | None = None,
    warn: Warn | None = None,
) -> Held:
    """``sink``'s answer about batch ``mark + 1`` of ``epoch`` (a failing hook: ``None``,
    logged, or said through ``warn`` when given).

    A sink with ``write_timeout_s`` (``timeout_s``) is asked in a daemon thread and waited
    for that long; one that does not answer refuses the start with a
    :class:`fanout.SinkTimeoutError`: counted as "cannot tell", it would let the new epoch
    write a batch the sink may hold a second time. Its ``target_replaced``, when it says
    held, is bounded apart (:func:`_identity`)."""
    held = bounded(sink, pipeline, lambda: _ask(sink, pipeline, epoch, mark, warn), timeout_s)
    if not isinstance(held, NoAnswer):
        return _identity(sink, pipeline, epoch, held, timeout_s)
    raise SinkTimeoutError(
        f"cannot tell within its write_timeout_s={timeout_s:g} s whether it holds batch "
        f"{mark + 1} of epoch {epoch} (written but never marked: its holds_batch() did not "
        f"return): epoch {epoch + 1} does not start, since it could write that batch to the "
        "sink a second time. Find what holds the sink's target (a stalled connection, a "
        "server that does not answer) and restart the query, or raise write_timeout_s",
        sink=sink.name,
        batch_id=mark + 1,
    )


def _ask(sink: Sink, pipeline: str, epoch: int, mark: int, warn: Warn | None = None) -> Held:
    question = (
        f"whether it holds batch {mark + 1} of epoch {epoch} (written but never marked) "
        "before the new epoch starts"
    )
    holds = holds_answer(sink, pipeline, epoch, mark + 1, question, warn)
    if isinstance(holds, CannotTell):
        return Held(sink.name, mark, None, why=holds.why)
    if isinstance(holds, PartlyHeld):  # the old checkpoint's replay completes it: no hint
        return Held(sink.name, mark, True, part=holds)
    if not holds:
        return Held(sink.name, mark, holds)
    harmless = sink.harmless_rewrite()
    hint = None if harmless is not None else sink.remove_batch_hint(pipeline, epoch, mark + 1)
    if harmless is not None:  # the lost mark's ledger row quotes it
        harmless = redact(harmless, sink.secret_values())
    return Held(sink.name, mark, holds, hint, harmless)


def recorded_offsets(ledger: Ledger, pipeline: str, epoch: int, batch_id: int) -> str | None:
    """The source offsets the ledger recorded for ``batch_id`` of ``epoch`` (another
    sink's mark of it), or ``None``."""
    for entry in ledger.committed_entries(pipeline, batch_id, epoch):
        if entry.batch_id == batch_id and entry.source_offsets is not None:
            return entry.source_offsets
    return None


def _message(
    info: BatchInfo,
    ledger: Ledger,
    held: list[Held],
    refused: list[Held],
    answers: list[Held],
    marks: Mapping[str, int | None],
    offsets: Mapping[str, str | None],
) -> str:
    """The refusal: ``refused``, the sinks of ``held`` (every sink holding its batch after
    its mark) whose rewrite of it is not harmless."""
    epoch, new, pipeline = info.epoch, info.epoch + 1, info.pipeline
    where = ledger_location(ledger)
    recover = f"fanout recover --ledger {where} --pipeline {shell_word(pipeline)}"
    unknown = {a.sink for a in answers if a.holds is None}
    whole = [h for h in refused if h.part is None]
    lines = [
        f"pipeline {pipeline!r}: query {info.query_id} cannot start epoch {new}: "
        + ", ".join(
            f"sink {h.sink} holds "
            + (f"batch {h.mark + 1}" if h.part is None else f"part of batch {h.mark + 1}")
            for h in refused
        )
        + f" of epoch {epoch} by its own records, and the ledger had no mark of it (the "
        "write committed, the mark did not: the driver died in between, or the query was "
        "stopped mid-batch). A reset resumes after the last marked batch, so the new epoch "
        "would read that input again and write those rows a second time under new "
        f"transaction ids. Nothing was written under epoch {new}"
        + ("; the ledger now records the lost mark (the sink holds the batch)." if whole else ".")
        + "".join(
            f" Sink {h.sink} holds batch {h.mark + 1} too (mark recorded), but writing it "
            f"again changes nothing there: {h.harmless}."
            for h in held
            if h.harmless is not None
        )
    ]
    for h in refused:
        if h.part is not None:
            lines += partial_lines(pipeline, epoch, where, h, offsets[h.sink], marks)
        else:
            lines += choice_lines(pipeline, epoch, where, h, offsets[h.sink], marks, held, unknown)
    lines.append(
        f"Stop every query of this pipeline, run `{recover}` again, and start the new "
        "query from the offsets it prints (on a new checkpoint when they are not this "
        "checkpoint's start)."
    )
    return "\n".join(lines)


def epoch_began(batch: int) -> str:
    """Where an epoch whose first batch is ``batch`` began: what a new checkpoint resuming
    before that batch starts from (the ledger holds no offsets of it)."""
    if batch == 0:
        return "the query's starting offsets"
    return f"the replaced checkpoint's offsets/{batch - 1} file"


def lacking_sinks(
    batch: int, marks: Mapping[str, int | None], holding: Sequence[Held]
) -> list[str]:
    """The sinks without ``batch``: by ``marks`` (each sink's mark before the lost ones,
    ``None``: no mark), and not among ``holding`` (the sinks found holding their batch after
    their mark)."""
    return [
        name
        for name, mark in sorted(marks.items())
        if (mark is None or mark < batch)
        and not any(a.sink == name and a.whole and a.mark + 1 == batch for a in holding)
    ]


def choice_lines(
    pipeline: str,
    epoch: int,
    where: str,
    held: Held,
    known: str | None,
    marks: Mapping[str, int | None],
    holding: Sequence[Held],
    unknown: Collection[str],
    *,
    refusal: bool = True,
) -> list[str]:
    """The lines naming the batch ``held.sink`` holds after its mark without a mark of it
    (``known``: its source offsets, when another sink marked it), the sinks without it
    (``marks``: each sink's mark in ``epoch`` before the lost one; ``holding``: every sink
    found holding its batch after its mark; ``unknown``: the sinks that cannot tell), and
    the operator's two ways out with their consequences. The refusal
    (:class:`fanout.UnmarkedBatchError`) and ``fanout recover --config`` print them.

    :param where: the ledger, as a command names it
        (:func:`fanout.ledger.entry.ledger_location`).
    :param refusal: the lines of a refused query's message (``False``: of ``fanout
        recover``, where no query was refused).
    """
    h, batch = held, held.mark + 1
    recover = f"fanout recover --ledger {where} --pipeline {shell_word(pipeline)}"
    lacking = lacking_sinks(batch, marks, holding)
    listed = ", ".join(
        f"{name} ("
        + ("no mark" if marks[name] is None else f"mark {marks[name]}")
        + (", cannot tell" if name in unknown else "")
        + ")"
        for name in lacking
    )
    lines = [
        f"- sink {h.sink}: batch {batch} of epoch {epoch}, "
        + (f"source offsets {known}" if known else "source offsets unknown (no sink marked it)")
        + f"; sinks without it: {listed or 'none'}."
        # not when a sink wrote and marked the batch: the refused query would write it
        # there again, and recover, counting the lost mark, resumes after the batch
        + ("" if h.hint is None or _marked(marks, batch) else f" {h.hint}")
    ]
    if not lacking:
        if not known:
            lines.append(
                f"  Every sink holds batch {batch}, so resume after it; `{recover}` "
                "cannot print its offsets (no sink marked it): the replaced checkpoint's "
                f"offsets/{batch} file holds them (one JSON line per source, after the "
                "first two lines)."
                + (" This query's checkpoint starts before it: start a new one." if refusal else "")
                + (
                    f" Or remove {h.sink}'s copy as said above and start this query again, not "
                    "a new checkpoint (the ledger counts the batch as held by "
                    f"{h.sink} now: a new checkpoint after it never gives it the batch)."
                    if refusal and h.hint is not None and not _marked(marks, batch)
                    else ""
                )
            )
        return lines
    skip = " ".join(f"`{skip_command(where, pipeline, name, batch, epoch)}`" for name in lacking)
    if marks[h.sink] is not None or any(m is not None for m in marks.values()):
        resume = f"Resume after batch {h.mark}, where `{recover}` counts {', '.join(lacking)}"
    else:
        unmarked = ", ".join(name for name in lacking if marks[name] is None)
        resume = (
            f"Resume at epoch {epoch}'s start, before its first batch {batch} (where it "
            f"began: {epoch_began(batch)}; `{recover} --config PIPELINE.toml` says so, "
            f"counting {unmarked}, which has no mark: without --config it does not see "
            f"{unmarked} and says resume after batch {batch}, which is choice 2 without "
            "its skip)"
        )
    return [
        *lines,
        f"  1. {resume}: {h.sink} gets batch {batch}'s rows a second time (unless its copy "
        "is removed first).",
        f"  2. Or give batch {batch} up for {', '.join(lacking)}: {skip}, then resume "
        f"after batch {batch}: they never get its rows.",
    ]


def partial_lines(
    pipeline: str,
    epoch: int,
    where: str,
    held: Held,
    known: str | None,
    marks: Mapping[str, int | None],
) -> list[str]:
    """The lines naming the batch ``held.sink`` holds only part of (``held.part``), why no
    lost mark is recorded, and the ways out: the old checkpoint's restart completes the
    batch; without it, a skip and a resume before the batch (the committed part twice) or
    after it (the rest never). The refusal and ``fanout recover --config`` print them.

    :param known: the batch's source offsets, when another sink marked it.
    :param marks: each sink's mark in ``epoch`` (``None``: no mark).
    """
    assert held.part is not None
    h, batch, part = held, held.mark + 1, held.part
    rest = (
        "the other partitions"
        if part.partitions is None
        else f"the other {part.partitions - part.committed} of {part.partitions} partitions"
    )
    rows = f"{rest}' rows"
    if part.whole_rows:  # only dead letters are missing
        rest = rows = f"the {part.letters} refused row(s) its partitions kept for the dead letters"
    elif part.letters:
        rest += f" and the {part.letters} refused row(s) kept for the dead letters"
        rows = rest
    skip = f"`{skip_command(where, pipeline, h.sink, batch, epoch)}`"
    marked = sorted(n for n, m in marks.items() if n != h.sink and m is not None and m >= batch)
    twice = (
        f" ({', '.join(marked)} marked batch {batch}: "
        f"{'it gets' if len(marked) == 1 else 'they get'} it a second time too)"
        if marked
        else ""
    )
    before = (
        f"after batch {h.mark}"
        if marks.get(h.sink) is not None
        else f"at epoch {epoch}'s start ({epoch_began(batch)})"
    )
    return [
        f"- sink {h.sink}: part of batch {batch} of epoch {epoch}, {part.text()} committed"
        f"{part.letters_text()} (by its own records); no lost mark is recorded for it: a "
        f"mark says the sink holds the whole batch, and a replay of batch {batch} would then "
        f"skip {rest}.",
        "  1. Restart the query on its old checkpoint (the one that wrote the batch, not a "
        f"new one, and without a reset): it replays batch {batch}, skips the {part.committed} "
        f"committed partitions and writes {rest}: nothing lost, nothing twice.",
        "  If that checkpoint is gone (the sink keeps being asked about the batch until its "
        f"ledger mark reaches it, so first {skip}):",
        f"  2. Resume {before}: {h.sink} gets the {part.committed} committed "
        f"partitions' rows of batch {batch} a second time{twice}.",
        f"  3. Or resume after batch {batch} ({_after(batch, known)}): {h.sink} never gets "
        f"{rows} of batch {batch}.",
    ]


def _identity(sink: Sink, pipeline: str, epoch: int, held: Held, timeout_s: float | None) -> Held:
    """``held``, or "does not hold" with :meth:`fanout.Sink.target_replaced`'s reason when
    the sink's records say it holds the batch (all or part) but its target was re-created
    empty since: a lost mark recorded (or a harmless rewrite) would count a batch the
    target no longer holds. Bounded apart from ``holds_batch`` (its own thread): one that
    raises or does not answer in time is logged and leaves ``held``, as at a run's
    lost-target check."""
    if not held.holds or not answers_target_replaced(sink):
        return held
    replaced = replaced_reason(sink, pipeline, epoch, held.mark + 1, timeout_s)
    if replaced is not None:
        return Held(sink.name, held.mark, False, replaced=replaced)
    return held
