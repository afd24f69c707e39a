"""A batch the table's app transaction records but a RESTORE took out again is written
again by its replay, not skipped (docs/architecture.md §8.1, "A batch restored away"):
no Spark, real delta-rs tables, every writer of engine rs (the driver's append, the
executors' append, the merge) and the spark engine's refusal.

The sequence: the sink commits batch 2, the driver dies before the ledger marks it, the
user restores the table to the version before that commit; the restart replays batch 2
with the same plan. A RESTORE keeps the app transaction, so the replay found the batch
"done" and skipped it: its rows were in no version the table now reads, and the ledger
then marked it. ``tests/integration/test_delta_restored_replay.py`` runs the kill.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from arrow_batches import FakeFrame, opened
from deltacheck import ids
from deltalake import DeltaTable, write_deltalake
from fanout_delta import DeltaSink
from fanout_delta.spark_engine import write_spark

from fanout.contract.batch import Batch, BatchInfo, txn_app_id
from fanout.contract.sink import SinkContext
from fanout.deadletters.delta import DeltaDeadLetters
from fanout.delta_tables.io import read_delta
from fanout.errors import SinkWriteError

APP_ID = txn_app_id("p", "s")
PLANNED = 1_800_000_000_000


def batch(batch_id: int, planned: int | None = None) -> Batch:
    ids = range(10 * batch_id, 10 * batch_id + 10)
    data = pa.table({"id": pa.array(ids, pa.int64()), "v": [f"v{i}" for i in ids]})
    at = PLANNED + batch_id * 1000 if planned is None else planned
    info = BatchInfo("p", batch_id, "q-1", [{"logOffset": batch_id}], 0, at)
    return Batch(df=FakeFrame(data), info=info, sink_name="s", txn_app_id=APP_ID)


SINKS = {
    "driver append": {"write_from": "driver"},
    "executors append": {"write_from": "executors"},
    "merge": {"mode": "merge", "keys": ["id"]},
}


def restore_to_version(path: Path, version: int) -> None:
    """RESTORE the table to ``version``."""
    DeltaTable(str(path)).restore(version)


def restore_to_the_time_of(path: Path, version: int) -> None:
    """RESTORE the table to a timestamp at which ``version`` was its newest: delta-rs records
    the time (``datetime``), not the version, which the sink then finds by the files the
    restore left.

    The time is halfway between the modification times of the commit files of ``version``
    and the version after it, which is what delta-rs resolves a time by (the newest commit
    file modified at or before it), not the commit info's ``timestamp``: that is taken
    before the file is written, so under load the file of ``version`` was modified a few
    milliseconds after it and a restore to it went back to the version before (the
    restore took out batch 1 too, and the test failed on ids 10-19 missing)."""
    log = path / "_delta_log"
    modified = [(log / f"{v:020d}.json").stat().st_mtime_ns for v in (version, version + 1)]
    assert modified[0] < modified[1], f"versions {version} and {version + 1} modified at once"
    at = datetime.fromtimestamp(sum(modified) / 2 / 1e9, UTC)
    DeltaTable(str(path)).restore(at)
    restore = DeltaTable(str(path)).history(1)[0]
    assert restore["operation"] == "RESTORE"
    assert "version" not in restore["operationParameters"]
    restored = DeltaTable(str(path)).file_uris()
    assert sorted(restored) == sorted(DeltaTable(str(path), version=version).file_uris())


RESTORES = {"to a version": restore_to_version, "to a timestamp": restore_to_the_time_of}


def written(sink: DeltaSink, batches: int) -> None:
    """Batches ``0..batches-1`` written, each commit file modified milliseconds after the one
    before (a restore to a timestamp between them finds it)."""
    for n in range(batches):
        sink.write(batch(n))
        time.sleep(0.01)


@pytest.mark.parametrize("restore", RESTORES.values(), ids=RESTORES.keys())
@pytest.mark.parametrize("options", SINKS.values(), ids=SINKS.keys())
def test_a_batch_restored_away_is_written_again_once(
    tmp_path: Path, options: dict[str, Any], restore: Callable[[Path, int], None]
) -> None:
    path = tmp_path / "t"
    sink = opened(path, **options)
    written(sink, 3)
    restore(path, 1)  # batch 2 was version 2
    assert DeltaTable(str(path)).transaction_version(APP_ID) == 2
    assert ids(path) == list(range(20))
    assert sink.holds_batch("p", 0, 2) is False

    replay = sink.write(batch(2))

    assert replay.already_written is False
    if options.get("write_from") == "executors":
        assert replay.details["write_from"] == "executors"
    assert ids(path) == list(range(30))
    assert DeltaTable(str(path)).transaction_version(APP_ID) == 2
    assert sink.holds_batch("p", 0, 2) is True
    again = sink.write(batch(2))  # a second replay finds the new commit: skipped
    assert again.already_written is True
    assert ids(path) == list(range(30))
    sink.write(batch(3))
    assert ids(path) == list(range(40))


@pytest.mark.parametrize("restore", RESTORES.values(), ids=RESTORES.keys())
def test_a_restore_that_keeps_the_batch_or_gives_it_back_skips(
    tmp_path: Path, restore: Callable[[Path, int], None]
) -> None:
    path = tmp_path / "t"
    sink = opened(path, write_from="driver")
    written(sink, 3)
    write_deltalake(str(path), pa.table({"id": [900], "v": ["other"]}), mode="append")
    restore(path, 2)  # another writer's commit undone, batch 2 kept
    assert sink.holds_batch("p", 0, 2) is True
    assert sink.write(batch(2)).already_written is True
    assert ids(path) == list(range(30))

    restore(path, 1)
    time.sleep(0.01)
    restore(path, 2)  # and given back
    assert sink.write(batch(2)).already_written is True
    assert ids(path) == list(range(30))


@pytest.mark.parametrize("options", SINKS.values(), ids=SINKS.keys())
def test_a_batch_written_again_is_held_by_either_of_its_commits(
    tmp_path: Path, options: dict[str, Any]
) -> None:
    """Written again after a restore, the batch has two commits: the table holds it while
    either is in the version it reads. A restore back to the first commit (undoing the
    second) keeps it held: a replay skips it, and ``holds_batch`` says held after the
    rewrite (else the next start's check of the last mark refused the run, the target
    lost)."""
    path = tmp_path / "t"
    sink = opened(path, **options)
    for n in range(3):
        sink.write(batch(n))
    DeltaTable(str(path)).restore(1)
    assert sink.write(batch(2)).already_written is False  # version 4
    assert sink.holds_batch("p", 0, 2) is True
    assert sink.write(batch(2)).already_written is True

    DeltaTable(str(path)).restore(2)  # back to the first commit of batch 2
    assert ids(path) == list(range(30))
    assert sink.holds_batch("p", 0, 2) is True
    assert sink.write(batch(2)).already_written is True
    assert ids(path) == list(range(30))

    DeltaTable(str(path)).restore(1)  # both commits out
    assert sink.holds_batch("p", 0, 2) is False
    assert sink.write(batch(2)).already_written is False
    assert ids(path) == list(range(30))


def test_an_older_batch_restored_away_behind_a_later_one_is_skipped(tmp_path: Path) -> None:
    """The table's transaction is past the batch (a later batch committed after the
    restore): writing the older batch would set the transaction back, so it is skipped as
    before (the ledger's marks never hand it over again in a running pipeline)."""
    path = tmp_path / "t"
    sink = opened(path, write_from="driver")
    for n in range(3):
        sink.write(batch(n))
    DeltaTable(str(path)).restore(1)
    sink.write(batch(3))
    assert sink.write(batch(2)).already_written is True
    assert ids(path) == [*range(20), *range(30, 40)]
    assert DeltaTable(str(path)).transaction_version(APP_ID) == 3


def test_the_spark_engine_refuses_a_batch_restored_away(tmp_path: Path) -> None:
    """delta-spark skips a batch whose transaction the table records, so engine spark
    cannot write it again: it fails the batch instead of skipping it (its skip path runs
    on delta-rs' lookup; no Delta jars here)."""
    path = tmp_path / "t"
    sink = opened(path, write_from="driver")
    for n in range(3):
        sink.write(batch(n))
    DeltaTable(str(path)).restore(1)
    target = opened(path, write_from="driver").target()

    with pytest.raises(SinkWriteError) as refused:
        write_spark(target, batch(2))

    assert str(refused.value) == (
        f"sink 's', batch 2: the Delta table {path} records the batch's transaction "
        f"({APP_ID}), but a RESTORE since its commit took its rows out. delta-spark skips a "
        "batch whose transaction the table records, so engine 'spark' cannot write it again: "
        "restore the table to a version holding the batch (its commit or later), or write it "
        "with engine 'rs', which writes a restored-away batch again"
    )
    assert ids(path) == list(range(20))


# -- the letters of a batch the table holds are not written again ---------------------------


def lettered(batch_id: int) -> Batch:
    """Batch ``batch_id``: ids ``10n..10n+3``, the first two with an empty string as
    partition value ``k``, which no Delta table keeps (refused: dead letters)."""
    ids = range(10 * batch_id, 10 * batch_id + 4)
    data = pa.table({"id": pa.array(ids, pa.int64()), "k": ["", "", "x", "y"]})
    info = BatchInfo("p", batch_id, "q-1", [{"logOffset": batch_id}], 0, PLANNED + batch_id)
    return Batch(df=FakeFrame(data), info=info, sink_name="s", txn_app_id=APP_ID)


def with_letters(path: Path, dead: Path, **options: Any) -> DeltaSink:
    sink = DeltaSink(name="s", path=str(path), partition_by=["k"], **options)
    sink.open(SinkContext(pipeline="p", dead_letters=DeltaDeadLetters(str(dead))))
    return sink


def letters(dead: Path) -> list[tuple[int, int]]:
    if not dead.exists():
        return []
    rows = read_delta(str(dead)).to_pylist()
    return sorted((r["batch_id"], json.loads(r["row"])["id"]) for r in rows)


@pytest.mark.parametrize("options", SINKS.values(), ids=SINKS.keys())
def test_a_replay_under_another_target_writes_no_letters_of_a_batch_the_table_holds(
    tmp_path: Path, options: dict[str, Any]
) -> None:
    """The batch was committed (its letters written first, to ``a``) and not marked; the
    replay runs with ``dead_letter`` moved to ``b``: it skips the batch and writes its
    letters nowhere (they were in ``b`` too), and the next batch's go to ``b``."""
    path = tmp_path / "t"
    first = with_letters(path, tmp_path / "a", **options)
    for n in range(3):
        first.write(lettered(n))
    moved = with_letters(path, tmp_path / "b", **options)

    replay = moved.write(lettered(2))

    assert (replay.already_written, replay.dead_lettered) == (True, 2)
    assert letters(tmp_path / "b") == []
    assert letters(tmp_path / "a") == [(n, 10 * n + i) for n in range(3) for i in (0, 1)]
    assert moved.write(lettered(3)).already_written is False
    assert letters(tmp_path / "b") == [(3, 30), (3, 31)]
    assert ids(path) == [10 * n + i for n in range(4) for i in (2, 3)]


def test_a_batch_restored_away_is_written_again_and_its_letters_kept_once(
    tmp_path: Path,
) -> None:
    """Restored away, the batch is written again; its letters, which the restore did not
    touch, are handed to the target again, which keeps them once."""
    path = tmp_path / "t"
    sink = with_letters(path, tmp_path / "a", write_from="driver")
    for n in range(3):
        sink.write(lettered(n))
    DeltaTable(str(path)).restore(DeltaTable(str(path)).version() - 1)

    replay = sink.write(lettered(2))

    assert (replay.already_written, replay.dead_lettered) == (False, 2)
    assert letters(tmp_path / "a") == [(n, 10 * n + i) for n in range(3) for i in (0, 1)]
    assert ids(path) == [10 * n + i for n in range(3) for i in (2, 3)]


class CommitsAsTheHistoryIsRead:
    """Another writer's append (id 900) committed once, right before the first read of the
    table's history: after the sink loaded its snapshot, before it looks for RESTOREs."""

    def __init__(self, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.path, self.done = path, False
        history = DeltaTable.history

        def racing(table: DeltaTable, limit: int | None = None) -> list[dict[str, Any]]:
            if not self.done:
                self.done = True
                write_deltalake(str(path), pa.table({"id": [900], "v": ["other"]}), mode="append")
            return history(table, limit)

        monkeypatch.setattr(DeltaTable, "history", racing)


@pytest.mark.parametrize("options", SINKS.values(), ids=SINKS.keys())
def test_a_batch_restored_away_is_written_again_when_another_writer_commits_meanwhile(
    tmp_path: Path, options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """delta-rs (1.6) lists the history from the newest commit in storage but numbers it
    down from the snapshot's version: a commit by another writer after the replay loaded
    its snapshot numbered batch 2's commit and the RESTORE one lower each, so the replay
    read the restore as undoing the commit before it, found batch 2 held, and skipped it:
    its rows lost (the ledger then marks it)."""
    path = tmp_path / "t"
    sink = opened(path, **options)
    written(sink, 3)
    restore_to_version(path, 1)  # batch 2 was version 2; the restore is version 3
    race = CommitsAsTheHistoryIsRead(path, monkeypatch)

    replay = sink.write(batch(2))

    assert race.done
    assert ids(path) == [*range(30), 900]
    assert replay.already_written is False
    assert sink.write(batch(2)).already_written is True
    assert ids(path) == [*range(30), 900]


def test_holds_batch_says_a_batch_restored_away_is_not_held_when_another_writer_commits_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start's check of a sink's last mark (``holds_batch``) reads the history the same
    way: a commit landing after it opened the table answered "held" for a batch restored
    away (the start then trusted the mark: the batch lost)."""
    path = tmp_path / "t"
    sink = opened(path, write_from="driver")
    written(sink, 3)
    restore_to_version(path, 1)
    race = CommitsAsTheHistoryIsRead(path, monkeypatch)

    assert sink.holds_batch("p", 0, 2) is False
    assert race.done


class CommitsAsEveryHistoryIsRead:
    """Another writer appends (ids 900, 901, ...) during every listing of the table's
    history, until :meth:`stop`: a table committed to faster than its history is read
    (``numbered_history`` gives up after ``HISTORY_READS`` reads, 3 here)."""

    def __init__(self, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        from fanout.delta_tables import io as deltaio

        self.appended: list[int] = []
        self.racing = True
        history = DeltaTable.history

        def racing(table: DeltaTable, limit: int | None = None) -> list[dict[str, Any]]:
            listed = history(table, limit)
            if self.racing:
                self.appended.append(900 + len(self.appended))
                new = pa.table({"id": [self.appended[-1]], "v": ["other"]})
                write_deltalake(str(path), new, mode="append")
            return listed

        monkeypatch.setattr(DeltaTable, "history", racing)
        monkeypatch.setattr(deltaio, "HISTORY_READS", 3)

    def stop(self) -> None:
        """The other writer pauses."""
        self.racing = False


@pytest.mark.parametrize("options", SINKS.values(), ids=SINKS.keys())
def test_a_replay_whose_history_cannot_be_numbered_is_retried_when_a_restore_is_listed(
    tmp_path: Path, options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay of a batch restored away, on a table another writer commits to during each
    read of its history: its numbering unknown, the replay cannot tell whether the RESTORE
    listed took the batch out. It skipped it (its rows lost); it now fails with a transient
    error, and its retry, once the history can be read, writes the batch again."""
    path = tmp_path / "t"
    sink = opened(path, **options)
    written(sink, 3)
    restore_to_version(path, 1)
    race = CommitsAsEveryHistoryIsRead(path, monkeypatch)

    with pytest.raises(Exception, match="RESTORE") as raised:
        sink.write(batch(2))
    assert sink.is_transient(raised.value)
    assert ids(path) == [*range(20), *race.appended]

    race.stop()
    assert sink.write(batch(2)).already_written is False
    assert ids(path) == [*range(30), *race.appended]


def test_a_replay_whose_history_cannot_be_numbered_is_skipped_when_no_restore_is_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same busy table without a RESTORE among the commits read: nothing can have
    taken the batch out, whatever their numbers, and the replay skips it as before."""
    path = tmp_path / "t"
    sink = opened(path, write_from="driver")
    written(sink, 3)
    race = CommitsAsEveryHistoryIsRead(path, monkeypatch)

    assert sink.write(batch(2)).already_written is True
    assert ids(path) == [*range(30), *race.appended]
    assert len(race.appended) == 6  # 3 listings by the plan's check, 3 by the restore's


@pytest.mark.parametrize("options", SINKS.values(), ids=SINKS.keys())
def test_a_restore_keeping_the_batch_behind_a_commit_without_commit_info_skips_its_replay(
    tmp_path: Path, options: dict[str, Any]
) -> None:
    """Another writer's commit without a commit info after batch 2's, then a RESTORE to
    batch 2's own version: the batch is held. delta-rs' history left that commit out and
    numbered batch 2's commit one version high, so the RESTORE read as taking it out: the
    replay wrote ids 20-29 a second time."""
    path = tmp_path / "t"
    sink = opened(path, **options)
    written(sink, 3)  # batch 2 is version 2
    bare = path / "_delta_log" / f"{3:020d}.json"
    bare.write_text('{"txn":{"appId":"other","version":1}}\n')  # version 3, no commit info
    restore_to_version(path, 2)  # version 4: keeps batch 2

    assert sink.holds_batch("p", 0, 2) is True
    replay = sink.write(batch(2))

    assert replay.already_written is True
    assert ids(path) == list(range(30))
