"""Calling the lifecycle hooks through pluggy so that one broken observer cannot fail a batch.

The hooks are called as pluggy calls them (``manager.hook.<name>(**kwargs)``), so hook
wrappers (``@hookimpl(wrapper=True)``) see the call and its result, and ``tryfirst`` /
``trylast`` order the observers. What pluggy does not do is go on after an implementation
raised: for that, :func:`isolate_observers` replaces the function of every ordinary
implementation of an observer hook with one that logs its own exception and returns
``None``, so the next observer still runs. Wrappers are left as they are; one that raises is
logged by :meth:`HookCaller.call`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import pluggy

log = logging.getLogger(__name__)

OBSERVER_HOOKS: frozenset[str] = frozenset(
    {
        "fanout_batch_start",
        "fanout_sink_start",
        "fanout_sink_error",
        "fanout_sink_done",
        "fanout_batch_end",
        "fanout_batch_failed",
    }
)
"""The lifecycle hooks whose implementations are observers: what they raise is logged."""

_ISOLATED = "_fanout_isolated"


class HookCaller:
    """Calls lifecycle hooks on every registered plugin, isolating their failures.

    An exception raised by an observer is logged with the plugin's name and the hook, and
    the next plugin is still called. (``BaseException``s such as ``SystemExit`` pass.)
    """

    def __init__(self, manager: pluggy.PluginManager) -> None:
        self.manager = manager
        isolate_observers(manager)

    def call(self, hook_name: str, **kwargs: Any) -> None:
        """Call ``hook_name`` through pluggy: every plugin implementing it, most recent
        first, inside any hook wrappers."""
        try:
            getattr(self.manager.hook, hook_name)(**kwargs)
        except Exception:  # for an observer hook, only a wrapper can raise here
            log.exception("hook %s failed (in a hook wrapper); ignored", hook_name)


def isolate_observers(manager: pluggy.PluginManager) -> None:
    """Make each ordinary implementation of an observer hook catch and log its own
    exceptions (once per implementation; plugins registered later need another call)."""
    for hook_name in OBSERVER_HOOKS:
        for impl in getattr(manager.hook, hook_name).get_hookimpls():
            if impl.wrapper or impl.hookwrapper or getattr(impl.function, _ISOLATED, False):
                continue
            impl.function = _isolated(impl.function, impl.plugin_name, hook_name)


def _isolated(function: Callable[..., Any], plugin_name: str, hook_name: str) -> Any:
    @functools.wraps(function)
    def observer(*args: Any) -> Any:
        try:
            return function(*args)
        except Exception:
            log.exception("plugin %r failed in hook %s; ignored", plugin_name, hook_name)
            return None

    setattr(observer, _ISOLATED, True)
    return observer
