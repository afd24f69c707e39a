"""``fanout ledger maintain``: the ledger's log checkpoint, compaction and vacuum."""

from __future__ import annotations

import argparse

from fanout.app.commands.newest import NEWEST_HELP, ledger_newest_marks, say_newest
from fanout.app.commands.scope import existing_ledger


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fanout ledger maintain`` to ``commands``."""
    maintain = commands.add_parser(
        "maintain",
        help="log checkpoint, compaction of small files, vacuum",
        description="Log checkpoint, compaction of small files, vacuum. First, per "
        f"pipeline: {NEWEST_HELP} (no warning: maintenance beside a running pipeline is "
        "safe, its compaction retries on the pipeline's marks).",
    )
    maintain.add_argument("--ledger", required=True, help="the ledger's Delta table path")
    maintain.add_argument(
        "--retention-hours",
        type=_hours,
        default=168,
        help="vacuum files unreferenced for longer than this (default 168)",
    )
    maintain.add_argument("--no-vacuum", action="store_true", help="skip vacuum")
    maintain.add_argument("--no-compact", action="store_true", help="skip compaction")
    maintain.add_argument("--no-checkpoint", action="store_true", help="skip the log checkpoint")
    maintain.set_defaults(func=cmd_maintain)


def cmd_maintain(args: argparse.Namespace) -> int:
    """Checkpoint the ledger's log, compact its files, vacuum old ones; first, each
    pipeline's newest write mark (no warning: maintenance beside a running pipeline is
    safe, docs/architecture.md §4, "Compactions that race")."""
    ledger = existing_ledger(args.ledger, None)
    say_newest(ledger_newest_marks(ledger, None), None, None)
    report = ledger.maintain(
        checkpoint=not args.no_checkpoint,
        compact=not args.no_compact,
        vacuum_retention_hours=None if args.no_vacuum else args.retention_hours,
    )
    print(
        f"ledger {args.ledger}: version {report.version_before} -> {report.version_after}; "
        f"compacted {report.files_compacted} files; vacuumed {len(report.files_vacuumed)} files; "
        f"log checkpoint {'written' if report.checkpoint_created else 'skipped'}"
    )
    return 0


def _hours(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more hours, not {text!r}")
    return value
