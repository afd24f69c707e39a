"""Review 2 (adversarial): holes found in the shared job, the app layer, the backfill path
and the hooks/plugin contract, each as a strict expected failure until it is fixed."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pytest

from fanout import Batch, FanOut
from fanout.contract.batch import BatchInfo
from fanout.ledger.memory import MemoryLedger
from fanout.sink_spec import SinkSpec, lag_policy
from tests.unit.fakes import BackfillLake, SchemaFrame, ScriptedSink

# -- finding 1: a backfill that finishes while the live batch is being written -------------


def test_finding1_a_backfill_finishing_during_a_live_batch_loses_that_batch(
    tmp_path: Path,
) -> None:
    ledger = MemoryLedger()
    lake = BackfillLake("lake")
    frames = {b: SchemaFrame([b * 10, b * 10 + 1]) for b in range(5)}
    first = FanOut("grow", ledger, [lake], backoff_s=0)
    for batch in range(3):  # the pipeline runs with the Delta sink alone
        first.process(frames[batch], BatchInfo("grow", batch, "q"))
    first.close()

    pg = ScriptedSink("pg")
    spec = SinkSpec(pg, lag=lag_policy("pg", {"backfill_from": "lake"}))
    fan = FanOut("grow", ledger, [lake, spec], backoff_s=0, spool=str(tmp_path / "spool"),
                 probe_interval_s=3600)  # fmt: skip
    fan.catchup.stop()  # this test plays the catch-up thread's part itself, at one moment
    fan.catchup._reader.read = lambda sink, key: (  # type: ignore[method-assign]
        SchemaFrame(lake.table[key].column("id").to_pylist()),
        BatchInfo("grow", key[1], "q"),
    )

    def catch_up_meanwhile(batch: Batch) -> None:
        # The catch-up thread runs beside the live write of batch 3 (held back for pg:
        # it still needs 0..2 from the lake) and finishes the backfill before the lake's
        # write of batch 3 is done and marked.
        if batch.batch_id == 3:
            fan.catch_up(timeout_s=10)

    lake.on_write = catch_up_meanwhile
    try:
        fan.process(frames[3], BatchInfo("grow", 3, "q"))
        fan.catch_up(timeout_s=10)  # whatever is left for pg
        fan.process(frames[4], BatchInfo("grow", 4, "q"))
        fan.catch_up(timeout_s=10)
        received = sorted(b for b, _ in pg.calls)
        assert received == [0, 1, 2, 3, 4], (
            f"pg (backfill_from='lake') received batches {received}: batch 3, which the "
            "lake wrote while pg's backfill finished, was neither backfilled nor spooled"
        )
    finally:
        fan.close()


def test_finding1_a_backfilled_sink_that_lags_later_gets_its_misses_from_the_spool(
    tmp_path: Path,
) -> None:
    ledger = MemoryLedger()
    lake = BackfillLake("lake")
    frames = {b: SchemaFrame([b * 10, b * 10 + 1]) for b in range(6)}
    first = FanOut("grow", ledger, [lake], backoff_s=0)
    for batch in range(2):
        first.process(frames[batch], BatchInfo("grow", batch, "q"))
    first.close()

    pg = ScriptedSink("pg")
    spec = SinkSpec(pg, lag=lag_policy("pg", {"on_failure": "lag", "backfill_from": "lake"}))
    fan = FanOut("grow", ledger, [lake, spec], backoff_s=0, spool=str(tmp_path / "spool"),
                 probe_interval_s=3600)  # fmt: skip
    fan.catchup.stop()
    fan.catchup._reader.read = lambda sink, key: (  # type: ignore[method-assign]
        SchemaFrame(lake.table[key].column("id").to_pylist()),
        BatchInfo("grow", key[1], "q"),
    )
    try:
        fan.catch_up(timeout_s=10)  # the backfill: batches 0 and 1
        fan.process(frames[2], BatchInfo("grow", 2, "q"))  # live: the backfill is done
        pg.always_fail = RuntimeError("pg is down")
        fan.process(frames[3], BatchInfo("grow", 3, "q"))  # pg fails it and lags
        fan.process(frames[4], BatchInfo("grow", 4, "q"))  # pg is behind: held back
        assert fan.spool is not None
        spooled = {b.batch_id: sorted(b.needed_by) for b in fan.spool.batches()}
        assert spooled == {3: ["pg"], 4: ["pg"]}, (
            f"the spool holds {spooled}: batch 4, which pg missed after its backfill was "
            "done, must be spooled for it (its source is no longer read for it)"
        )
        pg.always_fail = None
        fan.catch_up(timeout_s=10)
        fan.process(frames[5], BatchInfo("grow", 5, "q"))
        received = [b.batch_id for b in pg.batches if b.attempt == 1]
        assert sorted(set(received)) == [0, 1, 2, 3, 4, 5]
        assert [b for b, _ in pg.calls if b != 3] == [0, 1, 2, 4, 5]
    finally:
        fan.close()


class _CommitLake(BackfillLake):
    """A :class:`BackfillLake` that, like a Delta table, has no commit of a batch without rows."""

    def write(self, batch: Batch) -> Any:
        rows = super().write(batch)
        key = (batch.info.epoch, batch.batch_id)
        if self.table[key].num_rows == 0:
            del self.table[key]
        return rows

    def backfill_source(self, pipeline: str) -> Any:
        source = super().backfill_source(pipeline)
        lake = self

        class _Source:
            def batches(self, epochs: Any) -> list[tuple[int, int]]:
                return source.batches(epochs)  # type: ignore[no-any-return]

            def read(self, key: tuple[int, int]) -> pa.Table:
                return lake.table.get(key, pa.table({"id": pa.array([], pa.int64())}))

        return _Source()


def test_finding1_a_source_batch_without_rows_is_backfilled_empty_and_refuses_nothing(
    tmp_path: Path,
) -> None:
    ledger = MemoryLedger()
    lake = _CommitLake("lake")
    frames = {b: SchemaFrame([b * 10, b * 10 + 1]) for b in range(5)}
    frames[1] = SchemaFrame([])  # an empty batch: the lake's table has no commit of it
    first = FanOut("grow", ledger, [lake], backoff_s=0)
    for batch in range(3):
        first.process(frames[batch], BatchInfo("grow", batch, "q"))
    first.close()
    assert sorted(lake.table) == [(0, 0), (0, 2)]

    pg = ScriptedSink("pg")
    spec = SinkSpec(pg, lag=lag_policy("pg", {"backfill_from": "lake"}))
    fan = FanOut("grow", ledger, [lake, spec], backoff_s=0, spool=str(tmp_path / "spool"),
                 probe_interval_s=3600)  # fmt: skip
    fan.catchup.stop()
    read: list[tuple[int, int]] = []

    def _read(sink: str, key: tuple[int, int]) -> Any:
        read.append(key)
        table = fan.lagging.sources[sink].read(key)
        return SchemaFrame(table.column("id").to_pylist()), BatchInfo("grow", key[1], "q")

    fan.catchup._reader.read = _read  # type: ignore[method-assign]
    try:
        fan.process(frames[3], BatchInfo("grow", 3, "q"))  # pg is held back: it needs 0..2
        fan.catchup.drain("pg", until=lambda: bool(pg.calls))  # the catch-up writes batch 0
        # pg's mark is 0 and batch 1 is in no table: still not a gap, it comes next
        fan.process(frames[4], BatchInfo("grow", 4, "q"))
        fan.catch_up(timeout_s=10)
        assert [(b.batch_id, b.df.count()) for b in pg.batches] == [
            (0, 2), (1, 0), (2, 2), (3, 2), (4, 2)
        ]  # fmt: skip
        assert read == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4)]
        assert ledger.last_committed("grow", ["pg"]) == {"pg": 4}
    finally:
        fan.close()


# -- finding 2: SIGTERM while a batch fails: `fanout run` exits 0 ---------------------------


class _FailingQuery:
    """A streaming query whose batch 7 is in flight when SIGTERM arrives, then fails."""

    id = "query-1"
    recentProgress: list[Any] = []

    def __init__(self, tracker: Any) -> None:
        self.tracker = tracker
        self.active = True
        self.error: Exception | None = None
        self.stopped = False

    @property
    def isActive(self) -> bool:
        if self.tracker.in_flight is None and self.error is None:
            import os
            import signal
            import threading

            self.tracker.fanout_batch_start(BatchInfo("p", 7, "q"), ["a"], [])
            os.kill(os.getpid(), signal.SIGTERM)  # the handler `run` installed sets its flag

            def fail() -> None:  # the batch fails while `run` waits for it
                from fanout.errors import BatchFailedError

                self.error = RuntimeError("batch 7 failed")
                self.active = False
                self.tracker.fanout_batch_failed(
                    BatchInfo("p", 7, "q"),
                    BatchFailedError("p", 7, {"a": RuntimeError("sink 'a' is down")}),
                )

            threading.Timer(0.2, fail).start()
        return self.active

    def stop(self) -> None:
        self.stopped = True

    def exception(self) -> Exception | None:
        return self.error


def test_finding2_sigterm_during_a_batch_that_fails_exits_0(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import io

    from fanout.app import runner
    from fanout.app.config import PipelineConfig
    from fanout.steps.stop_gate import StopGate

    config = PipelineConfig("p", str(tmp_path / "ledger"), str(tmp_path / "cp"), {}, [],
                            stop_timeout_s=5)  # fmt: skip
    made: dict[str, Any] = {}

    class _Fan:
        specs: ClassVar[dict[str, Any]] = {}  # no sink: nothing to check before the start
        unopened = ()
        stop_gate = StopGate("p")

        def check_source(self, df: Any) -> None:
            """No sink: nothing to check before the start."""

        def behind(self) -> list[Any]:
            return []

        def start_catch_up(self, query: Any) -> str | None:
            return None

        def close(self) -> None:
            pass

    def build_fanout(spark: Any, config: Any, plugins: Any = (), **kw: Any) -> Any:
        made["tracker"] = plugins[0]
        return _Fan()

    monkeypatch.setattr(runner, "load_pipeline", lambda path: config)
    monkeypatch.setattr(runner, "build_session", lambda config: None)
    monkeypatch.setattr(runner, "_quiet_query_errors", lambda spark: None)
    monkeypatch.setattr(runner, "build_source", lambda spark, config: None)
    monkeypatch.setattr(runner, "build_fanout", build_fanout)
    monkeypatch.setattr(runner, "_start", lambda df, fan, config: _FailingQuery(made["tracker"]))
    out = io.StringIO()

    code = runner.run("p.toml", out)

    said = out.getvalue()
    assert (code, "abandoned" in said) == (1, False), (
        f"`fanout run` exited {code} after SIGTERM during a batch that failed, saying:\n{said}"
    )


# -- finding 3: pipeline values `fanout validate` passes and `fanout run` refuses ----------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("retries", -1),  # run: ValueError from RetryPolicy, a traceback, exit 1
        ("backoff_s", -1.0),  # the same
        ("parallelism", 0),  # run: ConfigurationError once Spark has started
        ("probe_interval_s", 0),  # the same
        ("trigger", {"processing_time": "ten seconds"}),  # run: Spark refuses it at start
    ],
)
def test_finding3_validate_passes_what_run_refuses(tmp_path: Path, key: str, value: Any) -> None:
    from fanout.app.config import parse
    from fanout.app.validate import run_checks

    data = {
        "pipeline": {
            "name": "p",
            "ledger": str(tmp_path / "ledger"),
            "checkpoint": str(tmp_path / "cp"),
            key: value,
        },
        "source": {"format": "rate"},
    }
    try:
        config = parse({**data, "sinks": [{"type": "memory", "name": "m"}]}, {"memory": []})
    except Exception as exc:  # refused with the key's path: what the README promises
        assert f"pipeline.{key}" in str(exc), str(exc)
        return
    import dataclasses

    config = dataclasses.replace(config, sinks=[])  # only the pipeline's own values here
    checks = run_checks(None, config, lambda spark, config: None).checks
    failed = [c.line() for c in checks if c.failed]
    assert failed, f"pipeline.{key} = {value!r}: parse() and `fanout validate` accept it"


# -- finding 4: two distributions whose entry points share a name: one is dropped silently --


def test_finding4_two_distributions_with_one_entry_point_name_are_not_reported() -> None:
    from fanout.errors import PluginError
    from fanout.hooks.registry import load_registry
    from tests.unit.test_registry import JsonlSink, OtherSink, entry_point

    registry = load_registry(
        entry_points_=[
            entry_point("jsonl", {"jsonl": JsonlSink}, dist=("fanout-jsonl", "1.0.0")),
            entry_point("jsonl", {"jsonl": OtherSink}, dist=("acme-fanout-jsonl", "0.4")),
        ],
    )
    try:
        registry.raise_load_errors()
        chosen = registry.sink_types()["jsonl"].plugin.describe()
    except PluginError as exc:  # reported, naming both: what two type names get
        assert "acme-fanout-jsonl" in str(exc), str(exc)
        return
    raise AssertionError(
        f"two distributions provide entry point 'jsonl' (and sink type 'jsonl'); "
        f"fanout chose {chosen} without a word"
    )


# -- finding 5: the backfill's side of a source sink's dead letters -----------------------
# (the rows themselves: tests/integration/test_review2_findings.py, with real Spark)


def test_finding5_a_delta_history_gives_a_batch_without_a_commit_empty(tmp_path: Path) -> None:
    from fanout_delta import DeltaSink

    from fanout.contract.batch import txn_app_id
    from fanout.contract.sink import SinkContext
    from fanout.deadletters.delta import DeltaDeadLetters

    dead = DeltaDeadLetters(str(tmp_path / "dead"))
    lake = DeltaSink(name="lake", path=str(tmp_path / "lake"), partition_by=["k"])
    lake.open(SinkContext("p", dead_letters=dead))

    class _Frame:  # engine rs reads a batch through toArrow()
        def __init__(self, table: pa.Table) -> None:
            self.table = table

        def toArrow(self) -> pa.Table:
            return self.table

    schema = pa.schema([("id", pa.int64()), ("k", pa.string())])
    for batch_id, rows in enumerate([[(1, "a"), (2, "")], [(3, "")], [(4, "b")]]):
        table = pa.Table.from_pylist([{"id": i, "k": k} for i, k in rows], schema=schema)
        batch = Batch(_Frame(table), BatchInfo("p", batch_id, "q"), "lake", txn_app_id("p", "lake"))
        lake.write(batch)

    source = lake.backfill_source("p")
    assert source is not None
    assert source.batches([0]) == [(0, 0), (0, 2)]  # batch 1's only row was set aside
    assert source.read((0, 0)).select(["id", "k"]).to_pylist() == [{"id": 1, "k": "a"}]
    empty = source.read((0, 1))
    assert (empty.num_rows, sorted(empty.column_names)) == (0, ["id", "k"])
    assert source.read((0, 2)).select(["id", "k"]).to_pylist() == [{"id": 4, "k": "b"}]
    assert [dead.read_rows("p", "lake", (0, b)).column("row").to_pylist() for b in range(3)] == [
        ['{"id": 2, "k": ""}'], ['{"id": 3, "k": ""}'], []
    ]  # fmt: skip


def test_finding5_backfill_from_a_sink_whose_letters_cannot_be_read_back_is_refused() -> None:
    from fanout.errors import ConfigurationError
    from fanout.steps.lag_steps import backfill_sources

    lake = BackfillLake("lake")
    lake.dead_letter = "kafka:lake-dlq"  # type: ignore[attr-defined]
    specs = {
        "lake": SinkSpec(lake),
        "pg": SinkSpec(ScriptedSink("pg"), lag=lag_policy("pg", {"backfill_from": "lake"})),
    }
    with pytest.raises(ConfigurationError) as refused:
        backfill_sources("p", specs)
    assert str(refused.value) == (
        "pipeline 'p', sink 'pg': backfill_from='lake': that sink sets rows aside in "
        "dead_letter='kafka:lake-dlq', which a backfill cannot read back (only a Delta "
        "table's letters are given back to the new sink with the batch's other rows): make "
        "it a Delta table, or backfill from another sink"
    )
    lake.dead_letter = "/data/dead"  # type: ignore[attr-defined]
    assert sorted(backfill_sources("p", specs)) == ["pg"]


# -- finding 6: a sink raising a BaseException leaves no trace of its failed attempt -------


class _Abort(BaseException):
    """What a plugin's write may raise that is not an Exception (a KeyboardInterrupt,
    SystemExit, gevent's GreenletExit, a C extension's own)."""


def test_finding6_a_sink_raising_a_base_exception_is_not_recorded() -> None:
    ledger = MemoryLedger()
    fine = ScriptedSink("fine")
    odd = ScriptedSink("odd", always_fail=_Abort("the plugin gave up"))
    fan = FanOut("p", ledger, [fine, odd], backoff_s=0)
    try:
        with pytest.raises(BaseException):  # noqa: B017 - whatever reaches Spark
            fan.process(SchemaFrame([1, 2]), BatchInfo("p", 0, "q"))
    finally:
        fan.close()
    failed = [
        (e.sink, e.batch_id, "the plugin gave up" in (e.error or ""))
        for e in ledger.entries
        if e.status == "failed"
    ]
    assert failed == [("odd", 0, True)], (
        f"the ledger's failed attempts after sink 'odd' raised a BaseException: {failed}"
    )


# -- finding 8: `${NAME:-default}` keeps an empty NAME instead of the default ---------------


def test_finding8_an_empty_variable_takes_the_default() -> None:
    from fanout.observe.secrets import expand_env

    found = expand_env("${FANOUT_SPOOL:-/data/spool}", what="pipeline.spool",
                       environ={"FANOUT_SPOOL": ""})  # fmt: skip
    assert found == "/data/spool", f"pipeline.spool became {found!r}"
