"""The reopen hooks a lag state is built with (:mod:`fanout.steps.lag_reopen`): those whose
owner is built after it are filled exactly once, and what ``FanOut(...)`` gives them does
its part: a finished reopen wakes the catch-up, and a reopen reads the pipeline's secrets
as they are when it runs (a sink reopened before may have fetched one)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fanout import FanOut, SinkUnreachableError
from fanout.contract.batch import BatchInfo
from fanout.contract.sink import SinkContext
from fanout.errors import FanoutError, SinkWriteError
from fanout.ledger.memory import MemoryLedger
from fanout.observe.secrets import error_chain
from fanout.sink_spec import SinkSpec, lag_policy
from fanout.steps.lag import Lagging
from fanout.steps.lag_reopen import LateHook, ReopenHooks
from fanout.steps.lag_state import Refusal, SinkState
from tests.unit.fakes import SchemaFrame, ScriptedSink
from tests.unit.test_lag import _catch_up_from_memory

WAIT_S = 30.0
"""The bound of every wait for another thread (never reached when the test passes)."""
WOKEN_S = 10.0
"""How soon the catch-up, woken, writes a reopened sink (it takes milliseconds); unwoken,
it sleeps its probe interval (an hour here)."""
FETCHED = "Fetched-token-4417"
"""A secret a sink's ``open`` fetches: no one knows it before that open."""


def _lag(sink: ScriptedSink) -> SinkSpec:
    return SinkSpec(sink, lag=lag_policy(sink.name, {"on_failure": "lag"}))


def test_a_late_hook_answers_with_its_before_until_filled_once() -> None:
    wake = LateHook[[], str]("the wake", before=lambda: "before")
    assert wake() == "before"
    wake.fill(lambda: "filled")
    assert wake() == "filled"
    with pytest.raises(FanoutError) as twice:
        wake.fill(lambda: "again")
    assert str(twice.value) == (
        "a reopen hook, the wake, was filled twice, but FanOut(...) fills it once, right "
        "after building the hook's owner: a bug in fanout"
    )
    assert wake() == "filled"  # the first kept


def test_a_late_hook_without_before_may_not_be_called_unfilled() -> None:
    ask = LateHook[[str], None]("the check")
    with pytest.raises(FanoutError) as unfilled:
        ask("down")
    assert str(unfilled.value) == (
        "a reopen hook, the check, was called before FanOut(...) filled it, which it does "
        "right after building the hook's owner: a bug in fanout"
    )


def test_a_reopen_asking_an_unfilled_target_check_fails_saying_it_is_a_bug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Asked in the reopen's thread, the error is taken as the check's failure: the sink,
    opened, is closed and stays behind with it, and the log names the bug."""
    down = ScriptedSink("down")
    unopened = SinkUnreachableError("connection refused", sink="down")
    ask = LateHook[[str], Refusal | None]("the target checks' ask_reopened")
    lagging = Lagging(
        "p", {"down": _lag(down)}, MemoryLedger(), None,
        unopened={"down": (SinkContext("p"), unopened)},
        reopen_hooks=ReopenHooks(ask_target=ask),
    )  # fmt: skip
    bug = (
        "a reopen hook, the target checks' ask_reopened, was called before FanOut(...) "
        "filled it, which it does right after building the hook's owner: a bug in fanout"
    )
    with caplog.at_level(logging.WARNING, logger="fanout"):
        error = lagging.reopen("down")
    assert isinstance(error, FanoutError) and str(error) == bug
    assert lagging.held("down").state is SinkState.UNOPENED
    assert (down.opened, down.closed) == (1, 1)
    assert lagging.not_opened() == {"down": error}  # what the next batches lag with
    assert (
        f"pipeline p: sink 'down' opened, but the check of its target failed ({bug}): "
        "closed, it stays behind, opened and asked again at its next try"
    ) in caplog.text


class _Gated(ScriptedSink):
    """Cannot be reached at the start; its next ``open`` waits for :attr:`gate`, then
    opens (:attr:`reopening` set once it waits)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.gate = threading.Event()
        self.reopening = threading.Event()
        self.tries = 0

    def open(self, context: Any) -> None:
        self.tries += 1
        if self.tries == 1:
            raise SinkUnreachableError("connection refused", sink=self.name)
        self.reopening.set()
        assert self.gate.wait(WAIT_S)
        super().open(context)


def test_a_finished_reopen_wakes_the_catch_up(tmp_path: Path) -> None:
    """The catch-up starts a sink's reopen and does not wait for it (a check that hangs
    would stall the other sinks): it sleeps its probe interval. The reopen, once it has
    opened the sink, wakes it, and the sink's missed batch is written at once."""
    ledger, spool = MemoryLedger(), str(tmp_path / "spool")
    frames = {batch: SchemaFrame([batch, batch + 10]) for batch in range(2)}
    refused = ScriptedSink("down", always_fail=SinkWriteError("refused", sink="down"))
    before = FanOut("woken", ledger, [ScriptedSink("good"), _lag(refused)], backoff_s=0,
                    spool=spool, probe_interval_s=3600)  # fmt: skip
    try:  # down lags batches 0 and 1 (1 settles 0: a later batch was planned)
        for batch, frame in frames.items():
            before.process(frame, BatchInfo("woken", batch, "q"))
    finally:
        before.close()
    down = _Gated("down")
    fan = FanOut("woken", ledger, [ScriptedSink("good"), _lag(down)], backoff_s=0,
                 spool=spool, probe_interval_s=3600)  # fmt: skip
    _catch_up_from_memory(fan, frames)
    try:
        assert fan.lagging.held("down").state is SinkState.UNOPENED
        fan.catchup.start()  # no failure recorded yet: it tries down at once
        assert down.reopening.wait(WAIT_S)  # its reopen, started by the catch-up, waits
        assert down.calls == []
        down.gate.set()
        deadline = time.monotonic() + WOKEN_S
        while not down.calls and time.monotonic() < deadline:
            time.sleep(0.02)
        assert down.calls[:1] == [(0, 1)]  # its oldest missed batch, first attempt
    finally:
        down.gate.set()
        fan.close()


class _Fetching(ScriptedSink):
    """Cannot be reached until :attr:`reachable`; its ``open`` then fetches a token, one
    of its secrets from then on."""

    reachable = False

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.token: str | None = None

    def open(self, context: Any) -> None:
        if not self.reachable:
            raise SinkUnreachableError("connection refused", sink=self.name)
        super().open(context)
        self.token = FETCHED

    def secret_values(self) -> list[str]:
        return [] if self.token is None else [self.token]


class _Quoting(ScriptedSink):
    """Cannot be reached, its error quoting the token ``vault`` holds (none at the
    start); keeps the context of each ``open``."""

    def __init__(self, name: str, vault: _Fetching) -> None:
        super().__init__(name)
        self.vault = vault
        self.contexts: list[SinkContext] = []

    def open(self, context: Any) -> None:
        self.contexts.append(context)
        raise SinkUnreachableError(f"login with {self.vault.token} refused", sink=self.name)


def test_a_reopen_masks_a_secret_another_sinks_reopen_fetched(tmp_path: Path) -> None:
    """A reopen reads the pipeline's secrets when it runs, gathered again after each
    reopen that opened a sink: a secret the vault's open fetched is masked in the other
    sink's later open error (the error itself, not only its printed text) and is in that
    open's context."""
    vault = _Fetching("vault")
    other = _Quoting("other", vault)
    fan = FanOut("fetched", MemoryLedger(), [ScriptedSink("good"), _lag(vault), _lag(other)],
                 backoff_s=0, spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip
    fan.catchup.stop()
    try:
        assert FETCHED not in fan.secrets
        vault.reachable = True
        assert fan.lagging.reopen("vault") is None
        assert FETCHED in fan.secrets
        error = fan.lagging.reopen("other")
        said = "sink 'other': login with *** refused"
        assert isinstance(error, SinkUnreachableError) and str(error) == said
        assert not [e for e in error_chain(error) if FETCHED in str(e)]
        assert FETCHED in other.contexts[-1].secrets
        fan.process(SchemaFrame([1, 2]), BatchInfo("fetched", 0, "q"))  # other lags it
        assert fan.lagging.lags()["other"].error == f"SinkUnreachableError: {said}"
        failed = [e.error for e in fan.ledger.entries if e.status == "failed"]
        assert failed == [f"SinkUnreachableError: {said}"]
    finally:
        fan.close()
