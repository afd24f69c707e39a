"""The check at a run's first batch for a sink renamed between a crash and its replay
(fanout.steps.renamed): who is asked (only a sink without a mark in the epoch, only about a
sink the ledger names that is no longer configured, about the batch after its last mark),
what refuses (held, whole or part), what only warns (cannot tell, an error, no answer in
time, a harmless rewrite) and the refusal's text (a memory ledger, fake sinks: the real
sinks' answers are tested against their services)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from fanout import PartlyHeld, Sink
from fanout.ledger.entry import LedgerEntry
from fanout.ledger.memory import MemoryLedger
from fanout.steps.renamed import RenamedSinkError, refuse_renamed

Answer = bool | PartlyHeld | None


class Target(Sink):
    """Answers ``holds_batch_of`` with ``answer`` (raised when an exception); records the
    questions."""

    def __init__(self, name: str, answer: Answer | Exception = True, *, harmless: str | None = None,
                 wait_s: float = 0.0) -> None:  # fmt: skip
        super().__init__(name)
        self.answer, self.harmless, self.wait_s = answer, harmless, wait_s
        self.path = "/data/orders"
        self.asked: list[tuple[str, int, int]] = []

    def holds_batch_of(self, sink_name: str, pipeline: str, epoch: int, batch_id: int) -> Answer:
        self.asked.append((sink_name, epoch, batch_id))
        time.sleep(self.wait_s)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def harmless_rewrite(self) -> str | None:
        return self.harmless


def _ledger(marks: dict[str, list[int]], epoch: int = 0) -> MemoryLedger:
    ledger = MemoryLedger()
    for sink, batches in marks.items():
        for batch in batches:
            ledger.mark_committed(LedgerEntry("p", sink, batch, "committed", rows=1, epoch=epoch))
    return ledger


def _check(ledger: MemoryLedger, *sinks: Sink, batch: int = 3, epoch: int = 0,
           timeouts: dict[str, float] | None = None) -> dict[str, RenamedSinkError]:  # fmt: skip
    named = {s.name: s for s in sinks}
    marks = ledger.last_committed("p", named, epoch)
    return refuse_renamed("p", epoch, batch, ledger, named, named, marks, timeouts)


def test_a_new_sink_holding_a_vanished_sinks_next_batch_is_refused_naming_both() -> None:
    new, keep = Target("new"), Target("keep")
    refused = _check(_ledger({"keep": [0, 1, 2, 3], "old": [0, 1, 2]}), keep, new)
    assert set(refused) == {"new"} and new.asked == [("old", 0, 3)] and keep.asked == []
    text = str(refused["new"])
    assert text.startswith(
        "sink 'new', batch 3: path '/data/orders' holds batch 3 of sink 'old' (epoch 0, its "
        "records keyed 'fanout/p/old'), a sink the pipeline no longer configures, and sink "
        "'new' has no mark in the epoch. "
    )
    assert "rename the sink back to 'old' and restart" in text
    assert "or remove batch 3 of 'old' from the target" in text
    assert (refused["new"].sink, refused["new"].batch_id) == ("new", 3)
    part = _check(_ledger({"old": [0, 1, 2]}), Target("new", PartlyHeld(1, 2)))
    assert "holds batch 3 of sink 'old' (part of it: some of its partitions)" in str(part["new"])


def test_nothing_is_asked_without_both_a_new_sink_and_a_vanished_one() -> None:
    marked = Target("old")  # every configured sink has a mark: no question, no ledger scan
    assert _check(_ledger({"old": [0, 1, 2], "gone": [0]}), marked) == {}
    new = Target("new")  # a new sink, no sink gone
    assert _check(_ledger({"keep": [0, 1, 2]}), Target("keep"), new) == {}
    assert marked.asked == [] and new.asked == []


def test_a_vanished_sink_without_a_mark_in_the_epoch_is_asked_about_the_runs_first_batch() -> None:
    ledger = _ledger({"old": [0, 1]})  # epoch 0; the run is in epoch 1, where nobody marked
    new = Target("new", False)
    assert _check(ledger, new, batch=5, epoch=1) == {}
    assert new.asked == [("old", 1, 5)]


def test_cannot_tell_an_error_no_answer_in_time_and_a_harmless_rewrite_only_warn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger = _ledger({"old": [0, 1, 2]})
    caplog.set_level(logging.WARNING, logger="fanout")
    assert _check(ledger, Target("new", None)) == {}
    said = (
        "pipeline p, sink new: cannot tell whether its target holds batch 3 of epoch 0 "
        "written by sink 'old', which the pipeline no longer configures. If 'new' is 'old' "
        "renamed"
    )
    assert said in caplog.text
    assert _check(ledger, Target("new", OSError("marker topic gone"))) == {}
    assert "no longer configures: OSError: marker topic gone. If 'new'" in caplog.text
    slow = Target("new", True, wait_s=1.0)
    assert _check(ledger, slow, timeouts={"new": 0.1}) == {}
    assert "cannot tell within its write_timeout_s=0.1 s whether its target" in caplog.text
    assert _check(ledger, Target("new", harmless="it upserts by key")) == {}
    harmless = (
        "holds batch 3 of sink 'old' (epoch 0, its records keyed 'fanout/p/old'), a sink the "
        "pipeline no longer configures, and sink 'new' has no mark in the epoch; it upserts "
        "by key, so writing the batch again is harmless: writing it"
    )
    assert harmless in caplog.text


def test_a_sink_type_without_the_hook_is_not_asked() -> None:
    plain = Sink("new")  # the default hook (cannot tell): not asked, no warning
    assert _check(_ledger({"old": [0]}), plain) == {}


class Holds(Target):
    """Answers ``holds_batch_of`` from the batches ``held`` it holds of each other sink's
    name (``>=``, as the built-in sinks read their records: a later batch holds it too)."""

    def __init__(self, name: str, held: dict[str, int]) -> None:
        super().__init__(name)
        self.held = held

    def holds_batch_of(self, sink_name: str, pipeline: str, epoch: int, batch_id: int) -> Answer:
        self.asked.append((sink_name, epoch, batch_id))
        return self.held.get(sink_name, -1) >= batch_id


def test_the_question_is_about_the_batch_the_new_sink_would_write() -> None:
    # an orphan batch of a sink removed long ago (committed 3, never marked; the pipeline
    # went on to batch 10 without it): a new sink on that target writes batch 10, not 3
    ledger = _ledger({"keep": list(range(10)), "old": [0, 1, 2]})
    new = Holds("new", {"old": 3})
    assert _check(ledger, Target("keep"), new, batch=10) == {}
    assert new.asked == []  # old's last mark 2: it cannot have written batch 10
    # killed after every sink marked batch 3, before Spark's commit: Spark replays 3, and
    # 'old' renamed 'new' would write it again where 'old' committed (and marked) it
    marked = _ledger({"keep": [0, 1, 2, 3], "old": [0, 1, 2, 3]})
    again = Holds("new", {"old": 3})
    refused = _check(marked, Target("keep"), again, batch=3)
    assert set(refused) == {"new"} and again.asked == [("old", 0, 3)]
    assert "holds batch 3 of sink 'old'" in str(refused["new"])


def test_the_check_runs_after_a_catch_up_checked_the_targets_first(tmp_path: Path) -> None:
    # a pipeline with a sink that can lag: `fanout run` (start_catch_up) and catch_up()
    # check the targets before the first batch; the renamed check must still run there
    from fanout import BatchFailedError, FanOut
    from fanout.contract.batch import BatchInfo
    from fanout.sink_spec import SinkSpec, lag_policy
    from tests.unit.fakes import SchemaFrame, ScriptedSink

    class New(ScriptedSink):
        def holds_batch_of(self, sink_name: str, pipeline: str, epoch: int,
                           batch_id: int) -> Answer:  # fmt: skip
            return sink_name == "old" and batch_id <= 2

    ledger = _ledger({"keep": [0, 1], "slow": [0, 1], "old": [0, 1]})
    new, slow = New("new"), ScriptedSink("slow")
    spec = SinkSpec(slow, lag=lag_policy("slow", {"on_failure": "lag"}))
    fan = FanOut("p", ledger, [ScriptedSink("keep"), spec, new], backoff_s=0,
                 spool=str(tmp_path / "spool"), probe_interval_s=3600)  # fmt: skip
    try:
        fan.catchup.stop()
        fan.catch_up(timeout_s=5)
        with pytest.raises(BatchFailedError) as refused:
            fan.process(SchemaFrame([20, 21]), BatchInfo("p", 2, "q"))
        assert set(refused.value.failures) == {"new"}
        assert new.calls == []
    finally:
        fan.close()


def test_the_three_checks_raise_one_class_with_one_advice(monkeypatch: pytest.MonkeyPatch) -> None:
    # the core's start check, the Delta sink's and the PostgreSQL append sink's own checks
    # at a first write (their lookups stubbed: their services are tested in the plugins)
    import fanout_delta.plans
    import fanout_postgres.replay_refusals as pg_refusals
    import fanout_postgres.sink as pg
    from fanout_delta.fence import RenamedSinkError as DeltaRenamed
    from fanout_delta.fence import refuse_vanished_sink
    from fanout_delta.plans import CommitPlan
    from fanout_kafka import KafkaSink

    import fanout
    from fanout.contract.batch import Batch, BatchInfo

    assert RenamedSinkError is DeltaRenamed is fanout.RenamedSinkError  # the old paths
    assert issubclass(RenamedSinkError, fanout.SinkWriteError)
    ways = (
        "twice, so nothing was written. Either rename the sink back to 'old' and restart: the "
        "replay skips what {} holds of the batch and the pipeline completes it; or rename "
        "it once batch 1 is marked (the new name then starts after it)"
    )
    errors: dict[str, Exception] = {}
    refused = _check(_ledger({"old": [0]}), Target("new"), batch=1)
    errors["core"] = refused["new"]

    class Topic(Target):
        batch_removable = KafkaSink.batch_removable  # a topic keeps what it committed

    errors["kafka"] = _check(_ledger({"old": [0]}), Topic("new"), batch=1)["new"]
    batch = Batch(None, BatchInfo("p", 1), "new", "fanout/p/new")
    plan = CommitPlan("fanout/p/old", 1, 0, None, version=7)
    monkeypatch.setattr(fanout_delta.plans, "vanished_sink_commit", lambda *a: plan)
    monkeypatch.setattr("fanout.delta_tables.io.latest_version", lambda table: table.version())
    with pytest.raises(RenamedSinkError) as delta:
        newest = type("Table", (), {"version": lambda self: 7})()  # the batch's commit, newest
        refuse_vanished_sink(newest, batch, "new", "/lake/t", ["new"], False)  # type: ignore[arg-type]
    errors["delta"] = delta.value
    monkeypatch.setattr(pg_refusals, "vanished_sink_marks", lambda *a: ("old", 1, [0, 1]))
    sink = pg.PostgresSink("new", url="postgresql://h/db", table="orders", mode="append")
    sink._table = type(
        "T", (), {"quoted": lambda self: '"orders"', "__str__": lambda self: "'orders'"}
    )()
    with pytest.raises(RenamedSinkError) as postgres:
        pg_refusals.refuse_vanished_sink(None, sink._own_records(), batch, ("new",), sink._dead)
    errors["postgres"] = postgres.value
    targets = {"core": "path '/data/orders'", "kafka": "path '/data/orders'",
               "delta": "the Delta table /lake/t", "postgres": "table 'orders'"}  # fmt: skip
    for path, error in errors.items():
        assert type(error) is RenamedSinkError, path
        assert (error.sink, error.batch_id) == ("new", 1), path
        assert ways.format(targets[path]) in str(error), path
    assert str(errors["core"]).endswith(
        ways.format(targets["core"]) + "; or remove batch 1 of 'old' from the target the way "
        "this check passes over (for a Delta table: RESTORE it to the version before the "
        "batch's commit, or, when that commit created the table, version 0, delete the table; "
        "only while that commit is the table's newest: later ones, other sinks' marked "
        "batches, would go with it; deleting the batch's rows is no way on, the table still "
        "records the batch and this check refuses again) and restart"
    )
    assert str(errors["delta"]).endswith(
        "; or to have the batch written under the new name, restore the table to version 6 "
        "(the batch's rows out; delta-rs: DeltaTable(path).restore(6); Spark SQL: RESTORE "
        "TABLE delta.`/lake/t` TO VERSION AS OF 6) and restart"
    )
    for path in ("kafka", "postgres"):  # renaming back is the only way on
        assert str(errors[path]).endswith(ways.format(targets[path])), path
        assert "or remove batch" not in str(errors[path]), path


def test_a_vanished_sink_the_spool_keeps_batches_for_is_asked_about_its_last_mark(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A sink renamed while it lagged (docs/architecture.md §5): the spool keeps batches 4
    and 5 for 'old', whose last mark is 3, and the run's first batch is 6. The new name,
    on the same target, would write 6 on and never 4 and 5: refused, whatever its
    harmless_rewrite says (they would be missing, not written twice)."""
    from fanout.steps.renamed import Spooled

    ledger = _ledger({"keep": list(range(6)), "old": [0, 1, 2, 3]})
    spooled = Spooled("/spool", "/ledger", {"old": [2, 4, 5], "keep": [5]})

    def check(new: Sink, kept: Spooled | None = spooled) -> dict[str, RenamedSinkError]:
        named = {"keep": Target("keep"), new.name: new}
        marks = ledger.last_committed("p", named, 0)
        return refuse_renamed("p", 0, 6, ledger, named, named, marks, None, kept)

    same = Holds("new", {"old": 3})
    refused = check(same)
    assert same.asked == [("old", 0, 3)]
    text = str(refused["new"])
    assert text.startswith("sink 'new', batch 6: path '/data/orders' holds batch 3 of sink "
                           "'old' (epoch 0, its records keyed 'fanout/p/old')")  # fmt: skip
    assert "the spool at /spool keeps batches 4-5 of epoch 0 for sink 'old'" in text
    assert "rename the sink back to 'old' and restart: it catches up from the spool" in text
    assert ("`fanout ledger skip --ledger /ledger --pipeline p --sink old --through 5 "
            "--epoch 0 --spool /spool --release-spooled`") in text  # fmt: skip
    harmless = Holds("new", {"old": 3})
    harmless.harmless = "it upserts by key"
    assert set(check(harmless)) == {"new"}
    assert check(Holds("new", {})) == {}  # another target: a sink added, not renamed
    assert check(Holds("new", {"old": 3}), None) == {}  # no spool: nothing kept
    # kept from the run's first batch on only (a replay of 6, which 'old' lagged on): the
    # new name writes those; asked about batch 6 alone, by the replay's question
    replayed = Holds("new", {"old": 3})
    assert check(replayed, Spooled("/spool", "/ledger", {"old": [6]})) == {}
    assert replayed.asked == []
    caplog.set_level(logging.WARNING, logger="fanout")
    assert check(Target("new", None)) == {}
    assert ("cannot tell whether its target holds batch 3 of epoch 0 written by sink 'old', "
            "which the pipeline no longer configures and the spool at /spool keeps batches "
            "4-5 of epoch 0 for sink 'old'. If 'new' is 'old' renamed while it lagged") in (
        caplog.text
    )  # fmt: skip


def test_a_vanished_sink_with_no_mark_the_spool_keeps_batches_for_refuses_a_new_name() -> None:
    """A sink renamed while it lagged from the epoch's first batch on (docs/architecture.md
    §5): 'old' has no mark in the epoch (a failure row at most), so there is
    nothing to ask the new name's target about; the spool keeps batches 0-2 of the epoch
    for it and the run's first batch is 3. A name neither the ledger nor the spool knows is
    refused without a question, the message naming both ways on; a sink they know (one that
    itself lags from the epoch's first batch, not renamed) is not; nor are batches kept from
    the run's first batch on (a replay: the new name writes it)."""
    from fanout.steps.renamed import Spooled

    ledger = _ledger({"keep": [0, 1, 2]})  # no row of 'old': only the spool names it
    kept = Spooled("/spool", "/ledger", {"old": [0, 1, 2], "lags": [0, 1, 2]})

    def check(*sinks: Sink, spooled: Spooled | None = kept) -> dict[str, RenamedSinkError]:
        named = {s.name: s for s in (Target("keep"), *sinks)}
        marks = ledger.last_committed("p", named, 0)
        return refuse_renamed("p", 0, 3, ledger, named, named, marks, None, spooled)

    new, lags = Holds("new", {}), Holds("lags", {})
    refused = check(new, lags)
    assert set(refused) == {"new"} and new.asked == lags.asked == []  # nothing to ask
    text = str(refused["new"])
    assert text.startswith("sink 'new', batch 3: the spool at /spool keeps batches 0-2 of "
                           "epoch 0 for sink 'old', which the pipeline no longer configures "
                           "and which has no mark in the epoch")  # fmt: skip
    assert "path '/data/orders' would never get batches 0-2" in text
    assert "rename the sink back to 'old' and restart: it catches up from the spool" in text
    assert ("`fanout ledger skip --ledger /ledger --pipeline p --sink old --through 2 "
            "--epoch 0 --spool /spool --release-spooled`") in text  # fmt: skip
    assert check(Holds("new", {}), spooled=None) == {}  # no spool: nothing kept
    # kept from the run's first batch on (a replay of 3, which 'old' lagged on): the new
    # name writes those
    assert check(Holds("new", {}), spooled=Spooled("/spool", "/ledger", {"old": [3, 4]})) == {}
    # one the spool keeps batches for only from after 'old''s first (a renamed sink not
    # opened at its first run, batch 2 spooled for it): it would never get batches 0-1
    late = Spooled("/spool", "/ledger", {"old": [0, 1], "late": [2]})
    assert set(check(Holds("late", {}), spooled=late)) == {"late"}


def test_a_sink_lagging_since_the_epochs_start_on_a_removed_sinks_target_is_refused() -> None:
    """Two sinks on one target: 'a' lags from the epoch's first batch on (no mark, the spool
    keeps batches 0-5 for it), 'b' lagged after its mark 3 and was removed without its
    batches 4 and 5 released. 'a' is asked (a renamed sink not opened at its first run
    lags under its new name too: the spool naming it proves nothing) and its target holds
    b's batch 3: refused, a false refusal kept on purpose, whose way on, the release of
    b's batches the start's warning asks for anyway, is in the message."""
    from fanout.steps.renamed import Spooled

    ledger = _ledger({"keep": list(range(6)), "b": [0, 1, 2, 3]})
    spooled = Spooled("/spool", "/ledger", {"a": list(range(6)), "b": [4, 5]})
    a = Holds("a", {"b": 3})
    named = {"keep": Target("keep"), "a": a}
    marks = ledger.last_committed("p", named, 0)
    refused = refuse_renamed("p", 0, 6, ledger, named, named, marks, None, spooled)
    assert set(refused) == {"a"} and a.asked == [("b", 0, 3)]
    assert ("`fanout ledger skip --ledger /ledger --pipeline p --sink b --through 5 --epoch 0 "
            "--spool /spool --release-spooled`") in str(refused["a"])  # fmt: skip
    released = Spooled("/spool", "/ledger", {"a": list(range(6))})
    assert refuse_renamed("p", 0, 6, ledger, named, named, marks, None, released) == {}


@pytest.mark.parametrize(("version", "newest"), [(7, 9), (0, 2), (7, None)])
def test_the_delta_refusal_offers_no_removal_taking_later_commits_with_it(
    monkeypatch: pytest.MonkeyPatch, version: int, newest: int | None
) -> None:
    """A RESTORE to before the vanished sink's commit, or deleting the table it created,
    takes every later commit with it (another sink's marked batches): offered only while
    that commit is the table's newest; a table whose version cannot be read is offered
    neither (the integration test: test_delta_renamed_sink's
    test_no_delete_way_when_later_versions_hold_another_sinks_marked_batch)."""
    import fanout_delta.plans
    from fanout_delta.fence import refuse_vanished_sink
    from fanout_delta.plans import CommitPlan

    from fanout import BatchInfo
    from fanout.contract.batch import Batch

    def version_of(_: object) -> int:
        if newest is None:
            raise OSError("log unreadable")
        return newest

    plan = CommitPlan("fanout/p/old", 1, 0, None, version=version)
    monkeypatch.setattr(fanout_delta.plans, "vanished_sink_commit", lambda *a: plan)
    # the newest version in storage (the fake's), not the snapshot's: io.latest_version
    monkeypatch.setattr("fanout.delta_tables.io.latest_version", lambda table: table.version())
    table = type("Table", (), {"version": version_of})()
    with pytest.raises(RenamedSinkError) as refused:
        refuse_vanished_sink(table, Batch(None, BatchInfo("p", 1), "new", "fanout/p/new"),  # type: ignore[arg-type]
                             "new", "/lake/t", ["new"], False)  # fmt: skip
    text = str(refused.value)
    assert "restore the table" not in text and "delete the table" not in text
    later = "later versions" if newest is None else f"versions {version + 1}-{newest}"
    undo = "a RESTORE to before it" if version else "deleting the table"
    assert text.endswith(
        "rename it once batch 1 is marked (the new name then starts after it). Taking the "
        f"batch's commit (version {version}) out of the table, by {undo}, is no way on here: "
        f"its {later} would go with it (other sinks' marked batches, another writer's rows), "
        "which nothing writes again"
    )
