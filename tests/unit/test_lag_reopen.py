"""The reopen hooks a lag state is built with (:mod:`fanout.steps.lag_reopen`): those whose
owner is built after it are filled exactly once, and ``FanOut(...)`` fills every one."""

from __future__ import annotations

from pathlib import Path

import pytest

from fanout import FanOut
from fanout.ledger.memory import MemoryLedger
from fanout.sink_spec import SinkSpec, lag_policy
from fanout.steps.lag_reopen import LateHook
from tests.unit.fakes import ScriptedSink


def test_a_late_hook_answers_with_its_before_until_filled_once() -> None:
    wake = LateHook[[], str]("the wake", before=lambda: "before")
    assert wake() == "before"
    wake.fill(lambda: "filled")
    assert wake() == "filled"
    with pytest.raises(AssertionError, match="the wake: filled twice"):
        wake.fill(lambda: "again")


def test_a_late_hook_without_before_may_not_be_called_unfilled() -> None:
    ask = LateHook[[str], None]("the check")
    with pytest.raises(AssertionError, match="the check: called before it was filled"):
        ask("down")


def test_fanout_fills_every_reopen_hook_it_gives_its_lag_state(tmp_path: Path) -> None:
    lags = SinkSpec(ScriptedSink("down"), lag=lag_policy("down", {"on_failure": "lag"}))
    fan = FanOut("hooks", MemoryLedger(), [ScriptedSink("good"), lags],
                 spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip
    try:
        hooks = fan.lagging._reopener.hooks
        given = [getattr(hooks, name) for name in hooks.__dataclass_fields__]
        assert all(hook is not None for hook in given)
        late = [hook for hook in given if isinstance(hook, LateHook)]
        assert len(late) == 3 and all(hook._hook is not None for hook in late)
    finally:
        fan.close()
