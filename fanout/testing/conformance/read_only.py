"""What a sink answers fanout's read-only checks, which write no batch: the columns
:meth:`fanout.Sink.deterministic_columns` names for the determinism check, an ``open()``
under ``context.checking`` and :meth:`fanout.Sink.check_schema` for ``fanout validate``
(:attr:`fanout.Sink.read_only_check`: nothing created), and, of a sink built and not
opened, :meth:`fanout.Sink.standing_problems` for ``fanout status --config`` and
:meth:`fanout.Sink.secret_values` (asked before any ``open()``).

The contract: docs/architecture.md §5 (read-only checks, ``secret_values``), §6 (the
determinism check) and §8."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from fanout.contract.sink import Sink, SinkContext
from fanout.testing.conformance.case import NAME, SinkUnderTest
from fanout.testing.conformance.kit import Kit, _modules


class ReadOnlyChecks(Kit):
    """The sink's answers to fanout's read-only checks (module docstring)."""

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
