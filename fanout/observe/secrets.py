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
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from fanout.errors import ConfigurationError

MASK = "***"
E = TypeVar("E", bound=BaseException)
_NAME = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")


def expand_env(value: str, *, what: str, environ: Mapping[str, str] | None = None) -> str:
    """Replace ``${NAME}`` (or ``${NAME:-default}``, defaults may nest references) with
    environment variables. Substituted values are not expanded again.

    :param what: names the option in the error, e.g. ``"sink 'pg' option 'url'"``.
    :raises ConfigurationError: when a referenced variable is not set and has no default,
        or a reference is not closed; the message names the variable, never a value.
    """
    env = os.environ if environ is None else environ
    text, _end = _expand(value, 0, env, what, nested=False)
    return text


def _expand(
    value: str, pos: int, env: Mapping[str, str], what: str, *, nested: bool
) -> tuple[str, int]:
    """Expand from ``pos`` to the end, or (``nested``) to the ``}`` closing a default."""
    out: list[str] = []
    while pos < len(value):
        if nested and value[pos] == "}":
            return "".join(out), pos
        match = _NAME.match(value, pos)
        if not match:
            out.append(value[pos])
            pos += 1
            continue
        name, pos = match.group(1), match.end()
        default = None
        if value.startswith(":-", pos):
            default, pos = _expand(value, pos + 2, env, what, nested=True)
        if not value.startswith("}", pos):
            raise ConfigurationError(f"{what}: unclosed reference ${{{name}...")
        pos += 1
        if name in env:
            out.append(env[name])
        elif default is not None:
            out.append(default)
        else:
            raise ConfigurationError(
                f"{what}: environment variable {name!r} is referenced but not set; "
                f"export {name}=... before starting the pipeline"
            )
    if nested:
        raise ConfigurationError(f"{what}: a ${{NAME:-default}} reference is not closed")
    return "".join(out), pos


SECRET_OPTION_WORDS = ("secret", "password", "token", "key", "sas", "credential")
"""Words that make an option's value a secret (``AWS_SECRET_ACCESS_KEY``,
``azure_storage_account_key``, ``azure_storage_sas_token``, ``google_service_account_key``)."""


def secret_option_values(
    options: Mapping[str, Any] | None, words: Iterable[str] = SECRET_OPTION_WORDS
) -> list[str]:
    """The values of ``options`` (e.g. a Delta table's object-store ``storage_options``)
    whose names contain one of ``words``, to be scrubbed like passwords; an identifier
    masked with them costs nothing."""
    found = tuple(words)
    return [
        str(value)
        for key, value in (options or {}).items()
        if value is not None and str(value) and any(word in str(key).lower() for word in found)
    ]


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each non-empty secret replaced by ``***``."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def masked_error(
    error: BaseException,
    secrets: Iterable[str],
    rebuild: Callable[[str], E],
    said: str | None = None,
) -> E | None:
    """``None`` when no message in ``error``'s chain holds one of ``secrets``; else the
    error ``rebuild`` makes of its text (``said``, by default ``"<type>: <message>"``) with
    the secrets masked, its chain cut so that no traceback shows them."""
    found = list(secrets)
    if not holds_secret(error, found):
        return None
    masked = rebuild(redact(f"{type(error).__name__}: {error}" if said is None else said, found))
    masked.__cause__ = None
    masked.__suppress_context__ = True
    return masked


def holds_secret(error: BaseException, secrets: Iterable[str]) -> bool:
    """Whether any message in ``error``'s chain (causes and contexts) holds one of
    ``secrets``."""
    chain_text = " ".join(str(e) for e in error_chain(error))
    return any(secret and secret in chain_text for secret in secrets)


def error_chain(error: BaseException) -> list[BaseException]:
    """``error``, then its causes and contexts, each once."""
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen
