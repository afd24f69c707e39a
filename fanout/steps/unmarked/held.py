"""A sink's answer about the batch after its mark (:class:`Held`), which every decision of
a new epoch's start (:mod:`fanout.steps.unmarked`) and ``fanout recover`` reads."""

from __future__ import annotations

from dataclasses import dataclass

from fanout.contract.sink import PartlyHeld


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
