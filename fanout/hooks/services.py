"""What a plugin contributes to ``fanout demo`` and ``fanout dev``: an embedded server.

A plugin returns :class:`EmbeddedService` objects from
:func:`fanout.hooks.specs.fanout_embedded_services`; the core starts them by name and never
imports the plugin that provides them.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EmbeddedService:
    """A local server one sink type writes to, startable without any setup.

    :param name: the sink type it serves (``postgres``); one service per name.
    :param title: how messages name it (``PostgreSQL``).
    :param env_var: the variable ``fanout dev`` exports its address as (``FANOUT_PG_URL``).
    :param start: ``start(root)`` returns a context manager that starts the server, keeping
        any data under ``root`` (a directory of the caller's), yields the address the sink's
        configuration needs (a URL, a bootstrap address) and stops the server on exit. It
        raises when the server cannot start (a missing optional dependency, say); the demo
        then leaves that sink out and says why.
    :param answers: ``answers(address)``: ``None`` when the server at the address ``start``
        yielded answers now (a connection within a few seconds), else why not, in one
        line; ``fanout dev status`` asks it, since a server can stop while the process
        that started it runs on. ``None`` (the default): not asked.
    """

    name: str
    title: str
    env_var: str
    start: Callable[[Path], AbstractContextManager[str]]
    answers: Callable[[str], str | None] | None = None
