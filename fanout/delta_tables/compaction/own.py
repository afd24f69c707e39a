"""Compaction (``OPTIMIZE``) of a Delta table with delta-rs, taken back when it raced
another compaction of the same files (ARCHITECTURE §4).

delta-rs (1.6) commits a compaction even when a compaction committed since its snapshot
already removed the same files: its conflict check counts only removals with
``dataChange=true``, and a compaction's are ``false``. Both rewrites then stay in the
table and every row they both rewrote is there twice. No delta-rs call refuses that
commit (an ``OPTIMIZE`` drops the app transactions it is given; an overwrite after a
compaction commits the same way, see ``tests/integration/test_delta_rs_compaction_races.py``),
so :func:`compact` checks its own commit right after it: when the files it added hold
more rows than the files it actually removed, another compaction came first, and it
commits the files it removed back and its own added files away, ``dataChange=false``
(readers streaming the table see neither commit). A reader of the table between the two
commits sees the duplicated rows (a few milliseconds).

A process killed between the compaction's commit and its check (``kill -9``, an OOM
kill, an evicted pod) leaves that compaction unchecked. So before it compacts,
:func:`compact` (and :func:`~fanout.delta_tables.compaction.repair.repair_unchecked`, which
the Delta sink runs at its open) looks in the table's history since the last checked point
for fanout's compactions (tagged ``fanoutCommit = "compaction <token>"``) not taken back
(no ``"take back <token>"`` after them), and checks each as :func:`compact` checks its own: one that
duplicated rows is taken back the same way, ``dataChange`` as the caller's, or, when a
later compaction already rewrote its files, refused loudly (:class:`CompactionError`,
logged by the callers, naming the files and the version to restore). A refused one is
never recorded as checked: the compactions go on, and each reports it again until a
RESTORE undoes it or a person's fix commits with ``"take back <token>"`` (as
``fanoutCommit`` or Spark's ``userMetadata``). Every compaction
fanout commits records in its commit info the version up to which every fanout
compaction was checked (``fanoutCompactionsChecked``), so the scan reads the history
back to the newest such record only (and a process remembers the version it checked
last), and never before the table's mark, which fanout's first compaction of it commits
at the version its scan checked up to (:mod:`~fanout.delta_tables.compaction.marker`). A
table without the mark may still hold fanout compactions (a fanout built before the mark;
a mark expired by a retention since removed): the sink's open does not read its history,
its next compaction reads it back to the newest checked record, once. A compaction whose
snapshot was the version just before its commit (``readVersion``) cannot have raced and is
passed without reading its snapshots.
Readers streaming the table skip the late taking back (``dataChange=false``) as they
skipped the compaction; a reader of the latest version saw the rows twice from the
compaction to the next fanout run that compacts the table (or opens its sink, when
the table holds the mark).

What it cannot see: a compaction by another program (a scheduled ``OPTIMIZE``) that
planned before this one committed and commits after it duplicates the rows the same
way; only that program's own commit could be checked, and it carries no fanout tag.
Nor the Delta sink's Spark engine's compaction (delta-spark's ``OPTIMIZE``, untagged),
nor, on a table that expires app transactions (where the mark cannot be trusted), past its
:data:`~fanout.delta_tables.compaction.scan.RECENT` newest commits, a sink's table whose
``compact_every`` was removed after the crash (its open then looks only there), nor, on a
table without the mark, any sink's open: until a fanout compaction of the table runs again.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fanout.delta_tables.compaction import refusals
from fanout.delta_tables.compaction import take_back as taking_back
from fanout.delta_tables.compaction.files import changed, duplicates
from fanout.delta_tables.compaction.marker import mark_compacted, with_mark
from fanout.delta_tables.compaction.repair import scan, unless
from fanout.delta_tables.compaction.tags import CHECKED_TAG, COMMIT_TAG, compaction_tag

if TYPE_CHECKING:
    from deltalake import DeltaTable


@dataclass(frozen=True)
class Compaction:
    """What :func:`compact` did.

    :ivar files_removed: small files the compaction removed (0 when taken back).
    :ivar files_added: files it added (0 when taken back).
    :ivar taken_back: another compaction had removed some of the same files first:
        this one committed, then was taken back at ``version``.
    :ivar version: the table's version after the compaction (and its taking back).
    """

    files_removed: int
    files_added: int
    taken_back: bool
    version: int


def compact(
    table: DeltaTable,
    what: str,
    storage_options: Mapping[str, str] | None,
    *,
    rewrite: Callable[[DeltaTable, Any], Mapping[str, Any]] | None = None,
    data_change: bool = False,
) -> Compaction:
    """Compact ``table``'s small files from its loaded snapshot; take the compaction back
    at once when another compaction had removed some of the same files since that
    snapshot. ``table`` ends at the table's latest version.

    :param what: the table as messages name it (``"ledger at /x"``, ``"sink 'orders'
        table /y"``).
    :param rewrite: commits the compaction: called with ``table`` and the
        ``CommitProperties`` to commit with, returns delta-rs' metrics (``None``: delta-rs
        ``OPTIMIZE``, which bin-packs the small files, ``dataChange=false``).
    :param data_change: the ``dataChange`` of the taking back's actions: ``False`` where
        readers may stream the table (they skip such commits), ``True`` where none does
        (a compaction planned before it then fails to commit).
    :raises CompactionError: the compaction duplicated rows and taking it back failed
        (the message names the files to remove), or an earlier fanout compaction left
        unchecked duplicated rows and cannot be taken back
        (:func:`~fanout.delta_tables.compaction.repair.repair_unchecked`; this one ran all
        the same, and the next one reports it again until it is fixed).
    """
    checked, refused = scan(table, what, storage_options, data_change=data_change)
    # a refusal is reported at every compaction until a person fixes it
    return unless(refused, _compact(table, what, storage_options, checked, rewrite, data_change))


def _compact(
    table: DeltaTable,
    what: str,
    storage_options: Mapping[str, str] | None,
    checked: int,
    rewrite: Callable[[DeltaTable, Any], Mapping[str, Any]] | None,
    data_change: bool,
) -> Compaction:
    """:func:`compact`'s own compaction and its check, recording ``checked``."""
    from deltalake import CommitProperties

    base, token = table.version(), uuid.uuid4().hex
    tags = {COMMIT_TAG: compaction_tag(token), CHECKED_TAG: str(checked)}
    metrics: Mapping[str, Any]
    if rewrite is None:
        mark_compacted(table, storage_options, checked)  # an OPTIMIZE drops app transactions
        metrics = table.optimize.compact(commit_properties=CommitProperties(custom_metadata=tags))
    else:
        metrics = rewrite(table, with_mark(table, tags, checked))
    removed, added = int(metrics.get("numFilesRemoved", 0)), int(metrics.get("numFilesAdded", 0))
    if not added:
        return Compaction(removed, added, False, table.version())
    unchecked, then = refusals.compaction_unchecked(what, base, token)
    # looked up in its module at the call: the crash tests kill the process there
    version = taking_back.committed_version(table, base, compaction_tag(token), unchecked, then)
    done = changed(table, version, storage_options)
    if not duplicates(*done, what, version):
        return Compaction(removed, added, False, table.version())
    taking_back.take_back(table, what, version, done, token, data_change, storage_options)
    return Compaction(0, 0, True, table.version())
