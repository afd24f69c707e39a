"""Asking a sink :meth:`fanout.Sink.holds_batch` (and :meth:`fanout.Sink.target_replaced`)
once an epoch or a run starts, never on the per-batch path: before a new epoch
(:mod:`fanout.steps.unmarked`) and at a run's first batch (:mod:`fanout.steps.lost_target`).

Both ask the same way: a failing hook is logged and read as "cannot tell"
(:class:`CannotTell`), and a sink with ``write_timeout_s`` is asked in a daemon thread and
waited for that long. What a sink that does not answer in time (:data:`NO_ANSWER`) means is
the caller's: it refuses a new epoch, and passes a run's check of its target.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeVar

from fanout.contract.sink import PartlyHeld, Sink
from fanout.observe.secrets import redact
from fanout.steps.timeout import BoundedCall

log = logging.getLogger("fanout")

T = TypeVar("T")

NO_REASON: Final = "the sink gave no reason (its target_replaced answered an empty text)"
"""The reason quoted for a :meth:`fanout.Sink.target_replaced` that answered ``""``: a
replaced target all the same (refused, never written)."""


@dataclass(frozen=True)
class CannotTell:
    """The sink's ``holds_batch`` (or ``target_replaced``) raised: it cannot read its
    records."""

    why: str
    """Its error, as ``Type: message``."""


class NoAnswer:
    """The sink's ``holds_batch`` did not return within its ``write_timeout_s``: it may
    still be running, in a daemon thread nobody waits for."""

    def __repr__(self) -> str:
        return "NO_ANSWER"


NO_ANSWER: Final = NoAnswer()
"""What :func:`bounded` returns for a sink that did not answer in time."""


Warn = Callable[..., None]
"""Where a question's warning goes: :meth:`logging.Logger.warning`'s arguments (message
and its arguments), e.g. held back until it is known whether the question counts."""


def holds_answer(
    sink: Sink, pipeline: str, epoch: int, batch_id: int, question: str, warn: Warn | None = None
) -> bool | PartlyHeld | CannotTell | None:
    """``sink.holds_batch(pipeline, epoch, batch_id)``; a hook that raises is logged as
    "pipeline P, sink S: cannot tell ``question``: its error" (through ``warn`` when given)
    and answers :class:`CannotTell`, the error masked with the sink's secrets (refusals and
    ``fanout recover`` print it)."""
    try:
        return sink.holds_batch(pipeline, epoch, batch_id)
    except Exception as exc:  # a check that cannot read its records cannot tell
        why = redact(f"{type(exc).__name__}: {exc}", sink.secret_values())  # errors show it
        (warn or log.warning)(
            "pipeline %s, sink %s: cannot tell %s: %s", pipeline, sink.name, question, why
        )
        return CannotTell(why)


def replaced_answer(
    sink: Sink, pipeline: str, epoch: int, batch_id: int, question: str
) -> str | CannotTell | None:
    """``sink.target_replaced(pipeline, epoch, batch_id)``, its reason masked with the
    sink's secrets (refusals, logs and ``fanout recover`` quote it), :data:`NO_REASON` for
    an empty one (it said replaced); a hook that raises is logged as :func:`holds_answer`
    logs it and answers :class:`CannotTell`, which every caller reads as "not replaced"
    (``holds_batch`` decides)."""
    try:
        reason = sink.target_replaced(pipeline, epoch, batch_id)
    except Exception as exc:  # an identity it cannot read tells nothing
        why = redact(f"{type(exc).__name__}: {exc}", sink.secret_values())
        log.warning("pipeline %s, sink %s: cannot tell %s: %s", pipeline, sink.name, question, why)
        return CannotTell(why)
    if reason is None:
        return None
    return redact(str(reason), sink.secret_values()) if str(reason).strip() else NO_REASON


def answers_target_replaced(sink: Sink) -> bool:
    """Whether ``sink``'s type implements :meth:`fanout.Sink.target_replaced` (one that does
    not is not asked: no thread, no wait)."""
    return type(sink).target_replaced is not Sink.target_replaced


def answers_records_gone(sink: Sink) -> bool:
    """Whether ``sink``'s type implements :meth:`fanout.Sink.records_gone`."""
    return type(sink).records_gone is not Sink.records_gone


def gone_reason(
    sink: Sink, pipeline: str, epoch: int, batch_id: int, timeout_s: float | None
) -> str | None:
    """``sink``'s :meth:`~fanout.Sink.records_gone` about ``batch_id`` of ``epoch`` (which
    ``holds_batch`` said its target does not hold), masked with its secrets; ``None`` when
    its type does not answer it, it raised or did not answer within ``timeout_s``
    (logged). Asked at a run's lost-target check (:mod:`fanout.steps.lost_target`) and
    at a new epoch's start (:mod:`fanout.steps.unmarked`)."""
    if not answers_records_gone(sink):
        return None
    question = f"whether its own records of batch {batch_id} of epoch {epoch} are gone"

    def ask() -> str | None:
        try:
            return sink.records_gone(pipeline, epoch, batch_id)
        except Exception as exc:  # records it cannot read tell nothing: holds_batch decides
            why = redact(f"{type(exc).__name__}: {exc}", sink.secret_values())
            log.warning("pipeline %s, sink %s: cannot tell %s: %s", pipeline, sink.name,
                        question, why)  # fmt: skip
            return None

    gone = _in_time(sink, pipeline, ask, timeout_s, "records-gone", question)
    return None if gone is None else redact(str(gone), sink.secret_values())


def bounded(
    sink: Sink,
    pipeline: str,
    ask: Callable[[], T],
    timeout_s: float | None,
    hook: str = "holds-batch",
) -> T | NoAnswer:
    """``ask()`` (a question to ``sink``, :func:`holds_answer` and what follows from its
    answer, or :func:`replaced_answer`) at once when ``timeout_s`` is ``None``; else in a
    daemon thread named ``fanout-<pipeline>-<sink>-<hook>``, waited for ``timeout_s``
    seconds: :data:`NO_ANSWER` when it did not return by then (what it raised is raised)."""
    if timeout_s is None:
        return ask()
    name = f"fanout-{pipeline}-{sink.name}-{hook}"
    call = BoundedCall.run(ask, timeout_s, name)
    if not call.done.is_set():
        return NO_ANSWER
    answer: T = call.outcome()
    return answer


def replaced_reason(
    sink: Sink, pipeline: str, epoch: int, batch_id: int, timeout_s: float | None
) -> str | None:
    """``sink``'s :meth:`~fanout.Sink.target_replaced` about ``batch_id`` of ``epoch``
    (:func:`replaced_answer`), bounded as ``holds_batch`` is (:func:`bounded`, its own
    thread): ``None`` when it raised or did not answer in time, logged (``holds_batch``'s
    answer stands)."""
    question = (
        f"whether its target is still the one batch {batch_id} of epoch {epoch} was written to"
    )
    reason = _in_time(
        sink,
        pipeline,
        lambda: replaced_answer(sink, pipeline, epoch, batch_id, question),
        timeout_s,
        "target-replaced",
        question,
    )
    return None if isinstance(reason, CannotTell) else reason


def _in_time(
    sink: Sink,
    pipeline: str,
    ask: Callable[[], T],
    timeout_s: float | None,
    hook: str,
    question: str,
) -> T | None:
    """``ask()`` bounded by :func:`bounded`; ``None`` when it did not answer within
    ``timeout_s``, logged as "cannot tell within its write_timeout_s ``question``"."""
    answer = bounded(sink, pipeline, ask, timeout_s, hook=hook)
    if isinstance(answer, NoAnswer):
        log.warning(
            "pipeline %s, sink %s: cannot tell within its write_timeout_s=%g s %s",
            pipeline, sink.name, timeout_s, question,
        )  # fmt: skip
        return None
    return answer
