"""``fanout status --watch`` asks the pipeline file's sinks for their standing problems
(:meth:`fanout.Sink.standing_problems`, which may read each target) at its first draw and
then at most once a minute, not at every redraw: such a problem changes only by hand
(:class:`fanout.app.standing.SinkProblemsEvery`). No Spark; a real (delta-rs) ledger for
the command (``test_status_config``'s)."""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from pathlib import Path

import pytest
from fanout_delta.sink import DeltaSink

from fanout import Sink
from fanout.app.cli import main
from fanout.app.standing import SINKS_ASKED_EVERY_S, SinkProblemsEvery
from fanout.app.watch import watch
from tests.unit.test_status_config import _setup


class CountingSink(Sink):
    """A sink whose target has a standing problem that names how often it was asked."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.asked = 0

    def standing_problems(self) -> Sequence[str]:
        """One problem, numbered by the ask."""
        self.asked += 1
        return (f"sink {self.name!r}: problem seen at ask {self.asked}",)


def test_redraws_every_5_s_ask_the_sinks_at_the_first_draw_then_once_a_minute() -> None:
    """26 draws 5 s apart (0 .. 125 s): the sinks are asked at 0, 60 and 120 s; the draws
    between show the last answer. Before, each of the 26 draws asked each sink."""
    assert SINKS_ASKED_EVERY_S == 60.0
    now = [0.0]
    sinks = {"a": CountingSink("a"), "b": CountingSink("b")}
    problems = SinkProblemsEvery(sinks, clock=lambda: now[0])
    drawn: list[list[str]] = []

    def render() -> str:
        texts = [p.where + ": " + p.text for p in problems()]
        drawn.append(texts)
        return "\n".join(texts)

    def sleep(seconds: float) -> None:
        now[0] += seconds

    out = io.StringIO()
    assert watch(render, title="t", interval_s=5, out=out, count=26, sleep=sleep) == 0

    assert [s.asked for s in sinks.values()] == [3, 3]
    seen = [[f"{n}: sink '{n}': problem seen at ask {k}" for n in ("a", "b")] for k in (1, 2, 3)]
    assert drawn == [seen[0]] * 12 + [seen[1]] * 12 + [seen[2]] * 2
    assert out.getvalue().count("problem seen at ask 3") == 4  # 2 draws, 2 sinks


def test_a_sink_that_cannot_be_asked_is_asked_again_only_a_minute_later() -> None:
    """A sink whose ``standing_problems`` raises is left out of the draw (as before), and
    not asked again at the next redraw either."""
    calls: list[float] = []
    now = [0.0]

    class Failing(Sink):
        def standing_problems(self) -> Sequence[str]:
            calls.append(now[0])
            raise OSError("the store did not answer")

    problems = SinkProblemsEvery({"f": Failing("f")}, clock=lambda: now[0])
    for at in (0.0, 30.0, 59.9, 60.0, 61.0):
        now[0] = at
        assert problems() == []
    assert calls == [0.0, 60.0]


def test_status_watch_of_a_pipeline_file_asks_each_sink_once_for_three_quick_draws(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fanout status --config --watch --count 3 --interval 0``: the Delta sinks of the
    file are asked once each (the first draw), and every draw shows their problem."""
    config = _setup(tmp_path)  # sinks a, b and c
    asked: list[str] = []

    def counted(sink: DeltaSink) -> Sequence[str]:
        asked.append(sink.name)
        return (f"sink {sink.name!r} table: a problem to fix by hand",)

    monkeypatch.setattr(DeltaSink, "standing_problems", counted)
    argv = ["status", "--config", config, "--watch", "--count", "3", "--interval", "0"]

    assert main(argv) == 0

    assert asked == ["a", "b", "c"]
    draws = re.split(r"\n(?=fanout status --config )", capsys.readouterr().out)
    assert len(draws) == 3
    for draw in draws:
        footer = draw.split("\n\nto fix by hand:\n", 1)[1].split("\n\n")[0]
        assert footer.splitlines() == [
            "sink 'a' table: a problem to fix by hand",
            "sink 'b' table: a problem to fix by hand",
            "sink 'c' table: a problem to fix by hand",
        ]
