"""The partitioned-sink kit refuses a replay whose committed partitions recorded another
route, for a sink that only returns the route each partition recorded
(:attr:`CommittedPartition.route`; tests/integration/kit_route_sink.py, no ``check_replay``
of its own): before the route's dead letters are written (the kit's ``check_replay``, which
the write of the same attempt then takes instead of reading again) and, without letters,
before any partition writes. The conformance suite's route check passes on that sink, and
fails on it without the kit's check. Real local Spark and Delta dead letters."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fanout import BatchFailedError, BatchInfo, FanOut, RouteError
from fanout.delta_tables.io import read_delta
from fanout.partitioned.replay_route import SKIPS
from fanout.routes.route import Route
from fanout.routes.settings import session_settings
from fanout.testing.conformance import SinkConformance, SinkUnderTest
from fanout.testing.faults import VetoOnce
from tests.integration import kit_route_sink
from tests.integration.kit_route_sink import read_rows

ODD_FAILS = "CAST(v AS INT) > 0"  # 'x' (the odd ids) fails the cast: route letters
OTHER = "CAST(v AS INT) > 2"  # the same letters, another route


@pytest.fixture(autouse=True)
def _by_value() -> Iterator[None]:
    """The sink's module pickled by value to the executors."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(kit_route_sink)
    yield
    cloudpickle.unregister_pickle_by_value(kit_route_sink)


class Case:
    """One pipeline of the sink ``s`` over files in ``tmp_path/out``."""

    def __init__(self, spark: Any, tmp_path: Path) -> None:
        self.tmp, self.out = tmp_path, tmp_path / "out"
        self.pipeline = f"kit{uuid.uuid4().hex[:8]}"
        rows = [(i, "x" if i % 2 else str(i + 1)) for i in range(8)]
        self.batch = spark.createDataFrame(rows, "id BIGINT, v STRING")

    def fan(self, *, veto: bool = False, **options: Any) -> FanOut:
        sink = {"type": "route_recording", "name": "s", "directory": str(self.out), **options}
        plugins: list[object] = [kit_route_sink]
        if veto:
            plugins.append(VetoOnce(batch=0, partition=0, state=str(self.tmp / "veto.json")))
        return FanOut(self.pipeline, str(self.tmp / "ledger"), [sink], retries=0, backoff_s=0,
                      plugins=plugins)  # fmt: skip

    def run(self, fan: FanOut) -> Any:
        return fan.process(self.batch, BatchInfo(self.pipeline, 0, "q"))

    def ids(self) -> list[int]:
        return sorted(int(row["id"]) for row in read_rows(self.out))

    def files(self) -> dict[str, str]:
        return {p.name: p.read_text() for p in sorted(self.out.glob("*.json"))}

    def committed(self) -> list[int]:
        return sorted(int(p.stem.rsplit("-", 1)[1]) for p in self.out.glob("*.json"))

    def partition_of(self) -> dict[int, int]:
        """Each id's partition: the kit's hash of ``id`` into 3 (a route keeps it)."""
        from pyspark.sql import functions as F

        parted = self.batch.repartition(3, "id").select("id", F.spark_partition_id().alias("p"))
        return {int(r["id"]): int(r["p"]) for r in parted.collect()}

    def shown(self, where: str) -> str:
        """The route as the refusal names it: its text and fingerprint."""
        stamp = Route(where=where).stamp(session_settings(self.batch))
        return f"{stamp.text} (fingerprint {stamp.fingerprint})"


def _letter_ids(path: Path) -> list[int]:
    if not path.exists():
        return []
    return sorted(json.loads(row)["id"] for row in read_delta(str(path)).column("row").to_pylist())


def test_a_replay_under_another_route_is_refused_before_its_letters(
    spark: Any, tmp_path: Path
) -> None:
    case, dead = Case(spark, tmp_path), tmp_path / "dead"
    with pytest.raises(BatchFailedError):  # partition 0 vetoed, the others committed
        case.run(case.fan(veto=True, where=ODD_FAILS, dead_letter=str(dead)))
    where = case.partition_of()
    done, before = case.committed(), case.files()
    assert done == sorted({p for p in where.values() if p != 0})
    assert case.ids() == [i for i in (0, 2, 4, 6) if where[i] != 0]  # the route's rows
    assert _letter_ids(dead) == [1, 3, 5, 7]

    fan = case.fan(where=OTHER, dead_letter=str(dead))
    with pytest.raises(BatchFailedError) as failed:
        case.run(fan)
    error = failed.value.failures["s"]
    assert isinstance(error, RouteError)
    assert str(error) == (
        f"sink 's', batch 0: the route changed mid-batch: partition(s) {done} committed this "
        f"batch under {case.shown(ODD_FAILS)}, but the sink's route is now "
        f"{case.shown(OTHER)}. {SKIPS} Nothing was written. Restore the old route (its "
        "expressions and the Spark settings it names) until this batch completes, then "
        "change it (a change between batches is safe)"
    )
    assert fan.sinks["s"].mark_reads == 1  # check_replay's read, before the letters
    assert case.files() == before and _letter_ids(dead) == [1, 3, 5, 7]

    fan = case.fan(where=ODD_FAILS, dead_letter=str(dead))  # the old route completes it
    result = case.run(fan)["s"]
    assert (result.rows, result.dead_lettered) == (4, 4)
    assert fan.sinks["s"].mark_reads == 1  # the write took check_replay's read
    assert case.ids() == [0, 2, 4, 6]
    assert _letter_ids(dead) == [1, 3, 5, 7]


def test_without_route_letters_the_write_refuses_before_any_partition(
    spark: Any, tmp_path: Path
) -> None:
    case = Case(spark, tmp_path)
    with pytest.raises(BatchFailedError):
        case.run(case.fan(veto=True))  # no route: every row
    where = case.partition_of()
    done, before = case.committed(), case.files()
    assert done == sorted({p for p in where.values() if p != 0})
    assert case.ids() == [i for i in range(8) if where[i] != 0]

    fan = case.fan(where="id % 2 = 0")  # no target: no letters, no check_replay
    with pytest.raises(BatchFailedError) as failed:
        case.run(fan)
    error = failed.value.failures["s"]
    assert isinstance(error, RouteError)
    assert error.detail == (
        f"the route changed mid-batch: partition(s) {done} committed this batch under no "
        f"route (fingerprint {Route().stamp().fingerprint}), but the sink's route is now "
        f"{case.shown('id % 2 = 0')}. {SKIPS} Nothing was written. Restore the old route (its "
        "expressions and the Spark settings it names) until this batch completes, then "
        "change it (a change between batches is safe)"
    )
    assert case.files() == before

    result = case.run(case.fan())["s"]
    assert result.rows == 8 and case.ids() == list(range(8))


def _route_check(spark: Any, tmp_path: Path) -> None:
    """The conformance suite's check of a route changed between a partial attempt and its
    replay, on the sink."""
    suite = SinkConformance()
    suite.pipeline = f"conformance{uuid.uuid4().hex[:8]}"
    out = tmp_path / "out"
    case = SinkUnderTest(
        config={"type": "route_recording", "directory": str(out)},
        read=lambda: read_rows(out),
        dead_letter=str(tmp_path / "dead"),
        plugins=[kit_route_sink.__name__],
    )
    suite.test_a_route_changed_between_a_partial_attempt_and_its_replay(spark, case, tmp_path)


def test_the_conformance_route_check_passes_on_the_route_field_alone(
    spark: Any, tmp_path: Path
) -> None:
    _route_check(spark, tmp_path)


def test_the_conformance_route_check_fails_without_the_kits_check(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("fanout.partitioned.sink.check_routes", lambda *a, **k: None)
    with pytest.raises(AssertionError):  # a row both in a committed partition and a letter
        _route_check(spark, tmp_path)


def test_a_replay_without_its_route_is_refused_when_no_partition_committed(
    spark: Any, tmp_path: Path
) -> None:
    """A first attempt wrote its route letters and committed no partition; the route is
    then removed (an identity route) with the dead-letter target kept. The target holds
    the batch's letters under the old route: the replay is refused before anything is
    written, as under any other route, not written whole (the letters' rows would be both
    in the sink and in its dead letters). Restoring the route completes the batch."""
    case, dead = Case(spark, tmp_path), tmp_path / "dead"
    with pytest.raises(BatchFailedError):  # its one partition vetoed: nothing committed
        case.run(case.fan(veto=True, where=ODD_FAILS, dead_letter=str(dead), partitions=1))
    assert (case.committed(), _letter_ids(dead)) == ([], [1, 3, 5, 7])

    fan = case.fan(dead_letter=str(dead), partitions=1)  # the route removed
    with pytest.raises(BatchFailedError) as failed:
        case.run(fan)
    error = failed.value.failures["s"]
    assert isinstance(error, RouteError)
    old, now = Route(where=ODD_FAILS).stamp(session_settings(case.batch)), Route().stamp()
    assert str(error) == (
        f"sink 's', batch 0: the route changed mid-batch: the Delta table {dead} holds this "
        f"batch's route dead letters chosen by {old.text} (fingerprint {old.fingerprint}), "
        f"but the sink's route is now no route (fingerprint {now.fingerprint}). Writing the "
        "batch with the new route would leave a row only it refuses in neither place and a "
        "row only the old one refuses in both. Restore the old route (its expressions and "
        "the Spark settings it names) until this batch completes, then change it"
    )
    assert (case.committed(), _letter_ids(dead)) == ([], [1, 3, 5, 7])

    result = case.run(case.fan(where=ODD_FAILS, dead_letter=str(dead), partitions=1))["s"]
    assert (result.rows, result.dead_lettered) == (4, 4)
    assert (case.ids(), _letter_ids(dead)) == ([0, 2, 4, 6], [1, 3, 5, 7])


def test_without_a_route_the_target_is_read_only_before_the_sinks_first_mark(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The identity's stamp goes to the target only while the sink may be handed a batch an
    earlier process attempted: up to its first mark in this FanOut. Its later batches
    (in order, each after the one before it was marked) were attempted by none: no read
    of the target. A new FanOut (a restart) reads it again for its first batch."""
    from fanout.delta_tables import io as deltaio

    case, dead = Case(spark, tmp_path), tmp_path / "dead"
    reads: list[str] = []
    opened = deltaio.open_table

    def counting(path: str, *args: Any, **kwargs: Any) -> Any:
        if str(path) == str(dead):
            reads.append(str(path))
        return opened(path, *args, **kwargs)

    monkeypatch.setattr(deltaio, "open_table", counting)

    def run(fan: FanOut, batch_id: int) -> int:
        before = len(reads)
        result = fan.process(case.batch, BatchInfo(case.pipeline, batch_id, "q"))["s"]
        assert (result.rows, result.dead_lettered) == (8, 0)
        return len(reads) - before

    fan = case.fan(dead_letter=str(dead), partitions=1)
    assert [run(fan, b) for b in range(3)] == [1, 0, 0]
    fan = case.fan(dead_letter=str(dead), partitions=1)  # a restart: its first batch reads
    assert [run(fan, b) for b in range(3, 5)] == [1, 0]
    assert case.committed() == [0] * 5 and _letter_ids(dead) == []  # one partition a batch
    assert sorted(int(row["id"]) for row in read_rows(case.out)) == sorted(list(range(8)) * 5)
