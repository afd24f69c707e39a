"""``fanout status``'s standing problems: what is wrong with the ledger's table or a sink's
target that only a person can fix, found without changing anything, each naming the fix.
Today one kind: a Delta compaction that left rows twice and cannot be taken back
(ARCHITECTURE §4, "Compactions that race"), of the ledger's table (always) and of the
pipeline file's sinks (``--config``: :meth:`fanout.Sink.standing_problems`).
"""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
