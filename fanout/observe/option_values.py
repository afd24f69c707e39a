"""Sink option values of the wrong type, as errors show them: each checked against its
constructor annotation (:mod:`fanout.contract.options`), the value shown with its secrets
masked (:mod:`fanout.observe.secrets`; here, since the contract layer sits below this one)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fanout.contract.options import SinkClass, option_types, type_text, value_fits
from fanout.observe.secrets import redact, secret_option_values, url_password


def option_type_problems(sink_class: SinkClass, options: Mapping[str, Any]) -> list[str]:
    """``option 'partitions': expected int, got '4' (str)`` for each option whose value is
    not of the type the constructor annotates (options the constructor does not take are
    left to its own "unknown option" error)."""
    hints = option_types(sink_class)
    return [
        f"option {key!r}: expected {type_text(hints[key])}, got {_shown(key, value)} "
        f"({type(value).__name__})"
        for key, value in options.items()
        if key in hints and not value_fits(value, hints[key])
    ]


def _shown(key: str, value: object) -> str:
    """``value`` as an error shows it, its secrets masked: a mapping's entries whose names
    say they are one (``storage_options``), a URL's password. The option's own name is
    not read as one: ``keys`` would be (``key``), and a secret option takes text, which
    fits."""
    if isinstance(value, Mapping):
        secrets = secret_option_values({str(k): v for k, v in value.items()})
    else:
        secrets = url_password(value) if isinstance(value, str) else []
    return redact(repr(value), secrets)
