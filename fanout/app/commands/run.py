"""``fanout run``: run a pipeline from its TOML file."""

from __future__ import annotations

import argparse


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fanout run`` to ``commands``."""
    run = commands.add_parser("run", help="run a pipeline from a TOML file (Ctrl-C stops cleanly)")
    run.add_argument("pipeline_file", help="e.g. examples/pipeline.toml")
    run.add_argument(
        "--new-epoch",
        action="store_true",
        help="after a lost or replaced checkpoint (CheckpointResetError): this run "
        "continues under a new epoch, whose transaction ids are new (start the new "
        "checkpoint where `fanout recover --config` says). This run only: later runs "
        "refuse resets again. Refused when the checkpoint was not reset",
    )
    run.add_argument(
        "--accept-lost-target",
        action="append",
        metavar="SINK",
        help="after TargetLostError (the sink's target was deleted or replaced and lost "
        "batches the ledger marks written there): this run writes on into the target as it "
        "is, accepting the loss. Repeat for several sinks. This run only",
    )
    run.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    """Run a pipeline described in a TOML file."""
    from fanout.app.runner import run

    return run(
        args.pipeline_file,
        new_epoch=args.new_epoch,
        accept_lost_targets=args.accept_lost_target or (),
    )
