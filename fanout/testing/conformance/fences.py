"""The epoch fence, as a new epoch's refused start and ``fanout ledger lift-fence`` use
it: :meth:`fanout.Sink.fence_earlier_epochs` refuses a write of the epoch it closed, and
the optional :meth:`fanout.Sink.lift_epoch_fence` says whether it lifted one and opens that
epoch again to the write.

The contract: docs/architecture.md §4 and §5 (epochs, their fences, ``fanout ledger
lift-fence``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from fanout.contract.sink import Sink
from fanout.errors import BatchFailedError
from fanout.observe.secrets import redact
from fanout.testing.conformance.case import NAME, SinkUnderTest
from fanout.testing.conformance.kit import Kit, _assert_ids, _assert_rows


class FenceChecks(Kit):
    """An epoch fenced, then lifted (module docstring)."""

    def test_lift_epoch_fence_opens_the_fenced_epoch_again(
        self, spark: Any, under_test: SinkUnderTest, tmp_path: Path
    ) -> None:
        """The optional :meth:`fanout.Sink.lift_epoch_fence`, as a new epoch's refused start
        and ``fanout ledger lift-fence`` call it: batch 0 of epoch 0 written; a lift of
        epoch 1's fence before any fence does not say ``True`` (lifted: the command prints
        it); :meth:`fanout.Sink.fence_earlier_epochs` for epoch 1 refuses the write of batch
        1 of epoch 0 (a replaced query's batch in flight); the lift then says ``True`` or
        ``None`` (``False``: there was none), and batch 1 of epoch 0 is written, by a new
        ``FanOut`` (the replaced checkpoint started again), exactly once; a second lift does
        not say ``True``. Skipped for a sink that does not implement it."""
        path = str(tmp_path / "ledger")
        fan = self._fan(under_test, path)
        sink = fan.sinks[NAME]
        if type(sink).lift_epoch_fence is Sink.lift_epoch_fence:
            pytest.skip("the sink does not implement lift_epoch_fence")
        fan.process(self._batch(spark, [(i, f"v{i}") for i in range(3)]), self._info(0))
        _check_no_lift(sink.lift_epoch_fence(self.pipeline, 1), "before any fence")
        sink.fence_earlier_epochs(self.pipeline, 1)
        batch = self._batch(spark, [(i, f"v{i}") for i in range(3, 6)])
        try:
            fan.process(batch, self._info(1))
        except BatchFailedError:
            pass
        except _PASSED_ON:
            raise
        except BaseException as exc:  # a sink's own BaseException goes through FanOut as is
            # from None: pytest would print the sink's error, unmasked, as the context
            raise pytest.fail.Exception(_fenced_write_failure(exc, sink.secret_values())) from None
        else:
            pytest.fail(
                "batch 1 of epoch 0 was written after fence_earlier_epochs(pipeline, 1) "
                "returned: once it returns, no write of an earlier epoch may commit (a "
                "replaced query still running would write its batch in flight beside the "
                "new epoch's); refuse it in write() (or in its tasks) by a fence the sink "
                "keeps with its records"
            )
        _assert_ids(under_test, [0, 1, 2], "after the fenced write of batch 1 of epoch 0")
        lifted = sink.lift_epoch_fence(self.pipeline, 1)
        if lifted is False:
            pytest.fail(
                "lift_epoch_fence(pipeline, 1) returned False (no fence there) just after "
                "fence_earlier_epochs(pipeline, 1) fenced epoch 0: return True when it "
                "lifted one, None when it cannot tell"
            )
        fan.close()  # the refused start's process ends; the checkpoint is started again
        again = self._fan(under_test, path)
        try:
            try:
                result = again.process(batch, self._info(1))[NAME]
            except BatchFailedError as exc:
                pytest.fail(
                    f"batch 1 of epoch 0 was refused after lift_epoch_fence(pipeline, 1) "
                    f"returned {lifted!r}: the lift must open epoch 0 again (its checkpoint is "
                    "started again to complete a batch), removing the fence "
                    f"fence_earlier_epochs keeps\nthe write's error: {exc}"
                )
            _assert_rows(result, 3, "batch 1 of epoch 0 written after the fence was lifted")
            _assert_ids(under_test, list(range(6)), "after batch 1 of epoch 0 was written")
            _check_no_lift(again.sinks[NAME].lift_epoch_fence(self.pipeline, 1), "a second time")
        finally:
            again.close()


_PASSED_ON = (
    KeyboardInterrupt,
    pytest.fail.Exception,
    pytest.skip.Exception,
    pytest.exit.Exception,
)
"""What the kit's checks let through as raised: an interrupt, pytest's own outcomes."""


def _fenced_write_failure(exc: BaseException, secrets: Sequence[str]) -> str:
    """Why the lift check fails: the fenced write of batch 1 of epoch 0 raised ``exc`` out
    of ``FanOut.process``, not :class:`fanout.BatchFailedError` (fanout did not mask it:
    the sink's ``secrets`` are masked here)."""
    said = (
        f"the write of batch 1 of epoch 0 after fence_earlier_epochs(pipeline, 1) returned "
        f"made FanOut.process raise {redact(repr(exc), secrets)}, not BatchFailedError"
    )
    if isinstance(exc, Exception):  # not the sink's: fanout wraps every Exception of it
        return f"{said}: an error of fanout's own (its ledger, its spool), not the sink's refusal"
    return (
        f"{said}: refuse a fenced write with an Exception (a fanout.SinkWriteError) from "
        "write() (or its tasks), which fanout reports as the sink's failure of the batch, "
        "while a BaseException that is not an Exception goes up through fanout as raised "
        "and ends the run, as KeyboardInterrupt does"
    )


def _check_no_lift(answer: bool | None, when: str) -> None:
    """``lift_epoch_fence`` did not say it lifted a fence ``when`` there was none."""
    if answer is True:
        pytest.fail(
            f"lift_epoch_fence(pipeline, 1) returned True (lifted) {when}, with no fence of "
            "epoch 0 there: `fanout ledger lift-fence` prints what it returns; return False "
            "when there was none, None when it cannot tell"
        )
