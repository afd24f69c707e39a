"""What fanout says when a compaction's duplicated rows stay in a table: the texts of the
:class:`fanout.errors.CompactionError` s a compaction, its taking back or a later scan
raise, each naming the compaction, the files, and the way out (deduplicate, RESTORE, or
mark it fixed)."""

from __future__ import annotations

from collections.abc import Iterable

from fanout.delta_tables.compaction.tags import COMMIT_TAG, compaction_tag, take_back_tag


def fix_mark(token: str) -> str:
    """How a person tells fanout that a refused compaction's duplicated rows are fixed."""
    return (
        "Every fanout compaction of the table reports this again until the fix commits "
        f"with {COMMIT_TAG} = '{take_back_tag(token)}' in its commit info (delta-rs: "
        "CommitProperties(custom_metadata=...); Spark: the write option userMetadata = "
        f"'{take_back_tag(token)}'); a RESTORE to the version before it needs no mark"
    )


def _named(version: int, token: str) -> str:
    tag = compaction_tag(token)
    return f"the compaction committed at version {version} ({COMMIT_TAG} = '{tag}')"


def versions_unreadable(what: str, version: int, token: str, why: str) -> str:
    """An unchecked compaction whose versions can no longer be read (its log cleaned up)."""
    return (
        f"{what}: {_named(version, token)} was never checked against another compaction of "
        "the same files (the process that committed it ended first), and its versions can "
        f"no longer be read ({why}): if another compaction removed some of the same files "
        "before it, their rows are in the table twice; look for duplicated rows and "
        "deduplicate the table. " + fix_mark(token)
    )


def cannot_take_back(what: str, version: int, token: str, why: str) -> str:
    """An unchecked compaction that duplicated rows and cannot be taken back now."""
    return (
        f"{what}: {_named(version, token)} rewrote files another compaction had rewritten "
        "first, so rows are in the table twice; the process that committed it ended before "
        f"it checked that, and it cannot be taken back now: {why}. Deduplicate the table, "
        f"or RESTORE it to version {version - 1} if nothing was written since. " + fix_mark(token)
    )


def taking_back_failed(
    what: str, version: int, new: Iterable[str], gone: Iterable[str], why: Exception
) -> str:
    """A compaction that duplicated rows, whose taking back delta-rs refused."""
    return (
        f"{what}: the compaction committed at version {version} rewrote files another "
        f"compaction had rewritten first, so rows are in the table twice, and taking it "
        f"back failed: {why}. Remove its files {sorted(new)} from the table "
        f"(dataChange=false) and add back {sorted(gone)}, or RESTORE the table to version "
        f"{version - 1} if nothing was written since"
    )


def taken_back_unchecked(what: str, version: int, token: str) -> tuple[str, str]:
    """What was left unchecked, and what that may have left and what to do, when a taking
    back's own commit cannot be found in a history other writers kept committing to."""
    return (
        f"{what}: the compaction committed at version {version} rewrote files another "
        "compaction had rewritten first, and was taken back; whether a third compaction "
        "rewrote its files before that could not be checked",
        f"If a compaction committed between version {version} and the taking back (commit "
        f"info {COMMIT_TAG} = '{take_back_tag(token)}') removed some of the files it added, "
        "their rows are in the table twice: deduplicate it, or RESTORE it to version "
        f"{version - 1} if nothing was written since",
    )


def taken_back_too_late(what: str, version: int, back: int, late: Iterable[str]) -> str:
    """A taking back a third compaction came before: it rewrote the duplicated files."""
    return (
        f"{what}: the compaction committed at version {version} rewrote files another "
        f"compaction had rewritten first, and before it was taken back (version "
        f"{back}) a third compaction rewrote its files {sorted(late)}: rows are in the "
        "table twice. Stop the other programs compacting this table, then deduplicate "
        f"it, or RESTORE it to version {version - 1} if nothing was written since"
    )


def compaction_unchecked(what: str, base: int, token: str) -> tuple[str, str]:
    """As :func:`taken_back_unchecked`, for this process's own compaction committed after
    version ``base``."""
    return (
        f"{what}: the compaction committed after version {base} could not be checked against "
        "another compaction of the same files",
        f"If a compaction by another program (an OPTIMIZE) committed after version {base} "
        "too and removed some of the same files, their rows are now in the table twice "
        "until the next fanout compaction of the table checks it again; to fix it at "
        "once, look in the table's history after version "
        f"{base} for the two compactions (this one's commit info has {COMMIT_TAG} = "
        f"'{compaction_tag(token)}'); if both removed a same file, remove this one's added "
        "files (dataChange=false) and add back the files it removed, or RESTORE the table "
        "to the version before it if nothing was written since",
    )
