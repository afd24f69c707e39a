"""Asking a sink :meth:`fanout.Sink.holds_batch` once an epoch or a run starts, never on the
per-batch path: before a new epoch (:mod:`fanout.steps.unmarked`) and at a run's first
batch (:mod:`fanout.steps.lost_target`).

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


@dataclass(frozen=True)
class CannotTell:
    """The sink's ``holds_batch`` raised: it cannot read its records."""

    why: str
    """Its error, as ``Type: message``."""


class NoAnswer:
    """The sink's ``holds_batch`` did not return within its ``write_timeout_s``: it may
    still be running, in a daemon thread nobody waits for."""

    def __repr__(self) -> str:
        return "NO_ANSWER"


NO_ANSWER: Final = NoAnswer()
"""What :func:`bounded` returns for a sink that did not answer in time."""


def holds_answer(
    sink: Sink, pipeline: str, epoch: int, batch_id: int, question: str
) -> bool | PartlyHeld | CannotTell | None:
    """``sink.holds_batch(pipeline, epoch, batch_id)``; a hook that raises is logged as
    "pipeline P, sink S: cannot tell ``question``: its error" and answers
    :class:`CannotTell`, the error masked with the sink's secrets (refusals and
    ``fanout recover`` print it)."""
    try:
        return sink.holds_batch(pipeline, epoch, batch_id)
    except Exception as exc:  # a check that cannot read its records cannot tell
        why = redact(f"{type(exc).__name__}: {exc}", sink.secret_values())  # errors show it
        log.warning("pipeline %s, sink %s: cannot tell %s: %s", pipeline, sink.name, question, why)
        return CannotTell(why)


def bounded(
    sink: Sink, pipeline: str, ask: Callable[[], T], timeout_s: float | None
) -> T | NoAnswer:
    """``ask()`` (a question to ``sink``, :func:`holds_answer` and what follows from its
    answer) at once when ``timeout_s`` is ``None``; else in a daemon thread named
    ``fanout-<pipeline>-<sink>-holds-batch``, waited for ``timeout_s`` seconds:
    :data:`NO_ANSWER` when it did not return by then (what it raised is raised)."""
    if timeout_s is None:
        return ask()
    name = f"fanout-{pipeline}-{sink.name}-holds-batch"
    call = BoundedCall.run(ask, timeout_s, name)
    if not call.done.is_set():
        return NO_ANSWER
    answer: T = call.outcome()
    return answer
