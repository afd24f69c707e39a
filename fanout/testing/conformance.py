"""A conformance suite any sink type runs from pytest in a few lines.

Subclass :class:`SinkConformance` in your plugin's tests and give it a fixture
``under_test`` returning a :class:`SinkUnderTest`: the sink's configuration and a way to
read what its target holds. The suite needs a ``spark`` fixture (a local SparkSession) and
checks, with the real sink and exact contents::

    import pytest
    from fanout.testing.conformance import SinkConformance, SinkUnderTest

    class TestMySink(SinkConformance):
        @pytest.fixture
        def under_test(self, tmp_path):
            return SinkUnderTest(
                config={"type": "mysink", "directory": str(tmp_path / "out")},
                read=lambda: read_my_target(tmp_path / "out"),  # rows with "id" and "v"
                dead_letter=str(tmp_path / "dead"),  # any dead_letter your sink takes
            )

Batches have two columns, ``id BIGINT`` and ``v STRING``; ``read`` returns the target's
rows as mappings holding at least ``id``. The checks: a driver (a real subprocess) dying
between the sink's write and its ledger mark (``os._exit`` at that point: no ``finally``, no
``atexit``, nothing flushed, as ``kill -9`` leaves it), then the replay; the replay of
a marked batch (skipped) and of an unmarked one (no duplicate); an empty batch; schema
drift (a new column: refused naming it, or written, as the sink declares); null keys
(refused naming the column, or dead-lettered once, also by a replay after a kill between
the commit and the hand-over: never dropped); rows failing a route go to the dead-letter
target; a route changed between a partial attempt (some pieces committed,
then a failure) and its replay is refused before any letter is written, or the replay's
outcome is exact (``commits_in_pieces``); a row the target itself refuses (when
``refused_value`` says which) ends in the dead letters once, not in the target, also when
the batch is replayed (both letter checks, with a local Delta ``dead_letter`` read by the
suite, delete the letters before the replay: a kill between the commit and the
hand-over); a batch of a new epoch (a checkpoint reset accepted with
``on_checkpoint_reset="new_epoch"``: batch ids start at 0 again) lands beside the old
epoch's batch of the same id; a secret of the configuration never appears in an error or a
log; and, when the sink implements the optional :meth:`fanout.Sink.holds_batch`, that it
says ``False`` before a batch is written and ``True`` after (the whole batch: not a
:class:`fanout.PartlyHeld`, which a sink answers only for a batch some of whose
partitions never committed, or whose refused rows are not in its dead-letter target yet);
when the sink implements the optional
:meth:`fanout.Sink.target_replaced`, that it says ``None`` about an empty batch and a batch
of rows just written (the same target) and, given ``recreate``, a reason once the target
was dropped and created again empty; when it implements :meth:`fanout.Sink.records_gone`,
that it says ``None`` about a batch just written and, given ``drop``, about a deleted
target; when :meth:`fanout.Sink.harmless_rewrite` gives a reason,
that a batch written again under a new epoch's idempotency key leaves the target as one
write did; when :meth:`fanout.Sink.deterministic_columns` names columns, that the batch
has them; when it implements :meth:`fanout.Sink.standing_problems`, that a sink built and
not opened (as ``fanout status --config`` asks it) says none before its target exists and
after a batch, and touches no file; when it implements :meth:`fanout.Sink.secret_values`
(and the case gives ``secret``), that a sink built from ``failing_config`` and not opened
names that secret, in a list of strings; when it implements
:meth:`fanout.Sink.lift_epoch_fence`, that it says no fence was lifted where none was,
that :meth:`fanout.Sink.fence_earlier_epochs` refuses a write of the epoch it closed, and
that the lift opens that epoch again to the write.

The sink type is found as ``FanOut`` finds it: through the ``fanout`` entry point of an
installed distribution (``pip install -e .`` of your plugin in the test environment), or,
without installing it, through ``plugins``: the modules registering it (``fanout_sink_types``),
each the module itself or its name, as ``FanOut(plugins=...)`` takes them; the kill check's
driver, a subprocess, imports them by name, with the directories this process imported
them from added to its ``sys.path`` behind the standard library and ahead of
site-packages (``env`` adds what else it needs).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import pytest

from fanout.contract.batch import BatchInfo
from fanout.contract.sink import PartlyHeld, Sink, SinkContext
from fanout.errors import (
    BatchFailedError,
    ConfigurationError,
    FanoutError,
    RouteError,
    SinkResultError,
)
from fanout.fan_out import FanOut
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry
from fanout.observe.logs import RedactFilter, known_secrets, secrets_apart
from fanout.observe.secrets import redact
from fanout.testing.faults import KILL_EXIT_CODE, VetoOnce

SCHEMA = "id BIGINT, v STRING"
NAME = "under_test"


@dataclass
class SinkUnderTest:
    """A sink type as the suite sees it.

    :param config: the sink's configuration without ``name`` (``{"type": ..., **options}``),
        JSON-serialisable: the kill check rebuilds it in another process.
    :param read: the rows the target holds (mappings with ``id``; ``v`` when kept).
    :param dead_letter: a ``dead_letter`` option value the sink takes (``None``: the route
        check is skipped).
    :param read_dead_letters: the dead letters' rows (default: the Delta table at
        ``dead_letter``).
    :param keyed: whether ``id`` is the sink's key, or a row whose ``id`` is null is one the
        sink refuses (the null-key check applies; with ``dead_letter``, the row must end in
        the dead letters once, also after a replay whose ledger mark was lost).
    :param schema_drift: what a new column does: ``"refuses"`` (an error naming it) or
        ``"writes"``.
    :param secret: a secret value held by ``failing_config`` (``None``: check skipped).
    :param failing_config: a configuration with ``secret`` that fails (at open or write).
    :param env: environment variables the kill check's subprocess needs (``PYTHONPATH``).
    :param plugins: the modules registering the sink type (``fanout_sink_types``), for a
        plugin that is not installed: each the module itself or its importable name, as
        ``FanOut(plugins=...)`` takes them (:func:`fanout.hooks.registry.plugin_object`);
        given to ``FanOut(plugins=...)``, and by name to the kill check's driver (with the
        directory each was imported from on its ``sys.path``, ahead of site-packages only).
    :param commits_in_pieces: whether an attempt commits the batch in pieces that a failure
        can leave behind (a partitioned sink: one transaction per Spark partition), so that
        a route changed between a partial attempt and its replay must be refused or its
        outcome exact. ``None``: a :class:`fanout.partitioned.PartitionedSink` does (the
        suite vetoes partition 0's commit through ``fanout_partition_commit``); a sink
        committing each batch whole does not (the check is skipped).
    :param recreate: drop the target and create it again empty, as an operator or a deploy
        script would (outside fanout: the same name and columns, e.g. ``DROP TABLE`` then
        ``CREATE TABLE``); ``None``: the re-created half of the
        :meth:`fanout.Sink.target_replaced` check is skipped.
    :param drop: delete the target (no re-creation: a ``DROP TABLE``, a directory removed);
        ``None``: the check that :meth:`fanout.Sink.holds_batch` answers ``False`` for a
        deleted target (records kept beside it outlive it) is skipped.
    :param refused_value: a value of ``v`` the target refuses (the fixture sets the target up
        so, e.g. a ``CHECK`` constraint); ``None``: the check is skipped. With
        ``dead_letter``, such a row must go there once (not into the target), also when the
        mark is lost and the batch replayed; without, the batch must fail naming the value.
    """

    config: Mapping[str, Any]
    read: Callable[[], Sequence[Mapping[str, Any]]]
    dead_letter: str | None = None
    read_dead_letters: Callable[[], Sequence[Mapping[str, Any]]] | None = None
    keyed: bool = False
    schema_drift: Literal["refuses", "writes"] = "refuses"
    secret: str | None = None
    failing_config: Mapping[str, Any] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    plugins: Sequence[ModuleType | str] = ()
    commits_in_pieces: bool | None = None
    refused_value: str | None = None
    recreate: Callable[[], None] | None = None
    drop: Callable[[], None] | None = None

    def sink(self, **extra: Any) -> dict[str, Any]:
        """The configuration as ``FanOut(sinks=[...])`` takes it."""
        return {**self.config, "name": NAME, **extra}

    def ids(self) -> list[int]:
        """The ids the target holds, sorted (duplicates kept)."""
        return sorted(int(row["id"]) for row in self.read())


class _MarkLost:
    """A ledger whose first ``committed`` mark fails: the sink wrote, the mark is lost."""

    def __init__(self, inner: DeltaLedger) -> None:
        self.inner, self.lost = inner, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def mark_committed(self, entry: LedgerEntry) -> bool:
        if not self.lost:
            self.lost = True
            raise OSError("the driver died before the ledger mark")
        return self.inner.mark_committed(entry)


class SinkConformance:
    """The checks; subclass it and provide the ``under_test`` fixture (module docstring)."""

    pipeline = "conformance"

    @pytest.fixture(autouse=True)
    def _own_pipeline(self) -> None:
        """A pipeline name of this test's own: sinks that keep idempotency records outside
        the ledger (Kafka's marker groups, PostgreSQL's progress rows) must not meet
        another test's."""
        self.pipeline = f"conformance{uuid.uuid4().hex[:8]}"

    def _fan(
        self,
        case: SinkUnderTest,
        ledger: Any,
        *,
        observers: Sequence[object] = (),
        fan_options: Mapping[str, Any] | None = None,
        **extra: Any,
    ) -> FanOut:
        try:
            return FanOut(self.pipeline, ledger, [case.sink(**extra)], retries=0, backoff_s=0,
                          plugins=[*_modules(case.plugins), *observers],
                          **dict(fan_options or {}))  # fmt: skip
        except ConfigurationError:
            if "dead_letter" in extra and "dead_letter" not in _options_of(case):
                pytest.fail(
                    f"SinkUnderTest(dead_letter=...) is given, but sink type "
                    f"{case.config.get('type')!r} takes no dead_letter option (its options: "
                    f"{', '.join(_options_of(case)) or 'none'}): declare one, "
                    'SinkOption("dead_letter", "none", ...) and a keyword '
                    "`dead_letter: str | None = None` stored as self.dead_letter (README, "
                    "'Writing a sink plugin': Dead letters), or leave dead_letter out of "
                    "SinkUnderTest to skip the dead-letter checks"
                )
            raise

    def _batch(self, spark: Any, rows: Sequence[tuple[Any, ...]], schema: str = SCHEMA) -> Any:
        return spark.createDataFrame(list(rows), schema)

    def _info(self, batch_id: int) -> BatchInfo:
        return BatchInfo(self.pipeline, batch_id, "conformance-query")

    def test_replay_of_a_marked_batch_is_skipped(
        self, spark: Any, under_test: SinkUnderTest, tmp_path: Path
    ) -> None:
        fan = self._fan(under_test, str(tmp_path / "ledger"))
        batch = self._batch(spark, [(i, f"v{i}") for i in range(5)])
        _assert_rows(fan.process(batch, self._info(0))[NAME], 5, "a batch of 5 rows")
        assert fan.process(batch, self._info(0)) == {}  # the ledger says: written
        _assert_ids(under_test, list(range(5)), "after a batch of ids 0-4 and its replay")

    def test_replay_of_an_unmarked_batch_writes_no_duplicate(
        self, spark: Any, under_test: SinkUnderTest, tmp_path: Path
    ) -> None:
        path = str(tmp_path / "ledger")
        batch = self._batch(spark, [(i, f"v{i}") for i in range(6)])
        with pytest.raises(BatchFailedError):
            self._fan(under_test, _MarkLost(DeltaLedger(path))).process(batch, self._info(0))
        _assert_ids(under_test, list(range(6)), "after writing ids 0-5 (its ledger mark lost)")
        result = self._fan(under_test, path).process(batch, self._info(0))[NAME]
        _assert_rows(result, 6, "the replay of a batch of 6 rows it had written")
        _assert_ids(under_test, list(range(6)), _REPLAYED)

    def test_kill_between_write_and_mark(
        self, spark: Any, under_test: SinkUnderTest, tmp_path: Path
    ) -> None:
        spec = {"pipeline": self.pipeline, "ledger": str(tmp_path / "ledger"),
                "sink": under_test.sink(), "rows": [[i, f"v{i}"] for i in range(8)],
                "plugins": _module_names(under_test.plugins),
                "paths": _import_roots(under_test.plugins)}  # fmt: skip
        env = {**os.environ, **under_test.env}
        killed = subprocess.run(
            [sys.executable, "-m", "fanout.testing.kill_driver", json.dumps(spec)],
            capture_output=True, text=True, timeout=600, env=env,
        )  # fmt: skip
        assert killed.returncode == KILL_EXIT_CODE, killed.stderr[-3000:]
        _assert_ids(under_test, list(range(8)), "after the killed driver wrote ids 0-7")
        fan = self._fan(under_test, str(tmp_path / "ledger"))
        batch = self._batch(spark, [(i, f"v{i}") for i in range(8)])
        _assert_rows(fan.process(batch, self._info(0))[NAME], 8, "the replay of 8 rows")
        _assert_ids(under_test, list(range(8)), _REPLAYED)

    def test_a_new_epoch_writes_beside_the_old_one(
        self, spark: Any, under_test: SinkUnderTest, tmp_path: Path
    ) -> None:
        """A checkpoint reset accepted with ``on_checkpoint_reset="new_epoch"`` starts batch
        ids at 0 again: the new query's batch 0 holds new rows, which land beside the old
        epoch's batch 0. A sink naming its writes by ``batch_id`` instead of
        ``batch.idempotency_key`` skips them as already written, or overwrites the old ones."""
        path = str(tmp_path / "ledger")
        old = self._batch(spark, [(i, f"v{i}") for i in range(3)])
        _assert_rows(self._fan(under_test, path).process(old, self._info(0))[NAME], 3, "3 rows")
        new = self._batch(spark, [(i, f"v{i}") for i in range(10, 14)])
        after_reset = BatchInfo(self.pipeline, 0, "conformance-query-after-a-reset")
        fan = self._fan(under_test, path, fan_options={"on_checkpoint_reset": "new_epoch"})
        result = fan.process(new, after_reset)[NAME]
        why = (
            "batch 0 of a new epoch (ids 10-13) after batch 0 of the old one (ids 0-2): key "
            "what write() records by batch.idempotency_key (app_id and version, or token), "
            "which a new epoch changes, never by batch_id alone"
        )
        assert not result.already_written, f"write() said already written: {why}"
        _assert_rows(result, 4, why)
        _assert_ids(under_test, [0, 1, 2, 10, 11, 12, 13], why)

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

    def test_deterministic_columns_are_columns_of_the_batch(
        self, spark: Any, under_test: SinkUnderTest, tmp_path: Path
    ) -> None:
        """The optional :meth:`fanout.Sink.deterministic_columns` (by default
        :meth:`fanout.Sink.partitioned_by`'s): fanout checks that the batch computes the
        columns named there deterministically; a name the batch does not have (the
        target's spelling of a renamed column, a typo) leaves that check nothing to
        inspect, so a route or source computing the real column with ``rand()`` or
        ``uuid()`` passes unrefused. The kit's batch has ``id`` and ``v``. Skipped for a
        sink naming none."""
        sink = self._fan(under_test, str(tmp_path / "ledger")).sinks[NAME]
        stable = sink.deterministic_columns()
        if stable is None:
            pytest.skip("the sink names no deterministic columns (deterministic_columns: None)")
        _assert_batch_columns(stable.columns, self._batch(spark, []).columns)

    def test_a_read_only_check_creates_nothing(
        self, spark: Any, under_test: SinkUnderTest, tmp_path: Path
    ) -> None:
        """A sink type setting :attr:`fanout.Sink.read_only_check` promises that ``fanout
        validate``'s ``open()`` (``context.checking``) and ``check_schema`` create, change
        and remove nothing: the check opens it so, before its target exists and again after
        a batch was written to it (``fanout validate`` of a running pipeline), and compares
        the files under the test's ``tmp_path`` (where a local target of the fixture lives)
        before and after each. A target elsewhere (a database server) it cannot see.
        Skipped for a type without ``read_only_check`` (``fanout validate`` does not open
        it)."""
        from fanout.hooks.registry import load_registry

        registry = load_registry(_modules(under_test.plugins))
        sink = registry.build_sink(under_test.sink(), registry.sink_types())
        if not type(sink).read_only_check:
            pytest.skip("the sink does not set read_only_check (fanout validate does not open it)")
        self._check_read_only(spark, sink, tmp_path, "before its target exists")
        batch = self._batch(spark, [(1, "v1")])
        self._fan(under_test, str(tmp_path / "ledger")).process(batch, self._info(0))
        sink = registry.build_sink(under_test.sink(), registry.sink_types())
        self._check_read_only(spark, sink, tmp_path, "after a batch was written")

    def _check_read_only(self, spark: Any, sink: Sink, tmp_path: Path, when: str) -> None:
        """Open ``sink`` as ``fanout validate`` does; fail naming what it touched."""
        import pyarrow as pa

        before = _files(tmp_path)
        changes: list[str] = []
        sink.open(SinkContext(self.pipeline, spark, None, checking=True, changes=changes))
        try:
            sink.check_schema(pa.schema([("id", pa.int64()), ("v", pa.string())]))
        finally:
            sink.close()
        if touched := _touched(before, _files(tmp_path)):
            pytest.fail(
                f"open() with context.checking (fanout validate; the class sets "
                f"read_only_check = True) or check_schema() {when} created, changed or "
                f"removed {', '.join(touched)} under {tmp_path}: check without creating or "
                "changing anything (create the target at the first write), and say what a "
                "run would do with context.would(...)"
            )

    def test_standing_problems_of_a_healthy_target_are_none(
        self, spark: Any, under_test: SinkUnderTest, tmp_path: Path
    ) -> None:
        """The optional :meth:`fanout.Sink.standing_problems`, asked as ``fanout status
        --config`` asks it (a sink built from the configuration, not opened), before its
        target exists (a pipeline not run yet) and after a batch was written to it: nothing
        to fix by hand (each text is shown under ``to fix by hand:``), and nothing created,
        changed or removed under the test's ``tmp_path`` (``fanout status --config`` asks
        it, beside a running pipeline too). Skipped for a sink that does not implement
        it."""
        from fanout.hooks.registry import load_registry

        registry = load_registry(_modules(under_test.plugins))
        sink = registry.build_sink(under_test.sink(), registry.sink_types())
        if type(sink).standing_problems is Sink.standing_problems:
            pytest.skip("the sink does not implement standing_problems")
        _check_no_standing_problem(sink, tmp_path, "before its target exists")
        fan = self._fan(under_test, str(tmp_path / "ledger"))
        try:
            fan.process(self._batch(spark, [(1, "v1")]), self._info(0))
        finally:
            fan.close()
        sink = registry.build_sink(under_test.sink(), registry.sink_types())
        _check_no_standing_problem(sink, tmp_path, "after a batch was written to it")

    def test_secret_values_name_the_secret_before_open(
        self, spark: Any, under_test: SinkUnderTest, tmp_path: Path
    ) -> None:
        """The optional :meth:`fanout.Sink.secret_values`, asked as fanout asks it first: of
        a sink built from its configuration and not opened (a ``FanOut`` registers its
        sinks' secrets before it opens them, so what ``open()`` logs is masked; ``fanout
        validate`` and ``fanout recover --config`` before they open it, ``fanout status
        --config`` without opening it): a list (or tuple) of strings (a blank one is
        masked nowhere, allowed), holding the secret of ``failing_config``, and strings
        only for ``config``. Skipped for a case
        without ``secret`` and for a sink that does not implement it (the check that the
        secret never appears tells it to)."""
        if under_test.secret is None or under_test.failing_config is None:
            pytest.skip("no secret in this sink's configuration")
        from fanout.hooks.registry import load_registry

        registry = load_registry(_modules(under_test.plugins))
        types = registry.sink_types()
        failing = registry.build_sink({**under_test.failing_config, "name": NAME}, types)
        if type(failing).secret_values is Sink.secret_values:
            pytest.skip("the sink does not implement secret_values")
        _check_secret_values(failing, "failing_config", under_test.secret)
        _check_secret_values(registry.build_sink(under_test.sink(), types), "config", None)

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

    def test_an_empty_batch_writes_nothing_and_is_marked(
        self, spark: Any, under_test: SinkUnderTest, tmp_path: Path
    ) -> None:
        fan = self._fan(under_test, str(tmp_path / "ledger"))
        assert fan.process(self._batch(spark, []), self._info(0))[NAME].rows == 0
        assert fan.process(self._batch(spark, []), self._info(0)) == {}
        assert under_test.ids() == []

    def test_schema_drift(self, spark: Any, under_test: SinkUnderTest, tmp_path: Path) -> None:
        fan = self._fan(under_test, str(tmp_path / "ledger"))
        fan.process(self._batch(spark, [(1, "a")]), self._info(0))
        drifted = self._batch(spark, [(2, "b", 7)], SCHEMA + ", extra INT")
        if under_test.schema_drift == "writes":
            try:
                result = fan.process(drifted, self._info(1))[NAME]
            except BatchFailedError as failed:
                pytest.fail(
                    f"{_DRIFT} refused it: {failed.failures[NAME]!r}; say "
                    "SinkUnderTest(schema_drift='refuses') if it refuses new columns"
                )
            _assert_rows(result, 1, "a batch of 1 row with a new column")
            _assert_ids(under_test, [1, 2], "after a batch adding a column was written")
            return
        try:
            fan.process(drifted, self._info(1))
        except BatchFailedError as failed:
            error = failed.failures[NAME]
        else:
            pytest.fail(
                f"{_DRIFT} wrote it, and SinkUnderTest(schema_drift='refuses') (the default) "
                "says it refuses it: say schema_drift='writes' if it writes new columns, or "
                "raise a SchemaMismatchError naming the column"
            )
        if "extra" not in str(error) or f"sink {NAME!r}, batch 1" not in str(error):
            pytest.fail(
                f"{_DRIFT} refused it with an error that does not name the column: {error!r}; "
                "raise SchemaMismatchError(message, sink=self.name, batch_id=batch.batch_id, "
                "columns=[...]) with the column's name in the message"
            )
        _assert_ids(under_test, [1], "after batch 1, which added a column, was refused")

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
                "README, 'Writing a sink plugin': Dead letters)"
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
        with pytest.raises(BatchFailedError):  # written, mark lost: the replay must not
            self._fan(under_test, _MarkLost(DeltaLedger(path)), **target).process(  # add
                batch, self._info(0)
            )
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
                "README, 'Writing a sink plugin': Dead letters)"
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

    def test_a_secret_never_appears_in_errors_or_logs(
        self,
        spark: Any,
        under_test: SinkUnderTest,
        tmp_path: Path,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        if under_test.secret is None or under_test.failing_config is None:
            pytest.skip("no secret in this sink's configuration")
        caplog.set_level(logging.DEBUG)
        config = {**under_test.failing_config, "name": NAME}
        texts: dict[str, str] = {}
        # the log as a real run's handler writes it (`fanout run` installs RedactFilter),
        # masked of this pipeline's secrets only
        redacting = RedactFilter()
        caplog.handler.addFilter(redacting)
        try:
            with secrets_apart():
                failed = self._fail_with_secret(spark, config, under_test, tmp_path, texts)
                declared = under_test.secret in known_secrets()
        finally:
            caplog.handler.removeFilter(redacting)
        if not failed:
            pytest.fail(
                "the failing configuration did not fail: SinkUnderTest.failing_config must "
                "make FanOut(...) or the batch's write raise (a wrong secret, an unreachable "
                "server)"
            )
        texts["the log"] = caplog.text
        found = [where for where, text in texts.items() if under_test.secret in text]
        what = (
            "The sink declares it (secret_values()), but logged it before fanout knew it (in "
            "its constructor, before the FanOut registers its sinks' secrets), or spelled so "
            "that fanout's masking does not find it: do not log it"
            if found == ["the log"] and declared
            else "Return it from the sink's secret_values() (fanout then masks it in every "
            "error it raises or records and every log line), and keep it out of texts your "
            "sink builds itself"
        )
        assert not found, (
            f"the secret of failing_config appears in {', '.join(found)}: "
            f"{_around(texts[found[0]], under_test.secret)!r}. {what}"
        )

    def _fail_with_secret(
        self,
        spark: Any,
        config: dict[str, Any],
        under_test: SinkUnderTest,
        tmp_path: Path,
        texts: dict[str, str],
    ) -> bool:
        """Build a FanOut of ``config`` and write a batch; whether it failed (the error's
        texts into ``texts``)."""
        try:
            fan = FanOut(self.pipeline, str(tmp_path / "ledger"), [config], retries=0,
                         plugins=_modules(under_test.plugins))  # fmt: skip
            fan.process(self._batch(spark, [(1, "a")]), self._info(0))
        except FanoutError as error:
            texts["the error raised"] = str(error)
            texts["its repr"] = repr(error)
            texts["its cause"] = str(error.__cause__ or "")
            return True
        return False


def _around(text: str, secret: str) -> str:
    """The line of ``text`` holding ``secret``, the secret shown as ``<secret>``."""
    line = next(line for line in text.splitlines() if secret in line)
    return line.replace(secret, "<secret>")[:300]


_DRIFT = "batch 1 added a column 'extra' (id BIGINT, v STRING, extra INT) and the sink"

_REPLAYED = (
    "after the replay of a batch it had written whose ledger mark was lost: write() must "
    "find the record it keeps of batch.idempotency_key and return SinkResult(rows, "
    "already_written=True) without writing, or write idempotently (README, 'Writing a sink "
    "plugin')"
)


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


def _assert_ids(case: SinkUnderTest, expected: list[int], when: str) -> None:
    """The target holds exactly ``expected`` ids, else an error saying what it holds."""
    held = case.ids()
    assert held == expected, f"the target holds ids {held}, expected {expected}, {when}"


def _assert_rows(result: Any, expected: int, what: str) -> None:
    """The sink's result counts ``expected`` rows."""
    assert result.rows == expected, (
        f"write() returned rows={result.rows} for {what}: it must count the rows the batch "
        f"holds for it (written now, or found already written), {expected} here"
    )


_HOLDS = (
    "holds_batch(pipeline, epoch, batch_id) must look up the record write() keeps of that "
    "batch's idempotency key (app id txn_app_id(pipeline, self.name, epoch), from "
    "fanout.contract.batch, version batch_id): True when it finds it, False when not (a "
    "target not created yet holds nothing), None only when the sink cannot tell at all"
)


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
        hint = _HOLDS
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


def _assert_batch_columns(named: Sequence[str] | str, columns: Sequence[str]) -> None:
    """``named`` (``deterministic_columns().columns``) is ``"*"`` or batch columns only."""
    if named == "*":
        return
    missing = [c for c in named if c not in columns]
    assert not missing, (
        f"deterministic_columns() names {missing}, not columns of the batch "
        f"({', '.join(columns)}): fanout finds nothing to check for a name the batch lacks, "
        "so a route or source computing that column non-deterministically passes. Name "
        "the batch columns the sink keys or partitions by, as the batch spells them (its "
        "options' columns, not the target's), or \"*\" for the whole row"
    )


def _commits_in_pieces(case: SinkUnderTest, fan: FanOut) -> bool:
    """What ``case`` declares, else whether its sink is a partitioned sink."""
    if case.commits_in_pieces is not None:
        return case.commits_in_pieces
    from fanout.partitioned.sink import PartitionedSink

    return isinstance(fan.sinks[NAME], PartitionedSink)


def _options_of(case: SinkUnderTest) -> list[str]:
    """The options the case's sink type takes (``[]`` when its type does not resolve)."""
    from fanout.hooks.registry import load_registry, option_names

    types = load_registry(_modules(case.plugins)).sink_types()
    sink_type = types.get(str(case.config.get("type")))
    return [] if sink_type is None else option_names(sink_type.sink_class)


def _check_no_standing_problem(sink: Sink, tmp_path: Path, when: str) -> None:
    """Ask ``sink`` its standing problems; fail naming any, or what asking touched."""
    before = _files(tmp_path)
    problems = list(sink.standing_problems())
    if problems:
        pytest.fail(
            f"standing_problems() {when} returned {problems!r}, expected none: fanout status "
            "shows each under 'to fix by hand:', and a target fanout just wrote cleanly (or "
            "none yet) has nothing to fix"
        )
    if touched := _touched(before, _files(tmp_path)):
        pytest.fail(
            f"standing_problems() {when} created, changed or removed {', '.join(touched)} "
            f"under {tmp_path}: fanout status asks it as it draws, and it must read only"
        )


def _check_secret_values(sink: Sink, config: str, secret: str | None) -> None:
    """``sink``'s secret values (built from the case's ``config``, not opened) are a list of
    strings holding ``secret`` (when given), else fail saying what to do; the message never
    shows a value. A blank item passes: fanout masks none (an unset password as ``""``)."""
    values = sink.secret_values()
    asked = f"secret_values() of a sink built from {config} and not opened"
    if isinstance(values, str):
        pytest.fail(
            f"{asked} returned a string ({len(values)} characters), not a list of them: "
            "fanout masks each item, here each character alone; return [value]"
        )
    bad = [type(v).__name__ for v in values if not isinstance(v, str)]
    if bad:
        pytest.fail(
            f"{asked} returned {len(bad)} value(s) that are not strings "
            f"({', '.join(bad)}): return each secret the options hold, as a string, and "
            "leave out those they do not set"
        )
    if secret is not None and secret not in values:
        pytest.fail(
            f"{asked} does not hold the secret of failing_config (it returned "
            f"{len(values)} value(s)): fanout asks it before open() (a FanOut registers its "
            "sinks' secrets before opening them, fanout validate and fanout recover "
            "--config before they open it, fanout status --config without opening it), so "
            "a secret it learns in open() goes unmasked there: take it from the options "
            "the constructor stores"
        )


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


def _touched(
    before: Mapping[str, tuple[int, int]], after: Mapping[str, tuple[int, int]]
) -> list[str]:
    """The paths of two :func:`_files` listings that differ, sorted."""
    return sorted(p for p in {*before, *after} if before.get(p) != after.get(p))


def _files(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` (relative) with its modification time and size (a rewrite
    within the file system's timestamp tick mostly changes the size), and every directory
    (``(0, 0)``: its time changes with its entries, which are compared themselves)."""
    return {
        str(p.relative_to(root)): (0, 0) if p.is_dir() else (p.stat().st_mtime_ns, p.stat().st_size)
        for p in root.rglob("*")
    }


def _modules(plugins: Sequence[ModuleType | str]) -> list[Any]:
    """The plugin modules, those given by name imported (as ``FanOut`` imports them)."""
    from fanout.hooks.registry import resolve_plugins

    return list(resolve_plugins(plugins))


def _import_roots(plugins: Sequence[ModuleType | str]) -> list[str]:
    """The directories the plugin modules were imported from (a module ``a.b`` at
    ``/x/a/b.py``: ``/x``), so that another process imports them by name as this one did
    (a ``sys.path`` entry a ``conftest.py`` added is not inherited)."""
    roots = []
    for module in _modules(plugins):
        file = getattr(module, "__file__", None)
        if not isinstance(module, ModuleType) or not file:
            continue
        path = Path(file).parent if Path(file).name == "__init__.py" else Path(file)
        roots.append(str(path.parents[module.__name__.count(".")]))
    return list(dict.fromkeys(roots))


def _module_names(plugins: Sequence[ModuleType | str]) -> list[str]:
    """Each plugin's module name, for the kill check's driver (another process), which
    imports them; refused for what is neither a module nor a name."""
    names = []
    for plugin in plugins:
        if isinstance(plugin, str):
            names.append(plugin)
        elif isinstance(plugin, ModuleType):
            names.append(plugin.__name__)
        else:
            raise TypeError(
                f"SinkUnderTest(plugins=...): {plugin!r} is neither a module nor a module's "
                "name; the kill check's driver, another process, imports each plugin by name"
            )
    return names
