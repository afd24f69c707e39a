"""Which of a Delta sink's batches its table holds, by the app transactions its log records:
what a replay, a lost target's check and a new epoch's start ask
(:meth:`~fanout_delta.DeltaSink.holds_batch`, ``holds_batch_of``, ``records_gone``), and
the restore a refusal offers to remove one (``remove_batch_hint``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fanout_delta.plans import batch_commits, restored_away
from fanout_delta.table_states import TableStates


@dataclass(frozen=True)
class HeldBatches:
    """The batches the table of Delta sink ``sink`` at ``path`` holds."""

    sink: str
    path: str
    storage_options: Mapping[str, str] | None = field(default=None, repr=False)  # credentials

    def holds(self, name: str, pipeline: str, epoch: int, batch_id: int) -> bool | None:
        """Whether the table holds batch ``batch_id`` of ``epoch`` by the app transaction
        of sink ``name`` (:meth:`~fanout_delta.DeltaSink.holds_batch`, which is this with
        the sink's own name)."""
        from fanout.contract.batch import txn_app_id
        from fanout.delta_tables import io
        from fanout.delta_tables import retention as txn_retention

        app_id = txn_app_id(pipeline, name, epoch)
        table = io.open_table(self.path, self.storage_options)
        done = io.transaction_version(table, app_id)
        if done is None and table is not None and name == self.sink:
            where = f"Delta sink {self.sink!r} (table {self.path!r})"
            if txn_retention.retention_of(table.metadata().configuration, where) is not None:
                return None
        if done is None or done < batch_id:
            return False
        assert table is not None
        last = table.version()
        first = self.batch_version(app_id, batch_id, last)
        if first is None:
            return True
        # only the commits after it: history() reads every commit it returns; those of the
        # batch written again after a restore (fanout_delta.plans.taken_out) hold it too.
        # Numbered from the newest listed commit: delta-rs numbers from the snapshot's
        history = io.numbered_history(table, max(last - first, 1))
        commits = {first, *batch_commits(history, app_id, batch_id)}
        return not restored_away(
            history, commits, last, TableStates.of(table, self.storage_options)
        )

    def records_gone(self, pipeline: str, epoch: int) -> str | None:
        """Why the table's log keeps no app transaction of ``epoch`` while the table holds
        data files (:meth:`~fanout_delta.DeltaSink.records_gone`); ``None``: no table, a
        transaction of the epoch there, no retention set, or no data file."""
        from fanout.contract.batch import txn_app_id
        from fanout.delta_tables import io
        from fanout.delta_tables import retention as txn_retention

        table = io.open_table(self.path, self.storage_options)
        app_id = txn_app_id(pipeline, self.sink, epoch)
        if table is None or io.transaction_version(table, app_id) is not None:
            return None
        configuration = table.metadata().configuration
        where = f"Delta sink {self.sink!r} (table {self.path!r})"
        if txn_retention.retention_of(configuration, where) is None or not table.file_uris():
            return None
        return (
            f"the table's log keeps no app transaction {app_id!r} (its "
            f"{txn_retention.PROPERTY} = {configuration.get(txn_retention.PROPERTY)!r} "
            "expired it after the epoch's last batch) while the table holds data files"
        )

    def remove_hint(self, pipeline: str, epoch: int, batch_id: int) -> str | None:
        """The table version that committed the batch, and the restore that removes it
        (:meth:`~fanout_delta.DeltaSink.remove_batch_hint`); ``None``: no table, or the
        commit not found among the 100 latest versions."""
        from fanout.contract.batch import txn_app_id
        from fanout.delta_tables import io

        app_id, path = txn_app_id(pipeline, self.sink, epoch), self.path
        latest = io.open_table(path, self.storage_options)
        if latest is None:
            return None
        if io.latest_version(latest) > latest.version():  # committed to since it was opened
            latest.update_incremental()
        last = latest.version()
        version = self.batch_version(app_id, batch_id, last)
        if not version:
            return None
        return restore_hint(path, version, last, fences_after(latest, version, last))

    def batch_version(self, app_id: str, batch_id: int, last: int) -> int | None:
        """The table version whose commit set ``app_id`` to ``batch_id`` or past it (among
        the 100 versions up to ``last``; ``None``: not found, or the version before it
        cannot be loaded: its log files expired after a later checkpoint,
        ``delta.logRetentionDuration``).

        An app transaction's version only grows (a RESTORE keeps it), and the versions that
        can be loaded are the latest ones, so the versions before ``last`` are searched by
        halves: about 7 snapshots loaded, not up to 100."""
        low = max(last - 100, 0)
        below = low - 1  # the highest version known not to hold the batch, or low - 1
        above = last  # the lowest version known to hold it (``last`` is taken as holding)
        loaded: dict[int, bool | None] = {}
        while above - below > 1:
            middle = (below + above) // 2
            loaded[middle] = held = self._holds_at(app_id, batch_id, middle)
            if held:
                above = middle
            else:  # not held, or cannot be loaded: the batch is in a later commit
                below = middle
        if below < low:  # every version searched holds it
            return 0 if last <= 100 else None
        return above if loaded.get(below) is False else None

    def _holds_at(self, app_id: str, batch_id: int, version: int) -> bool | None:
        """Whether version ``version`` of the table records ``app_id`` at ``batch_id`` or
        past it; ``None``: the version cannot be loaded."""
        from deltalake import DeltaTable

        from fanout.delta_tables import io

        path, options = str(self.path), dict(self.storage_options or {}) or None
        try:
            table = DeltaTable(path, version=version, storage_options=options)
        except Exception:  # delta-rs' errors for a cleaned-up version vary by release
            return None
        done = io.transaction_version(table, app_id)  # a later epoch's fence cleared
        return done is not None and done >= batch_id


def fences_after(table: Any, version: int, last: int) -> int:
    """How many of the commits after ``version`` up to ``last`` are, all of them, epoch
    fences or their lifts (:data:`fanout_delta.fence.FENCE_KEY`; 0 when any is not)."""
    from fanout.delta_tables.io import numbered_history
    from fanout_delta.fence import FENCE_KEY

    if last <= version:
        return 0
    try:
        after = numbered_history(table, last - version)
    except Exception:  # evidence only
        return 0
    if len(after) != last - version or any(FENCE_KEY not in info for info in after):
        return 0
    return last - version


def restore_hint(path: str, version: int, last: int, fences: int = 0) -> str:
    """How to remove the commit ``version`` of the table at ``path`` (latest: ``last``,
    of which the ``fences`` last commits are epoch fences, holding no rows)."""
    if version == last - fences:
        commits = "the epoch fence commit" if fences == 1 else f"the {fences} epoch fence commits"
        fenced = (
            ""
            if not fences
            else f" but for {commits} after it (without rows; a new epoch's start fences again)"
        )
        return (
            f"Its rows are version {version} of the Delta table at {path}, the table's last "
            f"commit{fenced}: to remove them, restore the table to version {version - 1} "
            f"(delta-rs: DeltaTable(path).restore({version - 1}); Spark SQL: RESTORE TABLE "
            f"delta.`{path}` TO VERSION AS OF {version - 1})."
        )
    return (
        f"Its rows are version {version} of the Delta table at {path}; versions "
        f"{version + 1}-{last} came after it, so a restore to version {version - 1} would "
        f"remove those too: delete the rows version {version} added instead."
    )
