"""The rows a sink does not write and never drops: a null key (refused naming the
column, or dead-lettered once), rows failing a route, a row the target refuses, handed to
``context.dead_letters`` once, also by a replay whose mark (and hand-over) was lost, and a
route changed between a partial attempt and its replay.

The contract: docs/architecture.md §7 (routes and dead letters)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from fanout.errors import BatchFailedError, RouteError, SinkResultError
from fanout.fan_out import FanOut
from fanout.ledger.delta import DeltaLedger
from fanout.testing.conformance.case import NAME, SinkUnderTest
from fanout.testing.conformance.kit import Kit, _assert_ids, _assert_rows, _MarkLost
from fanout.testing.faults import VetoOnce


class DeadLetterChecks(Kit):
    """Null keys, routes and refused rows, to the dead letters once (module docstring)."""

    def test_a_null_key_is_refused_by_name_or_dead_lettered(
        self, spark: Any, under_test: SinkUnderTest, tmp_path: Path
    ) -> None:
        if not under_test.keyed:
            pytest.skip("the sink has no key")
        target: dict[str, Any] = (
            {} if under_test.dead_letter is None else {"dead_letter": under_test.dead_letter}
        )
        fan = self._fan(under_test, str(tmp_path / "ledger"), **target)
        rows = [(1, "a"), (None, "no key"), (2, "b")]
        batch = self._batch(spark, rows)
        try:
            result = fan.process(batch, self._info(0))[NAME]
        except BatchFailedError as failed:
            error = failed.failures[NAME]
            if isinstance(error, SinkResultError):  # the sink refused nothing: its counts
                pytest.fail(
                    "fanout refused the counts write() reported for a batch of ids 1, null, "
                    f"2 ({len(rows)} rows): {error}"
                )
            if "'id'" not in str(error):
                pytest.fail(
                    f"the sink refused a batch with a null key with an error that does not "
                    f"name the key column: {error!r}; name it, quoted: 'id'"
                )
            return
        held = sorted((row.get("id") for row in under_test.read()), key=lambda i: (i is None, i))
        if held != [1, 2] or result.dead_lettered != 1:  # the null key's row is not dropped
            pytest.fail(
                f"a batch of ids 1, null, 2 left the target holding ids {held} and "
                f"SinkResult.dead_lettered={result.dead_lettered}, expected [1, 2] and 1: a "
                "row whose key is null is never written nor dropped without a word: refuse "
                "the batch naming the key column ('id'), or hand the row to the dead-letter "
                "target (context.dead_letters) and count it in SinkResult.dead_lettered"
            )
        if not target:
            return
        letters = [(_letter_id(d), d["source"]) for d in self._dead_letters(under_test)]
        if letters != [(None, "refused")]:
            pytest.fail(
                f"a batch of ids 1, null, 2 left the dead-letter target holding {letters} "
                "(row id, source), expected [(None, 'refused')]: hand the null key's row to "
                "context.dead_letters (its write(batch, letters, source='refused')) once your "
                "commit of the others succeeded"
            )
        # the same batch again, its ledger mark lost (a fresh ledger: the driver died
        # between the write and the mark); the sink's own records find it committed. With
        # a local Delta target (the default), its letters are taken away first: the driver
        # died between the sink's commit and its hand-over of the refused row
        handed = _forget_letters(under_test)
        replay = self._fan(under_test, str(tmp_path / "ledger-lost"), **target)
        _assert_rows(replay.process(batch, self._info(0))[NAME], 2, _NULL_KEY_REPLAY)
        _assert_ids(under_test, [1, 2], "after the replay of ids 1, null, 2 (its mark lost)")
        letters = [(_letter_id(d), d["source"]) for d in self._dead_letters(under_test)]
        if letters != [(None, "refused")]:
            pytest.fail(
                "after the replay of a batch of ids 1, null, 2 whose ledger mark was lost"
                + ("" if handed else " (and its refused row's hand-over: killed after the commit)")
                + f", the dead-letter target holds {letters} (row id, source), expected [(None, "
                "'refused')] once: a replay that finds the batch committed hands over again the "
                "rows it refused, as recorded with that commit (the target keeps them once; "
                "docs/writing-sinks.md: Dead letters)"
            )

    def test_rows_failing_the_route_go_to_the_dead_letter_target(
        self, spark: Any, under_test: SinkUnderTest, tmp_path: Path
    ) -> None:
        if under_test.dead_letter is None:
            pytest.skip("no dead_letter target given")
        fan = self._fan(under_test, str(tmp_path / "ledger"), dead_letter=under_test.dead_letter,
                        where="CAST(v AS INT) > 0")  # fmt: skip
        rows = [(1, "1"), (2, "abc"), (3, "3")]
        result = fan.process(self._batch(spark, rows), self._info(0))[NAME]
        assert (result.rows, result.dead_lettered) == (2, 1)
        assert under_test.ids() == [1, 3]
        letters = self._dead_letters(under_test)
        assert [json.loads(d["row"])["id"] for d in letters] == [2]
        assert "CAST_INVALID_INPUT" in letters[0]["reason"]

    def test_a_row_the_target_refuses_is_dead_lettered_once(
        self, spark: Any, under_test: SinkUnderTest, tmp_path: Path
    ) -> None:
        refused = under_test.refused_value
        if refused is None:
            pytest.skip("no refused_value given")
        batch = self._batch(spark, [(1, "a"), (2, refused), (3, "c")])
        path = str(tmp_path / "ledger")
        if under_test.dead_letter is None:
            with pytest.raises(BatchFailedError) as failed:
                self._fan(under_test, path).process(batch, self._info(0))
            error = str(failed.value.failures[NAME])
            assert f"sink {NAME!r}, batch 0" in error and refused in error
            return
        target: dict[str, Any] = {"dead_letter": under_test.dead_letter}
        losing = _MarkLost(DeltaLedger(path))  # written, mark lost: the replay must not add
        losing.write_losing_the_mark(self._fan(under_test, losing, **target), batch, self._info(0))
        assert under_test.ids() == [1, 3]
        handed = _forget_letters(under_test)  # killed after the commit, before the hand-over
        result = self._fan(under_test, path, **target).process(batch, self._info(0))[NAME]
        assert result.rows == 2
        assert under_test.ids() == [1, 3]
        letters = [(_letter_id(d), d["source"]) for d in self._dead_letters(under_test)]
        if letters != [(2, "refused")]:
            pytest.fail(
                f"after the replay of a batch of ids 1, 2 (v {refused!r}: refused), 3 whose "
                "ledger mark was lost"
                + ("" if handed else " (and its refused row's hand-over: killed after the commit)")
                + f", the dead-letter target holds {letters} (row id, source), expected [(2, "
                "'refused')] once: a replay that finds the batch committed hands over again the "
                "rows it refused, as recorded with that commit (the target keeps them once; "
                "docs/writing-sinks.md: Dead letters)"
            )

    def test_a_route_changed_between_a_partial_attempt_and_its_replay(
        self, spark: Any, under_test: SinkUnderTest, tmp_path: Path
    ) -> None:
        """A first attempt without a route (so no route letter records a route) commits
        some pieces and fails (partition 0's commit vetoed); the replay's route refuses the
        odd ids. Either the replay is refused before any letter is written (a
        :class:`fanout.RouteError`; the old route then completes the batch exactly), or its
        outcome is exact: the even ids in the target, the odd ones in the dead letters,
        none in both places."""
        if under_test.dead_letter is None:
            pytest.skip("no dead_letter target given")
        path = str(tmp_path / "ledger")
        target: dict[str, Any] = {"dead_letter": under_test.dead_letter}
        veto = VetoOnce(batch=0, partition=0, state=str(tmp_path / "veto.json"), sink=NAME)
        fan = self._fan(under_test, path, observers=[veto], **target)
        if not _commits_in_pieces(under_test, fan):
            pytest.skip("the sink commits each batch whole: no partial attempt")
        batch = self._batch(spark, [(i, "x" if i % 2 else str(i + 1)) for i in range(8)])
        with pytest.raises(BatchFailedError):
            fan.process(batch, self._info(0))
        partial = under_test.ids()
        assert set(partial) < set(range(8))  # partition 0 did not commit
        routed: dict[str, Any] = {**target, "where": "CAST(v AS INT) > 0"}
        try:
            result = self._fan(under_test, path, **routed).process(batch, self._info(0))[NAME]
        except BatchFailedError as failed:
            error = failed.failures[NAME]
            assert isinstance(error, RouteError), error
            assert f"sink {NAME!r}, batch 0" in str(error) and "route" in str(error)
            assert self._dead_letters(under_test) == []  # refused before any letter
            assert under_test.ids() == partial
            result = self._fan(under_test, path, **target).process(batch, self._info(0))[NAME]
            assert (result.rows, result.dead_lettered) == (8, 0)
            assert under_test.ids() == list(range(8))
            assert self._dead_letters(under_test) == []
            return
        assert (result.rows, result.dead_lettered) == (4, 4)
        assert under_test.ids() == [0, 2, 4, 6]
        letters = self._dead_letters(under_test)
        assert sorted(json.loads(d["row"])["id"] for d in letters) == [1, 3, 5, 7]

    def _dead_letters(self, case: SinkUnderTest) -> Sequence[Mapping[str, Any]]:
        if case.read_dead_letters is not None:
            return case.read_dead_letters()
        from fanout.delta_tables.io import read_delta

        assert case.dead_letter is not None
        location = case.dead_letter.removeprefix("delta:")
        if "://" not in location and not Path(location).exists():
            return []  # never written: no letters
        return read_delta(location).to_pylist()


def _letter_id(letter: Mapping[str, Any]) -> Any:
    """The ``id`` of a dead letter's row; ``None`` also for a letter without its row (a sink
    that keeps only its encoding of it, as the Kafka sink does for a record it refused)."""
    return None if letter["row"] is None else json.loads(letter["row"]).get("id")


def _forget_letters(case: SinkUnderTest) -> bool:
    """Delete the case's dead-letter table when it is a local Delta table (the default
    reading): the state a driver killed between the sink's commit and its hand-over of the
    rows it refused leaves. ``True`` when it could not (the letters stay)."""
    location = (case.dead_letter or "").removeprefix("delta:")
    if case.read_dead_letters is not None or "://" in location or ":" in location.split("/")[0]:
        return True
    shutil.rmtree(location, ignore_errors=True)
    return False


_NULL_KEY_REPLAY = "the replay of ids 1, null, 2 (2 written, the null key dead-lettered)"


def _commits_in_pieces(case: SinkUnderTest, fan: FanOut) -> bool:
    """What ``case`` declares, else whether its sink is a partitioned sink."""
    if case.commits_in_pieces is not None:
        return case.commits_in_pieces
    from fanout.partitioned.sink import PartitionedSink

    return isinstance(fan.sinks[NAME], PartitionedSink)
