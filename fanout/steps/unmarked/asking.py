"""Which sinks a new epoch's start asks about which batch of the replaced epoch, and what
each answers (:class:`~fanout.steps.unmarked.held.Held`): the batch after its mark (after
the others' highest, for a sink without one), asked through
:func:`fanout.steps.holds.holds_answer`, its target's identity checked when it says it
holds it. A sink to be asked that could not be opened refuses the start unasked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from fanout.contract.batch import BatchInfo
from fanout.contract.sink import PartlyHeld, Sink
from fanout.errors import SinkTimeoutError, UnmarkedBatchError
from fanout.ledger.entry import Ledger
from fanout.observe.secrets import redact
from fanout.steps.holds import (
    CannotTell,
    NoAnswer,
    Warn,
    answers_target_replaced,
    bounded,
    holds_answer,
    replaced_reason,
)
from fanout.steps.unmarked.held import Held, common
from fanout.steps.unmarked.start_text import holds_timeout_message, unasked_message


def answers_holds_batch(sink: Sink) -> bool:
    """Whether ``sink``'s type answers :meth:`fanout.Sink.holds_batch` (overrides it): one
    that does not cannot tell, opened or not."""
    return type(sink).holds_batch is not Sink.holds_batch


def refuse_unasked(
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
    unasked = to_ask(marks, before, in_spool)
    if unasked:
        raise UnmarkedBatchError(
            unasked_message(info, unasked, unopened),
            sinks=list(unasked),
            batch_id=common(None if mark is None else mark + 1 for mark in unasked.values()),
            epoch=epoch,
        )


def to_ask(
    marks: Mapping[str, int | None], before: int, in_spool: Mapping[str, int]
) -> dict[str, int | None]:
    """The sinks to ask, by name, each with its mark (``marks``, ``None``: no mark in the
    epoch; ``before``: the batch before the epoch's first, :func:`before_start`): those
    the spool does not hold the batch after it for (``in_spool``: per sink, the last batch
    of the epoch it holds)."""
    return {
        name: mark
        for name, mark in sorted(marks.items())
        if in_spool.get(name, -1) <= (before if mark is None else mark)
    }


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
        holds_timeout_message(mark, epoch, timeout_s), sink=sink.name, batch_id=mark + 1
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
