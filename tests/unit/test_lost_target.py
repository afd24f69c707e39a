"""The check at a run's first batch (fanout.steps.lost_target): which batch each sink is
asked about (its last mark, else its last mark that wrote rows: not an empty batch's, not a
skip's), what passes (cannot tell, accepted, no mark that wrote rows), and the refusal's
text (a memory ledger, fake sinks: the real sinks are tested against their services)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fanout import Sink, TargetLostError
from fanout.app.cli import build_parser
from fanout.ledger.entry import LedgerEntry
from fanout.ledger.gaps import skip_batches
from fanout.ledger.memory import MemoryLedger
from fanout.steps.lost_target import refuse_lost_targets


class Target(Sink):
    """Holds the batches in ``held`` (``None``: cannot tell); records what it was asked."""

    def __init__(self, name: str, held: set[int] | None, path: str = "/data/silver") -> None:
        super().__init__(name)
        self.held, self.path, self.asked = held, path, []

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool | None:
        self.asked.append((epoch, batch_id))
        return None if self.held is None else batch_id in self.held


def _ledger(rows: dict[str, list[int]]) -> MemoryLedger:
    """Marks of epoch 0, batch by batch, each with its row count."""
    ledger = MemoryLedger()
    for sink, counts in rows.items():
        for batch, count in enumerate(counts):
            ledger.mark_committed(LedgerEntry("p", sink, batch, "committed", rows=count))
    return ledger


def _check(ledger: MemoryLedger, *sinks: Target, accepted: tuple[str, ...] = ()) -> None:
    named = {s.name: s for s in sinks}
    refuse_lost_targets("p", 0, ledger, named, ledger.last_committed("p", named), accepted)


def test_a_target_without_its_last_mark_is_refused_naming_sink_target_and_batch() -> None:
    ledger = _ledger({"a": [3, 3], "b": [3, 3]})
    a, b = Target("a", {0, 1}), Target("b", set(), path="/data/gold")
    with pytest.raises(TargetLostError) as refused:
        _check(ledger, a, b)
    assert (refused.value.sink, refused.value.batch_id) == ("b", 1)
    assert str(refused.value).startswith(
        "sink 'b', batch 1: pipeline 'p': path '/data/gold' no longer holds batch 1 of epoch "
        "0, which the ledger marks written there (its last marked batch that wrote rows): "
        "the target was probably deleted or replaced since, and created again empty "
        "(create_table, create_topic, or a Delta table written anew)."
    )
    assert "`fanout run PIPELINE.toml --accept-lost-target b`" in str(refused.value)
    assert "FanOut(accept_lost_targets=['b'])" in str(refused.value)
    assert a.asked == [(0, 1)] and b.asked == [
        (0, 1),
    ]


def test_the_refusal_under_fanout_run_names_the_pipeline_file_in_its_command() -> None:
    """Under `fanout run /abs/p.toml` the refusal said `fanout run PIPELINE.toml
    --accept-lost-target b`, where the reset's and the lag's refusals name the file."""
    ledger = _ledger({"b": [3]})
    named = {"b": Target("b", set(), path="/data/gold")}
    with pytest.raises(TargetLostError) as refused:
        refuse_lost_targets("p", 0, ledger, named, ledger.last_committed("p", named),
                            pipeline_file="/work/p.toml")  # fmt: skip
    ways = str(refused.value).splitlines()[1]
    assert ways.startswith(
        "Ways on: restore the target (from a backup or the storage's history: a Delta table's "
        "RESTORE, a PostgreSQL dump, the topic's mirror), then start again; or accept the loss "
        "explicitly for this run: `fanout run /work/p.toml --accept-lost-target b`, which "
        "writes on from the next batch into the target as it is (the ledger at "
    )


def test_an_empty_last_batch_is_passed_over_for_the_last_that_wrote_rows() -> None:
    ledger = _ledger({"a": [3, 2, 0, 0]})
    held = Target("a", {1})  # an empty batch commits nothing: the target holds up to 1
    _check(ledger, held)
    assert held.asked == [(0, 3), (0, 1)]
    lost = Target("a", set())
    with pytest.raises(TargetLostError, match="no longer holds batch 1 of epoch 0"):
        _check(ledger, lost)


def test_a_skip_mark_is_passed_over_and_a_sink_that_never_wrote_rows_passes() -> None:
    ledger = _ledger({"a": [3, 3], "b": [0, 0], "c": [3, 3, 3, 3, 3]})
    skip_batches(ledger, "p", "a", 4)  # a never gets 2-4: its mark 4 wrote nothing
    a, b, c = Target("a", {0, 1}), Target("b", set()), Target("c", {0, 1, 2, 3, 4})
    _check(ledger, a, b, c)
    assert a.asked == [(0, 4), (0, 1)] and b.asked == [(0, 1)] and c.asked == [(0, 4)]


def test_cannot_tell_a_failing_hook_and_an_accepted_sink_pass(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Failing(Target):
        def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool | None:
            raise OSError("unreachable")

    ledger = _ledger({"a": [1], "b": [1], "c": [1]})
    accepted = Target("c", set())
    with caplog.at_level(logging.WARNING, logger="fanout"):
        _check(ledger, Target("a", None), Failing("b", set()), accepted, accepted=("c",))
    assert accepted.asked == [(0, 0)]  # asked: an accepted sink must have lost it
    assert [r.getMessage() for r in caplog.records] == [
        "pipeline p, sink b: cannot tell whether its target still holds batch 0 of epoch 0: "
        "OSError: unreachable",
        "pipeline p, sink c: its target no longer holds batch 0 of epoch 0; accepted "
        "(accept_lost_targets): the batches marked written there stay lost from it",
    ]


def test_an_accepted_sink_whose_target_holds_its_mark_is_told_to_drop_the_flag(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The flag left on a later command line (a script): the target holds its last mark,
    so there is nothing to accept; it is asked all the same (before, an accepted sink was
    not asked at all, and a later loss of its target went unseen without a word)."""
    ledger = _ledger({"a": [3, 0]})
    held = Target("a", {0})  # its last mark is an empty batch: batch 0 is asked next
    with caplog.at_level(logging.WARNING, logger="fanout"):
        _check(ledger, held, accepted=("a",))
        _check(ledger, Target("a", None), accepted=("a",))  # cannot tell: no word
    assert held.asked == [(0, 1), (0, 0)]
    assert [r.getMessage() for r in caplog.records] == [
        "pipeline p, sink a: accept_lost_targets (--accept-lost-target a): path "
        "'/data/silver' holds batch 0 of epoch 0, which the ledger marks written there: there "
        "is no loss to accept at the start: drop the flag, unless the sink's refusal of a "
        "replayed batch named it (left on, it accepts this target's next loss unseen)"
    ]


def test_fanout_run_takes_accept_lost_target_once_per_sink() -> None:
    args = build_parser().parse_args(
        ["run", "p.toml", "--accept-lost-target", "a", "--accept-lost-target", "b"]
    )
    assert args.accept_lost_target == ["a", "b"]
    assert build_parser().parse_args(["run", "p.toml"]).accept_lost_target is None


def test_a_timed_sink_that_does_not_answer_in_time_passes_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No answer within write_timeout_s is "cannot tell" here (a new epoch's check refuses
    the start instead): the run goes on; the question ran in its own named thread."""
    import threading

    release = threading.Event()
    threads: list[str] = []

    class Hung(Target):
        def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool | None:
            threads.append(threading.current_thread().name)
            release.wait(10)
            return False

    ledger = _ledger({"a": [1]})
    named = {"a": Hung("a", set())}
    try:
        with caplog.at_level(logging.WARNING, logger="fanout"):
            refuse_lost_targets(
                "p", 0, ledger, named, ledger.last_committed("p", named), (), {"a": 0.2}
            )
    finally:
        release.set()
    assert threads == ["fanout-p-a-holds-batch"]
    assert [r.getMessage() for r in caplog.records] == [
        "pipeline p, sink a: cannot tell within its write_timeout_s=0.2 s whether its "
        "target still holds batch 0 of epoch 0"
    ]


def test_fanout_run_names_the_flag_and_the_sinks_for_an_accepted_sink_it_lacks(
    tmp_path: Path,
) -> None:
    """A real ``python -m fanout run``, refused before Spark starts (before, the FanOut's
    check said ``accept_lost_targets``, a name the CLI user never typed, once Spark and
    the source were up)."""
    config = tmp_path / "pipeline.toml"
    config.write_text(
        f'[pipeline]\nname = "clicks"\nledger = "{tmp_path}/ledger"\n'
        f'checkpoint = "{tmp_path}/ck"\n[source]\nformat = "rate"\n'
        f'[[sinks]]\ntype = "delta"\nname = "bronze"\npath = "{tmp_path}/bronze"\n'
        f'[[sinks]]\ntype = "delta"\nname = "gold"\npath = "{tmp_path}/gold"\n'
    )
    flags = [f"--accept-lost-target={name}" for name in ("bronz", "silver", "gold")]
    done = subprocess.run(
        [sys.executable, "-m", "fanout", "run", str(config), *flags],
        capture_output=True, text=True, timeout=300, env=dict(os.environ),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"fanout: configuration error: --accept-lost-target bronz: pipeline 'clicks' ({config}) "
        "has no sink 'bronz', did you mean bronze?\n"
        f"--accept-lost-target silver: pipeline 'clicks' ({config}) has no sink 'silver'\n"
        "Its sinks: bronze, gold\n"
    )
    assert not (tmp_path / "ledger").exists() and not (tmp_path / "ck").exists()


class Replaced(Target):
    """A :class:`Target` that also tells whether its target was replaced: ``reason`` (or,
    ``None``, not replaced); ``fails``: its hook raises; ``hangs``: it blocks until
    ``release`` is set. Records what the hook was asked (and in which thread)."""

    def __init__(
        self,
        name: str,
        held: set[int] | None,
        reason: str | None = None,
        *,
        fails: bool = False,
        secret: str = "s3cr3t",
    ) -> None:
        super().__init__(name, held)
        self.reason, self.fails, self.secret = reason, fails, secret
        self.replaced_asked: list[tuple[int, int, str]] = []
        self.hangs: Any = None

    def target_replaced(self, pipeline: str, epoch: int, batch_id: int) -> str | None:
        import threading

        self.replaced_asked.append((epoch, batch_id, threading.current_thread().name))
        if self.hangs is not None:
            self.hangs.wait(10)
        if self.fails:
            raise OSError(f"cannot read the identity (password {self.secret})")
        return self.reason

    def secret_values(self) -> list[str]:
        return [self.secret]


def test_a_replaced_target_is_refused_quoting_the_reason_masked_of_secrets() -> None:
    """Its records say it holds batch 1 (holds_batch True), its identity says it is another
    table, empty: refused as a False is, the reason quoted, the secret in it masked."""
    ledger = _ledger({"a": [3, 3]})
    a = Replaced("a", {0, 1}, "table t has OID 7 now, not 5 (s3cr3t), and holds no row")
    with pytest.raises(TargetLostError) as refused:
        _check(ledger, a)
    assert (refused.value.sink, refused.value.batch_id) == ("a", 1)
    assert str(refused.value).startswith(
        "sink 'a', batch 1: pipeline 'p': path '/data/silver' no longer holds batch 1 of "
        "epoch 0, which the ledger marks written there (its last marked batch that wrote "
        "rows): the target was replaced since by one created again empty: table t has OID 7 "
        "now, not 5 (***), and holds no row. The batches the ledger counts for it are gone"
    )
    assert "s3cr3t" not in str(refused.value)
    assert a.asked == [(0, 1)] and [q[:2] for q in a.replaced_asked] == [(0, 1)]


def test_not_replaced_leaves_holds_batch_to_decide_and_a_false_is_not_asked_again() -> None:
    ledger = _ledger({"held": [3, 3], "lost": [3, 3]})
    held, lost = Replaced("held", {0, 1}), Replaced("lost", set(), "never asked")
    with pytest.raises(TargetLostError) as refused:
        _check(ledger, held, lost)
    assert refused.value.sink == "lost"
    assert "the target was probably deleted or replaced since" in str(refused.value)
    assert [q[:2] for q in held.replaced_asked] == [(0, 1)]
    assert lost.replaced_asked == []  # holds_batch said False: nothing more to tell
    _check(_ledger({"held": [3, 3]}), held)  # alone, it passes


def test_a_replaced_target_of_a_lagging_or_accepted_sink_lags_or_is_accepted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger = _ledger({"lag": [3], "ok": [3]})
    lag, ok = Replaced("lag", {0}, "topic t has id B now"), Replaced("ok", {0}, "topic u: id C")
    named = {"lag": lag, "ok": ok}
    with caplog.at_level(logging.WARNING, logger="fanout"):
        lost = refuse_lost_targets(
            "p", 0, ledger, named, ledger.last_committed("p", named), ["ok"], lags=["lag"]
        )
    assert list(lost) == ["lag"]
    assert "created again empty: topic t has id B now. The batches the ledger" in str(lost["lag"])
    assert "with on_failure='lag' it lags" in str(lost["lag"])
    assert [r.getMessage() for r in caplog.records][-1] == (
        "pipeline p, sink ok: its target no longer holds batch 0 of epoch 0 (topic u: id C); "
        "accepted (accept_lost_targets): the batches marked written there stay lost from it"
    )


def test_a_replaced_check_that_raises_or_does_not_answer_in_time_cannot_tell(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The hook failing (its error masked) or not answering within write_timeout_s: logged,
    holds_batch's True stands, the run goes on; the timed one ran in its own thread."""
    import threading

    ledger = _ledger({"fails": [3], "hangs": [3]})
    fails = Replaced("fails", {0}, "never returned", fails=True)
    hangs = Replaced("hangs", {0}, "returned too late")
    hangs.hangs = threading.Event()
    named = {"fails": fails, "hangs": hangs}
    try:
        with caplog.at_level(logging.WARNING, logger="fanout"):
            lost = refuse_lost_targets(
                "p", 0, ledger, named, ledger.last_committed("p", named), (), {"hangs": 0.2}
            )
    finally:
        hangs.hangs.set()
    assert lost == {}
    assert [r.getMessage() for r in caplog.records] == [
        "pipeline p, sink fails: cannot tell whether its target is still the one batch 0 of "
        "epoch 0 was written to: OSError: cannot read the identity (password ***)",
        "pipeline p, sink hangs: cannot tell within its write_timeout_s=0.2 s whether its "
        "target is still the one batch 0 of epoch 0 was written to",
    ]
    assert [q[2] for q in hangs.replaced_asked] == ["fanout-p-hangs-target-replaced"]


def test_a_sink_whose_holds_batch_did_not_answer_in_time_is_not_asked_its_identity() -> None:
    """Its service hangs: the identity check would be waited for a second time."""
    import threading

    release = threading.Event()

    class HungHolds(Replaced):
        def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool | None:
            release.wait(10)
            return True

    ledger = _ledger({"a": [1]})
    named = {"a": HungHolds("a", {0}, "never asked")}
    try:
        lost = refuse_lost_targets(
            "p", 0, ledger, named, ledger.last_committed("p", named), (), {"a": 0.2}
        )
    finally:
        release.set()
    assert lost == {} and named["a"].replaced_asked == []


@pytest.mark.parametrize("reason", ["", "  "])
def test_an_empty_reason_is_still_a_replaced_target_refused_saying_none_was_given(
    reason: str,
) -> None:
    """``""`` is no ``None``: the sink said replaced. The refusal quoted nothing ("...
    created again empty: . The batches..."); it now says the sink gave no reason."""
    ledger = _ledger({"a": [3, 3]})
    with pytest.raises(TargetLostError) as refused:
        _check(ledger, Replaced("a", {0, 1}, reason))
    assert str(refused.value).startswith(
        "sink 'a', batch 1: pipeline 'p': path '/data/silver' no longer holds batch 1 of "
        "epoch 0, which the ledger marks written there (its last marked batch that wrote "
        "rows): the target was replaced since by one created again empty: the sink gave no "
        "reason (its target_replaced answered an empty text). The batches the ledger counts "
        "for it are gone"
    )
