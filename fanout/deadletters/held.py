"""What a dead-letter target holds of one batch, asked by a sink's ``holds_batch``.

A partitioned sink whose dead-letter target cannot join its partitions' transactions
(PostgreSQL's driver-written targets, Kafka's parked letters) hands the refused rows over
after the partitions committed; a driver killed in between leaves a batch whose every
partition committed and whose letters are not there yet. The sink asks the target how
many it holds (:func:`refused_rows_held`) before it says the batch is held whole.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fanout.observe.secrets import redact

if TYPE_CHECKING:
    from fanout.contract.dead_letters import DeadLetterTarget

_log = logging.getLogger(__name__)


def refused_rows_held(
    target: DeadLetterTarget | None,
    pipeline: str,
    sink: str,
    key: tuple[int, int],
    *,
    secrets: Sequence[str] = (),
    logger: logging.Logger | None = None,
) -> int:
    """How many rows ``sink`` of ``pipeline`` refused itself (source ``refused``, not a
    route's) in batch ``key`` (``(epoch, batch id)``) the dead-letter ``target`` holds,
    when it can tell: a target with ``read_rows`` (a Delta table,
    :meth:`fanout.deadletters.delta.DeltaDeadLetters.read_rows`).

    0 when it cannot tell (no ``read_rows``), when there is no target (``None``), or when
    the read fails; a failure is logged as a warning, ``sink S, batch N: cannot read its
    dead letters in <target> (<error>): counted as not there``, masked of ``secrets``
    (the sink's: its error may quote a credential). The caller counts what it lacks as
    not there: the batch is then held in part, never taken as whole.

    :param logger: where the warning goes (the asking sink's logger; this module's
        without one).
    """
    read_rows = getattr(target, "read_rows", None)
    if target is None or read_rows is None:
        return 0
    try:
        return int(read_rows(pipeline, sink, key).num_rows)
    except Exception as exc:
        text = f"cannot read its dead letters in {target.describe()} ({exc}): counted as not there"
        (logger or _log).warning("sink %r, batch %d: %s", sink, key[1], redact(text, secrets))
        return 0
