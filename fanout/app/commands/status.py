"""``fanout status``: per sink, the progress a ledger records (:mod:`fanout.app.status`)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any

from fanout.app.commands.newest import NEWEST_HELP
from fanout.app.commands.output import json_text, print_json, unmasked_stdout
from fanout.app.commands.scope import command_scope, existing_ledger
from fanout.contract.locations import shown_location
from fanout.errors import ConfigurationError, FanoutError, SpoolError, shell_word
from fanout.observe.logs import known_secrets
from fanout.observe.secrets import redact_printed


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fanout status`` to ``commands``."""
    status = commands.add_parser(
        "status",
        help="per-sink progress recorded in a ledger",
        description="Per sink: last committed batch, rows, failed attempts, last commit. "
        f"After the table, per pipeline: {NEWEST_HELP} (--json: pipeline_newest_mark in each "
        "sink's object).",
    )
    status.add_argument(
        "--config",
        metavar="PIPELINE.toml",
        help="the pipeline file (as for fanout run): the ledger, pipeline and spool come "
        "from it (a flag saying otherwise is refused), and every sink of it is listed, one "
        "the ledger holds no row of as 'no mark yet'",
    )
    status.add_argument(
        "--ledger", help="the ledger's Delta table path (required without --config)"
    )
    status.add_argument("--pipeline", help="only this pipeline")
    status.add_argument(
        "--spool",
        help="the pipeline's spool: also show how far behind each sink is, and the batches a "
        "`fanout ledger skip` without --spool kept in it",
    )
    status.add_argument("--json", action="store_true", help="print JSON (every detail)")
    status.add_argument(
        "--wide", action="store_true", help="every column, with the last error (wider than 100)"
    )
    status.add_argument(
        "--watch", action="store_true", help="redraw every --interval seconds until Ctrl-C"
    )
    status.add_argument(
        "--interval",
        type=_seconds,
        default=5.0,
        help="seconds between refreshes (default 5; with --config, the sinks' targets are "
        "asked for problems to fix by hand at most once a minute)",
    )
    status.add_argument(
        "--count", type=_positive, help="with --watch: stop after this many refreshes"
    )
    status.set_defaults(func=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    """Per sink: last committed batch, rows, last commit time, failed attempts; with
    ``--config``, of the pipeline file's pipeline, every sink of it listed."""
    from fanout.app.standing import SinkProblemsEvery, ledger_problems
    from fanout.app.status import checkpoint_fact, report
    from fanout.ledger.delta import DeltaLedger

    location, pipeline, spool = args.ledger, args.pipeline, args.spool
    sinks: tuple[str, ...] | None = None
    checkpoint = ""
    built: dict[str, Any] = {}  # the file's sinks, asked for their standing problems
    if args.config is not None:
        target, config = command_scope(args)
        checkpoint = config.checkpoint if config is not None else ""
        built = _built_sinks(config)
        location, pipeline, spool, sinks = (
            target.ledger,
            target.pipeline,
            target.spool,
            target.sinks,
        )
        if spool is not None and args.spool is None:
            try:
                started = _spool_started(spool, pipeline)
            except SpoolError as exc:  # the ledger's table is still worth showing
                unread = f"{exc} (its spooled batches and the sinks lagging on them not shown)"
                target, spool = replace(target, notes=(*target.notes, unread)), None
            else:
                if not started:
                    ran = _has_batches(target.ledger, pipeline)
                    note = _no_spool_yet(spool, args.config, ran=ran)
                    target, spool = replace(target, notes=(*target.notes, note)), None
        for note in target.notes:  # stderr: --json's output stays JSON
            print(f"pipeline {pipeline!r}: {note}", file=sys.stderr)
    elif location is None:
        raise ConfigurationError("--ledger required: give it, or --config PIPELINE.toml")
    ledger = DeltaLedger(location) if args.config is not None else existing_ledger(location, None)
    checked = False
    if args.config is not None and not ledger.exists():
        print(
            f"pipeline {pipeline!r}: no ledger at {location} yet: the first run creates it "
            f"(if {args.config} has run, check pipeline.ledger)",
            file=sys.stderr,
        )

    asked = SinkProblemsEvery(built)  # each sink at the first draw, then once a minute

    def once() -> str:
        nonlocal checked  # the spool's existence: checked at the first draw, not each redraw
        # --config before the first run: no ledger yet, every sink of the file "no mark yet"
        present = ledger if args.config is None or ledger.exists() else None
        fact = None
        if checkpoint and pipeline is not None:
            fact = checkpoint_fact(checkpoint, present, pipeline, args.config)
        problems = ledger_problems(present) + asked()
        text = report(present, pipeline, as_json=args.json, wide=args.wide, spool=spool,
                      spool_checked=checked, sinks=sinks, checkpoint=fact,
                      newest=True, problems=problems)  # fmt: skip
        checked = True
        if fact is not None and not args.json:
            text += f"\n\ncheckpoint {fact.location}: {fact.said}"
        return text

    if args.watch or args.count is not None:
        from fanout.app.watch import watch

        title = (
            f"fanout status --ledger {shell_word(location)}"
            if args.config is None
            else f"fanout status --config {shell_word(args.config)}"
        )
        if args.json:  # each draw masked value by value, past stdout's masking (print_json)
            return watch(
                lambda: json_text(json.loads(once())),
                title=redact_printed(title, known_secrets()),
                interval_s=args.interval,
                count=args.count,
                out=unmasked_stdout(),
            )
        return watch(once, title=title, interval_s=args.interval, count=args.count, out=sys.stdout)
    if args.json:
        print_json(json.loads(once()))
    else:
        print(once())
    return 0


def _built_sinks(config: Any) -> dict[str, Any]:
    """The pipeline file's sinks, built (not opened) for ``fanout status`` to ask each for
    its standing problems; one whose options do not build is left out (``fanout validate``
    says why)."""
    from fanout.app.recover_sinks import built_sink

    built: dict[str, Any] = {}
    for options in [] if config is None else config.sinks:
        try:
            built[str(options["name"])] = built_sink(options, config.plugins)[0]
        except Exception:  # its options' error is validate's and the run's to say
            continue
    return built


def _spool_started(path: str, pipeline: str | None) -> bool:
    """Whether a run created the spool at ``path`` (its index table)."""
    from fanout.spool.index import existing_index

    try:
        existing_index(path, pipeline)
    except ConfigurationError:
        return False
    return True


def _has_batches(ledger: str, pipeline: str | None) -> bool:
    """Whether the ledger at ``ledger`` holds rows of ``pipeline`` (``False`` when there
    is no ledger to read: nothing ran)."""
    from fanout.ledger.delta import DeltaLedger

    try:
        return pipeline in DeltaLedger(ledger).pipelines()
    except FanoutError:
        return False


def _no_spool_yet(path: str, file: str, *, ran: bool = False) -> str:
    """``status --config``'s note for the file's spool that is not there: none yet (a
    pipeline whose first start failed: nothing spooled), or, when the ledger holds the
    pipeline's batches (``ran``), maybe one deleted or moved, whose batches it cannot show."""
    shown = shown_location(path)
    if ran:
        return (
            f"spool {shown} (pipeline.spool in {file}): none there, though the ledger holds "
            "batches of the pipeline: a start that failed before creating it, or a spool "
            "deleted, moved, or another path in the file than the runs had (its spooled "
            "batches and the sinks lagging on them are not shown: give the spool the runs "
            "had by --ledger, --pipeline and --spool instead of --config)"
        )
    return (
        f"spool {shown} (pipeline.spool in {file}): none there yet, which a run of the "
        "pipeline creates when it starts: no batch is spooled (if the pipeline ran with "
        "another spool, give it: --ledger, --pipeline and --spool instead of --config)"
    )


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, not {text!r}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text!r}")
    return value
