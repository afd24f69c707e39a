"""A fanout compaction that another program's ``OPTIMIZE`` of the same files committed
before, in a process of its own killed at a named point of fanout's code (as
:mod:`tests.kill_at` kills the ``fanout`` command): what the crash tests of
:mod:`fanout.delta_tables.compaction` run.

``python -m tests.compaction_driver KIND PATH TARGET WHEN N``: ``KIND`` ``table`` compacts
the Delta table at ``PATH`` as the Delta sink does (delta-rs ``OPTIMIZE``), ``ledger``
compacts the ledger there as the ledger does after its marks (an overwrite with its own
rows); ``TARGET WHEN N`` as for :mod:`tests.kill_at`.
"""

from __future__ import annotations

import sys

from deltalake import DeltaTable

from tests.kill_at import kill_at


def main(argv: list[str]) -> int:
    """Plan the compaction, let the other program's ``OPTIMIZE`` commit first, then run
    the compaction with ``TARGET`` wrapped to kill this process."""
    kind, path, target, when, nth = argv
    mine = DeltaTable(path)  # the compaction's snapshot: the small files
    DeltaTable(path).optimize.compact()  # another program's OPTIMIZE of them, first
    kill_at(target, when, int(nth))
    if kind == "ledger":
        from fanout.ledger.delta import DeltaLedger

        DeltaLedger(path)._table.compact(mine)
    else:
        from fanout.delta_tables.compaction import compact

        compact(mine, f"test table {path}", None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
