"""What a sink's reported counts may be: the check between its write and its ledger mark.

Only what holds for every sink is checked. A count is a whole number, never negative, and
the rows written plus the rows the sink refused (``dead_lettered``) do not exceed the rows
routed to it: every sink reports at most the rows it received (a replay the target holds
reports the batch's rows), and a refused row counts in ``dead_lettered`` only, never in
``rows`` too (:class:`fanout.contract.sink.SinkResult`). No lower bound is checked: an
upsert sink collapsing keys, or a replay that skips partitions the target holds, may write
fewer. The routed count is known only when the batch was converted to Arrow (by this sink
or another of its route); otherwise counting it would cost a Spark job per sink and batch,
and the upper bound is not checked.
"""

from __future__ import annotations

import numbers

from fanout.contract.sink import SinkResult
from fanout.errors import SinkResultError


def _count(value: object) -> bool:
    # Integral, not int: NumPy's integers (a pandas sum, a shape) are whole numbers too
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_counts(result: SinkResult, *, sink: str, batch_id: int, routed: int | None) -> None:
    """Raise :class:`fanout.errors.SinkResultError` when ``result``'s counts are impossible
    for a batch of ``routed`` rows (``None``: not known, the upper bound is not checked)."""
    rows, dead = result.rows, result.dead_lettered
    problem = None
    if not (_count(rows) and _count(dead)):
        problem = "counts must be whole numbers"
    elif rows < 0 or dead < 0:
        problem = "a count is below zero"
    elif routed is not None and max(rows, dead) > routed:
        problem = f"only {routed} rows were routed to it in this batch"
    elif routed is not None and rows + dead > routed:
        problem = (
            f"their sum, {rows + dead}, is more than the {routed} rows routed to it in this "
            "batch (a refused row counts in dead_lettered only, not in rows too)"
        )
    if problem is None:
        return
    raise SinkResultError(
        f"write() reported rows={rows!r}, dead_lettered={dead!r}, but {problem}. A sink "
        "reports the rows of the batch it wrote (at most the rows it received) and the "
        "rows it refused; this is a bug in the sink, fix what its write() returns. The "
        "batch is not marked for this sink: a replay writes it again",
        sink=sink,
        batch_id=batch_id,
    )
