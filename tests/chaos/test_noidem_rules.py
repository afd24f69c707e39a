"""The rule the chaos test holds the never-skipping sink to (tests/chaos/noidem.py),
checked on made-up runs: a batch written again is allowed only after a kill that fell
between its write and its mark, in the batch the killer killed in."""

from __future__ import annotations

from tests.chaos.noidem import NoidemRun, Write, ledger_skips, unexpected_writes


def _run(
    label: str, batches: list[int], mark: int, kill: tuple[str, int] | None = None
) -> NoidemRun:
    run = NoidemRun(label, mark, [Write(b, 10, 1) for b in batches])
    if kill is not None:
        run.kill_point, run.kill_batch = kill
    return run


def test_a_write_killed_before_its_mark_is_written_again_once() -> None:
    runs = [
        _run("sink_done of noidem @ 1", [0, 1], 0, ("sink_done", 1)),
        _run("final", [1, 2], 2),
    ]
    assert unexpected_writes(runs, 30, 2) == []
    assert ledger_skips(runs) == []


def test_a_marked_batch_written_again_is_named() -> None:
    runs = [
        _run("batch_end @ 1", [0, 1], 1, ("batch_end", 1)),
        _run("final", [1, 2], 2),  # what a plan treating every sink as pending does
    ]
    assert ledger_skips(runs) == [1]
    assert unexpected_writes(runs, 30, 2) == [
        "run 2 (final): noidem got batches [1, 2], the ledger allows [2] "
        "(its mark 1 before the run, 2 after)"
    ]


def test_an_unmarked_write_is_allowed_only_where_the_kill_fell_between_write_and_mark() -> None:
    for kill in [("batch_start", 1), ("sink_done", 0), None]:
        runs = [_run("killed", [0, 1], 0, kill), _run("final", [1], 1)]
        assert unexpected_writes(runs, 20, 1) == [
            "run 1 (killed): noidem got batches [0, 1], the ledger allows [0] "
            "(its mark -1 before the run, 0 after)"
        ], kill


def test_missing_batches_rows_and_retries_are_named() -> None:
    runs = [_run("final", [0, 2], 2)]
    runs[0].writes[1] = Write(2, 10, 2)
    assert unexpected_writes(runs, 30, 3) == [
        "run 1 (final): noidem got batches [0, 2], the ledger allows [0, 1, 2] "
        "(its mark -1 before the run, 2 after)",
        "run 1: batch 2 written at attempt 2",
        "the distinct batches hold 20 rows, the input 30",
        "noidem's last mark is 2, the stream's last batch 3",
    ]


def test_a_write_of_a_batch_the_sink_had_marked_is_named() -> None:
    """Whatever the kills: a write that began with the sink's mark at or past its batch
    (the mark ahead of the write, or the ledger's skip broken) fails the run."""
    runs = [NoidemRun("final", 2, [Write(0, 10, 1, -1), Write(1, 10, 1, 1), Write(2, 10, 1, 1)])]
    assert unexpected_writes(runs, 30, 2) == ["run 1: batch 1 written with the sink's mark at 1"]
