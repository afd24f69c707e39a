"""Whether the RESTOREs after a batch's commit took it out of the table (what
``DeltaSink.holds_batch`` follows once the app transaction says held): the history as
delta-rs gives it, newest first."""

from __future__ import annotations

from typing import Any

from fanout_delta.plans import restored_away


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
