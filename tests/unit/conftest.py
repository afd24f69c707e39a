"""Shared fixtures of the unit tests: no JVM, no Spark, no services.

The fakes themselves (FakeFrame, RecordingSink, ...) are in fakes.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest

from fanout.ledger.memory import MemoryLedger
from tests.unit.fakes import FakeFrame


@pytest.fixture
def frame() -> FakeFrame:
    return FakeFrame()


@pytest.fixture
def memory_ledger() -> MemoryLedger:
    return MemoryLedger()


@pytest.fixture
def with_test_sinks(monkeypatch: pytest.MonkeyPatch) -> Callable[[object], None]:
    """Call it with a plugin object (test sink types): every registry the code under test
    loads holds it, as if installed, before the plugins it is given (``load_registry`` as
    :mod:`fanout.hooks.registry` and :mod:`fanout.app.runner` name it, for ``fanout
    validate``'s checks and ``load_pipeline``)."""
    import fanout.hooks.registry as registry_module
    from fanout.app import runner

    def install(plugin: object) -> None:
        load = registry_module.load_registry

        def with_plugin(extra: Iterable[object] = (), **kwargs: Any) -> Any:
            return load([plugin, *extra], **kwargs)

        monkeypatch.setattr(registry_module, "load_registry", with_plugin)
        monkeypatch.setattr(runner, "load_registry", with_plugin)

    return install
