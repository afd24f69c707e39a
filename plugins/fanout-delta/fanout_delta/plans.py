"""The plan of the batch a Delta commit wrote, kept in the commit itself, and the refusal to
skip a batch that Spark planned again (docs/architecture.md §5, §8.1).

Every commit of a batch carries, in its commit info's ``userMetadata`` (delta-spark's own
field: ``DESCRIBE HISTORY`` shows it; delta-rs writes it as custom commit metadata), the
app id, the batch id and the plan Spark made of it: ``batchTimestampMs`` and the source
offsets. The sink skips a batch whose app transaction version is already at or past it;
on that path only (a replay, rare) :func:`refuse_replanned` finds the commit of the batch
in the table's history and compares plans. A checkpoint rolled back after the sink
committed batch N and before the ledger marked it makes Spark plan N again with more input
(a new ``batchTimestampMs``): the checkpoint guard cannot see it (the ledger holds nothing
at N), and skipping would lose the rows past the first plan, so the sink raises
:class:`fanout.CheckpointRollbackError` instead. No evidence, no refusal: a batch without a
planning time (``FanOut`` used without Spark's offsets), a commit without the metadata (an
older fanout wrote it, or its log file is gone) or not among the newest
:data:`SEARCH_COMMITS` commits, or one carrying the same planning time (a true replay).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fanout.delta_tables.io import numbered_history
from fanout.errors import CheckpointRollbackError, HistoryUnsettledError, shell_word
from fanout.ledger.gaps import LEDGER_UNKNOWN, ledger_note
from fanout_delta.table_states import TableStates

if TYPE_CHECKING:
    from fanout.contract.batch import Batch, BatchInfo

logger = logging.getLogger(__name__)

METADATA_KEY = "userMetadata"
"""The commit info field holding the plan (delta-spark's ``userMetadata``)."""

SPARK_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
"""delta-spark's session conf for a commit's ``userMetadata`` (a MERGE takes no option)."""

FENCE_KEY = "fanout.epochFence"
"""The custom metadata key of an epoch fence's commit (:mod:`fanout_delta.fence`): the
epoch whose start made it."""

SEARCH_COMMITS = 100
"""How many of the table's newest commits the skip path searches for the batch's commit."""

MAX_OFFSETS_CHARS = 4096
"""Source offsets longer than this (as JSON) are not recorded: every commit of the table
would carry them, and the planning time alone tells a re-plan from a replay."""


@dataclass(frozen=True)
class CommitPlan:
    """The plan a commit recorded for one batch of one app id.

    :param app_id: the sink's transaction app id.
    :param batch_id: the batch (the transaction version the commit wrote).
    :param batch_timestamp_ms: Spark's ``batchTimestampMs`` of the batch.
    :param source_offsets: its end offsets; ``None`` when too long to record.
    :param version: the table version of the commit (``None`` until found in the log).
    :param timestamp_ms: when the commit was made (``None`` until found in the log).
    """

    app_id: str
    batch_id: int
    batch_timestamp_ms: int
    source_offsets: Any = None
    version: int | None = None
    timestamp_ms: int | None = None

    def text(self) -> str:
        """The ``userMetadata`` value: one JSON object under the key ``"fanout"``."""
        return json.dumps(
            {
                "fanout": {
                    "app_id": self.app_id,
                    "batch_id": self.batch_id,
                    "batch_timestamp_ms": self.batch_timestamp_ms,
                    "source_offsets": self.source_offsets,
                }
            },
            separators=(",", ":"),
        )

    @classmethod
    def parse(cls, commit_info: dict[str, Any]) -> CommitPlan | None:
        """The plan a commit info (an entry of ``DeltaTable.history()``) records, or
        ``None`` when it records none (another writer's commit, an older fanout's)."""
        text = commit_info.get(METADATA_KEY)
        if not isinstance(text, str) or '"fanout"' not in text:
            return None
        try:
            plan = json.loads(text)["fanout"]
            return cls(
                app_id=str(plan["app_id"]),
                batch_id=int(plan["batch_id"]),
                batch_timestamp_ms=int(plan["batch_timestamp_ms"]),
                source_offsets=plan.get("source_offsets"),
                version=_int_or_none(commit_info.get("version")),
                timestamp_ms=_int_or_none(commit_info.get("timestamp")),
            )
        except (ValueError, TypeError, KeyError):
            return None


def batch_plan(batch: Batch) -> CommitPlan | None:
    """The plan to record with ``batch``'s commit; ``None`` when Spark's planning time is
    unknown (no evidence to record)."""
    info = batch.info
    if info.batch_timestamp_ms is None:
        return None
    offsets = info.source_offsets
    if offsets is not None and len(json.dumps(offsets)) > MAX_OFFSETS_CHARS:
        offsets = None
    key = batch.idempotency_key
    return CommitPlan(key.app_id, key.version, info.batch_timestamp_ms, offsets)


def user_metadata(batch: Batch) -> str | None:
    """``batch``'s plan as delta-spark's ``userMetadata`` (``None``: nothing to record)."""
    plan = batch_plan(batch)
    return None if plan is None else plan.text()


def commit_metadata(batch: Batch) -> dict[str, str] | None:
    """``batch``'s plan as delta-rs custom commit metadata (``None``: nothing to record)."""
    text = user_metadata(batch)
    return None if text is None else {METADATA_KEY: text}


def find_plan(
    table: Any, app_id: str, batch_id: int, limit: int | None = None
) -> CommitPlan | None:
    """The plan recorded by the commit of ``app_id``'s batch ``batch_id`` among the newest
    ``limit`` (:data:`SEARCH_COMMITS`) commits of ``table`` (a delta-rs ``DeltaTable``),
    newest first; ``None`` when not found. Stops at a commit of the app id for an earlier
    batch: the commits of one app id come in batch order."""
    for commit_info in numbered_history(table, SEARCH_COMMITS if limit is None else limit):
        plan = CommitPlan.parse(commit_info)
        if plan is None or plan.app_id != app_id:
            continue
        if plan.batch_id == batch_id:
            return plan
        if plan.batch_id < batch_id:
            return None
    return None


def taken_out(
    table: Any, app_id: str, batch_id: int, storage_options: Mapping[str, str] | None = None
) -> bool:
    """Whether a RESTORE took batch ``batch_id`` of ``app_id`` out of ``table`` (delta-rs,
    at the snapshot whose app transaction is at the batch) after the commits that wrote it:
    a restore keeps the app transaction, so the table still says "done" while it lacks the
    batch's rows, and a replay that skipped it lost them (the ledger then marked it).

    Only when the app transaction is the batch itself (a later batch's commit means the
    replay is of an older batch, which writing again would set the transaction back to)
    and its commits are found among the newest :data:`SEARCH_COMMITS` by the plan they
    recorded (:func:`restored_away` decides; no commit with a plan, an unreadable
    history: ``False``, skipped as before). A history other writers committed to during
    each read (:class:`fanout.errors.HistoryUnsettledError`, its numbers unknown):
    ``False`` when no RESTORE is among the commits listed, else that error, with what it
    means, which :meth:`fanout_delta.DeltaSink.is_transient` retries. Called on the skip
    path only (a replay), after the writer refused a later epoch's fence on ``app_id``
    (:mod:`fanout_delta.fence`): a fenced version, never equal to a batch id, would read
    "not taken out" here."""
    if table is None or table.transaction_version(app_id) != batch_id:
        return False
    try:
        history = numbered_history(table, SEARCH_COMMITS)
    except HistoryUnsettledError as exc:
        if not any(info.get("operation") == "RESTORE" for info in exc.listed):
            return False  # no RESTORE among them: none took the batch out, whatever the numbers
        raise HistoryUnsettledError(
            f"the Delta table {table.table_uri} records batch {batch_id} ({app_id}) and a "
            "RESTORE is among its newest commits, but other writers committed to it during "
            "each read of its history, so which commits the RESTORE undid cannot be told: "
            "skipping the batch would lose its rows if the RESTORE took them out. The write "
            "is retried; if it keeps failing, pause the table's other writers until it passes",
            exc.listed,
        ) from exc
    except Exception as exc:  # evidence only: unreadable, skip as before
        logger.warning("cannot read the history of %s to follow its RESTOREs: %s",
                       table.table_uri, exc)  # fmt: skip
        return False
    versions = batch_commits(history, app_id, batch_id)
    states = TableStates.of(table, storage_options)
    return bool(versions) and restored_away(history, versions, table.version(), states)


def batch_commits(history: Iterable[Mapping[str, Any]], app_id: str, batch_id: int) -> list[int]:
    """The versions of the commits in ``history`` (commit infos, newest first) whose plan
    is batch ``batch_id`` of ``app_id``: more than one when the batch was written again
    after a restore took it out (:func:`taken_out`). Stops at a commit of an earlier
    batch of the app id."""
    versions: list[int] = []
    for commit_info in history:
        plan = CommitPlan.parse(dict(commit_info))
        if plan is None or plan.app_id != app_id or plan.batch_id > batch_id:
            continue
        if plan.batch_id < batch_id:
            break
        if plan.version is not None:
            versions.append(plan.version)
    return versions


def restored_away(
    history: Sequence[Mapping[str, Any]],
    first: int | Collection[int],
    last: int,
    states: TableStates | None = None,
) -> bool:
    """Whether the table at version ``last`` lacks what the commits of versions ``first``
    (one, or those of a batch written again after a restore) added, by the RESTOREs in its
    ``history`` (commit infos) after the earliest: a restore to a version before it takes
    the batch out, one to a later version gives back what that version held; a commit of
    ``first`` brings it back; other commits keep it (a DELETE of its rows is not
    followed: the batch stays held). A restore to a timestamp records no version: the one
    it went back to is found by the table's files (``states``; without them, or none
    found: cannot tell). A commit missing from the history, or cannot tell: held."""
    commits = {first} if isinstance(first, int) else set(first)
    start = min(commits)
    infos = {info.get("version"): info for info in history}
    holds = {start: True}
    for version in range(start + 1, last + 1):
        info = infos.get(version)
        if info is None:
            return False
        if version in commits:
            holds[version] = True
            continue
        if info.get("operation") != "RESTORE":
            holds[version] = holds[version - 1]
            continue
        target = _restored_version(info, version, states)
        if target is None:
            return False
        holds[version] = target >= start and holds[target]
    return not holds[last]


def _restored_version(
    info: Mapping[str, Any], version: int, states: TableStates | None
) -> int | None:
    """The version the RESTORE committed at ``version`` (its commit info ``info``) went
    back to: recorded, or, restored to a timestamp (no version recorded), the newest
    earlier version holding the same files (:class:`fanout_delta.table_states.TableStates`,
    among the :data:`SEARCH_COMMITS` before it). ``None``: cannot tell."""
    raw: Any = (info.get("operationParameters") or {}).get("version")
    try:
        return int(raw)
    except (TypeError, ValueError):
        pass
    if states is None:
        return None
    return states.version_restored(version, version - SEARCH_COMMITS)


def refuse_replanned(
    batch: Batch, sink: str, path: str, table: Any, *, ledger: str | None = None
) -> None:
    """Called where the sink would skip ``batch`` because ``table`` (delta-rs, at the
    snapshot whose transaction version is at or past the batch) records it: raise
    :class:`fanout.CheckpointRollbackError` when the commit that wrote the batch recorded
    another plan; return (skip) when the plans match or nothing tells. ``ledger``: the
    pipeline's ledger as commands name it (``SinkContext.ledger``; ``None``: unknown)."""
    info = batch.info
    if info.batch_timestamp_ms is None or table is None:
        return
    key = batch.idempotency_key
    try:
        recorded = find_plan(table, key.app_id, key.version)
    except Exception as exc:  # the history is evidence only: unreadable, skip as before
        logger.warning(
            "sink %r, batch %d: cannot read the history of %s to check the plan of the "
            "commit that wrote the batch; skipping it as a replay: %s",
            sink, info.batch_id, path, exc,
        )  # fmt: skip
        return
    if recorded is None:
        logger.info(
            "sink %r, batch %d: no commit among the newest %d of %s records the batch's "
            "plan; skipping it as a replay",
            sink, info.batch_id, SEARCH_COMMITS, path,
        )  # fmt: skip
        return
    if recorded.batch_timestamp_ms == info.batch_timestamp_ms:
        return
    raise CheckpointRollbackError(replanned_message(info, sink, path, recorded, ledger=ledger))


def replanned_message(
    info: BatchInfo, sink: str, path: str, recorded: CommitPlan, *, ledger: str | None = None
) -> str:
    """The refusal of a batch a Delta sink already committed under another plan: what
    happened, both plans, how to proceed (as the checkpoint guard's rollback message).
    ``ledger``: the pipeline's ledger as commands name it (``None``: unknown, and the
    command says to name it)."""
    from fanout.contract.plans import describe_plan, planned_at

    query = "" if info.query_id is None else f" of query {info.query_id}"
    committed = "" if recorded.timestamp_ms is None else f", at {planned_at(recorded.timestamp_ms)}"
    where = "" if recorded.version is None else f" in version {recorded.version}"
    batch = info.batch_id
    lines = [
        f"pipeline {info.pipeline!r}: checkpoint rolled back. Spark handed batch {batch}"
        f"{query}, but the Delta table of sink {sink!r} ({path}) already holds batch {batch}, "
        "committed under another plan before the ledger marked it: the checkpoint was "
        "restored from a backup or lost its newest offsets/ and commits/ files, so Spark "
        "planned the batch again from the end of the batch before it. The sink would skip "
        "it and lose the rows it holds now; fanout refuses to write.",
        f"  Spark re-planned batch {batch}: "
        + describe_plan(info.source_offsets, info.batch_timestamp_ms, recorded=False),
        f"  the Delta table recorded batch {batch}{where}{committed}: "
        + describe_plan(recorded.source_offsets, recorded.batch_timestamp_ms, recorded=True),
        "How to proceed:",
        f"  1. Restore the newest checkpoint (the one whose offsets/{batch} holds the planning "
        f"time the Delta table recorded for batch {batch} above) and restart the query; "
        "nothing is lost or duplicated.",
        "  2. Or delete this checkpoint and start a new one whose source begins right after "
        "the offsets of the sink furthest behind (this sink holds batch "
        f"{batch} as recorded above; the ledger has the others), under a new pipeline name "
        "so the sinks' transaction ids start afresh; sinks further ahead then receive their "
        "last batches again.",
        _recover_line(info, ledger),
    ]
    return "\n".join(lines)


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _recover_line(info: BatchInfo, ledger: str | None) -> str:
    """The ``fanout recover`` that prints what the ledger knows (``ledger``: as commands name
    it; ``None``: a sink opened outside a FanOut, :data:`fanout.ledger.gaps.LEDGER_UNKNOWN`
    said so)."""
    named = LEDGER_UNKNOWN if ledger is None else ledger
    return (
        f"  `fanout recover --ledger {named} --pipeline {shell_word(info.pipeline)}` prints "
        "what the ledger knows per sink, with Kafka startingOffsets"
        f"{ledger_note(ledger)}."
    )


@dataclass(frozen=True)
class FanoutCommit:
    """A commit of a Delta table writing batch ``batch_id`` under app id ``app_id``.

    :param app_id: the app transaction the commit carries (``fanout/<pipeline>/<sink>``).
    :param batch_id: the batch (the transaction version committed).
    :param version: the table version of the commit (``None``: unknown).
    """

    app_id: str
    batch_id: int
    version: int | None


def vanished_sink_commit(
    table: Any,
    batch: Batch,
    sinks: Collection[str],
    storage_options: Mapping[str, str] | None = None,
    limit: int | None = None,
) -> FanoutCommit | None:
    """The newest commit among the newest ``limit`` (:data:`SEARCH_COMMITS`) of ``table``
    writing a batch at or past ``batch``'s of another sink of its pipeline and epoch that
    the pipeline no longer configures (not in ``sinks``): the sink renamed, or removed, after
    it committed that batch and before its ledger mark (docs/architecture.md §8.1, "A sink
    renamed mid-batch"); ``None`` when none, or the history cannot be read (logged).

    A commit is known by the plan it records (:class:`CommitPlan`) or, recording none (a
    batch without Spark's planning time: ``FanOut.process`` given none, a checkpoint whose
    offsets could not be read, a catch-up or backfill of such a batch), by the ``txn``
    actions of its log file (:func:`commit_transactions`; one read per such commit).

    A commit a RESTORE since took out (:func:`restored_away`: the refusal's third way on,
    the table restored to before it) is passed over.

    Asked only when the table records no transaction of ``batch``'s app id (the sink's
    first write to the table), so the common path reads nothing."""
    from fanout.contract.batch import txn_app_id

    prefix = txn_app_id(batch.pipeline, "", batch.info.epoch)
    key = batch.idempotency_key
    try:
        history = numbered_history(table, SEARCH_COMMITS if limit is None else limit)
    except Exception as exc:  # evidence only
        logger.warning("cannot read the history of %s to look for a renamed sink's commits: "
                       "%s", table.table_uri, exc)  # fmt: skip
        return None
    history = list(history)
    for commit in _fanout_commits(table, history, storage_options):
        if commit.app_id == key.app_id or not commit.app_id.startswith(prefix):
            continue
        other = commit.app_id[len(prefix) :]
        if "/" not in other and other not in sinks and commit.batch_id >= key.version:
            if commit.version is not None and restored_away(
                history, commit.version, table.version(), TableStates.of(table, storage_options)
            ):
                continue  # the way out the refusal names: the table restored to before it
            return commit
    return None


def _fanout_commits(
    table: Any, history: Iterable[Mapping[str, Any]], storage_options: Mapping[str, str] | None
) -> Iterator[FanoutCommit]:
    """The fanout batches the commits of ``history`` (newest first) wrote: by the plan a
    commit records, else by its ``txn`` actions (an epoch fence's, or its lift's, are no
    batch: skipped)."""
    from fanout.delta_tables.io import EPOCH_FENCE

    for commit_info in history:
        plan = CommitPlan.parse(dict(commit_info))
        if plan is not None:
            yield FanoutCommit(plan.app_id, plan.batch_id, plan.version)
            continue
        version = _int_or_none(commit_info.get("version"))
        if version is None or FENCE_KEY in commit_info:
            continue
        for app_id, batch_id in commit_transactions(table.table_uri, version, storage_options):
            if 0 <= batch_id < EPOCH_FENCE:
                yield FanoutCommit(app_id, batch_id, version)


def commit_transactions(
    table_uri: str, version: int, storage_options: Mapping[str, str] | None = None
) -> list[tuple[str, int]]:
    """The ``(appId, version)`` of the ``txn`` actions of the commit of ``version`` of the
    Delta table at ``table_uri`` (its ``_delta_log`` JSON file); ``[]`` when it cannot be
    read (logged: evidence only)."""
    from fanout.delta_tables.datafiles import table_filesystem

    try:
        fs, root = table_filesystem(table_uri, storage_options)
        name = f"_delta_log/{version:020d}.json"
        with fs.open_input_stream(f"{root}/{name}" if root else name) as stream:
            text = stream.read().decode("utf-8")
    except Exception as exc:  # evidence only
        logger.warning("cannot read the commit of version %d of %s: %s", version, table_uri, exc)
        return []
    found = []
    for line in text.splitlines():
        if '"txn"' not in line:
            continue
        try:
            txn = json.loads(line).get("txn")
            if isinstance(txn, dict):
                found.append((str(txn["appId"]), int(txn["version"])))
        except (ValueError, TypeError, KeyError):
            continue
    return found
