"""Under Spark Connect the query id is the checkpoint's: with several queries running in the
session, it must be the only one that can be running the batch (fakes of pyspark's Connect
``StreamingQuery``: ``id``, ``status``, ``lastProgress``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fanout import ConfigurationError
from fanout.steps.context import ContextReader


class _Query:
    """A running Connect StreamingQuery: ``status`` and ``lastProgress`` as pyspark gives
    them (``lastProgress`` is a dict subclass there); ``asked`` counts the calls."""

    def __init__(self, id: str, active: bool = True, last: int | None = None) -> None:
        self.id = id
        self._active = active
        self._last = last
        self.asked = 0

    @property
    def status(self) -> dict[str, Any]:
        self.asked += 1
        return {"message": "", "isDataAvailable": self._active, "isTriggerActive": self._active}

    @property
    def lastProgress(self) -> dict[str, Any] | None:
        self.asked += 1
        return None if self._last is None else {"batchId": self._last}


class _Streams:
    def __init__(self, queries: list[_Query]) -> None:
        self.active = queries


class _ConnectSession:
    def __init__(self, queries: list[_Query]) -> None:
        self.streams = _Streams(queries)


class _ConnectFrame:
    def __init__(self, queries: list[_Query]) -> None:
        self.sparkSession = _ConnectSession(queries)


_ConnectFrame.__module__ = "pyspark.sql.connect.dataframe"
_ConnectSession.__module__ = "pyspark.sql.connect.session"


def _checkpoint(path: Path, query_id: str, batches: range, committed: range) -> str:
    """A checkpoint of ``query_id`` with ``offsets/N`` for ``batches`` and ``commits/N`` for
    ``committed`` (batch N planned at 1000 + N)."""
    (path / "offsets").mkdir(parents=True)
    (path / "commits").mkdir()
    (path / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
    for n in batches:
        (path / "offsets" / str(n)).write_text(
            f'v1\n{{"batchWatermarkMs":0,"batchTimestampMs":{1000 + n}}}\n{{"logOffset":{n}}}\n'
        )
    for n in committed:
        (path / "commits" / str(n)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    return str(path)


@pytest.fixture
def orders(tmp_path: Path) -> str:
    """The orders query's checkpoint, running batch 3."""
    return _checkpoint(tmp_path / "orders", "q-orders", range(4), range(3))


HOW = (
    "run each fanout query from a Spark Connect session of its own (on the client: "
    "SparkSession.builder.remote(url).create() per query), where it is the only running "
    "query, or pass FanOut(checkpoint_location=...) the query's own checkpointLocation"
)


@pytest.mark.parametrize(
    "payments",
    [
        _Query("q-payments", active=False),  # between two triggers
        _Query("q-payments", active=True, last=10),  # in a trigger, but at batch 11
        _Query("q-payments", active=True, last=1),  # in a trigger, at batch 2
    ],
    ids=["idle", "ahead", "behind"],
)
def test_the_only_query_that_can_run_the_batch_is_confirmed(orders: str, payments: _Query) -> None:
    reader = ContextReader("orders", checkpoint_location=orders)
    running = [_Query("q-orders", active=True, last=2), payments]
    info = reader.read(_ConnectFrame(running), 3)
    assert (info.query_id, info.source_offsets, info.batch_timestamp_ms) == (
        "q-orders",
        [{"logOffset": 3}],
        1003,
    )
    # checked once: the next batch asks nobody
    asked = payments.asked
    assert reader.read(_ConnectFrame(running), 4).query_id == "q-orders"
    assert payments.asked == asked


@pytest.mark.parametrize("last", [None, 2, 3], ids=["first-of-run", "after-2", "idle-at-3"])
def test_two_queries_that_can_both_run_the_batch_are_refused_as_ambiguous(
    orders: str, last: int | None
) -> None:
    reader = ContextReader("orders", checkpoint_location=orders)
    running = [_Query("q-orders", last=2), _Query("q-payments", active=True, last=last)]
    with pytest.raises(ConfigurationError) as refused:
        reader.read(_ConnectFrame(running), 3)
    assert str(refused.value) == (
        "pipeline 'orders': under Spark Connect fanout cannot tell which query runs batch 3: "
        f"the query q-orders of checkpoint_location {orders} or query q-payments, running in "
        "the same session and possibly at batch 3 too (the foreachBatch function is handed "
        "no query id); taking the wrong one would hide a reset of this query's checkpoint: " + HOW
    )


@pytest.mark.parametrize(
    ("batches", "committed", "state"),
    [(range(4), range(4), "committed batch 3"), (range(2), range(2), "has no offsets/3")],
    ids=["committed", "not-planned"],
)
def test_the_checkpoint_of_another_query_not_at_the_batch_is_refused(
    tmp_path: Path, batches: range, committed: range, state: str
) -> None:
    """The orders pipeline is handed the payments query's checkpoint, which already
    committed batch 3 or never planned it: batch 3 is another query's."""
    payments = _checkpoint(tmp_path / "payments", "q-payments", batches, committed)
    reader = ContextReader("orders", checkpoint_location=payments)
    running = [_Query("q-orders", last=2), _Query("q-payments", active=False)]
    with pytest.raises(ConfigurationError) as refused:
        reader.read(_ConnectFrame(running), 3)
    assert str(refused.value) == (
        f"pipeline 'orders': checkpoint_location {payments} belongs to query q-payments, "
        f"whose checkpoint {state}, so batch 3 is not that query's but one of the other "
        "queries running in this session (q-orders): " + HOW
    )


def test_a_query_alone_in_its_session_is_its_checkpoints(orders: str) -> None:
    """One running query: the batch is its own; nothing more is asked."""
    alone = _Query("q-orders")
    reader = ContextReader("orders", checkpoint_location=orders)
    assert reader.read(_ConnectFrame([alone]), 3).query_id == "q-orders"
    assert alone.asked == 0


def test_a_query_whose_status_cannot_be_read_counts_as_possible(orders: str) -> None:
    class Broken(_Query):
        @property
        def status(self) -> dict[str, Any]:  # type: ignore[override]
            raise RuntimeError("StreamingQueryCommand failed")

    reader = ContextReader("orders", checkpoint_location=orders)
    running = [_Query("q-orders", last=2), Broken("q-payments")]
    with pytest.raises(ConfigurationError, match="cannot tell which query runs batch 3"):
        reader.read(_ConnectFrame(running), 3)
