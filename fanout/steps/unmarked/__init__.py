"""Before a new epoch starts: the batch a sink wrote but never marked (the story:
:mod:`.start`, whose :func:`refuse_unmarked` runs the check).

- :mod:`.asking`: which sinks are asked about which batch, and their answers (:mod:`.held`);
- :mod:`.records_gone`: a sink's "does not hold" without the records it reads;
- :mod:`.epoch_fence`: the replaced epoch closed to writes in flight, and opened again;
- :mod:`.lost_marks`: the lost marks recorded, and which rewrites are harmless;
- :mod:`.restart`: a refused query started again on its checkpoint;
- :mod:`.held_text`, :mod:`.start_text`: what the refusals and warnings say.
"""

from __future__ import annotations

from fanout.steps.unmarked.asking import (
    answers_holds_batch,
    ask,
    ask_in_turn,
    before_start,
    unmarked_asks,
)
from fanout.steps.unmarked.epoch_fence import fence_epochs, fences, lift_fences
from fanout.steps.unmarked.held import Held
from fanout.steps.unmarked.held_text import choice_lines, epoch_began, lacking_sinks, partial_lines
from fanout.steps.unmarked.lost_marks import lost_mark, recorded_offsets
from fanout.steps.unmarked.records_gone import refuse_records_gone
from fanout.steps.unmarked.start import refuse_unmarked

__all__ = [
    "Held",
    "answers_holds_batch",
    "ask",
    "ask_in_turn",
    "before_start",
    "choice_lines",
    "epoch_began",
    "fence_epochs",
    "fences",
    "lacking_sinks",
    "lift_fences",
    "lost_mark",
    "partial_lines",
    "recorded_offsets",
    "refuse_records_gone",
    "refuse_unmarked",
    "unmarked_asks",
]
