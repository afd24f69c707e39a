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
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import partial

from fanout.contract.batch import BatchInfo
from fanout.contract.sink import Sink
from fanout.ledger.entry import Ledger
from fanout.steps.unmarked.asking import (
    ask_in_turn,
    before_start,
    refuse_unasked,
    to_ask,
    unmarked_asks,
)
from fanout.steps.unmarked.epoch_fence import fence_epochs, fences, lift_fences
from fanout.steps.unmarked.held import held_refusal
from fanout.steps.unmarked.held_text import refusal_message
from fanout.steps.unmarked.lost_marks import (
    lost_mark_at_start,
    needed_rewrites,
    recorded_offsets,
    warn_rewrite,
)
from fanout.steps.unmarked.records_gone import refuse_records_gone
from fanout.steps.unmarked.restart import refuse_restart

log = logging.getLogger("fanout")


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
    ``write_timeout_s``, whose answer is waited for that long
    (:func:`~fanout.steps.unmarked.asking.ask`).
    ``unopened``: the sinks that could tell (their type answers ``holds_batch``) but whose
    ``open()`` failed (``on_failure="lag"``), each with its error: one that would be asked
    refuses the start (:func:`refuse_unasked`). When a sink to be asked fences, every sink
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
        refuse_unasked(info, ledger, unopened, in_spool)
    marks = ledger.last_committed(info.pipeline, sinks, epoch)
    before = before_start(ledger, info.pipeline, epoch, marks)
    asked = list(to_ask(marks, before, in_spool))
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
    refuse_restart(info, ledger, sinks, marks, unmarked, bounds, warn)
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
    held = needed_rewrites(held, marks, sinks, in_spool)
    if first is not None and all(h.harmless is not None for h in held):
        return
    offsets = {h.sink: recorded_offsets(ledger, info.pipeline, epoch, h.mark + 1) for h in held}
    owner = ledger.epoch_owners(info.pipeline).get(epoch)
    for h in held:
        if h.whole:  # a mark of part of a batch would make its replay skip the rest
            ledger.mark_committed(lost_mark_at_start(info, h, owner, offsets[h.sink]))
    refused = [h for h in held if h.harmless is None]
    for h in held:
        if h.harmless is not None:
            warn_rewrite(info, h)
    if refused:
        message = refusal_message(info, ledger, held, refused, answers, marks, offsets)
        raise held_refusal(message, refused, epoch)
