"""What every check of the suite stands on: a pipeline name of the test's own, a
``FanOut`` of the case's sink that calls ``write()`` from another thread than ``open()``'s
(as a ``FanOut`` of several sinks does), batches of the kit's schema, a ledger that loses a
mark, and the two asserts most checks end with (the ids the target holds, the rows
``write()`` counted)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any, NoReturn

import pytest

from fanout.contract.batch import BatchInfo
from fanout.contract.sessions import spark_threads
from fanout.contract.sink import SinkResult
from fanout.errors import BatchFailedError, ConfigurationError
from fanout.fan_out import FanOut
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry
from fanout.testing.conformance.case import NAME, SCHEMA, SinkUnderTest
from fanout.testing.conformance.refusals import for_the_author


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

    def write_losing_the_mark(self, fan: FanOut, df: Any, info: BatchInfo) -> None:
        """``fan`` (on this ledger) processes ``df``: the sink writes it, its mark is
        lost. A write that failed before its mark fails the check with the sink's error
        (the check asserted only the ids the target held after it)."""
        with pytest.raises(BatchFailedError) as failed:
            fan.process(df, info)
        if not self.lost:
            notes = "".join(f" {note}" for note in getattr(failed.value, "__notes__", ()))
            pytest.fail(
                f"write() of batch {info.batch_id} failed before its ledger mark (which this "
                f"check loses on purpose, after the write): "
                f"{failed.value.failures.get(NAME)!r}{notes}"
            )


class OffThreadFanOut(FanOut):
    """The kit's ``FanOut``: each :meth:`process` runs in a thread of its own, started for
    that batch, so the sink's ``write()`` never runs on the thread that ran its ``open()``
    (the one that built the ``FanOut``). A ``FanOut`` of several sinks writes each in a
    thread of a pool made for the batch; one of a single sink writes it on the thread that
    called ``process``, so without this the kit would pass a client bound to ``open()``'s
    thread that the pipeline's second sink breaks."""

    def process(self, df: Any, info: BatchInfo) -> dict[str, SinkResult]:
        """:meth:`fanout.fan_out.FanOut.process` in a new thread (its Spark jobs inherit
        this thread's properties, as the dispatcher's write threads' do); what it returns or
        raises, here."""
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["result"] = FanOut.process(self, df, info)
            except BaseException as exc:  # raised again on the caller's thread
                outcome["error"] = exc

        name = f"conformance-{info.pipeline}-batch-{info.batch_id}"
        thread = threading.Thread(target=spark_threads(df)(run), name=name)
        thread.start()
        thread.join()
        if "error" in outcome:
            if isinstance(outcome["error"], BatchFailedError):
                outcome["error"].add_note(_OFF_THREAD)
            self._raise(outcome["error"], info)
        result: dict[str, SinkResult] = outcome["result"]
        return result

    def process_on_open_thread(self, df: Any, info: BatchInfo) -> dict[str, SinkResult]:
        """:meth:`fanout.fan_out.FanOut.process` on this thread, the one that ran the
        sink's ``open()`` (the thread check's comparison)."""
        try:
            return FanOut.process(self, df, info)
        except BaseException as error:
            self._raise(error, info)

    def _raise(self, error: BaseException, info: BatchInfo) -> NoReturn:
        """Raise ``error``, or, for fanout's refusal of the batch after a wrong answer of
        the sink about what it holds, an ``AssertionError`` saying so to its author
        (:mod:`~fanout.testing.conformance.refusals`)."""
        try:
            told = for_the_author(error, self.sinks[NAME], self.ledger, info)
        except Exception:  # asking again failed: fanout's refusal as it is
            told = None
        if told is None:
            raise error
        raise AssertionError(told) from error


_OFF_THREAD = (
    "(the kit wrote this batch on a thread of its own, not the one that ran open(), as a "
    "FanOut of several sinks writes each sink: where the sink's error is its client refusing "
    "another thread, test_write_runs_on_another_thread_than_open says what to do)"
)


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
    ) -> OffThreadFanOut:
        try:
            return OffThreadFanOut(self.pipeline, ledger, [case.sink(**extra)], retries=0,
                                   backoff_s=0, plugins=[*_modules(case.plugins), *observers],
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
