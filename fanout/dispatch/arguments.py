"""The checks of :class:`fanout.fan_out.FanOut`'s arguments, before it builds anything."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable

from fanout.errors import ConfigurationError


def check_arguments(
    pipeline: str, ledger: object, *, parallelism: object, retries: object, backoff_s: object,
    probe_interval_s: object, share_tasks: object,
) -> None:  # fmt: skip
    """Refuse a keyword argument of :class:`FanOut` of the wrong type or out of its range,
    naming it, its value and what it takes (a ``TypeError`` from a comparison deep inside
    named none of them)."""
    where = f"pipeline {pipeline!r}"
    if isinstance(ledger, str) and not ledger.strip():
        raise ConfigurationError(f"{where}: ledger must not be empty: give the ledger's path")
    if not isinstance(ledger, str) and not hasattr(ledger, "mark_committed"):
        raise ConfigurationError(
            f"{where}: ledger must be the ledger's path or a fanout Ledger, got {ledger!r}"
        )
    if parallelism is not None:
        check_number(where, "parallelism", parallelism, 1, integer=True)
    check_number(where, "retries", retries, 0, integer=True)
    check_number(where, "backoff_s", backoff_s, 0)
    check_number(where, "probe_interval_s", probe_interval_s, 0, above=True)
    if not isinstance(share_tasks, bool):
        raise ConfigurationError(f"{where}: share_tasks must be True or False, got {share_tasks!r}")


def check_number(
    where: str, name: str, value: object, least: float, *, integer: bool = False,
    above: bool = False,
) -> None:  # fmt: skip
    """Refuse ``value`` of the argument ``name`` unless it is a number (an integer when
    ``integer``) of at least ``least`` (above it when ``above``), finite; a ``bool`` is
    refused."""
    kinds: tuple[type, ...] = (int,) if integer else (int, float)
    wanted = "an integer" if integer else "a number"
    bound = f"> {least:g}" if above else f">= {least:g}"
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not isinstance(value, kinds)
    ):
        raise ConfigurationError(f"{where}: {name} must be {wanted} {bound}, got {value!r}")
    if not math.isfinite(value) or value < least or (above and value == least):
        raise ConfigurationError(f"{where}: {name} must be {wanted} {bound}, got {value!r}")


def check_reset_choice(pipeline: str, on_checkpoint_reset: object) -> None:
    """Refuse an ``on_checkpoint_reset`` other than ``"refuse"`` and ``"new_epoch"``."""
    if on_checkpoint_reset not in ("refuse", "new_epoch"):
        raise ConfigurationError(
            f"pipeline {pipeline!r}: on_checkpoint_reset must be 'refuse' or 'new_epoch', "
            f"not {on_checkpoint_reset!r}"
        )


def check_accepted(pipeline: str, accepted: Iterable[str], sinks: Collection[str]) -> None:
    """Refuse an ``accept_lost_targets`` naming a sink the pipeline does not configure."""
    unknown = sorted(set(accepted) - set(sinks))
    if unknown:
        raise ConfigurationError(
            f"pipeline {pipeline!r}: accept_lost_targets names no sink of the pipeline: "
            f"{', '.join(unknown)} (sinks: {', '.join(sorted(sinks))})"
        )
