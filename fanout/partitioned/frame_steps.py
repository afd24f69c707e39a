"""A partitioned frame's DataFrame steps, one py4j round trip each.

pyspark's ``selectExpr``, ``repartition`` and ``sortWithinPartitions`` send their columns to
the JVM as a list filled one element per round trip, and make each column by name with one
more: ~40 round trips for a frame of a few columns, every batch, before any task of a shared
job can start. Those lists are the same batch after batch (the same sinks, the same
columns), so :func:`frame_steps` makes them once per JVM and passes them by reference: the
same JVM methods pyspark calls, with the same arguments, in three round trips (a frame of
seven columns: ~23 -> ~17 ms of the driver; the three analyses of the plan remain).
Spark Connect builds its plans client-side, without round trips: it takes pyspark's own steps.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fanout.contract.sessions import is_classic

_KEEP_AT_MOST = 64  # column lists kept: a few per shared group or partitioned sink


@dataclass(frozen=True)
class _JvmLists:
    gateway: Any  # the JVM they live in: a new gateway is a new JVM
    select: Any  # Seq[String] for selectExpr, or None
    by: Any  # Seq[Column] for repartition, or None
    sort: Any  # Seq[Column] for sortWithinPartitions, or None


_Key = tuple[tuple[str, ...] | None, tuple[str, ...], tuple[str, ...]]
_kept: dict[_Key, _JvmLists] = {}
_lock = threading.Lock()


def frame_steps(
    df: Any,
    select: Sequence[str] | None = None,
    partitions: int | None = None,
    by: Sequence[str] = (),
    sort: Sequence[str] = (),
) -> Any:
    """``df.selectExpr(*select)`` (when ``select`` is given), then
    ``.repartition(partitions, *by)`` (when ``partitions`` is), then
    ``.sortWithinPartitions(*sort)`` (when ``sort`` is not empty)."""
    if not is_classic(df):
        return _pyspark_steps(df, select, partitions, by, sort)
    from pyspark.sql import DataFrame

    session = df.sparkSession
    lists = _lists(session.sparkContext, select, by if partitions is not None else (), sort)
    jdf = df._jdf
    if lists.select is not None:
        jdf = jdf.selectExpr(lists.select)
    if partitions is not None:
        jdf = jdf.repartition(partitions, lists.by) if by else jdf.repartition(partitions)
    if lists.sort is not None:
        jdf = jdf.sortWithinPartitions(lists.sort)
    return DataFrame(jdf, session)


def _pyspark_steps(
    df: Any, select: Sequence[str] | None, partitions: int | None, by: Sequence[str],
    sort: Sequence[str],
) -> Any:  # fmt: skip
    if select is not None:
        df = df.selectExpr(*select)
    if partitions is not None:
        df = df.repartition(partitions, *by)
    return df.sortWithinPartitions(*sort) if sort else df


def _lists(
    sc: Any, select: Sequence[str] | None, by: Sequence[str], sort: Sequence[str]
) -> _JvmLists:
    key: _Key = (tuple(select) if select is not None else None, tuple(by), tuple(sort))
    gateway = sc._gateway
    with _lock:
        kept = _kept.get(key)
    if kept is not None and kept.gateway is gateway:
        return kept
    made = _make(sc, *key)
    with _lock:
        if len(_kept) >= _KEEP_AT_MOST:
            _kept.clear()
        _kept[key] = made
    return made


def _make(
    sc: Any, select: tuple[str, ...] | None, by: tuple[str, ...], sort: tuple[str, ...]
) -> _JvmLists:
    # what pyspark's selectExpr, repartition and sortWithinPartitions make of names: a Seq
    # of the strings, a Seq of ``functions.col(name)`` (through the JVM, not pyspark's
    # private helpers, whose module moved between releases)
    jvm = sc._jvm

    def names(values: tuple[str, ...]) -> Any:
        return jvm.PythonUtils.toSeq(list(values))

    def columns(values: tuple[str, ...]) -> Any:
        return jvm.PythonUtils.toSeq([jvm.functions.col(name) for name in values])

    return _JvmLists(
        gateway=sc._gateway,
        select=names(select) if select is not None else None,
        by=columns(by) if by else None,
        sort=columns(sort) if sort else None,
    )
