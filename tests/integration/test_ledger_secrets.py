"""A sink's error recorded in the ledger is masked of every secret of the pipeline: a
location's password and another sink's, not only the failing sink's own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from fanout import FanOut
from fanout.contract.batch import Batch
from fanout.contract.sink import SinkResult
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
