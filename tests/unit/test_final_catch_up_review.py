"""Review of the final catch-up, the gap catch-up and ``fanout ledger skip --spool``:
what each must do for a backfill sink and after a checkpoint reset (docs/architecture.md
§14)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fanout import FanOut
from fanout.contract.batch import BatchInfo
from fanout.ledger.memory import MemoryLedger
from fanout.sink_spec import SinkSpec, lag_policy
from tests.unit.fakes import BackfillLake, SchemaFrame, ScriptedSink

FRAMES = {b: SchemaFrame([b * 10, b * 10 + 1]) for b in range(6)}


def _lake_in_two_epochs(ledger: MemoryLedger, lake: BackfillLake) -> None:
    """The lake alone commits batches 0-1 of epoch 0, then, after a checkpoint reset
    accepted as a new epoch, batches 0-1 of epoch 1."""
    for query, options in (("q", {}), ("q2", {"on_checkpoint_reset": "new_epoch"})):
        fan = FanOut("grow", ledger, [lake], backoff_s=0, **options)
        try:
            for batch in range(2):
                fan.process(FRAMES[batch], BatchInfo("grow", batch, query))
        finally:
            fan.close()


def test_a_run_with_no_batch_backfills_the_current_epoch_too(tmp_path: Path) -> None:
    """An ``available_now`` run that finds no new data runs no batch: its final catch-up
    must still see the batches of the pipeline's current epoch the backfill source holds
    (it saw only epoch 0's, said the sink caught up, and the run exited 0)."""
    ledger, lake = MemoryLedger(), BackfillLake("lake")
    _lake_in_two_epochs(ledger, lake)

    pg = ScriptedSink("pg")
    spec = SinkSpec(pg, lag=lag_policy("pg", {"backfill_from": "lake"}))
    fan = FanOut("grow", ledger, [lake, spec], backoff_s=0, spool=str(tmp_path / "spool"),
                 probe_interval_s=3600)  # fmt: skip
    fan.catchup.stop()  # the query ended without a batch: only the final catch-up writes
    fan.catchup._reader.read = lambda sink, key: (  # type: ignore[method-assign]
        SchemaFrame(lake.table[key].column("id").to_pylist()),
        BatchInfo("grow", key[1], "q", epoch=key[0]),
    )
    try:
        [behind] = fan.behind()
        assert (behind.sink, behind.first, behind.last, behind.batches) == ("pg", (0, 0), (1, 1), 4)
        assert {n: lag.state for n, lag in fan.final_catch_up().items()} == {"pg": "live"}
        assert [(b.info.epoch, b.batch_id) for b in pg.batches] == [(0, 0), (0, 1), (1, 0), (1, 1)]
        assert ledger.last_committed("grow", ["pg"], epoch=1) == {"pg": 1}
    finally:
        fan.close()


def _run(fan: FanOut, batches: range) -> None:
    try:
        for batch in batches:
            fan.process(FRAMES[batch], BatchInfo("grow", batch, "q"))
    finally:
        fan.close()


def _read_from(fan: FanOut, lake: BackfillLake) -> FanOut:
    fan.catchup._reader.read = lambda sink, key: (  # type: ignore[method-assign]
        SchemaFrame(lake.table[key].column("id").to_pylist()),
        BatchInfo("grow", key[1], "q", epoch=key[0]),
    )
    return fan


def test_a_gap_refusal_names_a_skip_that_keeps_the_batches_after_the_gap(
    tmp_path: Path,
) -> None:
    """pg (backfill_from the lake) commits batch 0 and is left out for 1-2; the lake is left
    out for 2 (and its gap skipped). Back at batch 4, pg is given batch 1 from the lake and
    refused at 2: the skip it is told to run must stop at 2, not pass batch 3, which the
    lake still holds for it (the command said --through 3: batch 3 was lost to it)."""
    from fanout import MissedBatchesError
    from fanout.ledger.gaps import skip_batches

    ledger, lake, spool = MemoryLedger(), BackfillLake("lake"), str(tmp_path / "spool")
    good = ScriptedSink("good")

    def pg_spec(pg: ScriptedSink) -> SinkSpec:
        return SinkSpec(pg, lag=lag_policy("pg", {"backfill_from": "lake"}))

    _run(FanOut("grow", ledger, [good, lake, pg_spec(ScriptedSink("pg"))], spool=spool), range(1))
    _run(FanOut("grow", ledger, [good, lake]), range(1, 2))
    _run(FanOut("grow", ledger, [good]), range(2, 3))
    skip_batches(ledger, "grow", "lake", 2)  # the lake's own gap, acknowledged
    _run(FanOut("grow", ledger, [good, lake]), range(3, 4))

    pg = ScriptedSink("pg")
    fan = _read_from(
        FanOut("grow", ledger, [good, lake, pg_spec(pg)], spool=spool, probe_interval_s=3600),
        lake,
    )
    try:
        fan.process(FRAMES[4], BatchInfo("grow", 4, "q"))
        raise AssertionError("batch 4 was not refused")
    except MissedBatchesError as refused:
        assert (refused.mark, refused.missing, refused.spooled) == (1, [2], [3])
        assert str(refused).endswith(
            "; or accept that 'pg' never gets batch(es) 2: `fanout ledger skip --ledger "
            f"MemoryLedger@{id(ledger):x} --pipeline grow --sink pg --through 2 --epoch 0 "
            f"--spool {spool}` (in Python: fanout.ledger.gaps.skip_batches), then restart: it "
            "is given batch(es) "
            "3, which the spool or its backfill source still holds for it, next, in order."
        )
    finally:
        fan.close()
    assert [b for b, _ in pg.calls] == [1]  # the held batch before the gap, from the lake

    skip_batches(ledger, "grow", "pg", 2)  # as the message says
    pg = ScriptedSink("pg")
    _run(_read_from(FanOut("grow", ledger, [good, lake, pg_spec(pg)], spool=spool), lake),
         range(4, 5))  # fmt: skip
    fan = _read_from(FanOut("grow", ledger, [good, lake, pg_spec(pg)], spool=spool), lake)
    try:
        fan.catch_up(timeout_s=10)
    finally:
        fan.close()
    assert sorted(b for b, _ in pg.calls) == [3, 4]


def test_a_sink_its_backfill_source_cannot_serve_is_not_said_to_lose_nothing(
    tmp_path: Path,
) -> None:
    """The final catch-up ends with pg behind because its backfill source cannot give batch
    0 back as committed (a BackfillError: its dead letters are gone). The run's message must
    not tell the user that nothing is lost and that the next run writes the batch: no run
    does until the letters are restored or the batch skipped, as the error says."""
    import pytest

    from fanout import SinksBehindError
    from fanout.errors import BackfillError

    ledger, lake = MemoryLedger(), BackfillLake("lake")
    _run(FanOut("grow", ledger, [lake]), range(2))
    pg = ScriptedSink("pg")
    spec = SinkSpec(pg, lag=lag_policy("pg", {"backfill_from": "lake"}))
    fan = FanOut("grow", ledger, [lake, spec], backoff_s=0, spool=str(tmp_path / "spool"),
                 probe_interval_s=3600)  # fmt: skip
    fan.catchup.stop()
    lost = BackfillError("the letters are gone; restore them or skip it", sink="pg", batch_id=0)

    def read(sink: str, key: tuple[int, int]) -> Any:
        raise lost

    fan.catchup._reader.read = read  # type: ignore[method-assign]
    try:
        with pytest.raises(SinksBehindError) as behind:
            fan.final_catch_up()
    finally:
        fan.close()
    message = str(behind.value)
    assert "Nothing is lost" not in message
    assert message.endswith(
        "\nNot written by the next run until you act: pg, which cannot be given its next "
        "batch as things stand (its last error above names the batch and the ways on). The "
        f"other batches wait in the spool at {tmp_path / 'spool'} (or "
        "a backfill source), and the next run of this pipeline writes them to each sink "
        "first, in batch order and exactly once, before its live batches. `fanout status "
        f"--ledger MemoryLedger@{id(ledger):x} --pipeline grow --spool {tmp_path / 'spool'}` "
        "shows how far behind they are."
    ), message
    [sink] = behind.value.behind
    assert (sink.sink, sink.first, sink.last, sink.stuck) == ("pg", (0, 0), (0, 1), True)


def test_a_backfill_source_whose_table_lost_a_batch_says_what_to_do(tmp_path: Path) -> None:
    """The lake's ledger mark of batch 0 counts 2 rows, but its table holds no commit of
    batch 0 any more (replaced, or its log cleaned up): a BackfillError naming both sinks,
    the batch and the ways on (it was a bare LookupError saying none), and the final
    catch-up's message says pg waits for the operator."""
    import pytest

    from fanout import SinksBehindError

    ledger, lake = MemoryLedger(), BackfillLake("lake")
    _run(FanOut("grow", ledger, [lake]), range(1))
    lake.table[(0, 0)] = lake.table[(0, 0)].slice(0, 0)  # the table replaced: no commit of 0
    spec = SinkSpec(ScriptedSink("pg"), lag=lag_policy("pg", {"backfill_from": "lake"}))
    fan = FanOut("grow", ledger, [lake, spec], backoff_s=0, spool=str(tmp_path / "spool"),
                 probe_interval_s=3600)  # fmt: skip
    fan.catchup.stop()
    try:
        with pytest.raises(SinksBehindError) as behind:
            fan.final_catch_up()
    finally:
        fan.close()
    [sink] = behind.value.behind
    assert sink.error == (
        "BackfillError: sink 'pg', batch 0: cannot be backfilled from sink 'lake': its ledger "
        "mark says it committed batch 0 (epoch 0) with 2 row(s), but its table holds no commit "
        "of it (the table replaced, or its log cleaned up), so the batch read back would lack "
        "them; nothing of it is written to 'pg', which waits at this batch. Restore the "
        "table of 'lake' to a version that holds the batch, or accept that 'pg' never gets "
        f"batch 0: `fanout ledger skip --ledger MemoryLedger@{id(ledger):x} --pipeline grow "
        "--sink pg --through 0 --epoch 0`, then restart"
    )
    assert sink.stuck


def test_the_left_out_sinks_release_command_is_per_epoch(tmp_path: Path, caplog: Any) -> None:
    """The spool keeps batches 0-1 of epoch 0 and batch 0 of epoch 1 for "down", which is
    then left out: the start-up warning names one release command per epoch, each through
    that epoch's last batch (it named one, `--through 1` without --epoch: in epoch 1, which
    has no batch 1, the skip was refused, and epoch 0's batches were never released)."""
    import logging

    from fanout import SinkWriteError

    ledger, spool = MemoryLedger(), str(tmp_path / "spool")
    failing = SinkWriteError("refused", sink="down")

    def down() -> SinkSpec:
        sink = ScriptedSink("down", always_fail=failing)
        return SinkSpec(sink, lag=lag_policy("down", {"on_failure": "lag"}))

    for query, batches, options in (
        ("q", range(2), {}), ("q2", range(1), {"on_checkpoint_reset": "new_epoch"})
    ):  # fmt: skip
        fan = FanOut("grow", ledger, [ScriptedSink("good"), down()], backoff_s=0, spool=spool,
                     probe_interval_s=3600, **options)  # fmt: skip
        try:
            for batch in batches:
                fan.process(FRAMES[batch], BatchInfo("grow", batch, query))
        finally:
            fan.close()

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fanout"):
        FanOut("grow", ledger, [ScriptedSink("good")], spool=spool).close()
    said = [r.getMessage() for r in caplog.records if "not configured" in r.getMessage()]
    command = (
        f"`fanout ledger skip --ledger MemoryLedger@{id(ledger):x} --pipeline grow --sink down"
    )
    assert said == [
        f"pipeline grow: the spool at {spool} keeps 2 batch(es) of epoch 0 (from batch 0) "
        "for sink 'down', which is not configured: put back with on_failure='lag', it catches "
        f"up from them; removed for good, release them with {command} --through 1 --epoch 0 "
        f"--spool {spool} --release-spooled`",
        f"pipeline grow: the spool at {spool} keeps 1 batch(es) of epoch 1 (from batch 0) "
        "for sink 'down', which is not configured: put back with on_failure='lag', it catches "
        f"up from them; removed for good, release them with {command} --through 0 --epoch 1 "
        f"--spool {spool} --release-spooled`",
    ], said
    from fanout.ledger.gaps import skip_batches
    from fanout.spool.table import Spool

    opened = Spool(spool, "grow")
    opened.open()
    for through, epoch in ((1, 0), (0, 1)):  # the two commands, as named
        skip_batches(ledger, "grow", "down", through, epoch, spool=opened, release_spooled=True)
    released = FanOut("grow", ledger, [ScriptedSink("good")], spool=spool)
    try:
        assert released.lagging.spool is not None and released.lagging.spool.batches() == []
    finally:
        released.close()


def test_a_sink_whose_spooled_batches_were_released_by_a_skip_may_drop_lag(
    tmp_path: Path,
) -> None:
    """ "down" lags through batches 1-2 (spooled for it); the operator gives them up
    (`fanout ledger skip --through 2 --spool S --release-spooled`) and puts the sink back
    without on_failure='lag'. Its mark holds 1-2, so nothing is skipped: the start must not
    be refused saying it still needs them (the index rows are released at that start)."""
    from fanout import SinkWriteError
    from fanout.ledger.gaps import skip_batches
    from fanout.spool.table import Spool

    ledger, spool = MemoryLedger(), str(tmp_path / "spool")
    down = ScriptedSink("down")
    lagging = SinkSpec(down, lag=lag_policy("down", {"on_failure": "lag"}))
    fan = FanOut("grow", ledger, [ScriptedSink("good"), lagging], backoff_s=0, spool=spool,
                 probe_interval_s=3600)  # fmt: skip
    try:
        fan.process(FRAMES[0], BatchInfo("grow", 0, "q"))
        down.always_fail = SinkWriteError("refused", sink="down")
        for batch in (1, 2):
            fan.process(FRAMES[batch], BatchInfo("grow", batch, "q"))
    finally:
        fan.close()
    opened = Spool(spool, "grow")
    opened.open()
    skip_batches(ledger, "grow", "down", 2, spool=opened, release_spooled=True)

    back = ScriptedSink("down")
    fan = FanOut("grow", ledger, [ScriptedSink("good"), back], backoff_s=0, spool=spool)
    try:
        assert fan.spool is not None and fan.spool.batches() == []
        fan.process(FRAMES[3], BatchInfo("grow", 3, "q"))
    finally:
        fan.close()
    assert back.calls == [(3, 1)]


def test_the_final_catch_up_does_not_write_a_sink_past_a_gap(tmp_path: Path) -> None:
    """pg (backfill_from the lake) commits batch 0 and is left out for 1-3; the lake misses
    batch 2 (its gap skipped). A run that finds no new batch (available_now, no data) runs
    no gap check on a live batch: its final catch-up must give pg batch 1 and stop at the
    gap, naming it, not write batch 3 past it (batch 2 lost to pg without a word)."""
    import pytest

    from fanout import SinksBehindError
    from fanout.ledger.gaps import skip_batches

    ledger, lake, spool = MemoryLedger(), BackfillLake("lake"), str(tmp_path / "spool")
    good = ScriptedSink("good")

    def pg_spec(pg: ScriptedSink) -> SinkSpec:
        return SinkSpec(pg, lag=lag_policy("pg", {"backfill_from": "lake"}))

    _run(FanOut("grow", ledger, [good, lake, pg_spec(ScriptedSink("pg"))], spool=spool), range(1))
    _run(FanOut("grow", ledger, [good, lake]), range(1, 2))
    _run(FanOut("grow", ledger, [good]), range(2, 3))
    skip_batches(ledger, "grow", "lake", 2)
    _run(FanOut("grow", ledger, [good, lake]), range(3, 4))

    pg = ScriptedSink("pg")
    fan = _read_from(
        FanOut("grow", ledger, [good, lake, pg_spec(pg)], spool=spool, probe_interval_s=3600),
        lake,
    )
    fan.catchup.stop()  # the query ended without a batch
    try:
        with pytest.raises(SinksBehindError) as behind:
            fan.final_catch_up()
    finally:
        fan.close()
    assert [b for b, _ in pg.calls] == [1]  # not 3: batch 2 is nowhere for it
    assert ledger.last_committed("grow", ["pg"]) == {"pg": 1}
    [sink] = behind.value.behind
    assert sink.stuck and sink.error is not None
    assert sink.error.startswith(
        "MissedBatchesError: pipeline 'grow', batch 3: sink 'pg' last committed batch 1 and "
        "never received batch(es) 2,"
    ), sink.error
