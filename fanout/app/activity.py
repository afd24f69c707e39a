"""Whether a pipeline looks running, from its ledger marks alone (docs/architecture.md §4,
"Does the pipeline run?").

Nothing records that a pipeline runs: no heartbeat, no lock, no row per batch beyond the
marks it writes anyway. The operator's commands (``fanout status``, ``fanout ledger skip``,
``fanout recover``, ``fanout ledger maintain``) read the marks they read already and say
which is the newest write's mark (sink, batch, epoch, when) and how old it is, against a
window the marks themselves give: :data:`GAPS_READ` gaps between the pipeline's latest
batches of its newest epoch, each batch timed by its first write's mark (a catch-up's
later mark of an old batch does not stretch it), their median times :data:`GAPS_FACTOR`,
and no less than :data:`WINDOW_FLOOR_S` (marks carry the driver's clock, the command runs
on another machine's; a batch may take longer than the gap before it). A skip's mark (the
operator's, not the pipeline's) and a lost mark (recorded at a start, or by ``fanout
recover``) are no write's and count for nothing. Newer than the window: "looks running";
else "looks stopped". It is a judgement, said as one: a pipeline started a second ago
shows stopped until its first mark, one killed a second ago shows running for the window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import pairwise
from statistics import median
from typing import TYPE_CHECKING, Any

from fanout.ledger.entry import LOST_MARK
from fanout.ledger.gaps import SKIPPED

if TYPE_CHECKING:
    import pyarrow as pa

GAPS_READ = 10
"""How many gaps between the latest batches of the newest epoch the cadence is the median of."""

GAPS_FACTOR = 3
"""A pipeline quiet for this many of its median gaps looks stopped."""

WINDOW_FLOOR_S = 60.0
"""The shortest window: clocks of two machines, a batch slower than its cadence."""


@dataclass(frozen=True)
class NewestMark:
    """A pipeline's newest write mark, and whether it is recent enough to say the pipeline
    looks running (see the module docstring)."""

    pipeline: str
    sink: str
    batch_id: int
    epoch: int
    at: datetime
    age_s: float
    cadence_s: float | None
    """The median gap between the newest epoch's latest batches (``None``: one batch only)."""
    window_s: float

    @property
    def looks_running(self) -> bool:
        """Whether the mark is newer than :attr:`window_s`."""
        return self.age_s < self.window_s

    def describe(self) -> str:
        """One line: the mark, its age, and the judgement with the window it came from."""
        when = self.at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        looks = "looks running" if self.looks_running else "looks stopped"
        if self.cadence_s is None:
            why = f"one batch of epoch {self.epoch} only, no gap to judge by"
        else:
            why = (
                f"{GAPS_FACTOR} x {duration(self.cadence_s)}, the median gap between its "
                f"latest batches, at least {duration(WINDOW_FLOOR_S)}"
            )
        return (
            f"pipeline {self.pipeline!r} {looks}: its newest mark is batch {self.batch_id} "
            f"of epoch {self.epoch} by sink {self.sink!r}, {duration(self.age_s)} ago "
            f"({when}); window {duration(self.window_s)} ({why})"
        )

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``at`` in ISO 8601)."""
        return {
            "sink": self.sink,
            "batch_id": self.batch_id,
            "epoch": self.epoch,
            "at": self.at.isoformat(),
            "age_s": round(self.age_s, 1),
            "cadence_s": None if self.cadence_s is None else round(self.cadence_s, 1),
            "window_s": round(self.window_s, 1),
            "looks_running": self.looks_running,
        }


def no_mark_yet(pipeline: str) -> str:
    """The line for a pipeline the ledger holds no write mark of."""
    return (
        f"pipeline {pipeline!r}: no write mark with its time yet (never ran, no sink "
        "committed a batch, or its marks carry no time)"
    )


def duration(seconds: float) -> str:
    """``seconds`` for people, cut to two units: ``42s``, ``3m 5s``, ``1m``, ``2h``,
    ``4d 1h``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        big, small = f"{s // 60}m", f"{s % 60}s" if s % 60 else ""
    elif s < 86400:
        big, small = f"{s // 3600}h", f"{s % 3600 // 60}m" if s % 3600 // 60 else ""
    else:
        big, small = f"{s // 86400}d", f"{s % 86400 // 3600}h" if s % 86400 // 3600 else ""
    return f"{big} {small}" if small else big


MARK_COLUMNS = ("pipeline", "sink", "epoch", "batch_id", "status", "error", "finished_at")
"""The ledger columns a pipeline's activity is judged by (:func:`newest_marks_of`,
:meth:`fanout.ledger.delta.DeltaLedger.mark_times`)."""


def write_marks(table: pa.Table) -> pa.Table:
    """The rows of ``table`` (:data:`MARK_COLUMNS`) that are a write's own mark: committed,
    with a time, not a skip's, not a lost one. The one rule: ``fanout status`` (rows as
    dicts, :func:`newest_marks`) and the other commands (:func:`newest_marks_of`) both
    filter by it."""
    import pyarrow.compute as pc

    error = table.column("error")
    not_a_write = pc.or_(pc.starts_with(error, f"{SKIPPED}:"), pc.starts_with(error, LOST_MARK))
    kept = pc.and_(
        pc.and_(
            pc.fill_null(pc.equal(table.column("status"), "committed"), False),
            pc.is_valid(table.column("finished_at")),
        ),
        pc.invert(pc.fill_null(not_a_write, False)),
    )
    return table.filter(kept)


def clock() -> datetime:
    """Now, in UTC: what a mark's age is measured against when no ``now`` is given (one
    place, so tests of the commands can fix it)."""
    return datetime.now(UTC)


def newest_marks(rows: Sequence[dict[str, Any]], now: datetime | None = None) -> list[NewestMark]:
    """Per pipeline of ``rows`` (ledger rows as dicts, :meth:`DeltaLedger.rows`) holding a
    write's mark, its :class:`NewestMark` at ``now`` (default: :func:`clock`), by pipeline:
    :func:`newest_marks_of` of their :data:`MARK_COLUMNS` (the same rule, the same path)."""
    import pyarrow as pa

    types = [pa.string(), pa.string(), pa.int64(), pa.int64(), pa.string(), pa.string(),
             pa.timestamp("us", tz="UTC")]  # fmt: skip
    # inferred, then cast: a naive time is UTC either way, and inference is 5x faster
    columns = [
        pa.array([r.get(name) for r in rows]).cast(type_)
        for name, type_ in zip(MARK_COLUMNS, types, strict=True)
    ]
    return newest_marks_of(pa.table(columns, names=list(MARK_COLUMNS)), now)


def _judged(marks_of: dict[str, list[dict[str, Any]]], now: datetime) -> list[NewestMark]:
    """Per pipeline, from its write marks (:func:`newest_marks_of`'s reduction of them: its
    newest marks, each batch's first mark of its newest epoch), its :class:`NewestMark`."""
    found = []
    for pipeline, marks in sorted(marks_of.items()):
        newest = max(marks, key=lambda r: (_at(r), r.get("epoch") or 0, r["batch_id"]))
        epoch = max(r.get("epoch") or 0 for r in marks)
        first: dict[int, datetime] = {}  # per batch of the newest epoch, its first mark's time
        for r in marks:
            if (r.get("epoch") or 0) == epoch:
                at = _at(r)
                first[r["batch_id"]] = min(first.get(r["batch_id"], at), at)
        latest = [first[b] for b in sorted(first)[-(GAPS_READ + 1) :]]
        gaps = [max(0.0, (b - a).total_seconds()) for a, b in pairwise(latest)]
        cadence = median(gaps) if gaps else None
        window = max(WINDOW_FLOOR_S, GAPS_FACTOR * (cadence or 0.0))
        at = _at(newest)
        found.append(
            NewestMark(
                pipeline=pipeline,
                sink=newest["sink"],
                batch_id=newest["batch_id"],
                epoch=newest.get("epoch") or 0,
                at=at,
                age_s=max(0.0, (now - at).total_seconds()),
                cadence_s=cadence,
                window_s=window,
            )
        )
    return found


def newest_marks_of(table: pa.Table, now: datetime | None = None) -> list[NewestMark]:
    """Per pipeline of ``table`` (:data:`MARK_COLUMNS`:
    :meth:`fanout.ledger.delta.DeltaLedger.mark_times`) holding a write's mark
    (:func:`write_marks`), its :class:`NewestMark` at ``now`` (default: :func:`clock`), by
    pipeline. Reduced in Arrow first to what the judgement reads: per pipeline, its newest
    write marks and each batch's first mark time, so a ledger of millions of rows is never
    made into dicts (``fanout ledger maintain`` reads every pipeline's)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    writes = write_marks(table)
    epochs = pc.fill_null(writes.column("epoch"), 0)  # rows of older ledgers have none
    writes = writes.set_column(writes.schema.get_field_index("epoch"), "epoch", epochs)
    if writes.num_rows == 0:
        return []
    newest_at = writes.group_by("pipeline").aggregate([("finished_at", "max")])
    newest = writes.join(newest_at, "pipeline")
    newest = newest.filter(pc.equal(newest.column("finished_at"), newest.column("finished_at_max")))
    newest_epochs = writes.group_by("pipeline").aggregate([("epoch", "max")])
    last = writes.join(newest_epochs, "pipeline")
    last = last.filter(pc.equal(last.column("epoch"), last.column("epoch_max")))
    grouped = last.group_by(["pipeline", "epoch", "batch_id"]).aggregate([("finished_at", "min")])
    latest = []  # per pipeline, the batches _judged times its cadence by
    for name in pc.unique(grouped.column("pipeline")).to_pylist():
        of = grouped.filter(pc.equal(grouped.column("pipeline"), name))
        latest.append(
            of.take(pc.select_k_unstable(of, GAPS_READ + 1, [("batch_id", "descending")]))
        )
    firsts = pa.concat_tables(latest)
    marks_of: dict[str, list[dict[str, Any]]] = {}
    for r in newest.drop_columns(["finished_at_max"]).to_pylist():
        marks_of.setdefault(r["pipeline"], []).append(r)
    for r in firsts.to_pylist():
        marks_of[r["pipeline"]].append(
            {"pipeline": r["pipeline"], "sink": "", "epoch": r["epoch"], "batch_id": r["batch_id"],
             "finished_at": r["finished_at_min"]}
        )  # fmt: skip
    return _judged(marks_of, now or clock())


def _at(row: dict[str, Any]) -> datetime:
    at: datetime = row["finished_at"]
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)
