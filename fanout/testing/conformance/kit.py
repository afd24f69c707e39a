"""What every check of the suite stands on: a pipeline name of the test's own, a
``FanOut`` of the case's sink, batches of the kit's schema, a ledger that loses a mark,
and the two asserts most checks end with (the ids the target holds, the rows ``write()``
counted)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

import pytest

from fanout.contract.batch import BatchInfo
from fanout.errors import ConfigurationError
from fanout.fan_out import FanOut
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry
from fanout.testing.conformance.case import SCHEMA, SinkUnderTest


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


class Kit:
    """The base of every part of :class:`fanout.testing.conformance.SinkConformance`: its
    pipeline name, and how a check builds the case's ``FanOut`` and its batches."""

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
                    "`dead_letter: str | None = None` stored as self.dead_letter "
                    "(docs/writing-sinks.md: Dead letters), or leave dead_letter out of "
                    "SinkUnderTest to skip the dead-letter checks"
                )
            raise

    def _batch(self, spark: Any, rows: Sequence[tuple[Any, ...]], schema: str = SCHEMA) -> Any:
        return spark.createDataFrame(list(rows), schema)

    def _info(self, batch_id: int) -> BatchInfo:
        return BatchInfo(self.pipeline, batch_id, "conformance-query")


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


def _options_of(case: SinkUnderTest) -> list[str]:
    """The options the case's sink type takes (``[]`` when its type does not resolve)."""
    from fanout.hooks.registry import load_registry, option_names

    types = load_registry(_modules(case.plugins)).sink_types()
    sink_type = types.get(str(case.config.get("type")))
    return [] if sink_type is None else option_names(sink_type.sink_class)


def _modules(plugins: Sequence[ModuleType | str]) -> list[Any]:
    """The plugin modules, those given by name imported (as ``FanOut`` imports them)."""
    from fanout.hooks.registry import resolve_plugins

    return list(resolve_plugins(plugins))
