"""``fanout recover --config``: the sinks of the pipeline file are asked, by their own
records, whether they hold the batch after their mark (ARCHITECTURE §5, "A batch written but
never marked"), so the resume point it prints already accounts for a batch written but never
marked, instead of the operator learning it when the new epoch's start is refused.

Two Delta sinks on a real Delta ledger, batches fed by hand (``two_sink_resets``); the
driver dies after one sink committed batch 3 and before its mark.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fanout import BatchInfo, FanOut, hookimpl
from fanout.ledger.delta import DeltaLedger
from tests.in_process_cli import Cli
from tests.integration import two_sink_resets as resets
from tests.integration.test_unmarked_batch import DriverKilled, KillAfterWrite
from tests.integration.two_sink_resets import NEW, OLD, ROWS, SINKS
from tests.newest_lines import without_newest

PIPELINE = "unmarked"
SECRET = "TopSecretAwsKey123"


def _config(tmp_path: Path) -> str:
    """The pipeline file of bronze and silver (bronze with a storage credential: it must
    not appear in recover's output)."""
    file = tmp_path / "pipeline.toml"
    file.write_text(
        f'[pipeline]\nname = "{PIPELINE}"\nledger = "{tmp_path / "ledger"}"\n'
        f'checkpoint = "{tmp_path / "ckpt"}"\n[source]\nformat = "rate"\n'
        f'[[sinks]]\ntype = "delta"\nname = "bronze"\npath = "{tmp_path / "bronze"}"\n'
        f'storage_options = {{ AWS_SECRET_ACCESS_KEY = "{SECRET}" }}\n'
        f'[[sinks]]\ntype = "delta"\nname = "silver"\npath = "{tmp_path / "silver"}"\n'
    )
    return str(file)


def _recover(config: str, fanout_cli: Cli) -> list[str]:
    ran = fanout_cli("recover", "--config", config)
    assert ran.returncode == 0, ran
    out = without_newest(ran.stdout)[0]
    assert SECRET not in out
    return out.splitlines()


def test_recover_names_the_batch_a_sink_wrote_but_never_marked_and_the_choice(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """bronze committed batch 3 (rows 30-39), the driver died before its mark; silver never
    got it. `recover` said "resume after batch 2", and the new epoch's start was refused
    for bronze; now `recover --config` asks bronze, records its lost mark, names the sink,
    the batch and both ways out; the new epoch resuming after batch 2 (choice 1) starts at
    once, and bronze gets batch 3's rows a second time, as choice 1 says."""
    old = resets.fan(PIPELINE, tmp_path, KillAfterWrite())
    for batch in range(3):
        resets.run(old, spark, OLD, batch, batch * ROWS)
    with pytest.raises(DriverKilled):
        resets.run(old, spark, OLD, 3, 30)
    config, ledger = _config(tmp_path), tmp_path / "ledger"
    recover = f"fanout recover --ledger {ledger} --pipeline {PIPELINE}"

    assert _recover(config, fanout_cli)[:12] == [
        f"pipeline '{PIPELINE}': last committed batch per sink",
        "  bronze: batch 3, query id query-old, source offsets not recorded",
        '  silver: batch 2, query id query-old, source offsets [{"orders": {"0": 30}}], '
        "planned at 1002 (1970-01-01T00:00:01.002Z)",
        f"Asked each sink of {config}, by its own records, whether it holds the batch after "
        "its mark in epoch 0 (written, but never marked):",
        "  bronze: holds batch 3, which the ledger had no mark of",
        "  silver: does not hold batch 3",
        "The ledger now records each lost mark (the sink holds the batch; recorded by fanout "
        "recover): the counts here include it, and the new epoch's start asks the sink about "
        "the batch after it.",
        "  - sink bronze: batch 3 of epoch 0, source offsets unknown (no sink marked it); "
        f"sinks without it: silver (mark 2). Its rows are version 3 of the Delta table at "
        f"{tmp_path / 'bronze'}, the table's last commit: to remove them, restore the table "
        "to version 2 (delta-rs: DeltaTable(path).restore(2); Spark SQL: RESTORE TABLE "
        f"delta.`{tmp_path / 'bronze'}` TO VERSION AS OF 2).",
        f"    1. Resume after batch 2, where `{recover}` counts silver: bronze gets batch 3's "
        "rows a second time (unless its copy is removed first).",
        f"    2. Or give batch 3 up for silver: `fanout ledger skip --ledger {ledger} "
        f"--pipeline {PIPELINE} --sink silver --through 3 --epoch 0`, then resume after "
        "batch 3: they never get its rows.",
        "Resume after batch 2 (sink 'silver' is furthest behind); sink bronze already holds "
        "batch 3 and will write its rows again (a new epoch or a new pipeline name means new "
        "transaction ids, so nothing skips them): duplicates there, unless the sink upserts "
        "by key.",
        "Source 0 (Kafka): start a new checkpoint with",
    ]
    assert resets.marks(tmp_path) == sorted(
        [(0, s, b) for s in SINKS for b in range(3)] + [(0, "bronze", 3)]
    )

    # choice 1: the start is not refused (bronze is asked about batch 4 now)
    resets.run(resets.fan(PIPELINE, tmp_path, on_reset="new_epoch"), spark, NEW, 0, 30)
    assert resets.ids(tmp_path, "bronze") == sorted([*range(40), *range(30, 40)])
    assert resets.ids(tmp_path, "silver") == list(range(40))
    assert DeltaLedger(str(ledger)).current_epoch(PIPELINE) == 1


class KillBronzeAfterWrite:
    """Kills the driver right after bronze wrote batch 3, silver having marked it."""

    @hookimpl
    def fanout_sink_done(self, info: BatchInfo, sink: str, result: Any, duration_s: float) -> None:
        if info.batch_id == 3 and sink == "bronze":
            raise DriverKilled("killed between the write and the mark")


def test_recover_resumes_after_a_batch_every_sink_holds_though_one_lost_its_mark(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """silver marked batch 3, bronze wrote it and lost the mark. `recover` resumed after
    batch 2 (silver got rows 30-39 again, and the start was refused for bronze); now it
    counts bronze at batch 3 and resumes after it, and the new epoch writes every row once."""
    sinks = [{"type": "delta", "name": s, "path": str(tmp_path / s)} for s in ("silver", "bronze")]
    old = FanOut(PIPELINE, str(tmp_path / "ledger"), sinks, plugins=[KillBronzeAfterWrite()],
                 parallelism=1, retries=0)  # fmt: skip
    for batch in range(3):
        resets.run(old, spark, OLD, batch, batch * ROWS)
    with pytest.raises(DriverKilled):
        resets.run(old, spark, OLD, 3, 30)
    assert resets.marks(tmp_path)[-1] == (0, "silver", 3)

    out = _recover(_config(tmp_path), fanout_cli)
    assert out[:9] == [
        f"pipeline '{PIPELINE}': last committed batch per sink",
        '  bronze: batch 3, query id query-old, source offsets [{"orders": {"0": 40}}]',
        '  silver: batch 3, query id query-old, source offsets [{"orders": {"0": 40}}], '
        "planned at 1003 (1970-01-01T00:00:01.003Z)",
        f"Asked each sink of {tmp_path / 'pipeline.toml'}, by its own records, whether it "
        "holds the batch after its mark in epoch 0 (written, but never marked):",
        "  bronze: holds batch 3, which the ledger had no mark of",
        "  silver: does not hold batch 4",
        "The ledger now records each lost mark (the sink holds the batch; recorded by fanout "
        "recover): the counts here include it, and the new epoch's start asks the sink about "
        "the batch after it.",
        "Resume after batch 3: every sink the pipeline still writes holds it, so nothing is "
        "written twice.",
        "Source 0 (Kafka): start a new checkpoint with",
    ]
    assert out[9] == """  .option("startingOffsets", '{"orders": {"0": 40}}')"""
    resets.run(resets.fan(PIPELINE, tmp_path, on_reset="new_epoch"), spark, NEW, 0, 40)
    for sink in SINKS:
        assert resets.ids(tmp_path, sink) == list(range(50))


def test_recover_resumes_before_a_first_batch_one_sink_wrote_but_never_marked(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """The driver died in epoch 0's first batch, after bronze committed it, before its
    mark; silver never got it. The ledger holds no mark: `recover` said it holds no
    committed batch. Now it finds bronze's batch 0, counts silver (no mark) and resumes
    before batch 0, or after it once silver gives it up; the new epoch started that way
    passes its start."""
    from tests.integration.test_unmarked_batch import KillInTheFirstBatch

    with pytest.raises(DriverKilled):
        resets.run(resets.fan(PIPELINE, tmp_path, KillInTheFirstBatch()), spark, OLD, 0, 0)
    config, ledger = _config(tmp_path), tmp_path / "ledger"
    skip = (
        f"fanout ledger skip --ledger {ledger} --pipeline {PIPELINE} --sink silver "
        "--through 0 --epoch 0"
    )
    out = _recover(config, fanout_cli)
    assert out[:7] == [
        f"pipeline '{PIPELINE}': last committed batch per sink",
        "  bronze: batch 0, query id query-old, source offsets not recorded",
        "  silver: no mark in epoch 0 (no mark in the ledger)",
        f"Asked each sink of {config}, by its own records, whether it holds the batch after "
        "its mark in epoch 0 (written, but never marked):",
        "  bronze: holds batch 0, which the ledger had no mark of",
        "  silver: does not hold batch 0",
        "The ledger now records each lost mark (the sink holds the batch; recorded by fanout "
        "recover): the counts here include it, and the new epoch's start asks the sink about "
        "the batch after it.",
    ]
    assert out[7].startswith(
        "  - sink bronze: batch 0 of epoch 0, source offsets unknown (no sink marked it); "
        "sinks without it: silver (no mark)."
    )
    assert out[10:12] == [
        "Resume before batch 0, epoch 0's first: sink silver has no mark in epoch 0 (the "
        "driver died in that batch before the mark, or never wrote it there), so resuming "
        "after batch 0 would give that batch up for it. Start the new query where epoch 0 "
        "began (the query's starting offsets; the ledger holds no offsets before batch 0): "
        "sink bronze already holds batch 0 and will write its rows again (a new epoch means "
        "new transaction ids, so nothing skips them): duplicates there, unless the sink "
        "upserts by key.",
        f"Or give batch 0 up for silver: `{skip}`, then run this again: it resumes after batch 0.",
    ]
    assert resets.marks(tmp_path) == [(0, "bronze", 0)]

    # the way the output names first: the new epoch reads from the start
    resets.run(resets.fan(PIPELINE, tmp_path, on_reset="new_epoch"), spark, NEW, 0, 0)
    assert resets.ids(tmp_path, "bronze") == sorted([*range(10), *range(10)])
    assert resets.ids(tmp_path, "silver") == list(range(10))


def test_recover_choice_2_followed_as_printed_starts_the_new_epoch(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """bronze committed batch 3 and lost its mark; silver never got it. `recover --config`
    records its report (resume after batch 2) and prints choice 2: skip silver through
    batch 3, then resume after it. Followed as printed, the start was refused with
    ZombieBatchError: the skip's mark of batch 3 counted as a batch "epoch 0's query
    committed" after the report (no query was running). A skip's mark writes nothing to
    any sink, so the report does not count it against the start."""
    old = resets.fan(PIPELINE, tmp_path, KillAfterWrite())
    for batch in range(3):
        resets.run(old, spark, OLD, batch, batch * ROWS)
    with pytest.raises(DriverKilled):
        resets.run(old, spark, OLD, 3, 30)
    config, ledger = _config(tmp_path), tmp_path / "ledger"
    skip = [
        "ledger", "skip", "--ledger", str(ledger), "--pipeline", PIPELINE, "--sink", "silver",
        "--through", "3", "--epoch", "0",
    ]  # fmt: skip
    assert (
        f"    2. Or give batch 3 up for silver: `fanout {' '.join(skip)}`, then resume after "
        "batch 3: they never get its rows."
    ) in _recover(config, fanout_cli)
    assert fanout_cli(*skip).returncode == 0

    resets.run(resets.fan(PIPELINE, tmp_path, on_reset="new_epoch"), spark, NEW, 0, 40)
    assert resets.ids(tmp_path, "bronze") == list(range(50))
    assert resets.ids(tmp_path, "silver") == [*range(30), *range(40, 50)]
    assert DeltaLedger(str(ledger)).current_epoch(PIPELINE) == 1


def test_recover_asks_about_the_first_batch_of_an_epoch_started_without_a_mark(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """Epoch 1 started from recover's report (after batch 2 of epoch 0, offset 30) and its
    driver died in its first batch, after bronze committed it, before its mark. The ledger
    holds no mark of epoch 1: `recover --config` reported epoch 0, asked the sinks about
    epoch 0's batch 3 and said "resume after batch 2: nothing is written twice"; the start
    that followed it was refused (bronze holds epoch 1's batch 0). Now it asks about the
    batch the start asks about, records bronze's lost mark and resumes where epoch 1 began;
    the start that follows passes, bronze getting rows 30-39 twice, as it says."""
    from tests.integration.test_unmarked_batch import KillInTheFirstBatch

    old = resets.fan(PIPELINE, tmp_path)
    for batch in range(3):
        resets.run(old, spark, OLD, batch, batch * ROWS)
    config = _config(tmp_path)
    _recover(config, fanout_cli)
    with pytest.raises(DriverKilled):
        killed = resets.fan(PIPELINE, tmp_path, KillInTheFirstBatch(), on_reset="new_epoch")
        resets.run(killed, spark, NEW, 0, 30)

    out = _recover(config, fanout_cli)
    assert out[:6] == [
        f"pipeline '{PIPELINE}' (epoch 1): last committed batch per sink",
        f"  bronze: batch 0, query id {NEW}, source offsets not recorded",
        f"  silver: no mark in epoch 1 (last marked at batch 2 of epoch 0, query id {OLD})",
        f"Asked each sink of {config}, by its own records, whether it holds the batch after "
        "its mark in epoch 1 (written, but never marked):",
        "  bronze: holds batch 0, which the ledger had no mark of",
        "  silver: does not hold batch 0",
    ]
    assert out[10].startswith(
        "Resume before batch 0, epoch 1's first: sink silver has no mark in epoch 1"
    )
    assert resets.marks(tmp_path)[-1] == (1, "bronze", 0)

    # where epoch 1 began: offset 30
    resets.run(resets.fan(PIPELINE, tmp_path, on_reset="new_epoch"), spark, "query-3", 0, 30)
    assert resets.ids(tmp_path, "bronze") == sorted([*range(40), *range(30, 40)])
    assert resets.ids(tmp_path, "silver") == list(range(40))
    assert DeltaLedger(str(tmp_path / "ledger")).current_epoch(PIPELINE) == 2


class RecoverWhileBronzeMarks:
    """Runs `fanout recover --config` (an operator's look at the running pipeline) after
    bronze wrote batch 3 and before its mark: the batch is in flight, not lost."""

    def __init__(self, config: str, fanout_cli: Cli) -> None:
        self.config, self.cli = config, fanout_cli

    @hookimpl
    def fanout_sink_done(self, info: BatchInfo, sink: str, result: Any, duration_s: float) -> None:
        if info.batch_id == 3 and sink == "bronze":
            assert self.cli("recover", "--config", self.config).returncode == 0


def test_recover_during_a_batch_in_flight_leaves_the_query_s_own_mark(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """The pipeline runs on after the look: bronze's mark of batch 3 is the query's own,
    with its row count, not a lost mark recorded by recover (`fanout status` counted 0
    rows for it, and a sink backfilled from bronze could not check the batch)."""
    running = resets.fan(PIPELINE, tmp_path, RecoverWhileBronzeMarks(_config(tmp_path), fanout_cli))
    for batch in range(4):
        resets.run(running, spark, OLD, batch, batch * ROWS)
    for sink in SINKS:
        assert resets.ids(tmp_path, sink) == list(range(40))
    entries = DeltaLedger(str(tmp_path / "ledger")).committed_entries(PIPELINE)
    marks = {(e.sink, e.batch_id): (e.rows, e.error) for e in entries}
    assert marks[("bronze", 3)] == (ROWS, None)
    assert sorted(e.batch_id for e in entries if e.sink == "bronze") == [0, 1, 2, 3]  # one each


class KillAfterGoldWrote:
    """Kills the driver right after gold, added to the pipeline at batch 5, wrote its first
    batch (bronze and silver marked it), before gold's mark."""

    @hookimpl
    def fanout_sink_done(self, info: BatchInfo, sink: str, result: Any, duration_s: float) -> None:
        if sink == "gold":
            raise DriverKilled("killed between the write and the mark")


def test_recover_counts_a_sink_added_mid_epoch_at_the_batch_it_holds(
    spark: Any, tmp_path: Path, fanout_cli: Cli
) -> None:
    """gold joined at batch 5 (without backfill_from a sink added starts at the current
    batch) and lost the mark of it. `recover --config` recorded gold's lost mark at batch
    0, which gold never got, and said "resume after batch 5: nothing is written twice";
    the start following it was refused for gold holding batch 1, the next for batch 2, and
    so on, each recording a mark of a batch gold never got."""

    def fan(*plugins: object, on_reset: str = "refuse", sinks: tuple[str, ...] = SINKS) -> FanOut:
        return FanOut(
            PIPELINE, str(tmp_path / "ledger"),
            [{"type": "delta", "name": s, "path": str(tmp_path / s)} for s in sinks],
            on_checkpoint_reset=on_reset,  # type: ignore[arg-type]
            plugins=plugins, parallelism=1, retries=0,
        )  # fmt: skip

    three = (*SINKS, "gold")
    for batch in range(5):
        resets.run(fan(), spark, OLD, batch, batch * ROWS)
    with pytest.raises(DriverKilled):
        resets.run(fan(KillAfterGoldWrote(), sinks=three), spark, OLD, 5, 50)
    config = tmp_path / "pipeline.toml"
    config.write_text(
        f'[pipeline]\nname = "{PIPELINE}"\nledger = "{tmp_path / "ledger"}"\n'
        f'checkpoint = "{tmp_path / "ckpt"}"\n[source]\nformat = "rate"\n'
        + "".join(
            f'[[sinks]]\ntype = "delta"\nname = "{s}"\npath = "{tmp_path / s}"\n' for s in three
        )
    )
    out = _recover(str(config), fanout_cli)
    resume = "Resume after batch 5: every sink the pipeline still writes holds it, so nothing "
    assert resume + "is written twice." in out

    resets.run(fan(on_reset="new_epoch", sinks=three), spark, NEW, 0, 60)
    assert resets.ids(tmp_path, "gold") == list(range(50, 70))
    assert [(s, b) for e, s, b in resets.marks(tmp_path) if s == "gold"] == [
        ("gold", 5), ("gold", 0)
    ]  # fmt: skip
