"""``fanout ledger skip``: accept that a sink never gets the batches it missed
(:mod:`fanout.ledger.gaps`)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import TYPE_CHECKING

from fanout.app.commands.newest import NEWEST_HELP, ledger_newest_marks, say_newest
from fanout.app.commands.scope import CommandScope, command_scope, existing_ledger
from fanout.contract.locations import shown_location
from fanout.errors import ConfigurationError, batch_ranges, shell_word

if TYPE_CHECKING:
    from fanout.ledger.delta import DeltaLedger
    from fanout.spool.table import Spool


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fanout ledger skip`` to ``commands``."""
    skip = commands.add_parser(
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


SKIP_WHILE_RUNNING = (
    "a skip takes no lock: a batch the sink is writing or catching up right now may be "
    "given up though its rows arrive a moment later (its write's own mark is then recorded "
    "beside the skip's, so the ledger stays exact); check with `fanout status` that the "
    "sink is stuck (lagging, its last error a MissedBatchesError or BackfillError) rather "
    "than catching up, and skip no further than the batches it names"
)
"""``fanout ledger skip``'s warning when the pipeline looks running (still done: exit 0)."""


def cmd_skip(args: argparse.Namespace) -> int:
    """Record that a sink never gets the batches after its mark through ``--through``."""
    from fanout.ledger.gaps import OlderEpochSkipError, skip_batches

    target = _skip_target(args)
    ledger = existing_ledger(target.ledger, target.config)
    ledger.open()  # there already: its log retention set, as at a run's start
    _refuse_unknown_sink(ledger, target, args.sink)
    # before the skip: what the operator acted on
    newest = ledger_newest_marks(ledger, target.pipeline)
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
    say_newest(newest, target.pipeline, SKIP_WHILE_RUNNING if acted else None)
    return 0


def _skip_target(args: argparse.Namespace) -> CommandScope:
    """The ledger, pipeline, spool and the sink's ``backfill_from``: from ``--config``
    when given (a flag contradicting it refused), else from the flags alone."""
    if args.config is None and args.give_up_backfill:
        raise ConfigurationError(
            "--give-up-backfill needs --config PIPELINE.toml: the sink's backfill_from "
            "is in the pipeline file"
        )
    target, config = command_scope(args)
    if config is None:
        return target
    from fanout.sink_spec import lag_policy

    options = next((s for s in config.sinks if s["name"] == args.sink), None)
    if options is None:
        note = f"sink {args.sink!r} is not in {args.config}: it has no backfill source to check"
        return replace(target, notes=(*target.notes, note))
    return replace(target, backfill_from=lag_policy(args.sink, options).backfill_from)


def _refuse_unknown_sink(ledger: DeltaLedger, target: CommandScope, sink: str) -> None:
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


def _print_backfill(where: str, target: CommandScope, given_up: tuple[int, ...]) -> None:
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
    from fanout.spool.index import existing_index
    from fanout.spool.table import Spool

    existing_index(path, pipeline, named=named)
    spool = Spool(path, pipeline)
    spool.open()
    return spool
