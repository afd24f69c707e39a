"""What one partition task did, and how it travels back to the driver: one row per
partition (``partition``, ``outcome`` as JSON) in the ``mapInArrow`` result."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["committed", "skipped", "empty", "failed"]
"""``committed``: written in this attempt; ``skipped``: the target already held it (a
replay); ``empty``: no rows; ``failed``: see :attr:`PartitionOutcome.failure`."""

RESULT_DDL = "partition INT, outcome STRING"
"""The ``mapInArrow`` result schema (Spark DDL): one row per partition."""


@dataclass(frozen=True)
class PartitionFailure:
    """Why a partition failed, as the sink classified it.

    :param kind: the sink's class of error (``"transient"``, ``"data"``, ``"fenced"``...).
    :param message: what happened, naming what the sink knows (no secrets).
    :param transient: whether a replay of the batch may succeed.
    :param details: facts the driver's error names (column, value, row, SQLSTATE...).
    """

    kind: str
    message: str
    transient: bool = False
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PartitionOutcome:
    """One partition's fate.

    :param rows: the partition's rows written (``committed``) or held already
        (``skipped``), not those refused: they count in ``dead_lettered`` only, as in
        :attr:`fanout.SinkResult.rows`, the sum of these. A ``failed`` outcome's rows
        are the rows the partition received (nothing is summed).
    :param written: rows or records written in this attempt (0 when skipped).
    :param dead_lettered: rows refused and kept as dead letters.
    :param letters: refused rows for the driver to hand to the sink's dead-letter target
        (JSON-able mappings; the sink turns them into dead letters).
    :param counters: small counts of the sink's own (e.g. PostgreSQL's ``changed``).
    :param rival: (``skipped`` only) another attempt of this partition's Spark task (a
        speculative copy, a retried task's predecessor) committed it while this one ran,
        after this one found it unwritten: the rows reached the target in this write of
        the batch, not before it (no replay).
    """

    partition: int
    status: Status
    rows: int = 0
    written: int = 0
    dead_lettered: int = 0
    letters: Sequence[Mapping[str, Any]] = ()
    counters: Mapping[str, int] = field(default_factory=dict)
    failure: PartitionFailure | None = None
    rival: bool = False

    def to_json(self) -> str:
        """The outcome as the result row's text."""
        return json.dumps(asdict(self), default=str)

    @classmethod
    def from_json(cls, text: str) -> PartitionOutcome:
        """Parse what :meth:`to_json` wrote."""
        data = json.loads(text)
        failure = data.pop("failure")
        data["letters"] = tuple(data["letters"])
        return cls(**data, failure=None if failure is None else PartitionFailure(**failure))
