"""``fanout validate``: check a pipeline file and every sink's target, without starting."""

from __future__ import annotations

import argparse


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fanout validate`` to ``commands``."""
    validate = commands.add_parser(
        "validate", help="check a pipeline file and every sink's target, without starting"
    )
    validate.add_argument("pipeline_file")
    validate.set_defaults(func=cmd_validate)


def cmd_validate(args: argparse.Namespace) -> int:
    """Check a pipeline file and open every sink, without starting the stream."""
    from fanout.app.runner import validate

    return validate(args.pipeline_file)
