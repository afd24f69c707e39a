"""The test fakes themselves (tests/unit/fakes.py): :class:`ScriptedSink` fails as a real
sink does, with a new exception at each failing attempt."""

from __future__ import annotations

from types import TracebackType
from typing import Any

import pytest

from fanout import Batch, SinkWriteError
from fanout.errors import SchemaMismatchError, StopRequestedError
from fanout.testing import make_batch
from tests.unit.fakes import ScriptedSink, fresh_error, same_error


def _frames(traceback: TracebackType | None) -> list[str]:
    """The names of the functions a traceback passes through, outermost first."""
    names = []
    while traceback is not None:
        names.append(traceback.tb_frame.f_code.co_name)
        traceback = traceback.tb_next
    return names


def _first_attempt(sink: ScriptedSink, batch: Batch) -> BaseException:
    try:
        sink.write(batch)
    except BaseException as error:
        return error
    raise AssertionError("the sink did not fail")


def _second_attempt(sink: ScriptedSink, batch: Batch) -> BaseException:
    try:
        sink.write(batch)
    except BaseException as error:
        return error
    raise AssertionError("the sink did not fail")


@pytest.mark.parametrize("scripted_as", ["always_fail", "fail twice"])
def test_two_failing_attempts_raise_two_errors_alike_each_with_its_own_frames(
    scripted_as: str,
) -> None:
    """Raising the one object given at every attempt made its ``__traceback__`` grow by each
    failed write's frames (and keep them alive); each attempt raises an error of its own."""
    down = SinkWriteError("down", sink="s", batch_id=3)
    if scripted_as == "always_fail":
        sink = ScriptedSink("s", always_fail=down)
    else:
        sink = ScriptedSink("s", fail=[down, down])
    batch = make_batch([{"id": 1}], sink_name="s")

    first, second = _first_attempt(sink, batch), _second_attempt(sink, batch)

    assert first is not second and down not in (first, second)
    for raised in (first, second):
        assert type(raised) is SinkWriteError and str(raised) == "sink 's', batch 3: down"
        assert (raised.args, raised.sink, raised.batch_id) == (down.args, "s", 3)
    assert "_first_attempt" in _frames(first.__traceback__)
    assert "_second_attempt" not in _frames(first.__traceback__)
    assert "_second_attempt" in _frames(second.__traceback__)
    assert "_first_attempt" not in _frames(second.__traceback__)
    assert down.__traceback__ is None  # the script itself is never raised


def test_a_class_or_a_callable_makes_the_error_and_the_fail_list_runs_out() -> None:
    """``fail`` and ``always_fail`` take an exception, its class or ``(batch) -> exception``;
    past ``fail``'s last error the write succeeds."""
    made: list[int] = []

    def refused(batch: Batch) -> BaseException:
        made.append(batch.batch_id)
        return SinkWriteError("refused", sink="s", batch_id=batch.batch_id)

    sink = ScriptedSink("s", fail=[TimeoutError, refused, ValueError("bad")], reads="arrow")
    batch = make_batch([{"id": 1}, {"id": 2}], batch_id=7, sink_name="s")
    raised = [_first_attempt(sink, batch) for _ in range(3)]
    assert [(type(e), str(e)) for e in raised] == [
        (TimeoutError, ""),
        (SinkWriteError, "sink 's', batch 7: refused"),
        (ValueError, "bad"),
    ]
    assert made == [7]
    assert sink.write(batch) == 2

    always = ScriptedSink("s", always_fail=refused)
    assert _first_attempt(always, batch) is not _first_attempt(always, batch)
    assert made == [7, 7, 7]
    assert type(_first_attempt(ScriptedSink("s", always_fail=OSError), batch)) is OSError


class _Prefixed(Exception):
    """An error whose ``__init__`` makes its message: called again with its ``args`` (what
    ``copy.copy`` does), it would prefix it twice."""

    def __init__(self, what: str) -> None:
        super().__init__(f"failed: {what}")


@pytest.mark.parametrize(
    "error",
    [
        _Prefixed("disk full"),
        SinkWriteError("down", sink="s", batch_id=1),  # keyword-only sink=: no copy.copy
        SchemaMismatchError("bad", sink="s", columns=["a"]),
        StopRequestedError("p", 4),  # its own __reduce__
        FileNotFoundError(2, "gone", "/x"),  # errno and filename are no plain attributes
        KeyboardInterrupt("stop"),
        ValueError("bad row 7"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_a_fresh_error_keeps_class_args_message_and_attributes(error: BaseException) -> None:
    fresh = fresh_error(error)
    assert fresh is not error and same_error(fresh, error)
    assert vars(fresh) == vars(error)
    assert (getattr(fresh, "errno", None), getattr(fresh, "filename", None)) == (
        getattr(error, "errno", None),
        getattr(error, "filename", None),
    )


def test_a_fresh_error_keeps_its_cause_and_notes_and_a_cause_that_is_itself() -> None:
    caused = SinkWriteError("down", sink="s")
    caused.__cause__ = root = OSError("no route")
    caused.add_note("first")
    fresh: Any = fresh_error(caused)
    assert fresh.__cause__ is root and fresh.__suppress_context__
    fresh.add_note("second")
    assert (caused.__notes__, fresh.__notes__) == (["first"], ["first", "second"])

    looped = SinkWriteError("disk full", sink="s")
    looped.__cause__ = looped  # what `raise looped from looped` leaves
    fresh = fresh_error(looped)
    assert fresh.__cause__ is fresh


def test_same_error_compares_class_args_and_message() -> None:
    error = SinkWriteError("down", sink="s")
    assert same_error(SinkWriteError("down", sink="s"), error)
    assert not same_error(SinkWriteError("down", sink="t"), error)
    assert not same_error(RuntimeError("sink 's': down"), error)
    assert not same_error(None, error)
