"""What the commands print: ``--json``'s JSON and text masked of the registered secrets."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from fanout.observe.logs import RedactingStream, known_secrets
from fanout.observe.secrets import redact, redact_json


def print_json(data: Any) -> None:
    """Print ``data`` as JSON (``--json``), its strings masked of the registered secrets
    (:func:`fanout.observe.secrets.redact_json`), past stdout's
    :class:`fanout.observe.logs.RedactingStream`: masking the text would turn a number that
    holds a password of digits into ``***``, which is no JSON."""
    unmasked_stdout().write(json_text(data) + "\n")


def json_text(data: Any) -> str:
    """``data`` as ``--json`` prints it: its strings masked of the registered secrets."""
    return json.dumps(redact_json(data, known_secrets()), indent=2)


def unmasked_stdout() -> TextIO:
    """stdout without its :class:`fanout.observe.logs.RedactingStream`: for text masked
    already, value by value."""
    out = sys.stdout
    return out.stream if isinstance(out, RedactingStream) else out


def masked_text(text: str) -> str:
    """``text`` with every secret the sinks registered masked."""
    return redact(text, known_secrets())
