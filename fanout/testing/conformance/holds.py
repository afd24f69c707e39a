"""What a sink says of the batches it holds, by its own records, apart from the ledger:
the optional :meth:`fanout.Sink.holds_batch` (also of a deleted target),
:meth:`fanout.Sink.records_gone`, :meth:`fanout.Sink.target_replaced` (a target created
again empty) and :meth:`fanout.Sink.harmless_rewrite` (a batch written again under a new
epoch's key leaves the target as one write did).

The contract: docs/architecture.md §5 (the checkpoint guard asks these of an unmarked
batch) and §8."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fanout.contract.batch import BatchInfo
from fanout.contract.sink import PartlyHeld, Sink
from fanout.testing.conformance.case import NAME, SinkUnderTest
from fanout.testing.conformance.kit import Kit, _assert_ids
from fanout.testing.conformance.refusals import HOLDS_BATCH


class HoldsChecks(Kit):
    """The sink's own records of what it holds (module docstring)."""

    def test_holds_batch_by_its_own_records(
        self, spark: Any, under_test: SinkUnderTest, tmp_path: Path
    ) -> None:
        """The optional :meth:`fanout.Sink.holds_batch`: ``False`` before a batch is
        written, ``True`` after (whatever the ledger says; the whole batch was written, so
        not a :class:`fanout.PartlyHeld`: fanout records a lost mark only for ``True``),
        ``False`` for the next batch, and not held for the same batch id of another epoch.
        Skipped for a sink that cannot tell (``None``, the default). Where the sink has no
        record of an epoch at all it may say it cannot tell (``None``) instead of ``False``:
        records that expire (Kafka's markers, ``offsets.retention.minutes``) leave an epoch
        never written and one whose records expired alike."""
        fan = self._fan(under_test, str(tmp_path / "ledger"))
        sink = fan.sinks[NAME]
        before = sink.holds_batch(self.pipeline, 0, 0)
        if before is not None:
            _assert_holds(before, False, "batch 0 of epoch 0 before any batch was written")
        fan.process(self._batch(spark, [(i, f"v{i}") for i in range(3)]), self._info(0))
        after = sink.holds_batch(self.pipeline, 0, 0)
        if before is None and after is None:
            pytest.skip("the sink does not implement holds_batch (cannot tell)")
        _assert_holds(after, True, "batch 0 of epoch 0 after write() wrote all of it")
        _assert_holds(sink.holds_batch(self.pipeline, 0, 1), False,
                      "batch 1 of epoch 0, never written (only batch 0 was)")  # fmt: skip
        other = sink.holds_batch(self.pipeline, 1, 0)
        if other is not None:
            never = "batch 0 of epoch 1, never written (only epoch 0's batch 0 was)"
            _assert_holds(other, False, never)

    def test_holds_batch_of_a_deleted_target_is_false(
        self, spark: Any, under_test: SinkUnderTest, tmp_path: Path
    ) -> None:
        """The optional :meth:`fanout.Sink.holds_batch` about a batch it wrote, once ``drop``
        deleted the target: ``False`` (the run's lost-target check refuses only on
        ``False``, with :class:`fanout.TargetLostError`; records kept beside the target
        outlive it). Skipped without ``drop`` and for a sink that cannot tell."""
        if under_test.drop is None:
            pytest.skip("SinkUnderTest.drop not given: a deleted target not checked")
        fan = self._fan(under_test, str(tmp_path / "ledger"))
        sink = fan.sinks[NAME]
        fan.process(self._batch(spark, [(i, f"v{i}") for i in range(3)]), self._info(0))
        if sink.holds_batch(self.pipeline, 0, 0) is None:
            pytest.skip("the sink does not implement holds_batch (cannot tell)")
        under_test.drop()
        answer = sink.holds_batch(self.pipeline, 0, 0)
        if answer is not False:
            raise AssertionError(
                f"holds_batch returned {answer!r} for batch 0 of epoch 0 after drop() deleted "
                "the target it was written to, expected False: check that the target itself "
                "is there before asking records kept beside it, which outlive it (the run's "
                "lost-target check refuses with TargetLostError only on False)"
            )

    def test_records_gone_is_none_while_its_records_are_there(
        self, spark: Any, under_test: SinkUnderTest, tmp_path: Path
    ) -> None:
        """The optional :meth:`fanout.Sink.records_gone`: ``None`` about a batch of rows
        just written (its records are there: a reason refuses a healthy pipeline's next run
        with :class:`fanout.SinkRecordsGoneError`) and, given ``drop``, once the target
        was deleted (a lost target, not records gone). Skipped for a sink that does not
        implement it; its second half without ``drop``."""
        fan = self._fan(under_test, str(tmp_path / "ledger"))
        sink = fan.sinks[NAME]
        if type(sink).records_gone is Sink.records_gone:
            pytest.skip("the sink does not implement records_gone")
        fan.process(self._batch(spark, [(i, f"v{i}") for i in range(3)]), self._info(0))
        cases: list[tuple[str, Callable[[], None] | None]] = [
            ("just written (its records there)", None)
        ]
        if under_test.drop is not None:
            cases.append(("after drop() deleted the target (a lost target)", under_test.drop))
        for when, action in cases:
            if action is not None:
                action()
            gone = sink.records_gone(self.pipeline, 0, 0)
            if gone is not None:
                raise AssertionError(
                    f"records_gone returned {gone!r} about batch 0 of epoch 0 {when}: "
                    "expected None (a reason refuses the run with SinkRecordsGoneError)"
                )

    def test_target_replaced_tells_a_target_created_again_empty(
        self, spark: Any, under_test: SinkUnderTest, tmp_path: Path
    ) -> None:
        """The optional :meth:`fanout.Sink.target_replaced`: ``None`` about an empty batch
        just written (the same target, holding no row: empty is not re-created) and about a
        batch of rows written after it, and, once ``recreate`` dropped the target and
        created it again empty, a reason about that batch (a non-empty sentence the refusal
        quotes) although the sink's records still say it is held; the target still empty
        after it was asked (it creates and writes nothing). Skipped for a sink that does
        not implement it; its second half without ``recreate``."""
        fan = self._fan(under_test, str(tmp_path / "ledger"))
        sink = fan.sinks[NAME]
        if type(sink).target_replaced is Sink.target_replaced:
            pytest.skip("the sink does not implement target_replaced")
        fan.process(self._batch(spark, []), self._info(0))
        empty = sink.target_replaced(self.pipeline, 0, 0)
        if empty is not None:
            raise AssertionError(
                f"target_replaced returned {empty!r} about batch 0 of epoch 0, an empty batch "
                "just written to the same target: expected None (a reason refuses the next "
                "run as a target lost; a target that holds no row is not one created again)"
            )
        fan.process(self._batch(spark, [(i, f"v{i}") for i in range(3)]), self._info(1))
        same = sink.target_replaced(self.pipeline, 0, 1)
        if same is not None:
            raise AssertionError(
                f"target_replaced returned {same!r} about batch 1 of epoch 0, just written to "
                "the same target: expected None (a reason refuses the next run as a target "
                "lost)"
            )
        if under_test.recreate is None:
            pytest.skip("SinkUnderTest.recreate not given: a re-created target not checked")
        under_test.recreate()
        reason = sink.target_replaced(self.pipeline, 0, 1)
        if not isinstance(reason, str) or not reason.strip():
            raise AssertionError(
                f"target_replaced returned {reason!r} about batch 1 of epoch 0 after the "
                "target it was written to was dropped and created again empty: expected a "
                "reason (the run's lost-target check refuses with it; holds_batch's records, "
                "which outlive the target, still say held)"
            )
        _assert_ids(under_test, [], "after target_replaced was asked about a re-created target")

    def test_a_harmless_rewrite_leaves_the_target_as_one_write(
        self, spark: Any, under_test: SinkUnderTest, tmp_path: Path
    ) -> None:
        """The optional :meth:`fanout.Sink.harmless_rewrite`: a sink giving a reason says
        that writing a batch it holds again, under a new epoch's idempotency key, leaves
        its target as one write did (fanout then lets a new epoch start over a lost mark,
        with a warning, instead of refusing it). Checked so: batch 0 written, then the
        same rows as batch 0 of a new epoch; the target's rows (``id``, ``v``) must be those
        of the first write. Skipped for a sink giving none (``None``, the default)."""
        path = str(tmp_path / "ledger")
        fan = self._fan(under_test, path)
        reason = fan.sinks[NAME].harmless_rewrite()
        if reason is None:
            pytest.skip("the sink does not say a rewrite is harmless (harmless_rewrite: None)")
        rows = [(i, f"v{i}") for i in range(4)]
        fan.process(self._batch(spark, rows), self._info(0))
        once = _held(under_test)
        again = self._fan(under_test, path, fan_options={"on_checkpoint_reset": "new_epoch"})
        after_reset = BatchInfo(self.pipeline, 0, "conformance-query-after-a-reset")
        again.process(self._batch(spark, rows), after_reset)
        _assert_rewrite_harmless(_held(under_test), once, reason)


def _assert_holds(answer: object, expected: bool, batch: str) -> None:
    """``holds_batch`` answered ``expected`` about ``batch``, else an error saying what to do."""
    if answer is expected:
        return
    if expected and isinstance(answer, PartlyHeld):
        hint = (
            "PartlyHeld is the answer for a batch some of whose partitions never committed, "
            "or whose refused rows are not in the dead-letter target yet (letters=k); for a "
            "whole batch answer True (fanout records a lost mark only for True)"
        )
    else:
        hint = HOLDS_BATCH
    raise AssertionError(
        f"holds_batch returned {answer!r} for {batch}, expected {expected}: {hint}"
    )


def _held(case: SinkUnderTest) -> list[tuple[int, Any]]:
    """The target's rows as sorted ``(id, v)`` pairs (``v`` ``None`` when not kept)."""
    return sorted((int(row["id"]), row.get("v")) for row in case.read())


def _assert_rewrite_harmless(
    after: list[tuple[int, Any]], once: list[tuple[int, Any]], reason: str
) -> None:
    """The target holds what one write left (``once``), else an error saying what to do."""
    assert after == once, (
        f"harmless_rewrite() says {reason!r}, but batch 0 written again under a new "
        f"epoch's idempotency key left the target holding (id, v) {after}, not {once} as "
        "after one write: return None from harmless_rewrite() unless writing a held batch "
        "again leaves the target as one write would, for any input (an unconditional "
        "upsert by key does; an append, or dead letters kept beside it, does not)"
    )
