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

The group that read the last batch as Spark handed it over (not a persisted or
repartitioned copy) starts sooner still: :meth:`RecentLayouts.start_ahead` builds its input
and starts its shuffle (:mod:`fanout.steps.shuffle_ahead`) as the batch arrives, before the
guard, the plan and the routes (~20 ms of a batch whose cores would otherwise wait for the
driver); the group's pass takes it when its own layout and DataFrame are the same, and what
no pass took is cancelled when the batch ends.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fanout.contract.sessions import is_connect
from fanout.contract.sharing import SharedShape
from fanout.partitioned.membership import (
    MEMBER_COLUMN,
    partitioned_frame,
    quoted,
    select_columns,
)
from fanout.steps.shuffle_ahead import StartedShuffle, start_shuffle

log = logging.getLogger("fanout")

Group = tuple[str, ...]
"""A group of sinks sharing a job: their names, in configuration order."""


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

    def frame_columns(self) -> tuple[str, ...]:
        """The columns of :meth:`frame`, in order."""
        return self.columns + ((MEMBER_COLUMN,) if self.member_column else ())

    def frame(self, df: Any) -> Any:
        """``df`` selected, partitioned and sorted as this layout says."""
        if self.shape is None:
            return select_columns(df, [quoted(c) for c in self.columns])
        shape = self.shape
        return partitioned_frame(
            df, shape.partitions, shape.by, columns=self.columns,
            member=self.member_column, sort=shape.sort,
        )  # fmt: skip


@dataclass(frozen=True)
class EarlyInput:
    """A shared job's input built before the job, from a guessed layout, its shuffle
    started when it has one (:mod:`fanout.steps.shuffle_ahead`)."""

    layout: JobLayout
    frame: Any
    shuffle: StartedShuffle | None

    @classmethod
    def build(cls, layout: JobLayout, df: Any) -> EarlyInput | None:
        """``df`` framed as ``layout`` says, its shuffle started; ``None`` when it cannot be
        built (the job builds it again after its members prepared, raising there)."""
        try:
            frame = layout.frame(df)
        except Exception as exc:
            log.debug("the shared job's input could not be built early: %s", exc)
            return None
        # without a shape the frame has no repartition of its own: no shuffle to start
        shuffle = start_shuffle(frame) if layout.shape is not None else None
        return cls(layout, frame, shuffle)

    def reader(self) -> Any:
        """The frame the job reads: the started shuffle's output, or the frame itself."""
        return self.shuffle.frame if self.shuffle is not None else self.frame

    def discard(self) -> None:
        """No job reads it: stop its shuffle."""
        if self.shuffle is not None:
            self.shuffle.cancel()


@dataclass(frozen=True)
class _HeadStart:
    group: Group
    df: Any
    early: EarlyInput


class RecentLayouts:
    """The last layout each group of sinks shared a job with, kept across batches by the
    :class:`fanout.FanOut` (a guess for the next batch, never trusted without checking),
    and the input started ahead for the batch in progress (:meth:`start_ahead`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._layouts: dict[Group, JobLayout] = {}
        self._ahead_group: Group | None = None  # read the last batch as handed over
        self._ahead: _HeadStart | None = None

    def last(self, group: Group) -> JobLayout | None:
        """The layout ``group`` used last, if any."""
        with self._lock:
            return self._layouts.get(group)

    def remember(self, group: Group, layout: JobLayout) -> None:
        """``group`` now shares with ``layout``."""
        with self._lock:
            self._layouts[group] = layout

    def start_ahead(self, df: Any) -> None:
        """As batch ``df`` arrives: build the input of the group that read the last batch
        as Spark handed it over, from that group's layout, and start its shuffle. Nothing
        when there is no such group, or under Spark Connect (no shuffle to start there)."""
        with self._lock:
            group = self._ahead_group
            layout = self._layouts.get(group) if group is not None else None
        if group is None or layout is None or is_connect(df):
            return
        early = EarlyInput.build(layout, df)
        if early is not None:  # one FanOut per query: a head start left over is cancelled
            _discard(self._replace_ahead(_HeadStart(group, df, early)))

    def take_ahead(self, group: Group, df: Any) -> EarlyInput | None:
        """The input started ahead, when it was started for ``group`` reading this very
        ``df``; the caller then owns it (reads it or discards it). Started for another
        group or DataFrame, it is cancelled: a batch with a second group, or read by a
        sink of its own, is persisted, so no pass of this batch reads the batch as given."""
        ahead = self._replace_ahead(None)
        if ahead is not None and ahead.group == group and ahead.df is df:
            return ahead.early
        _discard(ahead)
        return None

    def cancel_ahead(self) -> None:
        """No pass of this batch reads it as Spark handed it over (it was persisted): stop
        the input started ahead, which would scan the batch beside its cache."""
        _discard(self._replace_ahead(None))

    def end_batch(self, follow: Group | None) -> None:
        """The batch ended: cancel an input started ahead that no group took; the next
        batch starts ``follow``'s input ahead (``None``: none, e.g. the batch was read as
        a persisted copy, which the next batch's early start could not be used for)."""
        with self._lock:
            self._ahead_group = follow
        _discard(self._replace_ahead(None))

    def _replace_ahead(self, ahead: _HeadStart | None) -> _HeadStart | None:
        with self._lock:
            earlier, self._ahead = self._ahead, ahead
        return earlier


def _discard(ahead: _HeadStart | None) -> None:
    if ahead is not None:
        ahead.early.discard()
