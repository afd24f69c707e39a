"""``fanout status``: the ledger summarised per pipeline and sink, for people."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any


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


def render(statuses: Sequence[SinkStatus]) -> str:
    """The status table as ``fanout status`` prints it."""
    if not statuses:
        return "the ledger holds no marks yet"
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
                s.last_commit_at.strftime("%Y-%m-%d %H:%M:%S") if s.last_commit_at else None,
                s.failed_attempts,
                _shorten(s.last_error),
            ]
            for s in statuses
        ],
    )


def _shorten(text: str | None, limit: int = 60) -> str | None:
    if text is None:
        return None
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
