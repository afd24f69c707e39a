"""The ``fanout`` command: plugins, status, ledger maintenance, the demo, and the commands
plugins contribute (``fanout migrate`` comes with fanout-postgres) through
:func:`fanout.hooks.specs.fanout_cli_commands`.

Exit codes: 0 success, 1 failure (also a sink whose target cannot be reached when it is
opened: the options may be right; ``fanout run`` and ``fanout validate`` alike),
2 configuration error (bad arguments or options);
``fanout run`` also 3 when it ends (its trigger, or a signal's clean stop) with a lagging
sink still missing batches, and 128 + the signal's number when a stop abandons a batch
(:func:`fanout.app.runner.run`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from fanout.contract.locations import local_path, shown_location
from fanout.errors import (
    ConfigurationError,
    FanoutError,
    SinkUnreachableError,
    SpoolError,
    batch_ranges,
    shell_word,
)
from fanout.observe.logs import RedactingStream, known_secrets, register_secrets
from fanout.observe.logs import configure as configure_logging
from fanout.observe.secrets import location_secrets, redact, redact_json, redact_printed
from fanout.version import __version__

if TYPE_CHECKING:
    from fanout.contract.sink import Sink
    from fanout.hooks.registry import Registry
    from fanout.ledger.delta import DeltaLedger
    from fanout.spool.table import Spool

EXIT_BROKEN_PIPE = 128 + 13
"""What a shell reports for a tool that SIGPIPE ended (``fanout status --json | head``)."""

UNREACHABLE_NEXT = (
    "fanout: the sink's target could not be reached, which is not always a mistake in the "
    "pipeline file: if its server is down, run the same command again once it accepts "
    "connections; if a host name that does not resolve or a port nothing listens on is in "
    "its options, fix them (`fanout validate PIPELINE.toml` checks them). A sink with "
    'on_failure = "lag" starts behind instead, the other sinks going on without it.'
)
"""What to do about a :class:`fanout.SinkUnreachableError` that stopped a command: the
same error comes of a server down and of a misspelt host or port (a sink cannot tell them
apart), so both are named."""


def _print_options(types: Mapping[str, Any], type_name: str, *, as_json: bool) -> int:
    """``fanout plugins --options TYPE``: the options a sink type declares."""
    from fanout.contract.options import declared_options, option_type_texts, text_table

    if type_name not in types:
        import difflib

        known = ", ".join(sorted(types)) or "none"
        close = difflib.get_close_matches(type_name, list(types), n=1)
        hint = f", did you mean {close[0]}?" if close else ""
        print(f"fanout: no sink type {type_name!r}{hint}; installed: {known}", file=sys.stderr)
        return 2
    sink_class = types[type_name].sink_class
    options = declared_options(sink_class)
    kinds = option_type_texts(sink_class)
    if as_json:
        listed = [{**vars(o), "type": kinds.get(o.name) or None} for o in options]
        _print_json(listed)
    else:
        print(f"options of sink type {type_name!r}:\n")
        print(text_table(options, kinds))
        print(f"\n{_implements(sink_class)}")
    return 0


def _implements(sink_class: type[Sink]) -> str:
    """``implements: holds_batch, ...``: the optional hooks a sink type implements (what a
    reset, a replay or ``fanout validate`` can ask it), each answering only under some
    options followed by them (``harmless_rewrite (mode=upsert, no dead_letter)``), or
    ``none``."""
    from fanout.contract.sink import implemented_hooks

    return f"implements: {', '.join(implemented_hooks(sink_class, conditions=True)) or 'none'}"


def _conditions(sink_class: type[Sink]) -> dict[str, str]:
    """The implemented hooks that answer only under some options, with those options."""
    from fanout.contract.sink import implemented_hooks

    implemented = implemented_hooks(sink_class)
    return {h: c for h, c in sink_class.hook_conditions.items() if h in implemented}


def cmd_plugins(args: argparse.Namespace) -> int:
    """List the sink types of every installed plugin, and of the modules ``--plugin`` names
    (a pipeline file's ``plugins``)."""
    from fanout.app.status import format_table
    from fanout.contract.sink import implemented_hooks
    from fanout.hooks.registry import load_registry

    registry = load_registry(args.plugin or ())
    if args.options is not None:  # imports that type's class only
        code = _print_options(registry.sink_types(), args.options, as_json=args.json)
        failed = _print_load_errors(registry)  # said either way: the type may be its
        return code or failed  # an unknown type stays exit 2
    types = registry.listed_sink_types()  # every class imported: its guarantees, hooks
    rows = [
        [
            t.name,
            t.guarantees_text(),
            t.plugin.distribution or "-",
            t.plugin.version or "-",
            f"{t.sink_class.__module__}.{t.sink_class.__qualname__}",
        ]
        for t in sorted(types.values(), key=lambda t: t.name)
    ]
    if args.json:
        _print_json(
            [
                {
                    "type": t.name,
                    "guarantees": list(t.guarantees),
                    "guarantees_declared": t.declared,
                    "distribution": t.plugin.distribution,
                    "version": t.plugin.version,
                    "class": f"{t.sink_class.__module__}.{t.sink_class.__qualname__}",
                    "implements": implemented_hooks(t.sink_class),
                    "conditions": _conditions(t.sink_class),
                }
                for t in sorted(types.values(), key=lambda t: t.name)
            ]
        )
    elif rows:
        print(format_table(["type", "guarantees", "distribution", "version", "class"], rows))
        print()  # then each type's optional hooks: too long for a column
        for t in sorted(types.values(), key=lambda t: t.name):
            print(f"{t.name} {_implements(t.sink_class)}")
    else:
        print("no sink types installed")
    return _print_load_errors(registry)


def _print_load_errors(registry: Registry) -> int:
    """Each plugin that did not load, on stderr (its text says what failed: no second
    "error" before it); 1 when there is one, else 0."""
    for error in registry.load_errors:
        print(f"fanout: {error}", file=sys.stderr)
    return 1 if registry.load_errors else 0


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
        target, config = _recover_target(args)
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
    ledger = DeltaLedger(location) if args.config is not None else _existing_ledger(location, None)
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
        if args.json:  # each draw masked value by value, past stdout's masking (_print_json)
            return watch(
                lambda: _json_text(json.loads(once())),
                title=redact_printed(title, known_secrets()),
                interval_s=args.interval,
                count=args.count,
                out=_unmasked_stdout(),
            )
        return watch(once, title=title, interval_s=args.interval, count=args.count, out=sys.stdout)
    if args.json:
        _print_json(json.loads(once()))
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
    from fanout.spool.table import existing_index

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


def cmd_recover(args: argparse.Namespace) -> int:
    """Print what a restart needs after a lost checkpoint, from the ledger (and, with
    ``--config``, from the pipeline's sinks)."""
    from dataclasses import replace

    from fanout.app.recover import NOT_RECORDED, record, recovery_of, render
    from fanout.app.status import unknown_pipeline
    from fanout.ledger.entry import ledger_location
    from fanout.spool.table import read_spooled

    target, config = _recover_target(args)
    for note in target.notes:
        print(f"pipeline {target.pipeline!r}: {note}")
    ledger = _existing_ledger(target.ledger, target.config)
    committed = ledger.committed_entries(target.pipeline)
    if not committed and (known := ledger.pipelines()) and target.pipeline not in known:
        raise unknown_pipeline(target.ledger, target.pipeline, known)  # a typo, most likely
    spooled = None if target.spool is None else read_spooled(target.spool, target.pipeline)
    sinks = target.sinks if target.config is not None else None
    _say_newest(_newest(ledger, target.pipeline), target.pipeline, RECOVER_WHILE_RUNNING)

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
        print(_masked_text(render(recovery, recorded=False, asked=asked)))
        if recovery.furthest_behind is not None:
            print(NOT_RECORDED)
        return 0
    # recorded before it is printed: the report says whether it is recorded, and a command
    # killed between the two must not have shown offsets to start from that nothing checks
    recorded, written = record(ledger, recovery, target.config)
    print(_masked_text(render(recovery, asked=asked, unwritten=not written)))
    if recorded is not None:
        print(_masked_text(recorded))
    return 0


def _existing_ledger(location: str, config: str | None) -> DeltaLedger:
    """The ledger at ``location``, refused (:class:`fanout.ConfigurationError`, exit 2)
    when there is none: an operator's command (``status``, ``recover``, ``ledger skip``,
    ``ledger maintain``) never creates a ledger, only a pipeline's run does, so a mistyped
    ``--ledger`` (or a ``pipeline.ledger`` of ``config`` that never ran) leaves nothing
    behind. One more open of the ledger's table per command (none on a run's path)."""
    from fanout.ledger.delta import DeltaLedger

    ledger = DeltaLedger(location)
    if ledger.exists():
        return ledger
    check = (
        "check the path for a typo, or give --config PIPELINE.toml to use the pipeline "
        "file's pipeline.ledger"
        if config is None
        else f"check pipeline.ledger in {config} for a typo, or whether the pipeline has run yet"
    )
    local = local_path(location)  # a relative path (or LEDGER pasted as printed): absolute
    where = shown_location(location) if local is None else os.path.abspath(local)
    raise ConfigurationError(
        f"no ledger at {where}: this command reads an existing ledger and "
        f"creates none (a pipeline's run creates its ledger when it starts): {check}"
    )


def _recover_target(args: argparse.Namespace) -> tuple[_SkipTarget, Any]:
    """The ledger, pipeline, spool and sinks ``fanout recover`` (and ``ledger skip``, and
    ``status --config``) reads, and the pipeline file's config: from ``--config`` when
    given (a flag contradicting it refused), else from the flags alone (no config)."""
    if args.config is None:
        missing = [f for f, v in (("--ledger", args.ledger), ("--pipeline", args.pipeline))
                   if v is None]  # fmt: skip
        if missing:
            raise ConfigurationError(
                f"{' and '.join(missing)} required: give them, or --config PIPELINE.toml"
            )
        return _SkipTarget(args.ledger, args.pipeline, args.spool, None), None
    from fanout.app.runner import load_pipeline

    file = args.config
    config = load_pipeline(file)
    notes: list[str] = []
    ledger = _agreed("--ledger", args.ledger, config.ledger, file, path=True, notes=notes)
    pipeline = _agreed("--pipeline", args.pipeline, config.name, file, path=False)
    spool = args.spool
    if config.spool is not None:
        spool = _agreed("--spool", args.spool, config.spool, file, path=True, notes=notes)
    elif spool is not None:
        raise ConfigurationError(
            f"--spool {spool}: {file} configures no spool (pipeline.spool): drop --spool or "
            "give the pipeline's own file"
        )
    named = tuple(str(s["name"]) for s in config.sinks)
    return _SkipTarget(ledger, pipeline, spool, None, file, tuple(notes), named), config


def _ask_sinks(config: Any, target: _SkipTarget, ledger: DeltaLedger, recovery: Any) -> Any:
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


def _masked_text(text: str) -> str:
    """``text`` with every secret the sinks registered masked."""
    return redact(text, known_secrets())


def cmd_maintain(args: argparse.Namespace) -> int:
    """Checkpoint the ledger's log, compact its files, vacuum old ones; first, each
    pipeline's newest write mark (no warning: maintenance beside a running pipeline is
    safe, docs/architecture.md §4, "Compactions that race")."""
    ledger = _existing_ledger(args.ledger, None)
    _say_newest(_newest(ledger, None), None, None)
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


NEWEST_HELP = (
    "the pipeline's newest write mark (sink, batch, epoch, how long ago) and whether it "
    "looks running: newer than 3 x the median gap between its latest batches, at least 60 s"
)
"""The operator commands' help on the newest-mark line (:mod:`fanout.app.activity`)."""

SKIP_WHILE_RUNNING = (
    "a skip takes no lock: a batch the sink is writing or catching up right now may be "
    "given up though its rows arrive a moment later (its write's own mark is then recorded "
    "beside the skip's, so the ledger stays exact); check with `fanout status` that the "
    "sink is stuck (lagging, its last error a MissedBatchesError or BackfillError) rather "
    "than catching up, and skip no further than the batches it names"
)
"""``fanout ledger skip``'s warning when the pipeline looks running (still done: exit 0)."""

RECOVER_WHILE_RUNNING = (
    "this report is of a moment: a running query commits past it, and a checkpoint reset "
    "started from it would write those batches again (a report recorded, not --no-record, "
    "refuses that reset); if the checkpoint is not lost there is nothing to recover, else "
    "stop every query of the pipeline first, then run this again"
)
"""``fanout recover``'s warning when the pipeline looks running (still done: exit 0)."""


def _newest(ledger: DeltaLedger, pipeline: str | None) -> list[Any]:
    """Per pipeline (``None``: every pipeline of the ledger), its newest write mark now
    (:func:`fanout.app.activity.newest_marks_of`): one scan of seven columns of the
    pipeline's committed rows, reduced in Arrow, in the operator's command only, none on a
    run's path."""
    from fanout.app.activity import newest_marks_of

    return newest_marks_of(ledger.mark_times(pipeline))


def _say_newest(marks: Sequence[Any], pipeline: str | None, warning: str | None) -> None:
    """Print each of ``marks`` (:func:`_newest`; none: ``pipeline`` has no write mark yet)
    and whether its pipeline looks running; for one that does, ``warning`` on stderr (the
    command goes on: its exit code is its own)."""
    from fanout.app.activity import no_mark_yet

    if not marks and pipeline is not None:
        print(no_mark_yet(pipeline))
    for mark in marks:
        print(mark.describe())
        if mark.looks_running and warning is not None:
            print(f"fanout: warning: pipeline {mark.pipeline!r} looks running: {warning}",
                  file=sys.stderr)  # fmt: skip


@dataclass(frozen=True)
class _SkipTarget:
    """Where ``fanout ledger skip`` acts: from its flags, or its ``--config`` file."""

    ledger: str
    pipeline: str
    spool: str | None
    backfill_from: str | None
    config: str | None = None
    notes: tuple[str, ...] = ()
    sinks: tuple[str, ...] = ()
    """The sinks ``config`` names (none without ``--config``)."""


def _relative(location: str) -> bool:
    """Whether ``location`` is a local path relative to the current directory."""
    path = local_path(location)
    return path is not None and not Path(path).is_absolute()


def _agreed(
    flag: str, given: str | None, configured: str, file: str, *, path: bool,
    notes: list[str] | None = None,
) -> str:  # fmt: skip
    """``configured`` (the pipeline file's), refusing a flag ``given`` that says otherwise.
    A location the file names relative is relative to the directory ``fanout run`` runs
    in, which a skip run elsewhere (the command a refusal prints, named absolute) cannot
    know: a flag given then names it, with a note in ``notes``."""
    if given is None:
        return configured
    if path and _relative(configured) and notes is not None:
        notes.append(
            f"{file} names the {flag[2:]} relative ({configured!r}, from the directory "
            f"fanout run runs in): {flag} {given} names it"
        )
        return given
    if path:
        from fanout.contract.locations import same_table_key

        same = same_table_key(given) == same_table_key(configured)
    else:
        same = given == configured
    if not same:
        raise ConfigurationError(
            f"{flag} {given}: {file} says {configured}: drop {flag} (the pipeline file says "
            f"{'where it is' if path else 'which it is'}) or give the pipeline's own file"
        )
    return given


def _skip_target(args: argparse.Namespace) -> _SkipTarget:
    """The ledger, pipeline, spool and the sink's ``backfill_from``: from ``--config``
    when given (a flag contradicting it refused), else from the flags alone."""
    if args.config is None and args.give_up_backfill:
        raise ConfigurationError(
            "--give-up-backfill needs --config PIPELINE.toml: the sink's backfill_from "
            "is in the pipeline file"
        )
    target, config = _recover_target(args)
    if config is None:
        return target
    from fanout.sink_spec import lag_policy

    options = next((s for s in config.sinks if s["name"] == args.sink), None)
    if options is None:
        note = f"sink {args.sink!r} is not in {args.config}: it has no backfill source to check"
        return replace(target, notes=(*target.notes, note))
    return replace(target, backfill_from=lag_policy(args.sink, options).backfill_from)


def _refuse_unknown_sink(ledger: DeltaLedger, target: _SkipTarget, sink: str) -> None:
    """Refuse a ``--sink`` that neither the ``--config`` file nor the ledger knows (a
    misspelt name): the skip would record marks for a sink that never was. Without
    ``--config`` a sink the ledger holds no row of may be real (a new ``backfill_from``
    sink waiting at a batch its source cannot give back has written nothing yet)."""
    if target.config is None or sink in target.sinks:
        return
    known = ledger.sink_names(target.pipeline)
    if sink in known:
        return
    raise ConfigurationError(
        f"--sink {sink}: no sink of that name in {target.config} ({', '.join(target.sinks)}) "
        f"nor in the ledger's pipeline {target.pipeline!r} ({', '.join(known) or 'none'}); "
        "check the name"
    )


def cmd_skip(args: argparse.Namespace) -> int:
    """Record that a sink never gets the batches after its mark through ``--through``."""
    from fanout.ledger.gaps import OlderEpochSkipError, skip_batches

    target = _skip_target(args)
    ledger = _existing_ledger(target.ledger, target.config)
    ledger.open()  # there already: its log retention set, as at a run's start
    _refuse_unknown_sink(ledger, target, args.sink)
    newest = _newest(ledger, target.pipeline)  # before the skip: what the operator acted on
    named = "--spool" if args.spool is not None else f"pipeline.spool of {target.config}"
    spool = None if target.spool is None else _existing_spool(target.spool, target.pipeline, named)
    try:
        done = skip_batches(
            ledger, target.pipeline, args.sink, args.through, args.epoch,
            spool=spool, release_spooled=args.release_spooled,
            backfill_from=target.backfill_from, give_up_backfill=args.give_up_backfill,
        )  # fmt: skip
    except OlderEpochSkipError as exc:
        if not exc.older:
            raise ConfigurationError(
                f"{exc.reason}. To skip epoch {exc.current}'s batches, run "
                f"`{_skip_command(args, exc.current)}`; to skip an older epoch's, the same "
                "with --epoch of it"
            ) from None
        raise ConfigurationError(
            f"{exc.reason}. To skip epoch {exc.epoch}'s batches, run "
            f"`{_skip_command(args, exc.epoch)}`; to skip epoch {exc.current}'s anyway, "
            f"the same with --epoch {exc.current}"
        ) from None
    where = f"pipeline {target.pipeline!r}, sink {args.sink!r}, epoch {done.epoch}"
    for note in target.notes:
        print(f"{where}: {note}")
    if not done.recorded:
        print(
            f"{where}: already holds batch {args.through} (its mark: {done.before}); "
            "no mark recorded"
        )
    else:
        first = 0 if done.before is None else done.before + 1
        print(
            f"{where}: batches {first}-{done.through} recorded as skipped (never written to it); "
            "the next batch writes it"
        )
        _print_backfill(where, target, done.backfill_held)
    if done.released:
        print(
            f"{where}: released batch(es) {batch_ranges(list(done.released))} from the spool "
            f"at {shown_location(str(target.spool))}"
        )
    elif spool is None and target.config is None:  # a pipeline file without a spool has none
        print(
            f"{where}: the spool was not checked (no --spool): batches it still holds for "
            "the sink through this mark are kept, neither written nor released; the "
            "pipeline's start-up names them and how to release them"
        )
    acted = done.recorded or bool(done.released)  # else nothing changed: nothing to warn of
    _say_newest(newest, target.pipeline, SKIP_WHILE_RUNNING if acted else None)
    return 0


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
    ledger = _existing_ledger(config.ledger, args.config)
    check_epoch(ledger, config.name, args.epoch)
    refuse_running_checkpoint(config, args.config)
    sinks = fencing_sinks(config, args.sink or ())
    _say_newest(_newest(ledger, config.name), config.name, STOP_FIRST)
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


def _skip_command(args: argparse.Namespace, epoch: int) -> str:
    """The ``fanout ledger skip`` given (``args``), with ``--epoch epoch``: its own flags,
    the locations named absolute (:func:`fanout.contract.locations.command_location`)."""
    from fanout.contract.locations import command_location

    parts = ["fanout ledger skip"]
    if args.config is not None:
        parts.append(f"--config {command_location(args.config)}")
    if args.ledger is not None:
        parts.append(f"--ledger {command_location(args.ledger)}")
    if args.pipeline is not None:
        parts.append(f"--pipeline {shell_word(args.pipeline)}")
    parts += [f"--sink {shell_word(args.sink)}", f"--through {args.through}", f"--epoch {epoch}"]
    if args.spool is not None:
        parts.append(f"--spool {command_location(args.spool)}")
    parts += [flag for flag, given in (("--release-spooled", args.release_spooled),
              ("--give-up-backfill", args.give_up_backfill)) if given]  # fmt: skip
    return " ".join(parts)


def _print_backfill(where: str, target: _SkipTarget, given_up: tuple[int, ...]) -> None:
    """What the skip knew of the sink's backfill source."""
    if target.config is None:
        print(
            f"{where}: the backfill source was not checked (no --config): if the sink has "
            "backfill_from in the pipeline file, batches that source holds through this "
            "mark were given up too (they are not backfilled to it)"
        )
    elif given_up:
        print(
            f"{where}: gave up batch(es) {batch_ranges(list(given_up))} its backfill "
            f"source {target.backfill_from!r} holds (--give-up-backfill)"
        )


def _existing_spool(path: str, pipeline: str, named: str = "--spool") -> Spool:
    """The spool at ``path``, opened; a :class:`fanout.ConfigurationError` when there is
    none (a mistyped path must not pass for an empty spool)."""
    from fanout.spool.table import Spool, existing_index

    existing_index(path, pipeline, named=named)
    spool = Spool(path, pipeline)
    spool.open()
    return spool


def cmd_run(args: argparse.Namespace) -> int:
    """Run a pipeline described in a TOML file."""
    from fanout.app.runner import run

    return run(
        args.pipeline_file,
        new_epoch=args.new_epoch,
        accept_lost_targets=args.accept_lost_target or (),
    )


def cmd_dev(args: argparse.Namespace) -> int:
    """Start, show or stop the local development services (``fanout.app.dev``)."""
    from pathlib import Path

    from fanout.app import dev

    state = Path(args.state)
    if args.action == "up":
        env = dev.up(state)
        print(env, end="")
        print(f"# services running (pid {dev.running_pid(state)}); load them with: . {state}/env")
        return 0
    if args.action == "status":
        pid = dev.running_pid(state)
        if pid is None:
            print(f"no dev services running for {state}")
            return 1
        silent = dev.silent(state)
        if silent:
            print(
                f"dev services stopped: their process (pid {pid}) runs, but "
                + "; ".join(silent)
                + f". Start them again: fanout dev down --state {shell_word(str(state))} && "
                f"fanout dev up --state {shell_word(str(state))}"
            )
            return 1
        print(f"dev services running (pid {pid}):")
        print((state / "env").read_text(), end="")
        return 0
    stopped = dev.down(state)
    print("dev services stopped" if stopped else f"no dev services running for {state}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Check a pipeline file and open every sink, without starting the stream."""
    from fanout.app.runner import validate

    return validate(args.pipeline_file)


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the end-to-end demo on embedded defaults."""
    from fanout.app.demo.run import run_demo

    return run_demo(
        workdir=args.workdir,
        rows_per_file=args.rows,
        files=args.batches,
        postgres_url=args.postgres_url,
        kafka_bootstrap=args.kafka_bootstrap,
    )


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, not {text!r}")
    return value


def _hours(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more hours, not {text!r}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text!r}")
    return value


def build_parser(registry: Registry | None = None) -> argparse.ArgumentParser:
    """The argument parser of the ``fanout`` command: the core's commands, then those the
    plugins of ``registry`` contribute (default: the installed plugins, :func:`installed_plugins`).

    :raises PluginError: when a plugin's command takes a core command's or another plugin's
        name.
    """
    parser = argparse.ArgumentParser(
        prog="fanout", description="Exactly-once fan-out of a Spark stream to many sinks."
    )
    parser.add_argument("--version", action="version", version=f"fanout {__version__}")
    parser.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING (default)")
    parser.add_argument(
        "--log-format", choices=("text", "json"), default="text", help="json: one object a line"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a pipeline from a TOML file (Ctrl-C stops cleanly)")
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

    validate = sub.add_parser(
        "validate", help="check a pipeline file and every sink's target, without starting"
    )
    validate.add_argument("pipeline_file")
    validate.set_defaults(func=cmd_validate)

    dev = sub.add_parser(
        "dev", help="local PostgreSQL and Kafka for the example pipeline: up, status, down"
    )
    dev.add_argument("action", choices=["up", "status", "down"])
    dev.add_argument(
        "--state", default=".fanout-dev", help="pid, env file, logs and data (default .fanout-dev)"
    )
    dev.set_defaults(func=cmd_dev)

    plugins = sub.add_parser("plugins", help="list installed sink types and their plugins")
    plugins.add_argument("--json", action="store_true", help="print JSON")
    plugins.add_argument(
        "--options", metavar="TYPE", help="the options of one sink type: default and meaning"
    )
    plugins.add_argument(
        "--plugin",
        action="append",
        metavar="MODULE",
        help="also a module of your own, not installed, as a pipeline file's plugins = [...] "
        "names it (imported from the working directory and PYTHONPATH); repeatable",
    )
    plugins.set_defaults(func=cmd_plugins)

    status = sub.add_parser(
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

    recover = sub.add_parser(
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

    ledger = sub.add_parser("ledger", help="ledger operations")
    ledger_sub = ledger.add_subparsers(dest="ledger_command", required=True, metavar="ACTION")
    maintain = ledger_sub.add_parser(
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

    skip = ledger_sub.add_parser(
        "skip",
        help="accept that a sink never gets the batches it missed (after MissedBatchesError)",
        description="Accept that a sink never gets the batches it missed (after "
        f"MissedBatchesError). After the skip's own lines, {NEWEST_HELP}; when it looks "
        "running, a warning on stderr (a skip takes no lock: a batch being written or caught "
        "up may be given up though its rows arrive); the skip is done all the same, exit 0.",
    )
    skip.add_argument(
        "--config",
        metavar="PIPELINE.toml",
        help="the pipeline file (as for fanout run): the ledger, pipeline, spool and the "
        "sink's backfill_from come from it (a flag saying otherwise is refused); a --through "
        "past a batch the sink's backfill source holds (its ledger marks it committed) is "
        "refused. Without it the backfill source is not checked: the ledger does not know "
        "a sink's backfill_from, so a --through chosen by hand can give up batches it holds",
    )
    skip.add_argument("--ledger", help="the ledger's Delta table path (required without --config)")
    skip.add_argument("--pipeline", help="the pipeline name (required without --config)")
    skip.add_argument("--sink", required=True, help="the sink that missed them")
    skip.add_argument("--through", type=int, required=True, help="the last batch it never gets")
    skip.add_argument(
        "--epoch",
        type=int,
        help="the epoch; required once the pipeline has more than one epoch (after a "
        "checkpoint reset): without it, the current epoch while it is epoch 0, else refused, "
        "naming the sink's oldest missing batch of an older epoch where the ledger shows one",
    )
    skip.add_argument(
        "--spool",
        help="the pipeline's spool: a --through past a batch it still holds for the sink "
        "is refused (without it, those batches are kept in the spool, neither written nor "
        "released, until released with --spool ... --release-spooled)",
    )
    skip.add_argument(
        "--release-spooled",
        action="store_true",
        help="with --spool: give up the batches it holds for the sink through --through "
        "too, releasing them now (a sink removed for good; also when the mark already "
        "holds --through)",
    )
    skip.add_argument(
        "--give-up-backfill",
        action="store_true",
        help="with --config: give up the batches the sink's backfill source holds through "
        "--through too (they are never backfilled to it)",
    )
    skip.set_defaults(func=cmd_skip)

    lift = ledger_sub.add_parser(
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

    demo = sub.add_parser(
        "demo",
        help="end-to-end demo: a failure mid-stream, a restart, "
        "and proof of no loss and no duplicate",
    )
    demo.add_argument(
        "--workdir",
        help="where to put input, tables and checkpoint (default: a new temporary directory)",
    )
    demo.add_argument("--rows", type=int, default=500, help="rows per input file (default 500)")
    demo.add_argument(
        "--batches", type=int, default=6, help="input files = micro-batches (default 6)"
    )
    demo.add_argument(
        "--postgres-url",
        help="write the PostgreSQL sink there (SQLAlchemy URL; ${VAR} allowed) instead of "
        "an embedded server",
    )
    demo.add_argument(
        "--kafka-bootstrap", help="write the Kafka sink there instead of an embedded broker"
    )
    demo.set_defaults(func=cmd_demo)

    registry = installed_plugins() if registry is None else registry
    for command in registry.cli_commands(taken=set(sub.choices)):
        added = sub.add_parser(command.name, help=command.help)
        command.add_arguments(added)
        added.set_defaults(func=command.run)
    return parser


def installed_plugins() -> Registry:
    """The registry of the installed plugins (a plugin that fails to load contributes no
    command; ``fanout plugins`` says why)."""
    from fanout.hooks.registry import load_registry

    return load_registry()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fanout`` console script."""
    plugins = installed_plugins()
    try:
        parser = build_parser(plugins)
    except FanoutError as exc:  # two plugins claiming one command: nothing can run safely
        print(f"fanout: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code == 2:  # a bad command line; a command may be missing with its plugin
            for error in plugins.load_errors:
                print(f"fanout: note: {error}", file=sys.stderr)
        raise
    configure_logging(args.log_level, args.log_format)
    register_secrets(location_secrets(list(vars(args).values())))  # --ledger s3://k:pw@...
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = RedactingStream(out), RedactingStream(err)  # type: ignore[assignment]
    code = _run(args)
    # put back only on a return: the traceback of an error raised through here, which the
    # interpreter prints to sys.stderr after main, may name a location's password too
    sys.stdout, sys.stderr = out, err
    return code


def _run(args: argparse.Namespace) -> int:
    """Run the parsed command; a :class:`fanout.FanoutError` becomes its message and exit
    code."""
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a reader that went away shows up here, not at exit
        return code
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_BROKEN_PIPE
    except SinkUnreachableError as exc:  # also a ConfigurationError: a server down is not one
        print(f"fanout: sink unreachable: {_masked(exc)}\n{UNREACHABLE_NEXT}", file=sys.stderr)
        return 1
    except ConfigurationError as exc:
        print(f"fanout: configuration error: {_masked(exc)}", file=sys.stderr)
        return 2
    except FanoutError as exc:
        print(f"fanout: {type(exc).__name__}: {_masked(exc)}", file=sys.stderr)
        return 1


def _print_json(data: Any) -> None:
    """Print ``data`` as JSON (``--json``), its strings masked of the registered secrets
    (:func:`fanout.observe.secrets.redact_json`), past stdout's
    :class:`fanout.observe.logs.RedactingStream`: masking the text would turn a number that
    holds a password of digits into ``***``, which is no JSON."""
    _unmasked_stdout().write(_json_text(data) + "\n")


def _json_text(data: Any) -> str:
    """``data`` as ``--json`` prints it: its strings masked of the registered secrets."""
    return json.dumps(redact_json(data, known_secrets()), indent=2)


def _unmasked_stdout() -> TextIO:
    """stdout without its :class:`fanout.observe.logs.RedactingStream`: for text masked
    already, value by value."""
    out = sys.stdout
    return out.stream if isinstance(out, RedactingStream) else out


def _masked(error: BaseException) -> str:
    """``error``'s text with every secret the sinks registered masked (stderr has no log
    handler to do it)."""
    return redact(str(error), known_secrets())


def _discard_stdout() -> None:
    """After the reader of stdout went away: quietly, like other Unix tools. Point stdout at
    /dev/null so the interpreter's final flush does not raise a second time."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass  # stdout is not a file descriptor (captured): nothing will flush to a pipe
    finally:
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
