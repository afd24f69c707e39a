"""Secrets in configuration: environment interpolation and redaction.

Passwords and credentials must never reach logs, exceptions, ``fanout status`` or the
ledger. Configuration may reference them as ``${VARIABLE}`` (resolved with
:func:`expand_env`), and a sink lists the values it holds through
:meth:`fanout.Sink.secret_values`, so fanout scrubs them from every error it logs, records
or raises (:func:`redact`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

from fanout.errors import ConfigurationError

MASK = "***"
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(value: str, *, what: str, environ: Mapping[str, str] | None = None) -> str:
    """Replace ``${NAME}`` (or ``${NAME:-default}``) with environment variables.

    :param what: names the option in the error, e.g. ``"sink 'pg' option 'url'"``.
    :raises ConfigurationError: when a referenced variable is not set and has no default;
        the message names the variable, never a value.
    """
    env = os.environ if environ is None else environ

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        raise ConfigurationError(
            f"{what}: environment variable {name!r} is referenced but not set; "
            f"export {name}=... before starting the pipeline"
        )

    return _REFERENCE.sub(substitute, value)


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each non-empty secret replaced by ``***``."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text
