"""Rules for pipeline and sink names, which become parts of transaction ids and paths."""

from __future__ import annotations

import re
from typing import Any

from fanout.errors import ConfigurationError

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
"""A whole valid name: match it with ``fullmatch`` (``$`` would let a trailing newline in)."""


def check_name(name: Any, what: str) -> str:
    """Return ``name`` when it is a valid pipeline or sink name, else raise.

    Names are letters, digits, ``_``, ``.`` and ``-`` (no ``/``), so the transaction ids
    ``fanout/<pipeline>/<sink>`` of different pipelines and sinks never collide.
    """
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ConfigurationError(
            f"{what}: name {name!r} is not valid; use 1-128 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return name
