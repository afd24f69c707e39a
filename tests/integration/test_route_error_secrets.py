"""A sink's error naming a route expression (:func:`fanout.routes.evaluate.explain_failure`,
for a routed sink without a dead-letter target whose write failed on Spark's data
exception) is chained from the sink's error as fanout records it, secrets masked: before,
it replaced the masked error and kept the sink's own error, password and all, as its
cause, so the traceback of the error :meth:`fanout.FanOut.process` raises (and Spark's
text of a failed query) showed the password."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

import pytest

from fanout import BatchFailedError, BatchInfo, FanOut, RouteError
from fanout.contract.batch import Batch
from fanout.contract.sink import SinkResult
from fanout.ledger.delta import DeltaLedger
from fanout.routes.route import Route
from fanout.sink_spec import SinkSpec
from fanout.testing import RecordingSink

PASSWORD = "Route-pw-60413"


class _Quoting(RecordingSink):
    """Reads its routed batch; wraps Spark's error in one naming its URL, password and all."""

    def __init__(self, name: str) -> None:
        super().__init__(name, reads="dataframe")

    def write(self, batch: Batch) -> SinkResult:
        try:
            batch.df.collect()
        except Exception as exc:
            raise RuntimeError(f"cannot write to postgresql://app:{PASSWORD}@db/shop") from exc
        return super().write(batch)

    def secret_values(self) -> list[str]:
        return [PASSWORD]


def test_a_route_error_is_chained_from_the_sink_s_error_masked(spark: Any, tmp_path: Path) -> None:
    batch = spark.createDataFrame([(1, "1"), (2, "x")], "id LONG, a STRING")
    route = Route(select=("id", "CAST(a AS INT) AS v"))  # row 2 fails it
    sink = _Quoting("quoting")
    with FanOut("routes", str(tmp_path / "ledger"), [SinkSpec(sink, route)], retries=0) as fan:
        with pytest.raises(BatchFailedError) as failed:
            fan.process(batch, BatchInfo("routes", 0, "q"))
    error = failed.value.failures["quoting"]
    assert isinstance(error, RouteError)
    assert (error.sink, error.batch_id, error.kind, error.expression) == (
        "quoting",
        0,
        "select",
        "CAST(a AS INT) AS v",
    )
    assert str(error).startswith("sink 'quoting', batch 0: route select 'CAST(a AS INT) AS v' ")
    cause = error.__cause__
    assert cause is not None and str(cause) == (
        "sink 'quoting', batch 0: RuntimeError: cannot write to postgresql://app:***@db/shop"
    )
    shown = "".join(traceback.format_exception(failed.value))
    assert "cannot write to postgresql://app:***@db/shop" in shown
    assert PASSWORD not in shown
    rows = DeltaLedger(str(tmp_path / "ledger")).rows("routes")
    assert [(r["sink"], r["error"]) for r in rows if r["status"] == "failed"] == [
        ("quoting", f"RouteError: {error}")
    ]
    assert all(PASSWORD not in str(r) for r in rows)
    assert sink.rows() == []
