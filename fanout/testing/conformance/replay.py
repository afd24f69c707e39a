"""The replays a sink's :meth:`fanout.Sink.write` must survive, by the record it keeps of
``batch.idempotency_key``: a marked batch replayed (the ledger skips it), an unmarked one
(its mark lost: no duplicate), a driver killed between the write and the mark (a real
subprocess), and batch 0 of a new epoch written beside the old epoch's batch 0.

The contract: docs/architecture.md §4 (the ledger's marks and epochs) and §8 (sinks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from fanout.contract.batch import BatchInfo
from fanout.contract.sink import declares_guarantees, declaring_class
from fanout.hooks.registry import load_registry
from fanout.ledger.delta import DeltaLedger
from fanout.testing.conformance.case import NAME, SinkUnderTest
from fanout.testing.conformance.kit import Kit, _assert_ids, _assert_rows, _MarkLost, _modules
from fanout.testing.faults import KILL_EXIT_CODE


class ReplayChecks(Kit):
    """A batch written once, whatever is replayed or killed (module docstring)."""

    def test_the_type_declares_the_guarantee_these_checks_hold_it_to(
        self, spark: Any, under_test: SinkUnderTest, tmp_path: Path
    ) -> None:
        """The replay checks hold the sink to a replay leaving the same state; a type that
        declares no :attr:`fanout.Sink.guarantees` (or ``()``) runs as ``at_least_once``,
        with a warning at every start, however well it replays. Its sink is built from
        ``config`` (not opened); a type that says ``("at_least_once",)`` passes."""
        registry = load_registry(_modules(under_test.plugins))
        sink_class = declaring_class(registry.build_sink(under_test.sink(), registry.sink_types()))
        assert declares_guarantees(sink_class), (
            f"sink type {sink_class.__name__} declares no guarantees (left out, or ()), so "
            "fanout runs it as at_least_once and warns at every start, whatever these checks "
            'find: once the replay checks pass, declare guarantees = ("idempotent",) (a '
            'replay leaves the same state) or ("transactional",) (the rows and the record of '
            "batch.idempotency_key in one commit) on the class; a sink at-least-once by "
            'design says guarantees = ("at_least_once",)'
        )

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
        losing = _MarkLost(DeltaLedger(path))
        losing.write_losing_the_mark(self._fan(under_test, losing), batch, self._info(0))
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


_REPLAYED = (
    "after the replay of a batch it had written whose ledger mark was lost: write() must "
    "find the record it keeps of batch.idempotency_key and return SinkResult(rows, "
    "already_written=True) without writing, or write idempotently (docs/writing-sinks.md: "
    "write(batch))"
)


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
