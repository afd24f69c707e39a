"""A sink's answer about the batch after its mark (:class:`Held`), which every decision of
a new epoch's start (:mod:`fanout.steps.unmarked`) and ``fanout recover`` reads, and the
refusal of the sinks holding it (:func:`held_refusal`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from fanout.contract.sink import PartlyHeld
from fanout.errors import UnmarkedBatchError

_T = TypeVar("_T")


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

    @property
    def answer(self) -> bool | PartlyHeld | None:
        """The answer as :meth:`fanout.Sink.holds_batch` gave it (``part`` when the sink
        holds part of the batch)."""
        return self.holds if self.part is None else self.part


def held_refusal(message: str, held: Sequence[Held], epoch: int) -> UnmarkedBatchError:
    """The refusal, saying ``message``, by the sinks of ``held`` holding their batch after
    their mark in ``epoch``: its attributes name them, the batch and their answer (each
    ``None`` where they differ)."""
    return UnmarkedBatchError(
        message,
        sinks=[h.sink for h in held],
        batch_id=common(h.mark + 1 for h in held),
        epoch=epoch,
        holds=common(h.answer for h in held),
    )


def common(values: Iterable[_T]) -> _T | None:
    """The value every one of ``values`` has (``None``: none given, or they differ)."""
    distinct = list(dict.fromkeys(values))
    return distinct[0] if len(distinct) == 1 else None
