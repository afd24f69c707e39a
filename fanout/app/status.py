"""``fanout status``: the ledger summarised per pipeline and sink, for people."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from fanout.errors import LedgerError

if TYPE_CHECKING:
    from fanout.ledger.delta import DeltaLedger


@dataclass(frozen=True)
class SinkStatus:
    """One sink of one pipeline as the ledger knows it."""

    pipeline: str
    sink: str
    last_committed_batch: int | None
    last_batch_rows: int | None
    committed_batches: int
    rows_total: int
    dead_lettered_total: int
    last_commit_at: datetime | None
    failed_attempts: int
    last_error: str | None

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict (times in ISO 8601)."""
        data = asdict(self)
        if self.last_commit_at is not None:
            data["last_commit_at"] = self.last_commit_at.isoformat()
        return data


def report(
    ledger: DeltaLedger, pipeline: str | None, *, as_json: bool = False, wide: bool = False
) -> str:
    """What ``fanout status`` prints, read from ``ledger`` now: the table or JSON.

    Raises :class:`LedgerError` for a ``pipeline`` the ledger holds no row of while it
    holds rows of others (a typo, most likely; the error names them).
    """
    rows = ledger.read(pipeline).to_pylist()
    if pipeline and not rows and (known := ledger.pipelines()):
        raise unknown_pipeline(ledger.path, pipeline, known)
    statuses = summarize(rows)
    if as_json:
        return json.dumps([s.as_json() for s in statuses], indent=2)
    return render(statuses, wide=wide)


def summarize(rows: Sequence[dict[str, Any]]) -> list[SinkStatus]:
    """Per (pipeline, sink) status from ledger rows (as dicts), sorted by pipeline, sink."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        if row["status"] == "epoch":
            continue  # an accepted checkpoint reset, not a sink's progress
        groups.setdefault((row["pipeline"], row["sink"]), []).append(row)
    statuses = []
    for (pipeline, sink), group in sorted(groups.items()):
        committed = [r for r in group if r["status"] == "committed"]
        failed = sorted(
            (r for r in group if r["status"] == "failed"),
            key=lambda r: (r["batch_id"], r["attempt"] or 0),
        )
        last = max(committed, key=_position) if committed else None
        statuses.append(
            SinkStatus(
                pipeline=pipeline,
                sink=sink,
                last_committed_batch=last["batch_id"] if last else None,
                last_batch_rows=last["rows"] if last else None,
                committed_batches=len({_position(r) for r in committed}),
                rows_total=sum(r["rows"] or 0 for r in committed),
                dead_lettered_total=sum(r.get("dead_lettered") or 0 for r in committed),
                last_commit_at=last["finished_at"] if last else None,
                failed_attempts=len(failed),
                last_error=failed[-1]["error"] if failed else None,
            )
        )
    return statuses


def _position(row: dict[str, Any]) -> tuple[int, int]:
    """Where a ledger row stands: (epoch, batch id); rows of older ledgers have no epoch."""
    return (row.get("epoch") or 0, row["batch_id"])


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain fixed-width text table."""
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


WIDTH = 100
"""The narrow table fits a terminal this wide; ``--wide`` and ``--json`` show everything."""


def render(statuses: Sequence[SinkStatus], *, wide: bool = False) -> str:
    """The status table as ``fanout status`` prints it: the essentials within
    :data:`WIDTH` columns, or (``wide``) every detail including the last error."""
    if not statuses:
        return "the ledger holds no marks yet"
    if wide:
        return _wide(statuses)
    failing = sum(1 for s in statuses if s.failed_attempts)
    names = _fit_names(statuses)
    table = format_table(
        ["pipeline", "sink", "last batch", "rows (total)", "failed", "last commit (UTC)"],
        [
            [pipeline, sink, s.last_committed_batch, s.rows_total, s.failed_attempts, _time(s)]
            for s, (pipeline, sink) in zip(statuses, names, strict=True)
        ],
    )
    if failing:
        table += (
            f"\n\n{failing} sink{' has' if failing == 1 else 's have'} failed attempts; "
            "`fanout status --wide` or `--json` shows the last error."
        )
    return table


def _fit_names(statuses: Sequence[SinkStatus]) -> list[tuple[str, str]]:
    """Pipeline and sink names, shortened (each to the same share) only when the narrow
    table would otherwise be wider than :data:`WIDTH`."""
    others = 10 + 12 + 6 + 19 + 2 * 5  # the fixed columns and the six columns' gaps
    pipeline_width = max(len("pipeline"), *(len(s.pipeline) for s in statuses))
    sink_width = max(len("sink"), *(len(s.sink) for s in statuses))
    room = WIDTH - others
    if pipeline_width + sink_width <= room:
        return [(s.pipeline, s.sink) for s in statuses]
    pipeline_limit = min(pipeline_width, max(room // 2, room - sink_width))
    sink_limit = room - pipeline_limit
    return [
        (_shorten(s.pipeline, pipeline_limit) or "", _shorten(s.sink, sink_limit) or "")
        for s in statuses
    ]


def _time(status: SinkStatus) -> str | None:
    return status.last_commit_at.strftime("%Y-%m-%d %H:%M:%S") if status.last_commit_at else None


def _wide(statuses: Sequence[SinkStatus]) -> str:
    return format_table(
        [
            "pipeline",
            "sink",
            "last batch",
            "rows (last)",
            "batches",
            "rows (total)",
            "dead letters",
            "last commit (UTC)",
            "failed attempts",
            "last error",
        ],
        [
            [
                s.pipeline,
                s.sink,
                s.last_committed_batch,
                s.last_batch_rows,
                s.committed_batches,
                s.rows_total,
                s.dead_lettered_total,
                _time(s),
                s.failed_attempts,
                _shorten(s.last_error, 120),
            ]
            for s in statuses
        ],
    )


def unknown_pipeline(path: str, pipeline: str, known: Sequence[str]) -> LedgerError:
    """The error for a pipeline name the ledger at ``path`` holds no row of, while it holds
    rows of the ``known`` ones (an empty ledger is no error: nothing has run yet)."""
    names = ", ".join(map(repr, known))
    return LedgerError(f"the ledger at {path} holds no pipeline {pipeline!r}; it knows: {names}")


def _shorten(text: str | None, limit: int = 60) -> str | None:
    if text is None:
        return None
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
