"""A lag sink's open/lost state is one value, moved by one method that checks the move
(fanout/steps/lag_state.py; docs/architecture.md §5, "A lagging sink whose open() failed")."""

from __future__ import annotations

import itertools
import threading

import pytest

from fanout import SinkUnreachableError, TargetLostError
from fanout.contract.sink import SinkContext
from fanout.ledger.memory import MemoryLedger
from fanout.sink_spec import SinkSpec, lag_policy
from fanout.steps.lag import Lagging
from fanout.steps.lag_reopen import ReopenHooks
from fanout.steps.lag_state import (
    MOVES,
    Held,
    Lost,
    Open,
    Opening,
    Reopening,
    SinkState,
    SinkStateError,
    SinkStates,
    Unopened,
)
from tests.unit.fakes import ScriptedSink

CONTEXT = SinkContext("p")
DOWN = SinkUnreachableError("connection refused", sink="down")
GONE = TargetLostError("table gone", sink="down", batch_id=0)
ALLOWED = {
    (SinkState.UNOPENED, SinkState.OPENING),
    (SinkState.OPENING, SinkState.OPENING),
    (SinkState.OPENING, SinkState.UNOPENED),
    (SinkState.OPENING, SinkState.OPEN),
    (SinkState.OPENING, SinkState.LOST),
    (SinkState.OPEN, SinkState.LOST),
    (SinkState.LOST, SinkState.LOST),
}


def _held(state: SinkState, opening: Opening) -> Held:
    return {
        SinkState.OPEN: Open(),
        SinkState.UNOPENED: Unopened(CONTEXT, DOWN),
        SinkState.OPENING: Reopening(CONTEXT, DOWN, opening),
        SinkState.LOST: Lost(GONE),
    }[state]


def _states_in(state: SinkState, opening: Opening) -> SinkStates:
    """A ``down`` sink put in ``state`` by allowed moves only."""
    states = SinkStates(threading.RLock(), ["down"], {"down": (CONTEXT, DOWN)})
    path = {
        SinkState.UNOPENED: [],
        SinkState.OPENING: [SinkState.OPENING],
        SinkState.OPEN: [SinkState.OPENING, SinkState.OPEN],
        SinkState.LOST: [SinkState.OPENING, SinkState.LOST],
    }[state]
    for step in path:
        states.move("down", _held(step, opening))
    assert states.of("down").state is state
    return states


def test_the_moves_allowed_are_those_of_the_lag_state_design() -> None:
    assert MOVES == ALLOWED


@pytest.mark.parametrize("was,to", sorted(ALLOWED, key=str))
def test_every_allowed_move_puts_the_sink_in_its_new_state(was: SinkState, to: SinkState) -> None:
    opening = Opening()
    states = _states_in(was, opening)
    target = _held(to, opening)
    left = states.move("down", target)
    assert left.state is was
    assert states.of("down") is target


DISALLOWED = sorted(set(itertools.product(SinkState, SinkState)) - ALLOWED, key=str)


@pytest.mark.parametrize("was,to", DISALLOWED)
def test_every_other_move_raises_naming_the_sink_and_both_states(
    was: SinkState, to: SinkState
) -> None:
    opening = Opening()
    states = _states_in(was, opening)
    before = states.of("down")
    with pytest.raises(SinkStateError) as refused:
        states.move("down", _held(to, opening))
    assert str(refused.value) == (
        f"sink 'down': its lag state cannot move from {was.value} to {to.value} "
        "(a bug in fanout: please report it)"
    )
    assert isinstance(refused.value, AssertionError)
    assert (refused.value.sink, refused.value.was, refused.value.to) == ("down", was, to)
    assert states.of("down") is before  # not moved


def test_nine_disallowed_moves_and_seven_allowed_cover_every_pair() -> None:
    assert (len(ALLOWED), len(DISALLOWED)) == (7, 9)


def _lagging() -> tuple[Lagging, ScriptedSink]:
    sink = ScriptedSink("down")
    spec = SinkSpec(sink, lag=lag_policy("down", {"on_failure": "lag"}))
    lagging = Lagging(
        "p", {"down": spec}, MemoryLedger(), None, unopened={"down": (CONTEXT, DOWN)},
        reopen_hooks=ReopenHooks(ask_target=lambda name: GONE),
    )  # fmt: skip
    return lagging, sink


def test_the_lag_state_keeps_no_second_container_of_unopened_or_lost_sinks() -> None:
    """The reviewer's race (hold_back read ``lost`` and ``unopened`` apart while a
    reopen's thread moved the sink from one to the other) came from two containers: the
    old ``Lagging.lost``, ``Lagging.unopened`` and ``Lagging._opening`` are gone, and one
    :class:`SinkStates` answers every question."""
    lagging, _ = _lagging()
    assert not hasattr(lagging, "lost") and not hasattr(lagging, "_opening")
    assert not isinstance(getattr(lagging, "unopened", None), dict)
    assert [name for name, v in vars(lagging).items() if isinstance(v, SinkStates)] == ["_states"]
    assert lagging.not_opened() == {"down": DOWN}


def test_a_reader_never_sees_a_lost_target_open_while_its_reopen_moves_it() -> None:
    """A reopen whose check finds the target lost moves the sink UNOPENED, OPENING, LOST
    in its own thread; a reader asking meanwhile (as hold_back does, one question) never
    finds it open."""
    seen: set[tuple[SinkState, bool]] = set()
    for _ in range(200):
        lagging, sink = _lagging()
        done = threading.Event()

        def read(lagging: Lagging = lagging, done: threading.Event = done) -> None:
            while not done.is_set():
                seen.add((lagging.held("down").state, lagging.closed("down")))

        reader = threading.Thread(target=read)
        reader.start()
        try:
            assert lagging.reopen("down", wait=True) is GONE
        finally:
            done.set()
            reader.join(10)
        assert isinstance(lagging.held("down"), Lost) and sink.opened == 1
    assert {closed for _, closed in seen} == {True}
    assert {state for state, _ in seen} <= {
        SinkState.UNOPENED,
        SinkState.OPENING,
        SinkState.LOST,
    }
