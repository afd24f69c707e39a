"""Sink option values of the wrong type, as errors show them: each checked against its
constructor annotation (:mod:`fanout.contract.options`), the value shown with its secrets
masked (:mod:`fanout.observe.secrets`; here, since the contract layer sits below this one)."""

from __future__ import annotations

from collections.abc import Mapping
from math import isfinite
from typing import Any

from fanout.contract.options import SinkClass, option_types, type_text, value_fits
from fanout.observe.secrets import location_secrets, redact, secret_option_values


def option_type_problems(sink_class: SinkClass, options: Mapping[str, Any]) -> list[str]:
    """``option 'partitions': expected int, got '4' (str)`` for each option whose value is
    not of the type the constructor annotates, or a number that is not finite (options the
    constructor does not take are left to its own "unknown option" error)."""
    hints = option_types(sink_class)
    found = (
        value_problem(key, value, hints[key]) or _not_finite(key, value)
        for key, value in options.items()
        if key in hints
    )
    return [problem for problem in found if problem is not None]


def _not_finite(key: str, value: Any) -> str | None:
    """``nan`` or ``inf`` given for a sink's number (``"nan"`` in a pipeline file reads as
    one): no timeout, size or retention it can mean; a Delta retention of ``nan`` failed
    deep in the sink, with neither sink nor option named."""
    if isinstance(value, float) and not isfinite(value):
        return f"option {key!r}: expected a finite number, got {value!r} (float)"
    return None


def value_problem(key: str, value: Any, hint: Any, expected: str | None = None) -> str | None:
    """``option 'retries': expected int, got 'x' (str)`` when ``value`` is not of the type
    ``hint`` (a sink's annotation, or one of fanout's own options' types; ``expected``:
    what the error says it takes, by default the type); ``None`` when it is."""
    if value_fits(value, hint):
        return None
    wanted = type_text(hint) if expected is None else expected
    if isinstance(value, str) and "mapping" in wanted:  # storage_options = "key=SECRET"
        return f"option {key!r}: expected {wanted}, got {HIDDEN_STRING}"
    return f"option {key!r}: expected {wanted}, got {_shown(key, value)} ({type(value).__name__})"


HIDDEN_STRING = "a string (its value not shown: it may hold a secret)"
"""How an error names a string given for a mapping of options (a sink's
``storage_options``, a pipeline file's ``source.options``): its text may be the options
written as one (``aws_secret_access_key=...``), so none of it is shown."""


def _shown(key: str, value: object) -> str:
    """``value`` as an error shows it, its secrets masked: a mapping's entries whose names
    say they are one (``storage_options``), a URL's password or secret query value
    (:func:`fanout.observe.secrets.location_secrets`, in a list or mapping too). The
    option's own name is not read as one: ``keys`` would be (``key``), and a secret option
    takes text, which fits."""
    if isinstance(value, Mapping):
        secrets = secret_option_values({str(k): v for k, v in value.items()})
    else:
        secrets = []
    return redact(repr(value), [*secrets, *location_secrets(value)])
