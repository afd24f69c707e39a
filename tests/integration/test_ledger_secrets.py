"""A sink's error recorded in the ledger is masked of every secret of the pipeline: a
location's password and another sink's, not only the failing sink's own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from fanout import BatchFailedError, BatchInfo, FanOut
from fanout.contract.batch import Batch
from fanout.contract.sink import SinkResult
from fanout.errors import SinkUnreachableError
from fanout.sink_spec import LagPolicy, SinkSpec
from fanout.testing import RecordingSink
from tests.integration.streams import delta_rows, run_stream, write_input

CHECKPOINT_PASSWORD = "Ckpt-pw-5813"
OTHER_PASSWORD = "Other-sink-pw-2207"


class _Guarded(RecordingSink):
    """A sink holding a password."""

    def __init__(self, name: str, password: str) -> None:
        super().__init__(name)
        self.password = password

    def secret_values(self) -> list[str]:
        return [self.password]


class _Leaky(RecordingSink):
    """Fails every batch with an error quoting the pipeline's other secrets."""

    def write(self, batch: Batch) -> SinkResult:
        raise RuntimeError(
            f"cannot reach s3://ck:{CHECKPOINT_PASSWORD}@bucket/ckpt, nor the store "
            f"whose password is {OTHER_PASSWORD}"
        )


def test_a_failed_row_is_masked_of_every_secret_of_the_pipeline(spark: Any, tmp_path: Path) -> None:
    write_input(tmp_path / "input", 1, 5)
    fan = FanOut(
        "masked",
        str(tmp_path / "ledger"),
        [_Leaky("leaky"), _Guarded("guarded", OTHER_PASSWORD)],
        retries=0,
        # a scheme no filesystem serves: the offsets cannot be read (a warning), the
        # password is the pipeline's all the same
        checkpoint_location=f"nofs://ck:{CHECKPOINT_PASSWORD}@bucket/ckpt",
    )
    with pytest.raises(StreamingQueryException) as failure:
        run_stream(spark, tmp_path / "input", fan, tmp_path / "checkpoint")
    failed = [r for r in delta_rows(tmp_path / "ledger") if r["status"] == "failed"]
    assert [(r["sink"], r["batch_id"]) for r in failed] == [("leaky", 0)]
    assert failed[0]["error"] == (
        "SinkWriteError: sink 'leaky', batch 0: RuntimeError: cannot reach "
        "s3://ck:***@bucket/ckpt, nor the store whose password is ***"
    )
    raised = str(failure.value)  # the error the batch raises, as the ledger's
    assert CHECKPOINT_PASSWORD not in raised and OTHER_PASSWORD not in raised
    assert "nor the store whose password is ***" in raised


FETCHED_TOKEN = "Fetched-token-7731"


class _Fetching(RecordingSink):
    """Holds no secret until ``open()`` fetches one (an OAuth token, a vault's password)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.token: str | None = None

    def open(self, context: Any) -> None:
        super().open(context)
        self.token = FETCHED_TOKEN

    def secret_values(self) -> list[str]:
        return [self.token] if self.token else []


class _QuotesToken(RecordingSink):
    def write(self, batch: Batch) -> SinkResult:
        raise RuntimeError(f"the gateway refused token {FETCHED_TOKEN}")


def test_a_secret_a_sink_fetches_at_open_is_one_of_the_pipeline_s(
    spark: Any, tmp_path: Path
) -> None:
    """``FanOut.secrets`` was taken before the sinks opened: a token one fetched in its
    ``open()`` was in clear in the ledger row of another sink's error quoting it."""
    fan = FanOut("fetched", str(tmp_path / "ledger"), [_QuotesToken("leaky"), _Fetching("tok")],
                 retries=0)  # fmt: skip
    assert FETCHED_TOKEN in fan.secrets
    with pytest.raises(BatchFailedError):
        fan.process(spark.createDataFrame([(1,)], "id LONG"), BatchInfo("fetched", 0, "q"))
    failed = [r for r in delta_rows(tmp_path / "ledger") if r["status"] == "failed"]
    assert [r["error"] for r in failed] == [
        "SinkWriteError: sink 'leaky', batch 0: RuntimeError: the gateway refused token ***"
    ]


class _FetchingLate(_Fetching):
    """Cannot be reached at the run's start; opened late by the catch-up, it fetches its
    token then."""

    def open(self, context: Any) -> None:
        if not self.opened_before:
            self.opened_before = True
            raise SinkUnreachableError("the gateway is down", sink=self.name)
        super().open(context)

    opened_before = False


def test_a_secret_a_sink_fetches_when_opened_late_is_one_of_the_pipeline_s(
    spark: Any, tmp_path: Path
) -> None:
    """A lag sink that could not be opened at the start is opened later (its catch-up's
    reopen): the token it fetches then was in clear in the ledger row of another sink's
    error quoting it, ``FanOut.secrets`` taken once, at the start."""
    late = SinkSpec(_FetchingLate("tok"), lag=LagPolicy("lag"))
    fan = FanOut("late", str(tmp_path / "ledger"), [_QuotesToken("leaky"), late], retries=0,
                 spool=str(tmp_path / "spool"))  # fmt: skip
    try:
        assert fan.unopened == ("tok",) and FETCHED_TOKEN not in fan.secrets
        assert fan.lagging.reopen("tok") is None
        assert FETCHED_TOKEN in fan.secrets
        with pytest.raises(BatchFailedError):
            fan.process(spark.createDataFrame([(1,)], "id LONG"), BatchInfo("late", 0, "q"))
    finally:
        fan.close()
    failed = [r for r in delta_rows(tmp_path / "ledger") if r["status"] == "failed"]
    assert [(r["sink"], r["error"]) for r in failed] == [
        ("leaky", "SinkWriteError: sink 'leaky', batch 0: RuntimeError: the gateway refused "
                  "token ***")
    ]  # fmt: skip
