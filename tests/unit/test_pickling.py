"""A FanOut pickles as its configuration (what Spark Connect does to the foreachBatch
function) and is built again on its first batch; plan text is walked like Catalyst plans;
the checkpoint is read without Hadoop."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

from fanout import ConfigurationError, FanOut
from fanout.contract.batch import BatchInfo
from fanout.ledger.delta import DeltaLedger
from fanout.partitioned.plan_text import analyzed_section, volatile_in_text
from fanout.sink_spec import SinkSpec
from fanout.steps.context import checkpoint_query_id, read_file_directly
from fanout.testing import RecordingSink
from tests.unit.fakes import FakeFrame


class Holder:
    """A plugin holding a lock: it cannot travel."""

    def __init__(self) -> None:
        self.lock = threading.Lock()


def test_a_fan_out_pickles_as_its_recipe_and_is_built_again_on_its_first_batch(
    tmp_path: Path,
) -> None:
    sink = RecordingSink("rec")
    fan = FanOut("pickled", str(tmp_path / "ledger"), [SinkSpec(sink)], retries=5)
    fan.process(FakeFrame(), BatchInfo("pickled", 0))
    assert sink.rows() == [{"id": 1}, {"id": 2}, {"id": 3}]

    copy = cloudpickle.loads(cloudpickle.dumps(fan))

    # no lock, thread, ledger table or session; born when unpickled (fanout.steps.replay)
    assert set(copy.__dict__) == {"_recipe", "_runs"}
    assert copy._recipe.options["retries"] == 5
    assert copy._recipe.sinks[0].sink is not sink  # copied before open()
    copy(FakeFrame(), 1)  # built here, on its first batch
    travelled = copy.sinks["rec"]
    assert isinstance(travelled, RecordingSink)
    assert travelled.batches[1] == [{"id": 1}, {"id": 2}, {"id": 3}]
    assert copy.ledger.last_committed("pickled", ["rec"]) == {"rec": 1}
    assert 1 not in sink.batches  # the original did not see batch 1


def test_a_part_that_cannot_be_pickled_is_named(tmp_path: Path) -> None:
    fan = FanOut("locked", str(tmp_path / "ledger"), [RecordingSink("rec")], plugins=[Holder()])
    with pytest.raises(ConfigurationError) as caught:
        cloudpickle.dumps(fan)
    text = str(caught.value)
    assert text.startswith("pipeline 'locked': plugin <tests.unit.test_pickling.Holder object")
    assert "cannot be pickled (TypeError: cannot pickle '_thread.lock' object)" in text
    assert "(Spark Connect)" in text


def test_the_delta_ledger_pickles_as_its_path(tmp_path: Path) -> None:
    ledger = DeltaLedger(str(tmp_path / "ledger"), storage_options={"a": "b"})
    ledger.open()
    copy = cloudpickle.loads(cloudpickle.dumps(ledger))
    assert (copy.path, copy.storage_options, copy._table._delta) == (ledger.path, {"a": "b"}, None)
    copy.open()
    assert copy.last_committed("p", ["s"]) == {"s": None}


class ConnectSession:
    """Looks like a Spark Connect session (its class lives in pyspark.sql.connect)."""


ConnectSession.__module__ = "pyspark.sql.connect.session"


def test_under_spark_connect_the_checkpoint_location_is_required(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as caught:
        FanOut("remote", str(tmp_path / "ledger"), [RecordingSink("r")], spark=ConnectSession())
    assert str(caught.value) == (
        "pipeline 'remote': under Spark Connect fanout cannot ask Spark for the query's "
        "checkpoint: pass FanOut(checkpoint_location=...) the same path as the query's "
        "checkpointLocation option"
    )


def test_the_checkpoint_is_read_with_pyarrow_filesystems(tmp_path: Path) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "metadata").write_text(json.dumps({"id": "4a8afe53"}) + "\n")
    (tmp_path / "offsets" / "3").write_text('v1\n{"batchTimestampMs":1}\n{"o":3}\n')
    for root in (str(tmp_path), f"file:{tmp_path}", f"file://{tmp_path}"):
        assert read_file_directly(root, "offsets/3") == 'v1\n{"batchTimestampMs":1}\n{"o":3}\n'
        assert read_file_directly(root, "offsets/4") is None
        assert checkpoint_query_id(root) == "4a8afe53"
    assert checkpoint_query_id(str(tmp_path / "offsets")) is None


EXPLAIN = """== Parsed Logical Plan ==
'Project ['k]

== Analyzed Logical Plan ==
k: bigint
Project [k#5L]
+- Filter (cast(id#1L as double) > rand(7200123243045090890))
   +- Project [id#1L, u#3, k#5L, current_timestamp() AS t#7]
      +- Project [id#1L, u#3, (id#1L * cast(2 as bigint)) AS k#5L]
         +- Project [id#1L, uuid(Some(-6048683583493871063)) AS u#3]
            +- Range (0, 5, step=1, splits=Some(2))

== Optimized Logical Plan ==
Project [(id#1L * 2) AS k#5L]
"""


@pytest.mark.parametrize(
    ("plan", "needed", "found", "leaves"),
    [
        # a filter decides which rows exist; the unused uuid() and clock do not count
        (analyzed_section(EXPLAIN), None, ["rand()"], set()),
        (
            "Project [u#3]\n+- Project [id#1L, uuid(Some(-60)) AS u#3, now() AS t#4]\n"
            "   +- Relation [id#1L,name#2] json",
            None, ["uuid()"], set(),
        ),
        (
            "Project [id#1L]\n+- Project [id#1L, uuid(Some(-60)) AS u#3, now() AS t#4]\n"
            "   +- Relation [id#1L,name#2] json",
            None, [], {"id"},
        ),
        (
            "WriteToMicroBatchDataSourceV1 ForeachBatchSink\n"
            "+- Project [order_id#1L, name#2, hour(current_timestamp()) AS h#9]\n"
            "   +- StreamingExecutionRelation FileSource[file:/x], [order_id#1L, name#2]",
            {"h"}, ["current_timestamp()"], set(),
        ),
        (
            "WriteToMicroBatchDataSourceV1 ForeachBatchSink\n"
            "+- Project [order_id#1L, name#2, hour(current_timestamp()) AS h#9]\n"
            "   +- StreamingExecutionRelation FileSource[file:/x], [order_id#1L, name#2]",
            {"order_id"}, [], {"order_id"},
        ),
        (
            "Aggregate [k#3], [k#3, count(1) AS n#4L]\n+- Project [id#1L, (id#1L % 3) AS k#3]\n"
            "   +- Relation [id#1L] json",
            None, [], {"id"},
        ),
    ],
)  # fmt: skip
def test_plan_text_is_walked_like_a_catalyst_plan(
    plan: str, needed: set[str] | None, found: list[str], leaves: set[str]
) -> None:
    assert volatile_in_text(plan, needed) == (found, leaves)


def test_the_metrics_observer_pickles_as_configuration_and_serves_where_it_lands() -> None:
    from fanout.observe.metrics import MetricsObserver

    observer = MetricsObserver.serve("m", port=0, host="127.0.0.1")
    copy = cloudpickle.loads(cloudpickle.dumps(observer))
    try:
        assert copy is not observer and copy.pipeline == "m"
        assert copy.port is not None and copy.port != observer.port  # its own server here
        copy.fanout_batch_start(BatchInfo("m", 0), ["s"], [])
        copy.fanout_batch_end(BatchInfo("m", 0), {})
        assert copy.value("fanout_batches_total", outcome="committed") == 1.0
        assert observer.value("fanout_batches_total", outcome="committed") is None
    finally:
        copy.stop()
        observer.stop()
    quiet = cloudpickle.loads(cloudpickle.dumps(MetricsObserver("q")))
    assert (quiet.pipeline, quiet.port) == ("q", None)


@pytest.mark.parametrize(
    ("distribution", "build"),
    [
        ("fanout_delta", lambda m: m.DeltaSink("lake", path="/tmp/x", mode="merge", keys=["id"])),
        (
            "fanout_postgres",
            lambda m: m.PostgresSink("pg", url="postgresql://u:secret@h/db", table="t"),
        ),
        ("fanout_kafka", lambda m: m.KafkaSink("bus", bootstrap_servers="h:9092", topic="t")),
    ],
)
def test_built_in_sinks_pickle_as_configuration(distribution: str, build: Any) -> None:
    module = pytest.importorskip(distribution)
    sink = build(module)
    copy = cloudpickle.loads(cloudpickle.dumps(sink))
    assert type(copy) is type(sink) and copy.name == sink.name
    assert {k: repr(v) for k, v in vars(copy).items()} == {
        k: repr(v) for k, v in vars(sink).items()
    }
