"""Which commit of a Delta table wrote which batch, and that batch's rows: what a sink
configured with ``backfill_from`` reads (docs/architecture.md §14.5).

A sink appending through Delta's idempotent writes commits each batch once, with the app
transaction ``(app_id, batch_id)``. Walking the table's versions in order, the version at
which an app id's transaction version changes is the commit of that batch; the files it
added are the batch's rows. Time travel needs the commits' log files: a table whose log was
cleaned past a batch (``delta.logRetentionDuration``) cannot give it back, and files
removed by ``VACUUM`` after a compaction are gone; both fail loudly, naming the batch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from fanout.delta_tables.io import open_table, transaction_version

if TYPE_CHECKING:
    import pyarrow as pa

BatchKey = tuple[int, int]
"""``(epoch, batch_id)``."""


class DeltaBatchHistory:
    """The batches an append-mode Delta table holds, found by their app transactions.

    :param path: the table's location.
    :param app_id: the app id of epoch ``e``'s batches (``txn_app_id(pipeline, sink, e)``).
    :param storage_options: for object stores.
    """

    def __init__(
        self,
        path: str,
        app_id: Callable[[int], str],
        storage_options: Mapping[str, str] | None = None,
    ) -> None:
        self.path = path
        self.app_id = app_id
        self.storage_options = dict(storage_options or {}) or None
        self._versions: dict[BatchKey, int] = {}
        self._walked = -1  # the last table version looked at
        self._last: dict[int, int | None] = {}  # epoch -> its app id's version at _walked
        self._lock = threading.Lock()

    def batches(self, epochs: Sequence[int]) -> list[BatchKey]:
        """Every batch of ``epochs`` the table holds, in batch order (walks the versions
        committed since the last call)."""
        with self._lock:
            self._walk(epochs)
            return sorted(k for k in self._versions if k[0] in epochs)

    def read(self, key: BatchKey) -> pa.Table:
        """The rows the commit of batch ``key`` added, with the table's columns at that
        version (partition columns included). ``key`` is a batch the sink committed (its
        ledger mark says so, and is written after the commit): when the table holds no
        commit of it, the batch wrote no row here (it was empty, or every row went to the
        sink's dead letters), and it is empty, with the table's latest columns."""
        import pyarrow as pa
        from deltalake import DeltaTable

        with self._lock:
            self._walk(sorted(set(self._last) | {key[0]}))
            version = self._versions.get(key)
        if version is None:
            return self._empty()
        try:
            after = DeltaTable(self.path, version=version, storage_options=self.storage_options)
            before = (
                set(
                    _paths(
                        DeltaTable(
                            self.path, version=version - 1, storage_options=self.storage_options
                        )
                    )
                )
                if version > 0
                else set()
            )
        except Exception as exc:
            raise LookupError(
                f"the Delta table at {self.path} cannot show version {version} (batch {key[1]}, "
                f"epoch {key[0]}): its log may have been cleaned up: {exc}"
            ) from exc
        added = set(_paths(after)) - before
        dataset = after.to_pyarrow_dataset()
        fragments = [f for f in dataset.get_fragments() if _relative(f.path, added)]
        try:
            tables = [f.to_table(schema=dataset.schema) for f in fragments]
        except Exception as exc:
            raise LookupError(
                f"the Delta table at {self.path}: the files of batch {key[1]} (epoch {key[0]}, "
                f"version {version}) cannot be read; a VACUUM may have removed them: {exc}"
            ) from exc
        if not tables:
            return dataset.schema.empty_table()
        return pa.concat_tables(tables)

    def _empty(self) -> pa.Table:
        import pyarrow as pa

        latest = open_table(self.path, self.storage_options)
        schema = pa.schema([]) if latest is None else pa.schema(latest.schema().to_arrow())
        return schema.empty_table()

    def _walk(self, epochs: Sequence[int]) -> None:
        from deltalake import DeltaTable

        latest = open_table(self.path, self.storage_options)
        if latest is None:
            return
        missing = [e for e in epochs if e not in self._last]
        if missing and self._walked >= 0:
            # an epoch not tracked before: walk again from the start for every epoch
            self._walked, self._last, self._versions = -1, {}, {}
        for version in range(self._walked + 1, latest.version() + 1):
            table = DeltaTable(self.path, version=version, storage_options=self.storage_options)
            for epoch in epochs:
                done = transaction_version(table, self.app_id(epoch))
                if done is not None and done != self._last.get(epoch):
                    self._versions[(epoch, int(done))] = version
                self._last[epoch] = None if done is None else int(done)
            self._walked = version
        for epoch in epochs:
            self._last.setdefault(epoch, None)


def _paths(table: object) -> list[str]:
    """The table's data files, relative to its root, as they are named in storage: the
    log holds each path URL-encoded (a partition directory ``k=New%20York`` is
    ``k=New%2520York`` there), the dataset's fragments the names themselves."""
    from urllib.parse import unquote

    import pyarrow as pa

    actions = pa.table(table.get_add_actions(flatten=True))  # type: ignore[attr-defined]
    return [unquote(str(path)) for path in actions.column("path").to_pylist()]


def _relative(fragment_path: str, added: set[str]) -> bool:
    return any(fragment_path.endswith(path) for path in added)
