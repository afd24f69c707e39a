"""``fanout status``: the ledger summarised per pipeline and sink, for people; with
``--spool``, also each sink's distance from the live batch (docs/architecture.md §14.7).

A sink's state:

- ``live``: nothing missed; its last attempt, if any, committed;
- ``lagging``: batches in the spool it has not committed, and its last attempt failed;
- ``catching up``: batches in the spool it has not committed, and its last attempt
  committed (the catch-up is writing them);
- ``stopped``: its last attempt failed and nothing waits for it in the spool (a sink with
  ``on_failure="stop"``: the query stopped with it).

With ``--spool``, a sink's batches kept in the spool after a ``fanout ledger skip`` made
without ``--spool`` (its mark is past them: neither written to it nor released, see
:meth:`fanout.steps.lag.Lagging.given_up`) are named too, with the command releasing them;
so are the batches of an epoch before the current one that Spark never committed
(:func:`fanout.spool.settled.settled_on_record`, the catch-up's rule): given up with their
checkpoint, they are not behind, and the next start releases them.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from fanout.app.activity import NewestMark, newest_marks, no_mark_yet
from fanout.app.standing import LEDGER, Problem, problems_footer
from fanout.contract.locations import command_location, shown_location
from fanout.errors import LedgerError, batch_ranges, shell_word
from fanout.ledger.entry import LOST_MARK, OWN_ROWS, as_of_log
from fanout.ledger.gaps import held_by_skip, mark_weight, release_command, says_skipped

if TYPE_CHECKING:
    from fanout.ledger.delta import DeltaLedger
    from fanout.spool.index import SpooledBatch


@dataclass(frozen=True)
class KeptBatches:
    """Spooled batches of one sink and epoch its mark passed by a ``fanout ledger skip``
    made without ``--spool``: kept in the spool, neither written nor released."""

    epoch: int
    batches: tuple[int, ...]
    rows: int
    release: str  # the command that releases them

    def describe(self, sink: str) -> str:
        """One line for the text output."""
        return (
            f"{sink}: {len(self.batches)} batch(es) / {self.rows} row(s) of epoch {self.epoch} "
            f"({batch_ranges(list(self.batches))}) kept in the spool after a `fanout ledger "
            f"skip` without --spool (or one with --release-spooled stopped before it released "
            f"them), neither written nor released: release them with "
            f"`{self.release}`"
        )


@dataclass(frozen=True)
class GivenUpBatches:
    """Spooled batches of one sink of an epoch before the current one that Spark never
    committed: given up with the replaced checkpoint, never written to the sink
    (:meth:`fanout.steps.lag.Lagging.abandoned`); the next start releases them."""

    epoch: int
    batches: tuple[int, ...]
    rows: int
    current_epoch: int

    def describe(self, sink: str) -> str:
        """One line for the text output."""
        return (
            f"{sink}: {len(self.batches)} batch(es) / {self.rows} row(s) of epoch {self.epoch} "
            f"({batch_ranges(list(self.batches))}) given up, not behind: Spark never committed "
            f"them before the checkpoint was replaced (epoch {self.current_epoch} now), so "
            f"they are not written to the sink (the new checkpoint reads their rows again "
            f"where `fanout recover` said); the next start releases them from the spool"
        )


NO_MARK = "no mark yet"
"""The state of a sink of the pipeline file the ledger holds no row of: it has committed
no batch, nor failed one (a sink added since the last run, or a pipeline not run yet)."""


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
    state: str = "live"
    lag_batches: int = 0
    lag_rows: int = 0
    lagging_since: datetime | None = None
    kept: tuple[KeptBatches, ...] = ()
    given_up: tuple[GivenUpBatches, ...] = ()

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict (times in ISO 8601)."""
        data = asdict(self)
        for key in ("last_commit_at", "lagging_since"):
            if data[key] is not None:
                data[key] = data[key].isoformat()
        return data

    def describe_state(self) -> str:
        """``live``, ``stopped``, or ``lagging 3 batches`` / ``catching up 3 batches``."""
        if self.lag_batches:
            return f"{self.state} {self.lag_batches} batch{'' if self.lag_batches == 1 else 'es'}"
        return self.state


def report(
    ledger: DeltaLedger | None,
    pipeline: str | None,
    *,
    as_json: bool = False,
    wide: bool = False,
    spool: str | None = None,
    spool_checked: bool = False,
    sinks: Sequence[str] | None = None,
    checkpoint: CheckpointFact | None = None,
    newest: bool = False,
    now: datetime | None = None,
    problems: Sequence[Problem] = (),
) -> str:
    """What ``fanout status`` prints, read from ``ledger`` (and ``spool``) now: the table
    or JSON; ``ledger`` ``None``: the pipeline file's ledger is not there yet (no run
    created it), so no rows. ``sinks``: the pipeline's sinks (its pipeline file's,
    ``--config``), each listed, one the ledger holds no row of as :data:`NO_MARK`.
    ``checkpoint``: the pipeline's checkpoint (``--config``), the JSON's ``checkpoint``
    field of each sink. ``newest``: also each pipeline's newest write mark and whether the
    pipeline looks running at ``now`` (:mod:`fanout.app.activity`): a line per pipeline
    after the table, ``pipeline_newest_mark`` in each sink's JSON object (``null``: no
    write mark yet); from the rows read for the table, no read more. ``problems``: the
    standing problems found on the ledger's table and the sinks' targets
    (:mod:`fanout.app.standing`), lines after the table; in the JSON, when there is one,
    ``ledger_problems`` in every sink's object and ``standing_problems`` in each sink's.

    Raises :class:`LedgerError` for a ``pipeline`` the ledger holds no row of while it
    holds rows of others (a typo, most likely; the error names them; not with ``sinks``,
    which come with the name from the same file), and
    :class:`fanout.ConfigurationError` for a ``spool`` path holding no spool (nothing is
    created there; :func:`fanout.spool.index.existing_index`), unless ``spool_checked``
    says the caller made that check already (``--watch`` makes it once, not at every
    redraw).
    """
    if ledger is None:
        rows: list[dict[str, Any]] = []
    else:
        rows = ledger.rows(pipeline)
        if pipeline and not rows and sinks is None and (known := ledger.pipelines()):
            raise unknown_pipeline(ledger.path, pipeline, known)
    entries = None if spool is None else _index_entries(spool, pipeline, spool_checked)
    backlogs, given_up = ({}, {}) if entries is None else spool_backlogs(entries, rows)
    kept = (
        {}
        if spool is None or entries is None or ledger is None
        else spool_kept(spool, entries, rows, command_location(ledger.path))
    )
    configured = None if sinks is None or pipeline is None else {pipeline: sinks}
    statuses = summarize(rows, backlogs, kept, given_up, configured)
    footer = "" if spool is None else spool_footer(spool, entries, pipeline)
    marks = {m.pipeline: m for m in newest_marks(rows, now)} if newest else {}
    if as_json:
        extra: dict[str, Any] = {} if checkpoint is None else {"checkpoint": checkpoint.as_json()}
        if problems:
            extra["ledger_problems"] = [p.text for p in problems if p.where == LEDGER]
            statuses_json = [
                {
                    **s.as_json(),
                    "standing_problems": [p.text for p in problems if p.where == s.sink],
                }
                for s in statuses
            ]
        else:
            statuses_json = [s.as_json() for s in statuses]
        if newest:
            return json.dumps(
                [
                    {**shown, **extra, "pipeline_newest_mark": _mark_json(marks, s)}
                    for shown, s in zip(statuses_json, statuses, strict=True)
                ],
                indent=2,
            )
        return json.dumps([{**shown, **extra} for shown in statuses_json], indent=2)
    text = render(statuses, wide=wide) + kept_footer(statuses) + footer
    text += problems_footer(problems, WIDTH)
    if newest and statuses:  # none: the table says the ledger holds no marks
        shown = sorted({s.pipeline for s in statuses} | ({pipeline} if pipeline else set()))
        lines = [marks[p].describe() if p in marks else no_mark_yet(p) for p in shown]
        text += "\n\n" + "\n".join(
            textwrap.fill(line, WIDTH, subsequent_indent="  ", break_on_hyphens=False)
            for line in lines
        )
    return text


def _mark_json(marks: Mapping[str, NewestMark], status: SinkStatus) -> dict[str, Any] | None:
    mark = marks.get(status.pipeline)
    return None if mark is None else mark.as_json()


def _index_entries(spool: str, pipeline: str | None, checked: bool) -> list[dict[str, Any]] | None:
    """The rows of the index of the spool at ``spool`` (``None``: no index), from one open
    and one read of it per draw; unless ``checked``, a path holding no spool raises
    (:func:`fanout.spool.index.existing_index`: a mistyped path is not an empty spool)."""
    from fanout.delta_tables.io import read_arrow
    from fanout.spool.index import existing_index, open_index

    index = open_index(spool) if checked else existing_index(spool, pipeline)
    return None if index is None else read_arrow(index).to_pylist()


def spool_kept(
    path: str,
    entries: Sequence[Mapping[str, Any]],
    rows: Sequence[dict[str, Any]],
    ledger: str,
) -> dict[tuple[str, str], tuple[KeptBatches, ...]]:
    """Per (pipeline, sink): the spooled batches its mark passed by a ``fanout ledger
    skip`` made without the spool, per epoch. A spooled batch is kept so when the sink's
    first committed mark at or after it is a skip's (as
    :meth:`fanout.steps.lag.Lagging.given_up` decides at each start). ``entries``: the
    rows of the index of the spool at ``path``."""
    marks: dict[tuple[str, str, int], list[tuple[int, bool]]] = {}
    for row in rows:
        if row["status"] == "committed":
            key = (row["pipeline"], row["sink"], row.get("epoch") or 0)
            skip = says_skipped(row.get("error"))
            marks.setdefault(key, []).append((row["batch_id"], skip))
    found: dict[tuple[str, str, int], dict[int, int]] = {}
    for entry in entries:
        key = (entry["pipeline"], entry["sink"], entry["epoch"])
        batch = entry["batch_id"]
        if held_by_skip(batch, marks.get(key, [])):
            found.setdefault(key, {})[batch] = entry["rows"] or 0
    kept: dict[tuple[str, str], tuple[KeptBatches, ...]] = {}
    for (pipeline, sink, epoch), batches in sorted(found.items()):
        ids = tuple(sorted(batches))
        release = release_command(ledger, pipeline, sink, ids[-1], epoch, path)
        kept[(pipeline, sink)] = (
            *kept.get((pipeline, sink), ()),
            KeptBatches(epoch, ids, sum(batches.values()), release),
        )
    return kept


def kept_footer(statuses: Sequence[SinkStatus]) -> str:
    """The lines naming each sink's batches kept after a skip (:func:`spool_kept`) and
    given up with a replaced checkpoint (:func:`spool_backlogs`)."""
    lines = [f"pipeline {s.pipeline}, {k.describe(s.sink)}" for s in statuses for k in s.kept]
    lines += [f"pipeline {s.pipeline}, {g.describe(s.sink)}" for s in statuses for g in s.given_up]
    return "\n\n" + "\n".join(lines) if lines else ""


Backlogs = dict[tuple[str, str], tuple[int, int, datetime | None]]
GivenUp = dict[tuple[str, str], tuple[GivenUpBatches, ...]]


def spool_backlogs(
    entries: Sequence[Mapping[str, Any]], rows: Sequence[dict[str, Any]]
) -> tuple[Backlogs, GivenUp]:
    """Per (pipeline, sink): the spooled batches it has not committed, their rows, and
    when the oldest was spooled; and apart, those of them given up: of an epoch before the
    pipeline's current one, and not settled by the ledger and the spool
    (:func:`fanout.spool.settled.settled_on_record`, as the catch-up judges them).
    ``entries``: the rows of the spool's index."""
    from fanout.spool.index import batches_of_index

    marks: dict[tuple[str, str, int], int] = {}
    epochs: dict[str, int] = {}
    for row in rows:
        epoch = row.get("epoch") or 0
        epochs[row["pipeline"]] = max(epochs.get(row["pipeline"], 0), epoch)
        if row["status"] == "committed":
            key = (row["pipeline"], row["sink"], epoch)
            marks[key] = max(marks.get(key, -1), row["batch_id"])
    abandoned = _abandoned(batches_of_index(entries), marks, epochs)
    needed: dict[tuple[str, str], dict[tuple[int, int], tuple[int, datetime]]] = {}
    dropped: dict[tuple[str, str, int], dict[int, int]] = {}
    for entry in entries:
        pipeline, sink, epoch, batch = (
            entry["pipeline"],
            entry["sink"],
            entry["epoch"],
            entry["batch_id"],
        )
        if batch <= marks.get((pipeline, sink, epoch), -1):
            continue
        if (pipeline, epoch, batch) in abandoned:
            dropped.setdefault((pipeline, sink, epoch), {})[batch] = entry["rows"] or 0
            continue
        needed.setdefault((pipeline, sink), {})[(epoch, batch)] = (
            entry["rows"] or 0,
            entry["spooled_at"],
        )
    backlogs: Backlogs = {
        key: (
            len(batches),
            sum(r for r, _ in batches.values()),
            min(t for _, t in batches.values()),
        )
        for key, batches in needed.items()
    }
    given_up: GivenUp = {}
    for (pipeline, sink, epoch), ids in sorted(dropped.items()):
        found = GivenUpBatches(epoch, tuple(sorted(ids)), sum(ids.values()), epochs[pipeline])
        given_up[(pipeline, sink)] = (*given_up.get((pipeline, sink), ()), found)
    return backlogs, given_up


def _abandoned(
    spooled: Mapping[str, Sequence[SpooledBatch]],
    marks: Mapping[tuple[str, str, int], int],
    epochs: Mapping[str, int],
) -> set[tuple[str, int, int]]:
    """The spooled (pipeline, epoch, batch) given up with a replaced checkpoint."""
    from fanout.spool.settled import settled_on_record

    found = set()
    for pipeline, batches in spooled.items():
        for batch in batches:
            if batch.epoch >= epochs.get(pipeline, 0):
                continue
            of_epoch = {s: m for (p, s, e), m in marks.items() if (p, e) == (pipeline, batch.epoch)}
            if not settled_on_record(batch.key, batches, of_epoch.get, of_epoch):
                found.add((pipeline, batch.epoch, batch.batch_id))
    return found


def spool_footer(
    path: str, entries: Sequence[Mapping[str, Any]] | None, pipeline: str | None
) -> str:
    """One line per pipeline (``pipeline``, else each one ``entries``, the rows of the
    index of the spool at ``path``, names): what the spool holds."""
    from fanout.spool.table import Spool

    if pipeline is not None:
        names = [pipeline]
    else:
        names = sorted({r["pipeline"] for r in entries or ()})
    lines = []
    for name in names:
        spool = Spool(path, name)
        spool.load(entries or ())
        batches, spooled_rows, size = spool.size()
        lines.append(
            f"spool {shown_location(path)} ({name}): {batches} batch(es), {spooled_rows} "
            f"row(s), {size} bytes"
        )
    return "\n\n" + "\n".join(lines) if lines else ""


def summarize(
    rows: Sequence[dict[str, Any]],
    backlogs: Mapping[tuple[str, str], tuple[int, int, datetime | None]] | None = None,
    kept: Mapping[tuple[str, str], tuple[KeptBatches, ...]] | None = None,
    given_up: Mapping[tuple[str, str], tuple[GivenUpBatches, ...]] | None = None,
    configured: Mapping[str, Sequence[str]] | None = None,
) -> list[SinkStatus]:
    """Per (pipeline, sink) status from ledger rows as dicts (:meth:`DeltaLedger.rows`; rows
    as written are read as of the log here too: a lost mark a write's own mark replaced is
    no mark of its own), the spool's backlogs and
    given-up batches (:func:`spool_backlogs`) and the batches it keeps after a skip
    (:func:`spool_kept`), sorted by pipeline, sink; ``configured``: per pipeline, sinks
    listed even without a row (state :data:`NO_MARK`, unless the spool holds batches for
    it)."""
    backlogs, kept, given_up = backlogs or {}, kept or {}, given_up or {}
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {
        (pipeline, sink): [] for pipeline, sinks in (configured or {}).items() for sink in sinks
    }
    for row in as_of_log(rows):
        if row["status"] in OWN_ROWS:
            # a reset accepted, a `fanout recover` report, a sink's dead-letter target
            # recorded, a batch refused before any write: not a sink's progress
            continue
        groups.setdefault((row["pipeline"], row["sink"]), []).append(row)
    statuses = []
    for (pipeline, sink), group in sorted(groups.items()):
        committed = [r for r in group if r["status"] == "committed"]
        failed = sorted(  # the newest last: a catch-up's failure may be of an older batch
            (r for r in group if r["status"] == "failed"),
            key=lambda r: (_finished(r), _position(r), r["attempt"] or 0),
        )
        # of two marks of the last batch (a write's recorded beside a skip's, §14.1): the write's
        last = max(committed, key=_last_key) if committed else None
        behind, behind_rows, since = backlogs.get((pipeline, sink), (0, 0, None))
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
                state=_state(group, behind) if group or behind else NO_MARK,
                lag_batches=behind,
                lag_rows=behind_rows,
                lagging_since=since,
                kept=kept.get((pipeline, sink), ()),
                given_up=given_up.get((pipeline, sink), ()),
            )
        )
    return statuses


def _state(group: Sequence[dict[str, Any]], behind: int) -> str:
    """See the module docstring."""
    attempts = [r for r in group if r["status"] in ("committed", "failed") and r.get("finished_at")]
    last = max(attempts, key=lambda r: r["finished_at"]) if attempts else None
    failing = last is not None and last["status"] == "failed"
    if behind:
        return "lagging" if failing else "catching up"
    return "stopped" if failing else "live"


def _finished(row: dict[str, Any]) -> tuple[bool, Any]:
    """A row's ``finished_at`` as a sort key (rows without one first)."""
    at = row.get("finished_at")
    return (at is not None, at if at is not None else 0)


def _last_key(row: dict[str, Any]) -> tuple[tuple[int, int], int]:
    """A committed row's place for the sink's last batch: its position, then the mark
    believed at that batch (:func:`fanout.ledger.gaps.mark_weight`)."""
    error = row.get("error")
    return (_position(row), mark_weight(says_skipped(error), (error or "").startswith(LOST_MARK)))


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
    show_state = any(s.state != "live" for s in statuses)
    names = _fit_names(statuses, show_state)
    headers = ["pipeline", "sink", "last batch", "rows (total)", "failed", "last commit (UTC)"]
    rows = [
        [pipeline, sink, s.last_committed_batch, s.rows_total, s.failed_attempts, _time(s)]
        for s, (pipeline, sink) in zip(statuses, names, strict=True)
    ]
    if show_state:  # a sink behind, or stopped: say so (a table of live sinks stays as it was)
        headers.insert(2, "state")
        for row, s in zip(rows, statuses, strict=True):
            row.insert(2, s.describe_state())
    table = format_table(headers, rows)
    if failing:
        table += (
            f"\n\n{failing} sink{' has' if failing == 1 else 's have'} failed attempts; "
            "`fanout status --wide` or `--json` shows the last error."
        )
    return table


def _fit_names(statuses: Sequence[SinkStatus], show_state: bool) -> list[tuple[str, str]]:
    """Pipeline and sink names, shortened (each to the same share) only when the narrow
    table would otherwise be wider than :data:`WIDTH`."""
    others = 10 + 12 + 6 + 19 + 2 * 5  # the fixed columns and the six columns' gaps
    if show_state:
        others += 2 + max(len("state"), *(len(s.describe_state()) for s in statuses))
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
            "state",
            "lag rows",
            "lagging since (UTC)",
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
                s.describe_state(),
                s.lag_rows or None,
                s.lagging_since.strftime("%Y-%m-%d %H:%M:%S") if s.lagging_since else None,
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


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):")
"""A location's scheme (two letters at least: ``C:`` is a Windows drive)."""


CheckpointState = Literal["unreadable", "none yet", "missing", "replaced", "in flight", "idle"]


@dataclass(frozen=True)
class CheckpointFact:
    """What ``fanout status --config`` says of the pipeline's checkpoint, as Spark left it.

    ``location``: as written in the pipeline file, a URI's password masked
    (:func:`fanout.contract.locations.shown_location`); ``state``: ``unreadable`` (not
    readable here), ``none yet`` (no checkpoint, no batch in the ledger), ``missing`` (gone
    while the ledger holds the pipeline's batches), ``replaced`` (another query's),
    ``in flight`` (``batch`` planned, not committed) or ``idle`` (``batch`` committed last,
    ``None``: none); ``said``: the sentence the text output ends with."""

    location: str
    state: CheckpointState
    batch: int | None
    said: str

    def as_json(self) -> dict[str, Any]:
        """The JSON-ready dict ``--json`` gives each sink as ``checkpoint``."""
        return asdict(self)


def checkpoint_fact(
    checkpoint: str, ledger: DeltaLedger | None, pipeline: str, file: str
) -> CheckpointFact:
    """The pipeline's checkpoint, as Spark left it: a batch planned and not committed (in
    flight, or a run killed or stopped during it), or the checkpoint gone or another query's
    while the ledger holds the pipeline's batches (a run would be refused as a checkpoint
    reset) — what the sinks' table cannot show."""
    from fanout.steps.context import checkpoint_query_id, latest_batch_id

    def fact(state: CheckpointState, said: str, batch: int | None = None) -> CheckpointFact:
        return CheckpointFact(shown_location(checkpoint), state, batch, said)

    scheme = _SCHEME.match(checkpoint)
    if scheme and scheme.group(1).lower() != "file" and "://" not in checkpoint:
        return fact(
            "unreadable",
            f"cannot be read here (a {scheme.group(1)}: location: fanout reads a "
            "checkpoint without Spark on a local path, file: and the stores pyarrow knows)",
        )
    try:
        query = checkpoint_query_id(checkpoint)
        planned = latest_batch_id(checkpoint, "offsets")
        committed = latest_batch_id(checkpoint, "commits")
    except Exception as exc:  # pyarrow's stores raise bare ArrowExceptions too
        said = " ".join(str(exc).split()) or type(exc).__name__
        return fact("unreadable", f"cannot be read here ({said})")
    owner = None
    if ledger is not None and pipeline in ledger.pipelines():
        owner = ledger.epoch_owners(pipeline).get(ledger.current_epoch(pipeline))
    recover = f"restore it, or see `fanout recover --config {shell_word(file)}`"
    if query is None and owner is None:
        return fact("none yet", "none yet (the first run creates it)")
    if query is None:
        return fact(
            "missing",
            f"none there, but the ledger holds batches of pipeline {pipeline!r} "
            f"(query {owner}): deleted or moved (or on a disk this machine does not see)? A "
            f"run starts a new query, which fanout refuses (CheckpointResetError): {recover}",
        )
    if owner is not None and query != owner:
        return fact(
            "replaced",
            f"of query {query}, but pipeline {pipeline!r} belongs to query {owner}: "
            f"replaced? A run is refused (CheckpointResetError) unless started with "
            f"--new-epoch: {recover}",
        )
    if planned is not None and (committed is None or planned > committed):
        return fact(
            "in flight",
            f"batch {planned} planned, not committed: in flight if the pipeline runs; "
            "else the run stopped or died during it, and the next run replays it, writing it "
            "only to the sinks whose last batch is before it",
            planned,
        )
    last = "no batch" if committed is None else f"batch {committed}"
    return fact("idle", f"{last} committed last, none in flight", committed)
