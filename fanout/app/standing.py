"""``fanout status``'s standing problems: what is wrong with the ledger's table or a sink's
target that only a person can fix, found without changing anything, each naming the fix.
Today one kind: a Delta compaction that left rows twice and cannot be taken back
(ARCHITECTURE §4, "Compactions that race"), of the ledger's table (always) and of the
pipeline file's sinks (``--config``: :meth:`fanout.Sink.standing_problems`).
"""

from __future__ import annotations

import logging
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fanout.delta_tables.io import one_line

if TYPE_CHECKING:
    from fanout.contract.sink import Sink
    from fanout.ledger.delta import DeltaLedger

log = logging.getLogger(__name__)

LEDGER = "ledger"
"""What :attr:`Problem.where` says of the ledger's own table."""


@dataclass(frozen=True)
class Problem:
    """One standing problem: ``where`` is :data:`LEDGER` or a sink's name; ``text`` names
    the table itself."""

    where: str
    text: str


def ledger_problems(ledger: DeltaLedger | None) -> list[Problem]:
    """The ledger table's refused compaction, if any (``ledger`` ``None``: none yet)."""
    if ledger is None:
        return []
    try:
        found = ledger.refused_compaction()
    except Exception as exc:  # status shows what it can: the table shows the read failing
        log.debug("ledger %s: compactions not checked: %s", ledger, one_line(str(exc)))
        return []
    return [] if found is None else [Problem(LEDGER, found)]


def sink_problems(sinks: Mapping[str, Sink]) -> list[Problem]:
    """Each sink's standing problems (:meth:`fanout.Sink.standing_problems`); one that
    cannot be asked is left out (its own checks at the run's open say why)."""
    found: list[Problem] = []
    for name, sink in sinks.items():
        try:
            found += [Problem(name, text) for text in sink.standing_problems()]
        except Exception as exc:
            log.debug("sink %r: standing problems not read: %s", name, one_line(str(exc)))
    return found


SINKS_ASKED_EVERY_S = 60.0
"""How often ``fanout status --watch`` asks the sinks again for their standing problems
(:class:`SinkProblemsEvery`): the first draw asks, a redraw asks only once this many
seconds passed since."""


@dataclass
class SinkProblemsEvery:
    """:func:`sink_problems` for ``fanout status``'s draws: asked at the first, then again
    only once ``every_s`` seconds passed since the last ask (a draw between shows the last
    answer). A standing problem is a state of the target that only a person changes (a
    refused compaction stays until someone fixes it), while asking may read the target (a
    Delta table's log: on an object store, requests) at each draw: a ``--watch`` redrawn
    every 5 s asked each sink 12 times a minute for an answer that changes by hand. So a
    problem appears, or goes once fixed, within a minute of the change; the ledger and the
    spool are still read at every draw."""

    sinks: Mapping[str, Sink]
    every_s: float = SINKS_ASKED_EVERY_S
    clock: Callable[[], float] = time.monotonic
    _asked_at: float | None = field(default=None, init=False)
    _found: list[Problem] = field(default_factory=list, init=False)

    def __call__(self) -> list[Problem]:
        """The sinks' standing problems, asked now or at the last ask."""
        now = self.clock()
        if self._asked_at is None or now - self._asked_at >= self.every_s:
            self._found, self._asked_at = sink_problems(self.sinks), now
        return list(self._found)


def problems_footer(problems: Sequence[Problem], width: int) -> str:
    """The lines after the status table (empty without problems)."""
    if not problems:
        return ""
    lines = [
        textwrap.fill(
            p.text, width, subsequent_indent="  ", break_on_hyphens=False, break_long_words=False
        )
        for p in problems
    ]
    return "\n\nto fix by hand:\n" + "\n".join(lines)
