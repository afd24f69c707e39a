"""The files of a Delta table at each of its versions, to find the version a RESTORE to a
timestamp went back to (docs/architecture.md §8.1, "A batch restored away").

A RESTORE records the version it restored only when given one: restored to a timestamp,
delta-spark records ``version: null`` and the timestamp as written, delta-rs only
``datetime`` (epoch ms). The table it leaves holds exactly the data files of the version
restored, so that version is the one whose files are the same (a restore that skipped
missing files, Spark's ``ignoreMissingFiles``, matches none: cannot tell). Read only on the
rare path (a replay of a batch the table's app transaction records, with such a restore
after its commit): one snapshot load per version searched.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger(__name__)


class TableStates:
    """The set of data files of the table at ``table_uri`` at a version, loaded once per
    version (``None``: that version cannot be loaded, its log cleaned up)."""

    def __init__(self, table_uri: str, storage_options: Mapping[str, str] | None = None):
        self.table_uri = table_uri
        self.storage_options = dict(storage_options or {}) or None
        self._files: dict[int, frozenset[str] | None] = {}

    @classmethod
    def of(cls, table: Any, storage_options: Mapping[str, str] | None = None) -> TableStates:
        """The states of the delta-rs ``table``'s table."""
        return cls(table.table_uri, storage_options)

    def files(self, version: int) -> frozenset[str] | None:
        """The data files the table reads at ``version``; ``None`` if it cannot be loaded."""
        if version not in self._files:
            self._files[version] = self._load(version)
        return self._files[version]

    def _load(self, version: int) -> frozenset[str] | None:
        from deltalake import DeltaTable

        try:
            table = DeltaTable(self.table_uri, version=version,
                               storage_options=self.storage_options)  # fmt: skip
            return frozenset(table.file_uris())
        except Exception as exc:  # evidence only: a version we cannot read tells nothing
            logger.warning("cannot load version %d of %s: %s", version, self.table_uri, exc)
            return None

    def version_restored(self, restore: int, oldest: int) -> int | None:
        """The newest version before ``restore`` (a RESTORE's commit) holding the same data
        files as the table after it, searched down to ``oldest``: the version it restored.
        ``None``: no such version there, or one on the way cannot be loaded. Versions
        holding the same files hold the same rows, so the newest of several serves."""
        after = self.files(restore)
        if after is None:
            return None
        for version in range(restore - 1, max(oldest, 0) - 1, -1):
            files = self.files(version)
            if files is None:
                return None
            if files == after:
                return version
        return None
