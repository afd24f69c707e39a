"""``fanout recover``: what a restart needs after a lost checkpoint (:mod:`fanout.app.recover`)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fanout.app.commands.newest import NEWEST_HELP, ledger_newest_marks, say_newest
from fanout.app.commands.output import masked_text
from fanout.app.commands.scope import CommandScope, command_scope, existing_ledger
from fanout.errors import FanoutError

if TYPE_CHECKING:
    from fanout.ledger.delta import DeltaLedger


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fanout recover`` to ``commands``."""
    recover = commands.add_parser(
        "recover",
        help="after a lost checkpoint: last batches, offsets, Kafka startingOffsets",
        description="After a lost checkpoint: the last batches, offsets, Kafka "
        f"startingOffsets. First, {NEWEST_HELP}; when it looks running, a warning on "
        "stderr (a report of a running pipeline is stale at once); exit codes unchanged.",
    )
    recover.add_argument(
        "--config",
        metavar="PIPELINE.toml",
        help="the pipeline file (as for fanout run): the ledger, pipeline, spool and sinks "
        "come from it (a flag saying otherwise is refused); a sink of it with no mark in "
        "the epoch counts, and each sink is opened (read only, as by fanout validate) and "
        "asked whether it holds the batch after its mark, written but never marked",
    )
    recover.add_argument(
        "--ledger", help="the ledger's Delta table path (required without --config)"
    )
    recover.add_argument("--pipeline", help="the pipeline name (required without --config)")
    recover.add_argument(
        "--spool",
        help="the pipeline's spool: a lagging sink counts at the batches it gives it",
    )
    recover.add_argument(
        "--no-record",
        action="store_true",
        help="print only: do not record the report in the ledger (a look at a running "
        "pipeline; a reset started from it is then not checked for a query still running)",
    )
    recover.set_defaults(func=cmd_recover)


RECOVER_WHILE_RUNNING = (
    "this report is of a moment: a running query commits past it, and a checkpoint reset "
    "started from it would write those batches again (a report recorded, not --no-record, "
    "refuses that reset); if the checkpoint is not lost there is nothing to recover, else "
    "stop every query of the pipeline first, then run this again"
)
"""``fanout recover``'s warning when the pipeline looks running (still done: exit 0)."""


def cmd_recover(args: argparse.Namespace) -> int:
    """Print what a restart needs after a lost checkpoint, from the ledger (and, with
    ``--config``, from the pipeline's sinks)."""
    from dataclasses import replace

    from fanout.app.recover import NOT_RECORDED, record, recovery_of, render
    from fanout.app.status import unknown_pipeline
    from fanout.ledger.entry import ledger_location
    from fanout.spool.table import read_spooled

    target, config = command_scope(args)
    for note in target.notes:
        print(f"pipeline {target.pipeline!r}: {note}")
    ledger = existing_ledger(target.ledger, target.config)
    committed = ledger.committed_entries(target.pipeline)
    if not committed and (known := ledger.pipelines()) and target.pipeline not in known:
        raise unknown_pipeline(target.ledger, target.pipeline, known)  # a typo, most likely
    spooled = None if target.spool is None else read_spooled(target.spool, target.pipeline)
    sinks = target.sinks if target.config is not None else None
    say_newest(ledger_newest_marks(ledger, target.pipeline), target.pipeline, RECOVER_WHILE_RUNNING)

    def facts(entries: Sequence[Any]) -> Any:
        found = recovery_of(target.pipeline, entries, spooled, target.spool, sinks)
        first = ledger.epoch_start(target.pipeline, found.epoch) if found.lacking else None
        return replace(found, first_batch=first or 0, ledger=ledger_location(ledger))

    recovery = facts(committed)
    asked = None
    if config is not None:
        asked = _ask_sinks(config, target, ledger, recovery)
        lost = asked.lost_marks(ledger, target.pipeline)
        if lost and not args.no_record:
            try:
                for entry in lost:
                    ledger.mark_committed(entry)
            except FanoutError as exc:  # read-only credentials: say what that costs
                asked = replace(asked, unrecorded=str(exc))
        if lost:
            recovery = facts([*committed, *lost])
    if args.no_record:
        print(masked_text(render(recovery, recorded=False, asked=asked)))
        if recovery.furthest_behind is not None:
            print(NOT_RECORDED)
        return 0
    # recorded before it is printed: the report says whether it is recorded, and a command
    # killed between the two must not have shown offsets to start from that nothing checks
    recorded, written = record(ledger, recovery, target.config)
    print(masked_text(render(recovery, asked=asked, unwritten=not written)))
    if recorded is not None:
        print(masked_text(recorded))
    return 0


def _ask_sinks(config: Any, target: CommandScope, ledger: DeltaLedger, recovery: Any) -> Any:
    """Each sink of the pipeline file asked about the batch after its mark
    (:func:`fanout.app.recover_sinks.ask_sinks`)."""
    from fanout.app.recover_sinks import ask_sinks

    assert target.config is not None
    # the pipeline's epoch, not the newest with marks: an epoch started and killed in its
    # first batch has none, and the next start asks about that batch (refuse_unmarked)
    epoch = max(recovery.epoch, ledger.current_epoch(target.pipeline))
    spooled = {
        sink: recovery.latest[sink].batch_id
        for sink in recovery.from_spool
        if recovery.latest[sink].epoch == epoch
    }
    return ask_sinks(config, target.config, ledger, epoch, spooled)
