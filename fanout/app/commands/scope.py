"""Where an operator's command (``status --config``, ``recover``, ``ledger skip``) acts: the
ledger, pipeline, spool and sinks, from its flags or its ``--config`` pipeline file."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fanout.contract.locations import local_path, shown_location
from fanout.errors import ConfigurationError

if TYPE_CHECKING:
    from fanout.ledger.delta import DeltaLedger


@dataclass(frozen=True)
class CommandScope:
    """Where ``fanout recover``, ``ledger skip`` or ``status --config`` acts: from its flags,
    or its ``--config`` file (``backfill_from``: ``ledger skip``'s alone)."""

    ledger: str
    pipeline: str
    spool: str | None
    backfill_from: str | None
    config: str | None = None
    notes: tuple[str, ...] = ()
    sinks: tuple[str, ...] = ()
    """The sinks ``config`` names (none without ``--config``)."""


def command_scope(args: argparse.Namespace) -> tuple[CommandScope, Any]:
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
        return CommandScope(args.ledger, args.pipeline, args.spool, None), None
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
    return CommandScope(ledger, pipeline, spool, None, file, tuple(notes), named), config


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


def _relative(location: str) -> bool:
    """Whether ``location`` is a local path relative to the current directory."""
    path = local_path(location)
    return path is not None and not Path(path).is_absolute()


def existing_ledger(location: str, config: str | None) -> DeltaLedger:
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
