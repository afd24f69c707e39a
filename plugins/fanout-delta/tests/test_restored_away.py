"""Whether the RESTOREs after a batch's commit took it out of the table (what
``DeltaSink.holds_batch`` follows once the app transaction says held): the history as
delta-rs gives it, newest first."""

from __future__ import annotations

from typing import Any

from fanout_delta.plans import restored_away
from fanout_delta.table_states import TableStates


def _write(version: int) -> dict[str, Any]:
    return {"version": version, "operation": "WRITE", "operationParameters": {"mode": "Append"}}


def _restore(at: int, **to: str) -> dict[str, Any]:
    return {"version": at, "operation": "RESTORE", "operationParameters": to}


def test_a_restore_to_before_the_commit_takes_it_out_and_one_back_gives_it_back() -> None:
    history = [_write(v) for v in range(4)]
    assert not restored_away(history, 3, 3)
    history.append(_restore(4, version="2"))
    assert restored_away(history, 3, 4)
    history.append(_write(5))  # a later batch appended to the restored table
    assert restored_away(history, 3, 5)
    history.append(_restore(6, version="3"))
    assert not restored_away(history, 3, 6)
    history.append(_restore(7, version="5"))  # version 5 lacked it
    assert restored_away(history, 3, 7)


def test_a_restore_to_a_timestamp_or_a_gap_in_the_history_cannot_tell_so_held() -> None:
    assert not restored_away([_write(3), _restore(4, datetime="2026-01-01T00:00:00Z")], 3, 4)
    assert not restored_away([_write(3), _restore(5, version="2")], 3, 5)


def test_a_restore_whose_version_is_not_a_number_cannot_tell_so_held() -> None:
    """delta-spark JSON-encodes its operation parameters, ``Option`` values included: a
    version it did not record reads ``"null"``."""
    restore = _restore(4, version="null", timestamp='"2026-01-01 00:00:00"')
    assert not restored_away([_write(3), restore], 3, 4)


def test_the_batch_held_by_any_of_its_commits() -> None:
    """A batch written again after a restore has two commits: held while either is in."""
    history = [_write(2), _restore(3, version="1"), _write(4), _restore(5, version="2")]
    assert not restored_away(history, [2, 4], 5)
    assert restored_away([*history, _restore(6, version="3")], [2, 4], 6)
    assert not restored_away([*history[:3]], [2, 4], 4)
    assert restored_away([*history[:2]], [2], 3)


class Files(TableStates):
    """The table's data files at each version, as given (a version missing: cannot be
    loaded, its log cleaned up)."""

    def __init__(self, files: dict[int, set[str]]) -> None:
        super().__init__("memory://t")
        self.by_version = {version: frozenset(names) for version, names in files.items()}

    def _load(self, version: int) -> frozenset[str] | None:
        return self.by_version.get(version)


def _at_timestamp(at: int) -> dict[str, Any]:
    return _restore(at, datetime="1796118135731")  # delta-rs records no version


def test_a_restore_to_a_timestamp_is_followed_by_the_files_it_left() -> None:
    """Batch 3 (version 3) added ``d``; restored to a timestamp at version 4: to before
    the batch when the table then reads version 2's files, taken out; to the batch's
    version or after, held."""
    before = {0: {"a"}, 1: {"a", "b"}, 2: {"a", "b", "c"}, 3: {"a", "b", "c", "d"}}
    history = [*[_write(v) for v in range(4)], _at_timestamp(4)]
    assert restored_away(history, 3, 4, Files({**before, 4: {"a", "b", "c"}}))
    assert restored_away(history, 3, 4, Files({**before, 4: {"a"}}))
    assert not restored_away(history, 3, 4, Files({**before, 4: {"a", "b", "c", "d"}}))


def test_a_restore_to_a_timestamp_after_a_compaction_follows_the_version_it_matches() -> None:
    """An OPTIMIZE (version 4) rewrote the batch's file ``d`` with the others into ``e``:
    a restore to a time after it leaves ``e``, the batch's rows held though ``d`` is gone;
    one to a time before the batch leaves version 2's files."""
    files = {1: {"a"}, 2: {"a", "c"}, 3: {"a", "c", "d"}, 4: {"e"}}
    history = [_write(v) for v in range(1, 4)]
    history.append({"version": 4, "operation": "OPTIMIZE", "operationParameters": {}})
    history.append(_at_timestamp(5))
    assert not restored_away(history, 3, 5, Files({**files, 5: {"e"}}))
    assert restored_away(history, 3, 5, Files({**files, 5: {"a", "c"}}))


def test_a_restore_to_a_timestamp_matching_no_version_cannot_tell_so_held() -> None:
    """No version has the files the restore left (Spark's ``ignoreMissingFiles`` skipped
    one), or a version on the way cannot be loaded: cannot tell, held."""
    files = {1: {"a"}, 2: {"a", "c"}, 3: {"a", "c", "d"}}
    history = [*[_write(v) for v in range(1, 4)], _at_timestamp(4)]
    assert not restored_away(history, 3, 4, Files({**files, 4: {"c"}}))
    assert not restored_away(history, 3, 4, Files({1: {"a"}, 3: files[3], 4: {"a"}}))
    spark = _restore(4, version="null", timestamp='"2026-01-01 00:00:00"')
    assert restored_away([*history[:3], spark], 3, 4, Files({**files, 4: {"a"}}))
