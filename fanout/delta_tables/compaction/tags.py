"""How fanout's compactions are written in a Delta table's commit infos, and read back: the
tag of a compaction and of its taking back (or a person's fix), and the version up to which
every fanout compaction was checked before a compaction."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

COMMIT_TAG = "fanoutCommit"
"""The commit info key marking fanout's compaction (``"compaction <token>"``) and its taking
back (``"take back <token>"``), to find their versions in the table's history."""

CHECKED_TAG = "fanoutCompactionsChecked"
"""The commit info key of fanout's compaction recording the version up to which every
fanout compaction in the table's history was checked before it (a scan reads the history
back to the newest one)."""


def compaction_tag(token: str) -> str:
    """The :data:`COMMIT_TAG` value of the compaction ``token``."""
    return f"compaction {token}"


def take_back_tag(token: str) -> str:
    """The :data:`COMMIT_TAG` value of the compaction ``token``'s taking back (or of a
    person's fix of it)."""
    return f"take back {token}"


def compaction_token(info: Mapping[str, Any]) -> str | None:
    """The token of the fanout compaction whose commit info ``info`` is, if it is one."""
    tag = str(info.get(COMMIT_TAG))
    return tag.removeprefix("compaction ") if tag.startswith("compaction ") else None


def taken_back(history: Iterable[Mapping[str, Any]]) -> set[str]:
    """The tokens of the compactions taken back (or marked fixed) in ``history``."""
    return {
        str(info.get(key)).removeprefix("take back ")
        for info in history
        for key in (COMMIT_TAG, "userMetadata")  # a person's "fixed" mark, also from Spark
        if str(info.get(key)).startswith("take back ")
    }


def checked_mark(info: Mapping[str, Any]) -> int | None:
    """The version a commit info records every fanout compaction checked up to, if any."""
    try:
        return int(info[CHECKED_TAG])
    except (KeyError, TypeError, ValueError):
        return None
