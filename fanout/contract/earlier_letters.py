"""What a sink's earlier dead-letter targets hold of a batch's letters, as fanout hands it
over in :attr:`fanout.Batch.earlier` (docs/architecture.md §7, "A ``dead_letter`` moved"): a
module of its own, so the batch and the dead-letter contract both name it without
importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class HeldLetters:
    """What one dead-letter target holds of one batch's letters of one sink, as its
    ``letters_held(batch)`` answers (docs/architecture.md §7, "A ``dead_letter`` moved").

    :param target: the target for people (:meth:`DeadLetterTarget.describe`).
    :param route: whether it holds route letters of the batch.
    :param fingerprint: the route fingerprint they were recorded under (``None``: none
        recorded, or no route letters).
    :param route_text: that route's text, when the target keeps it.
    :param refused: the write partitions whose refused rows (source ``refused``) of the
        batch it holds; ``None`` among them: rows refused without a partition.
    :param replaces: the target itself, when it holds refused rows and can take a batch's
        letters back (a ``ReplacesLetters``: a Delta table); set by fanout, not by
        ``letters_held``. An upsert replay makes its letters of :attr:`refused`'s
        partitions the batch's there (:func:`fanout.deadletters.moved.replace_letters`).
        Not compared.
    """

    target: str
    route: bool = False
    fingerprint: str | None = None
    route_text: str | None = None
    refused: frozenset[int | None] = frozenset()
    replaces: Any = field(default=None, compare=False, repr=False)
    """A :class:`fanout.contract.dead_letters.ReplacesLetters` or ``None`` (typed ``Any``:
    this module imports neither the batch nor the dead-letter contract)."""

    @property
    def any(self) -> bool:
        """Whether it holds any letter of the batch."""
        return self.route or bool(self.refused)


@dataclass(frozen=True)
class EarlierLetters:
    """What the sink's earlier dead-letter targets hold of one batch: set by fanout in
    :attr:`fanout.Batch.earlier` on the one batch an earlier process may have attempted
    under another ``dead_letter`` than the sink's now. Letters one of them holds are not
    written again (:func:`fanout.deadletters.moved.write_letters`). Picklable: it travels
    to the executors with the batch.

    :param epoch: the batch's epoch.
    :param batch_id: the batch.
    :param held: one answer per earlier target that may hold letters of the batch (also
        those holding none: a sink that records its target with each committed piece
        accepts a replay under another when the piece's is one of them).
    """

    epoch: int
    batch_id: int
    held: tuple[HeldLetters, ...] = ()

    def route(self) -> HeldLetters | None:
        """The earlier target holding the batch's route letters, if one does."""
        return next((h for h in self.held if h.route), None)

    def refused(self, partition: int | None) -> HeldLetters | None:
        """The earlier target holding the refused rows of write partition ``partition``
        (``None``: rows refused without a partition), if one does."""
        return next((h for h in self.held if partition in h.refused), None)


__all__ = ["EarlierLetters", "HeldLetters"]
