"""``fanout recover`` on recorded Kafka-style and file-source offsets."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from fanout.app.cli import main
from fanout.app.recover import (
    NO_CONFIG,
    NO_SPOOL,
    STOP_FIRST,
    is_kafka_offsets,
    recorded_text,
    recovery_of,
    render,
)
from fanout.ledger.delta import DeltaLedger
from fanout.ledger.entry import LedgerEntry
from tests.newest_lines import readout


def _mark(sink: str, batch: int, offsets: list[object], query: str = "q-old") -> LedgerEntry:
    return LedgerEntry(
        "orders", sink, batch, "committed", query_id=query, source_offsets=json.dumps(offsets)
    )


def test_kafka_offsets_of_the_sink_furthest_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = DeltaLedger(str(tmp_path))
    ledger.open()
    for batch in range(4):
        kafka = {"orders": {"0": 100 * (batch + 1), "1": 50 * (batch + 1)}}
        ledger.mark_committed(_mark("delta", batch, [kafka]))
        if batch < 3:
            ledger.mark_committed(_mark("pg", batch, [kafka]))
    ledger.mark_committed(LedgerEntry("other", "x", 9, "committed", query_id="q-x"))

    assert main(["recover", "--ledger", str(tmp_path), "--pipeline", "orders"]) == 0
    out = readout(capsys).out.splitlines()
    assert out[0] == "pipeline 'orders': last committed batch per sink"
    assert out[1] == (
        '  delta: batch 3, query id q-old, source offsets [{"orders": {"0": 400, "1": 200}}]'
    )
    assert out[2] == (
        '  pg: batch 2, query id q-old, source offsets [{"orders": {"0": 300, "1": 150}}]'
    )
    assert out[3].startswith("Resume after batch 2 (sink 'pg' is furthest behind)")
    assert out[4] == "Source 0 (Kafka): start a new checkpoint with"
    assert out[5] == """  .option("startingOffsets", '{"orders": {"0": 300, "1": 150}}')"""


def test_file_source_offsets_are_explained_not_turned_into_kafka_json() -> None:
    recovery = recovery_of("orders", [_mark("delta", 5, [{"logOffset": 5}])])
    assert recovery.starting_offsets() == [None]
    assert not is_kafka_offsets({"logOffset": 5})
    assert is_kafka_offsets({"t": {"0": 1, "3": 9}, "u": {"1": 0}})
    assert not is_kafka_offsets({"t": {}})


def test_a_file_source_is_told_where_the_files_read_are_listed() -> None:
    """A file source's ``{"logOffset": N}`` cannot be given to a new query: the line names
    the replaced checkpoint's log of the files read, what to do with them, and the option
    that makes it unnecessary (before: "start the new query so that it reads what comes
    after them", which a file source cannot be told)."""
    lines = render(
        recovery_of("orders", [_mark("delta", 5, [{"logOffset": 5}, {"x": 1}])])
    ).splitlines()
    files = next(line for line in lines if line.startswith("Source 0"))
    assert files.startswith(
        'Source 0 (files): {"logOffset": 5} counts batches of the replaced checkpoint\'s '
        "file log, sources/0/ (entries 0 to 5, or the '.compact' file before them, list the "
        "files read so far). Move those files out of the input directory"
    ), files
    assert "cleanSource=archive and sourceArchiveDir" in files
    other = next(line for line in lines if line.startswith("Source 1"))
    assert other == (
        'Source 1: offsets {"x": 1} are not Kafka offsets; start the new query so that it '
        "reads what comes after them."
    )


def test_empty_ledger_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    DeltaLedger(str(tmp_path)).open()
    assert main(["recover", "--ledger", str(tmp_path), "--pipeline", "orders"]) == 0
    assert readout(capsys).out.strip().splitlines() == [
        "pipeline 'orders': the ledger holds no committed batch",
        NO_SPOOL,
        NO_CONFIG,
    ]


def test_planning_time_is_printed_with_the_offsets() -> None:
    """The facts of a CheckpointRollbackError: the newest checkpoint is the one whose
    offsets/<N> holds these offsets and this batchTimestampMs."""
    entry = LedgerEntry(
        "orders",
        "delta",
        5,
        "committed",
        query_id="q-old",
        source_offsets=json.dumps([{"logOffset": 5}]),
        batch_timestamp_ms=1_763_856_000_250,
    )
    lines = render(recovery_of("orders", [entry])).splitlines()
    assert lines[1] == (
        '  delta: batch 5, query id q-old, source offsets [{"logOffset": 5}], '
        "planned at 1763856000250 (2025-11-23T00:00:00.250Z)"
    )


def _kafka(batch: int) -> list[object]:
    return [{"orders": {"0": 100 * (batch + 1)}}]


def _epoch1(sink: str, batch: int, offsets: list[object]) -> LedgerEntry:
    """A mark of the query that started epoch 1 after an accepted reset."""
    return LedgerEntry(
        "orders", sink, batch, "committed", query_id="q-new", epoch=1,
        source_offsets=json.dumps(offsets),
    )  # fmt: skip


def test_a_sink_behind_by_one_batch_decides_and_a_removed_one_does_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """'audit' was taken out of the pipeline after batch 1; the driver died between the
    marks of batch 5: 'pg' holds batch 4 only, and a new checkpoint must resume after it."""
    ledger = DeltaLedger(str(tmp_path))
    ledger.open()
    for batch in range(6):
        ledger.mark_committed(_mark("delta", batch, _kafka(batch)))
        if batch < 5:
            ledger.mark_committed(_mark("pg", batch, _kafka(batch)))
        if batch < 2:
            ledger.mark_committed(_mark("audit", batch, _kafka(batch)))

    assert main(["recover", "--ledger", str(tmp_path), "--pipeline", "orders"]) == 0
    assert readout(capsys).out.splitlines() == [
        "pipeline 'orders': last committed batch per sink",
        '  delta: batch 5, query id q-old, source offsets [{"orders": {"0": 600}}]',
        '  pg: batch 4, query id q-old, source offsets [{"orders": {"0": 500}}]',
        "  audit: not written since batch 1 (query id q-old): removed from the pipeline? It "
        "does not decide where to resume",
        "Resume after batch 4 (sink 'pg' is furthest behind); sink delta already holds "
        "batch 5 and will write its rows again (a new epoch or a new pipeline name means new "
        "transaction ids, so nothing skips them): duplicates there, unless the sink upserts "
        "by key.",
        "Source 0 (Kafka): start a new checkpoint with",
        """  .option("startingOffsets", '{"orders": {"0": 500}}')""",
        STOP_FIRST,
        NO_SPOOL,
        NO_CONFIG,
        recorded_text(1, 0, None),
    ]


def test_only_the_newest_epoch_decides() -> None:
    """Epoch 0 ended at batch 7 ('audit' last written at batch 1 there); after a reset
    accepted under a new epoch, the new query's batch ids start at 0 again: batch 3 of
    epoch 1 is where to resume, whatever epoch 0's batch ids were. Without --config,
    'audit' counts as a sink of the pipeline: named with the batches of epoch 1 a resume
    gives up for it, and the command accepting that."""
    old = [_mark(s, b, _kafka(b)) for b in range(8) for s in ("delta", "pg")]
    old += [_mark("audit", b, _kafka(b)) for b in range(2)]
    new = [_epoch1(s, b, _kafka(10 + b)) for b in range(4) for s in ("delta", "pg")]
    recovery = recovery_of("orders", old + new)
    assert recovery.furthest_behind == new[-2]  # batch 3 of delta (ties: by name)
    assert render(recovery).splitlines() == [
        "pipeline 'orders' (epoch 1): last committed batch per sink",
        '  delta: batch 3, query id q-new, source offsets [{"orders": {"0": 1400}}]',
        '  pg: batch 3, query id q-new, source offsets [{"orders": {"0": 1400}}]',
        "  audit: no mark in epoch 1 (last marked at batch 1 of epoch 0, query id q-old)",
        "Resume after batch 3: every sink the pipeline still writes holds it, so nothing is "
        "written twice.",
        "audit gets no batches 0-3 of epoch 1 from a new checkpoint resuming after batch 3: "
        "batch 0 committed without it, so it was not in the pipeline then (added since; or "
        "taken out, then nothing is missing). To accept that it never gets them: `fanout "
        "ledger skip --ledger LEDGER --pipeline orders --sink audit --through 3 --epoch 1`.",
        "Source 0 (Kafka): start a new checkpoint with",
        """  .option("startingOffsets", '{"orders": {"0": 1400}}')""",
        STOP_FIRST,
        NO_SPOOL,
        NO_CONFIG,
    ]


def test_a_sink_last_written_in_an_earlier_epoch_at_a_higher_batch_is_set_apart() -> None:
    """Batch ids of two epochs are not comparable: 'audit' at batch 9 of epoch 0 is not
    ahead of the sinks at batch 2 of epoch 1, nor does it count as written: it has no mark
    in epoch 1."""
    entries = [_mark("audit", 9, _kafka(9))] + [_epoch1("delta", b, _kafka(b)) for b in range(3)]
    recovery = recovery_of("orders", entries)
    assert sorted(recovery.marks.written) == ["delta"]
    assert recovery.marks.not_written == {}
    assert recovery.lacking == {"audit": entries[0]}
    assert recovery.furthest_behind == entries[-1]


def _spooled(batch: int, needed_by: set[str], party: set[str] | None) -> Any:
    from fanout.spool.index import SpooledBatch

    return SpooledBatch(
        "orders", 0, batch, 2, "{}", datetime(2026, 1, 1, tzinfo=UTC), frozenset(needed_by),
        query_id="q-old", source_offsets=json.dumps(_kafka(batch)), party=frozenset(party or ()),
    )  # fmt: skip


def test_a_lagging_sink_counts_at_its_settled_spooled_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Batch 1 ran: lake wrote it, pg failed it and lags (spooled): every sink holds it,
    so after a reset the catch-up writes it to pg. Counting pg at its mark (batch 0) would
    resume after batch 0: lake would get batch 1 again, and pg twice (spool and epoch 1)."""
    from fanout import FanOut, SinkWriteError
    from fanout.contract.batch import BatchInfo
    from fanout.sink_spec import SinkSpec, lag_policy
    from tests.unit.fakes import SchemaFrame, ScriptedSink

    ledger, spool = DeltaLedger(str(tmp_path / "ledger")), str(tmp_path / "spool")
    pg = ScriptedSink("pg")
    lagging = SinkSpec(pg, lag=lag_policy("pg", {"on_failure": "lag"}))
    fan = FanOut("orders", ledger, [ScriptedSink("lake"), lagging], backoff_s=0, spool=spool,
                 probe_interval_s=3600)  # fmt: skip
    try:
        fan.process(SchemaFrame([1]), BatchInfo("orders", 0, "q-old", _kafka(0)))
        pg.always_fail = SinkWriteError("refused", sink="pg")
        fan.process(SchemaFrame([2]), BatchInfo("orders", 1, "q-old", _kafka(1)))
    finally:
        fan.close()

    args = ["recover", "--ledger", str(tmp_path / "ledger"), "--pipeline", "orders"]
    assert main([*args, "--spool", spool]) == 0
    assert readout(capsys).out.splitlines() == [
        "pipeline 'orders': last committed batch per sink",
        '  lake: batch 1, query id q-old, source offsets [{"orders": {"0": 200}}]',
        '  pg: batch 1, query id q-old, source offsets [{"orders": {"0": 200}}] (from the '
        "spool: its last mark is batch 0; the catch-up writes it the spooled batches after "
        "a reset)",
        "Resume after batch 1: every sink the pipeline still writes holds it, so nothing is "
        "written twice.",
        "Source 0 (Kafka): start a new checkpoint with",
        """  .option("startingOffsets", '{"orders": {"0": 200}}')""",
        STOP_FIRST,
        NO_CONFIG,
        recorded_text(1, 0, None),
    ]
    assert main(args) == 0  # without the spool: pg at its mark, and the output says so
    out = readout(capsys).out.splitlines()
    assert out[3].startswith("Resume after batch 0 (sink 'pg' is furthest behind)")
    assert out[-3:] == [NO_SPOOL, NO_CONFIG, recorded_text(2, 0, None)]
    # a mistyped --spool read as an empty spool: pg at its mark, and no note that the
    # spool was not read (the resume point of a spool that holds pg's batch 1 instead)
    typo = str(tmp_path / "spoool")
    for command in (args, ["status", "--ledger", str(tmp_path / "ledger")]):
        assert main([*command, "--spool", typo]) == 2
        assert readout(capsys) == (
            "",
            f"fanout: configuration error: --spool {typo}: no spool there (no {typo}/index "
            "table, which a pipeline run with a spool creates when it starts); give the "
            "pipeline's spool (pipeline.spool in its file, FanOut(spool=...)), or leave "
            "--spool out\n",
        )


@pytest.mark.parametrize(
    "command",
    [["recover", "--pipeline", "orders"], ["status", "--pipeline", "orders"], ["status"]],
    ids=["recover", "status of one pipeline", "status of all"],
)
def test_a_spool_path_holding_no_spool_is_refused_not_read_as_an_empty_spool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """A mistyped --spool: every FanOut given a spool creates its index when it starts, so
    a path without one is not the pipeline's spool. Read as an empty spool, `fanout
    recover`'s output looked like one that was read (no note that it was not), and counted
    a lagging sink at its mark: a reset there writes it the batches the real spool gives
    it twice. `fanout status --spool` created an empty spool there and showed it as one
    holding nothing. Both fail, creating nothing."""
    ledger = DeltaLedger(str(tmp_path / "ledger"))
    ledger.open()
    ledger.mark_committed(_mark("lake", 1, [{"orders": {"0": 200}}]))
    ledger.mark_committed(_mark("pg", 0, [{"orders": {"0": 100}}]))
    wrong = str(tmp_path / "spoool")
    name, *rest = command

    assert main([name, "--ledger", str(tmp_path / "ledger"), "--spool", wrong, *rest]) == 2
    captured = readout(capsys)
    assert captured.out == ""
    assert captured.err.splitlines() == [
        f"fanout: configuration error: --spool {wrong}: no spool there (no {wrong}/index "
        "table, which a pipeline run with a spool creates when it starts); give the "
        "pipeline's spool (pipeline.spool in its file, FanOut(spool=...)), or leave --spool "
        "out"
    ]
    assert not (tmp_path / "spoool").exists()  # only looked


def test_a_spooled_batch_spark_never_committed_is_named_as_given_up_not_counted() -> None:
    """The epoch's first batch: pg spooled it, lake (fail-fast) failed it, so no sink has
    a mark. After a reset it is given up (the catch-up's rule): the new checkpoint starts
    from the beginning, and pg is not counted at batch 0."""
    recovery = recovery_of("orders", [], [_spooled(0, {"pg"}, {"lake", "pg"})], "spool")
    assert render(recovery).splitlines() == [
        "pipeline 'orders': the ledger holds no committed batch",
        "  pg: batch(es) 0 in the spool, never committed by Spark: given up at a reset (the "
        "new checkpoint reads their rows again)",
        NO_CONFIG,
    ]


def test_every_sink_lagging_from_the_first_batch_resumes_after_their_spooled_batches() -> None:
    """All sinks down since the epoch's first batch: no mark, every batch spooled for
    both, so the catch-up writes them all after a reset; resume after the last one."""
    both = {"pg", "kafka"}
    spooled = [_spooled(b, both, both) for b in range(3)]
    recovery = recovery_of("orders", [], spooled, "spool")
    assert recovery.given_up == {}
    lines = render(recovery).splitlines()
    assert lines[1:3] == [
        '  kafka: batch 2, query id q-old, source offsets [{"orders": {"0": 300}}] (from the '
        "spool: no mark in the epoch; the catch-up writes it the spooled batches after a reset)",
        '  pg: batch 2, query id q-old, source offsets [{"orders": {"0": 300}}] (from the '
        "spool: no mark in the epoch; the catch-up writes it the spooled batches after a reset)",
    ]
    assert lines[3:] == [
        "Resume after batch 2: every sink the pipeline still writes holds it, so nothing is "
        "written twice.",
        "Source 0 (Kafka): start a new checkpoint with",
        """  .option("startingOffsets", '{"orders": {"0": 300}}')""",
        STOP_FIRST,
        NO_CONFIG,
    ]


def test_a_spool_index_an_older_version_wrote_without_party_is_read_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An index from before the spool recorded each batch's sinks (no ``party`` column):
    `recover --spool` and `status --spool` read its batch as the sinks it is spooled for
    and those with a mark in its epoch (lake and pg, as recorded today), so the report is
    the one a current index gives."""
    from fanout import FanOut, SinkWriteError
    from fanout.app.recover import NOT_RECORDED, STOP_FIRST_UNRECORDED
    from fanout.app.status import report
    from fanout.contract.batch import BatchInfo
    from fanout.sink_spec import SinkSpec, lag_policy
    from fanout.spool.table import read_spooled
    from tests.unit.fakes import SchemaFrame, ScriptedSink
    from tests.unit.test_lag import _as_an_older_version_wrote_it

    ledger, spool = DeltaLedger(str(tmp_path / "ledger")), str(tmp_path / "spool")
    pg = ScriptedSink("pg", always_fail=SinkWriteError("refused", sink="pg"))
    lagging = SinkSpec(pg, lag=lag_policy("pg", {"on_failure": "lag"}))
    fan = FanOut("orders", ledger, [ScriptedSink("lake"), lagging], backoff_s=0, spool=spool,
                 probe_interval_s=3600)  # fmt: skip
    try:
        fan.process(SchemaFrame([1]), BatchInfo("orders", 0, "q-old", _kafka(0)))
        fan.process(SchemaFrame([2]), BatchInfo("orders", 1, "q-old", _kafka(1)))
    finally:
        fan.close()
    _as_an_older_version_wrote_it(f"{spool}/index")

    spooled = read_spooled(spool, "orders")
    assert [(b.key, b.needed_by, b.party) for b in spooled] == [
        ((0, 0), {"pg"}, None), ((0, 1), {"pg"}, None),
    ]  # fmt: skip
    args = ["recover", "--ledger", ledger.path, "--pipeline", "orders", "--spool", spool]
    readout(capsys)
    assert main([*args, "--no-record"]) == 0
    assert readout(capsys).out.splitlines() == [
        "pipeline 'orders': last committed batch per sink",
        '  lake: batch 1, query id q-old, source offsets [{"orders": {"0": 200}}]',
        '  pg: batch 1, query id q-old, source offsets [{"orders": {"0": 200}}] (from the '
        "spool: no mark in the epoch; the catch-up writes it the spooled batches after a "
        "reset)",
        "Resume after batch 1: every sink the pipeline still writes holds it, so nothing is "
        "written twice.",
        "Source 0 (Kafka): start a new checkpoint with",
        """  .option("startingOffsets", '{"orders": {"0": 200}}')""",
        STOP_FIRST_UNRECORDED,
        NO_CONFIG,
        NOT_RECORDED,
    ]
    status = {s["sink"]: s for s in json.loads(report(ledger, "orders", as_json=True, spool=spool))}
    assert (status["pg"]["state"], status["pg"]["lag_batches"], status["pg"]["given_up"]) == (
        "lagging", 2, [],
    )  # fmt: skip


def test_a_report_the_ledger_cannot_record_never_says_it_is_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ledger that refuses the write (read-only credentials): `recover` printed "the
    report is recorded in the ledger, so a new epoch started from it is refused when ...",
    then "Not recorded in the ledger (...)". Now the report says the ledger could not
    record it, the line after says why; the offsets are printed; nothing is in the ledger."""
    import deltalake

    from fanout.app.recover import STOP_FIRST_UNWRITTEN
    from fanout.delta_tables.io import transaction_version
    from fanout.ledger.recovery import recovery_app_id

    ledger = DeltaLedger(str(tmp_path / "ledger"))
    ledger.open()
    for sink, through in (("lake", 2), ("pg", 1)):
        for batch in range(through + 1):
            ledger.mark_committed(
                LedgerEntry(
                    "orders",
                    sink,
                    batch,
                    "committed",
                    query_id="q-old",
                    source_offsets=json.dumps(_kafka(batch)),
                )
            )

    def read_only(*_: Any, **__: Any) -> None:
        raise OSError("Generic LocalFileSystem error: Permission denied (os error 13)")

    monkeypatch.setattr(deltalake, "write_deltalake", read_only)
    readout(capsys)
    assert main(["recover", "--ledger", ledger.path, "--pipeline", "orders"]) == 0
    out = readout(capsys).out.splitlines()
    assert out[4:7] == [
        "Source 0 (Kafka): start a new checkpoint with",
        """  .option("startingOffsets", '{"orders": {"0": 200}}')""",
        STOP_FIRST_UNWRITTEN,
    ]
    assert out[-1] == (
        f"Not recorded in the ledger (cannot write to the ledger at {ledger.path}: Generic "
        "LocalFileSystem error: Permission denied (os error 13)): a new epoch started from "
        "these offsets cannot check that no batch was committed after this report."
    )
    assert not any("report is recorded" in line for line in out), out
    assert transaction_version(deltalake.DeltaTable(ledger.path), recovery_app_id("orders")) is None
