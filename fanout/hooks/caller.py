"""Calling the lifecycle hooks so that one broken observer cannot fail a batch."""

from __future__ import annotations

import logging
from typing import Any

import pluggy

log = logging.getLogger(__name__)


class HookCaller:
    """Calls lifecycle hooks on every registered plugin, isolating their failures.

    An exception raised by an observer is logged with the plugin's name and the hook, and
    the next plugin is still called. (``BaseException``s such as ``SystemExit`` pass.)
    """

    def __init__(self, manager: pluggy.PluginManager) -> None:
        self.manager = manager

    def call(self, hook_name: str, **kwargs: Any) -> None:
        """Call ``hook_name`` on every plugin implementing it, most recent first."""
        hook = getattr(self.manager.hook, hook_name)
        for impl in reversed(hook.get_hookimpls()):
            try:
                impl.function(*(kwargs[name] for name in impl.argnames))
            except Exception:
                log.exception("plugin %r failed in hook %s; ignored", impl.plugin_name, hook_name)
