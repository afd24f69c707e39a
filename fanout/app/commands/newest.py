"""The newest write mark an operator's command prints first, and whether its pipeline looks
running (:mod:`fanout.app.activity`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fanout.ledger.delta import DeltaLedger


NEWEST_HELP = (
    "the pipeline's newest write mark (sink, batch, epoch, how long ago) and whether it "
    "looks running: newer than 3 x the median gap between its latest batches, at least 60 s"
)
"""The operator commands' help on the newest-mark line (:mod:`fanout.app.activity`)."""


def ledger_newest_marks(ledger: DeltaLedger, pipeline: str | None) -> list[Any]:
    """Per pipeline (``None``: every pipeline of the ledger), its newest write mark now
    (:func:`fanout.app.activity.newest_marks_of`): one scan of seven columns of the
    pipeline's committed rows, reduced in Arrow, in the operator's command only, none on a
    run's path."""
    from fanout.app.activity import newest_marks_of

    return newest_marks_of(ledger.mark_times(pipeline))


def say_newest(marks: Sequence[Any], pipeline: str | None, warning: str | None) -> None:
    """Print each of ``marks`` (:func:`ledger_newest_marks`; none: ``pipeline`` has no write
    mark yet) and whether its pipeline looks running; for one that does, ``warning`` on stderr (the
    command goes on: its exit code is its own)."""
    from fanout.app.activity import no_mark_yet

    if not marks and pipeline is not None:
        print(no_mark_yet(pipeline))
    for mark in marks:
        print(mark.describe())
        if mark.looks_running and warning is not None:
            print(f"fanout: warning: pipeline {mark.pipeline!r} looks running: {warning}",
                  file=sys.stderr)  # fmt: skip
