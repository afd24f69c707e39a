"""The DataFrame a shared job reads (docs/architecture.md §3.4), and how it is built before
the members are ready.

Building it takes four DataFrame steps on the driver (``selectExpr``, ``repartition``, a sort,
``mapInArrow``), each a py4j round trip and an analysis of the batch's plan: ~15 ms of a
batch before any task can start. All but ``mapInArrow`` depend only on the batch and the
job's :class:`JobLayout`, which is the same batch after batch (the same sinks, the same
schema). So a :class:`~fanout.steps.share.SharedPass` builds them from the last batch's
layout while the members prepare (their round trips to the targets), and uses that frame
only when the members' own layout turns out equal: equal layouts build the same
DataFrame from the same batch, so what the job reads never depends on the guess.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fanout.contract.sharing import SharedShape
from fanout.partitioned.membership import partitioned_frame, quoted, select_columns


@dataclass(frozen=True)
class JobLayout:
    """What a shared job's input is made of.

    :param columns: the batch columns the members read, each once, in first-need order.
    :param shape: how the rows are partitioned and sorted (``None``: as the batch is).
    :param member_column: whether the member column (hashed from ``shape.by``) is added.
    """

    columns: tuple[str, ...]
    shape: SharedShape | None
    member_column: bool

    @classmethod
    def of(
        cls, shape: SharedShape | None, members: Sequence[tuple[Sequence[tuple[str, str]], bool]]
    ) -> JobLayout:
        """The layout for ``members``, each ``(columns, membership)``: ``columns`` its
        ``(batch column, sink's column)`` pairs, ``membership`` whether it keeps the member
        column."""
        needed = tuple(dict.fromkeys(c for columns, _ in members for c, _ in columns))
        wants_member = shape is not None and any(membership for _, membership in members)
        return cls(needed, shape, wants_member)

    def frame(self, df: Any) -> Any:
        """``df`` selected, partitioned and sorted as this layout says."""
        if self.shape is None:
            return select_columns(df, [quoted(c) for c in self.columns])
        shape = self.shape
        return partitioned_frame(
            df, shape.partitions, shape.by, columns=self.columns,
            member=self.member_column, sort=shape.sort,
        )  # fmt: skip


class RecentLayouts:
    """The last layout each group of sinks shared a job with, kept across batches by the
    :class:`fanout.FanOut` (a guess for the next batch, never trusted without checking)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._layouts: dict[tuple[str, ...], JobLayout] = {}

    def last(self, group: tuple[str, ...]) -> JobLayout | None:
        """The layout ``group`` used last, if any."""
        with self._lock:
            return self._layouts.get(group)

    def remember(self, group: tuple[str, ...], layout: JobLayout) -> None:
        """``group`` now shares with ``layout``."""
        with self._lock:
            self._layouts[group] = layout
