"""Observers are called through pluggy: wrappers see the call, and one raising observer
neither fails the call nor stops the others. A fresh registry per test."""

from __future__ import annotations

import logging
from collections.abc import Generator
from typing import Any

import pytest

from fanout import hookimpl
from fanout.contract.batch import BatchInfo
from fanout.hooks import specs
from fanout.hooks.caller import OBSERVER_HOOKS, HookCaller
from fanout.hooks.registry import load_registry

INFO = BatchInfo(pipeline="p", batch_id=7)


class Seen:
    """Records the batch starts it observes."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    @hookimpl
    def fanout_batch_start(self, info: BatchInfo, pending: list[str]) -> None:
        self.calls.append(f"seen {info.batch_id} {pending}")


class Raising:
    """An observer that is down."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    @hookimpl
    def fanout_batch_start(self, info: BatchInfo) -> None:
        self.calls.append("raising")
        raise RuntimeError("observer down")


class Wrapper:
    """A new-style pluggy wrapper around the whole hook call."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls
        self.result: Any = None

    @hookimpl(wrapper=True)
    def fanout_batch_start(self, info: BatchInfo) -> Generator[None, Any, Any]:
        self.calls.append("wrapper before")
        self.result = yield
        self.calls.append("wrapper after")
        return self.result


def caller(*plugins: object) -> HookCaller:
    registry = load_registry(plugins, entry_points_=[])
    assert registry.load_errors == []
    return HookCaller(registry.manager)


def test_a_raising_observer_is_logged_and_the_next_observer_still_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[str] = []
    seen, raising = Seen(calls), Raising(calls)
    hooks = caller(seen, raising)  # the most recent is called first: raising, then seen
    with caplog.at_level(logging.ERROR, logger="fanout.hooks.caller"):
        hooks.call("fanout_batch_start", info=INFO, pending=["a"], skipped=[])
    assert calls == ["raising", "seen 7 ['a']"]
    assert f"plugin 'Raising@{id(raising):x}' failed in hook fanout_batch_start" in caplog.text
    assert "RuntimeError: observer down" in caplog.text


def test_a_wrapper_sees_the_call_and_its_result() -> None:
    calls: list[str] = []
    wrapper = Wrapper(calls)
    hooks = caller(Seen(calls), Raising(calls), wrapper)
    hooks.call("fanout_batch_start", info=INFO, pending=["a", "b"], skipped=[])
    assert calls == ["wrapper before", "raising", "seen 7 ['a', 'b']", "wrapper after"]
    assert wrapper.result == []  # pluggy collects the non-None returns: observers return None


def test_a_raising_wrapper_does_not_fail_the_call(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []

    class Broken:
        @hookimpl(wrapper=True)
        def fanout_batch_end(self, info: BatchInfo) -> Generator[None, Any, Any]:
            yield
            raise RuntimeError("wrapper down")

    class Ends:
        @hookimpl
        def fanout_batch_end(self, info: BatchInfo) -> None:
            calls.append("end")

    hooks = caller(Ends(), Broken())
    with caplog.at_level(logging.ERROR, logger="fanout.hooks.caller"):
        hooks.call("fanout_batch_end", info=INFO, results={})
    assert calls == ["end"]
    assert "hook fanout_batch_end failed (in a hook wrapper); ignored" in caplog.text
    assert "RuntimeError: wrapper down" in caplog.text


def test_two_callers_on_one_manager_isolate_once(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []
    registry = load_registry([Raising(calls)], entry_points_=[])
    HookCaller(registry.manager)
    hooks = HookCaller(registry.manager)
    with caplog.at_level(logging.ERROR, logger="fanout.hooks.caller"):
        hooks.call("fanout_batch_start", info=INFO, pending=[], skipped=[])
    assert caplog.text.count("RuntimeError: observer down") == 1


def test_observer_hooks_are_the_lifecycle_hookspecs() -> None:
    for name in OBSERVER_HOOKS:
        assert hasattr(getattr(specs, name), "fanout_spec"), name
    assert "fanout_sink_types" not in OBSERVER_HOOKS  # a registration hook may raise
