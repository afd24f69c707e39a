"""Compaction of a Delta table with delta-rs, taken back when it raced another compaction of
the same files, also after its process was killed before its check (ARCHITECTURE §4,
"Compactions that race"; the story: :mod:`.own`).

- :mod:`.own`: :func:`compact`, the compaction and the check right after its commit;
- :mod:`.repair`: a later run's check of the compactions a killed process left unchecked;
- :mod:`.scan`: reading the history back to the last checked point;
- :mod:`.marker`: the table's mark, up to which every fanout compaction is checked, read
  from its snapshot alone;
- :mod:`.take_back`: the taking back, and finding one's own commit in the history;
- :mod:`.files`: the files a commit removed and added, and their rows;
- :mod:`.refusals`: what the errors say when rows stay twice;
- :mod:`.tags`: the commit-info tags all of them write and read.

Each imports only those listed below it, :mod:`fanout.delta_tables` and
:mod:`fanout.errors`.
"""

from __future__ import annotations

from fanout.delta_tables.compaction.own import Compaction, compact
from fanout.delta_tables.compaction.repair import (
    refused_compaction,
    repair_unchecked,
    would_take_back,
)
from fanout.delta_tables.compaction.scan import worth_a_scan

__all__ = [
    "Compaction",
    "compact",
    "refused_compaction",
    "repair_unchecked",
    "worth_a_scan",
    "would_take_back",
]
