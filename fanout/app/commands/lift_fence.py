"""``fanout ledger lift-fence``: lift the fences a refused or killed start of a new epoch
left (:mod:`fanout.app.lift_fence`)."""

from __future__ import annotations

import argparse

from fanout.app.commands.newest import ledger_newest_marks, say_newest
from fanout.app.commands.scope import existing_ledger
from fanout.errors import ConfigurationError


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fanout ledger lift-fence`` to ``commands``."""
    lift = commands.add_parser(
        "lift-fence",
        help="after a new epoch's start refused or killed: lift the fences it left, so the "
        "replaced epoch's checkpoint runs again",
        description="A new epoch's start (a checkpoint reset, --new-epoch) closes the "
        "replaced epoch to the sinks' writes still in flight (the built-in sinks) before it asks "
        "them about its batch. A start refused after that lifts its fences when it can; one "
        "killed before the ledger recorded it cannot, and the replaced epoch's writes are "
        "then refused (EpochFencedError). This lifts them, opening each sink as fanout "
        "validate does (creating nothing; a sink type without read_only_check as a run "
        "does), and says per sink whether there was a fence. Refused when the ledger "
        "records that the epoch started (its query relies on the fences), and while the "
        "file's checkpoint holds a batch planned in the last minute and not committed (a "
        "start perhaps in progress); the newest mark is printed, with a warning when the "
        "pipeline looks running. RISK: it cannot tell a start killed between its fences "
        "and its ledger row from one still running there, and lifted under a running "
        "start the replaced query writes its batch beside the new epoch's (rows twice): "
        "stop every query of the pipeline first. Exit 0 done (or nothing to lift), 1 a "
        "sink that could not be opened or lifted, 2 refused.",
    )
    lift.add_argument(
        "--config",
        metavar="PIPELINE.toml",
        required=True,
        help="the pipeline file (as for fanout run): its ledger, pipeline and sinks",
    )
    lift.add_argument(
        "--sink",
        action="append",
        metavar="SINK",
        help="only this sink (repeatable); default: every sink of the file that fences",
    )
    lift.add_argument(
        "--epoch",
        type=int,
        required=True,
        help="the epoch whose start fenced (the refusal names it: the one after the "
        "replaced epoch); its fence on the epoch before it is lifted",
    )
    lift.set_defaults(func=cmd_lift_fence)


def cmd_lift_fence(args: argparse.Namespace) -> int:
    """Lift the fences a refused or killed start of epoch ``--epoch`` left on the pipeline
    file's sinks (:mod:`fanout.app.lift_fence`), so the replaced epoch's checkpoint can run
    again."""
    from fanout.app.lift_fence import (
        STOP_FIRST,
        check_epoch,
        fencing_sinks,
        lift,
        refuse_running_checkpoint,
    )
    from fanout.app.runner import load_pipeline

    if args.epoch < 1:
        raise ConfigurationError(
            f"--epoch {args.epoch}: a start of epoch 1 or later fences (the epoch before "
            "it); give the epoch the refusal names"
        )
    config = load_pipeline(args.config)
    ledger = existing_ledger(config.ledger, args.config)
    check_epoch(ledger, config.name, args.epoch)
    refuse_running_checkpoint(config, args.config)
    sinks = fencing_sinks(config, args.sink or ())
    say_newest(ledger_newest_marks(ledger, config.name), config.name, STOP_FIRST)
    if not sinks:
        print(f"pipeline {config.name!r}: no sink of {args.config} fences epochs: nothing to lift")
        return 0
    lines, fenced = lift(config, ledger, sinks, args.epoch)
    for line in lines:
        print(line)
    if not fenced:
        print(
            f"pipeline {config.name!r}: no sink held a fence of epoch {args.epoch}'s start: "
            f"nothing lifted (a write of epoch {args.epoch - 1} still refused is refused "
            "for another reason: its error says which)"
        )
        return 0
    print(
        f"pipeline {config.name!r}: epoch {args.epoch - 1}'s checkpoint can run again: "
        "restart the query on it (the one whose write was refused) to complete its batch"
    )
    return 0
