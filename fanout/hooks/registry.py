"""Plugin discovery and the sink-type registry.

Plugins are modules registered under the entry-point group ``fanout``; the built-in sinks
are found exactly that way. Code shipped to a cluster as a ``--py-files`` zip has no
entry points, so :data:`BUILTIN_PLUGIN_MODULES` is imported as a fallback for each
built-in whose distribution is not installed (a test keeps it in sync with ``plugins/``).
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Protocol, cast

import pluggy

from fanout.contract.names import check_name
from fanout.contract.options import declaration_problems, option_names
from fanout.contract.sink import GUARANTEES, Sink
from fanout.deadletters.delta import delta_target
from fanout.deadletters.target import DELTA, DeadLetterKind
from fanout.errors import (
    ConfigurationError,
    DuplicateSinkTypeError,
    PluginError,
    PluginLoadError,
    UnknownSinkTypeError,
)
from fanout.hooks import specs as hookspecs

log = logging.getLogger(__name__)

BUILTIN_PLUGIN_MODULES: tuple[str, ...] = (
    "fanout_delta.plugin",
    "fanout_postgres.plugin",
    "fanout_kafka.plugin",
)
"""Modules of the built-in sink plugins, imported only when their distributions are not
installed (``--py-files`` deployments)."""


class EntryPointLike(Protocol):
    """The part of ``importlib.metadata.EntryPoint`` the registry uses."""

    name: str
    value: str

    @property
    def dist(self) -> Any: ...

    def load(self) -> Any: ...


@dataclass(frozen=True)
class PluginInfo:
    """A registered plugin and where it came from."""

    name: str
    module: str
    distribution: str | None = None
    version: str | None = None

    def describe(self) -> str:
        """``distribution version`` when known, else the plugin's module."""
        if self.distribution:
            return f"{self.distribution} {self.version or ''}".strip()
        return f"module {self.module}"


@dataclass(frozen=True)
class SinkType:
    """A sink type name, its class and the plugin providing it."""

    name: str
    sink_class: type[Sink]
    plugin: PluginInfo

    @property
    def guarantees(self) -> tuple[str, ...]:
        """The guarantees the class declares it can give."""
        return tuple(self.sink_class.guarantees)


@dataclass
class Registry:
    """The plugin manager plus what was learnt while loading plugins."""

    manager: pluggy.PluginManager
    plugins: dict[str, PluginInfo] = field(default_factory=dict)
    load_errors: list[PluginLoadError] = field(default_factory=list)

    def raise_load_errors(self) -> None:
        """Raise the first plugin import error, if any (others are logged)."""
        for error in self.load_errors[1:]:
            log.error("%s", error)
        if self.load_errors:
            raise self.load_errors[0]

    def sink_types(self) -> dict[str, SinkType]:
        """Every sink type of every plugin; two plugins claiming one name is an error."""
        types: dict[str, SinkType] = {}
        for impl in self.manager.hook.fanout_sink_types.get_hookimpls():
            info = self.plugins.get(impl.plugin_name) or PluginInfo(
                impl.plugin_name, getattr(impl.plugin, "__name__", impl.plugin_name)
            )
            try:
                provided = cast("Mapping[str, Any]", impl.function() or {})
            except Exception as exc:
                raise PluginLoadError(info.name, info.distribution, exc) from exc
            for type_name, sink_class in provided.items():
                _check_sink_class(info, type_name, sink_class)
                if type_name in types:
                    raise DuplicateSinkTypeError(
                        type_name, types[type_name].plugin.describe(), info.describe()
                    )
                types[type_name] = SinkType(type_name, sink_class, info)
        return types

    def dead_letter_kinds(self) -> dict[str, DeadLetterKind]:
        """Every dead-letter kind of every plugin (the core's ``delta`` included); two
        plugins claiming one kind is an error naming both."""
        kinds: dict[str, DeadLetterKind] = {}
        owners: dict[str, PluginInfo] = {}
        for impl in self.manager.hook.fanout_dead_letter_kinds.get_hookimpls():
            info = self.plugins.get(impl.plugin_name) or PluginInfo(
                impl.plugin_name, getattr(impl.plugin, "__name__", impl.plugin_name)
            )
            try:
                provided = cast("Mapping[str, DeadLetterKind]", impl.function() or {})
            except Exception as exc:
                raise PluginLoadError(info.name, info.distribution, exc) from exc
            for kind, factory in provided.items():
                if kind in kinds:
                    raise PluginError(
                        f"dead-letter kind {kind!r} is provided by both "
                        f"{owners[kind].describe()} and {info.describe()}"
                    )
                kinds[kind], owners[kind] = factory, info
        return kinds

    def build_sink(self, spec: Mapping[str, Any] | Sink, types: Mapping[str, SinkType]) -> Sink:
        """A sink from its configuration dict (``type``, ``name``, options) or as given."""
        if isinstance(spec, Sink):
            check_name(getattr(spec, "name", None), f"sink {type(spec).__name__}")
            return spec
        if not isinstance(spec, Mapping):
            raise ConfigurationError(
                f"a sink must be a dict with 'type' and 'name' or a fanout.Sink instance, "
                f"got {type(spec).__name__}"
            )
        options = dict(spec)
        name = options.pop("name", None)
        type_name = options.pop("type", None)
        check_name(name, f"sink {spec!r}")
        if not type_name:
            raise ConfigurationError(f"sink {name!r}: missing 'type' (one of {sorted(types)})")
        if type_name not in types:
            raise UnknownSinkTypeError(name, type_name, list(types))
        sink_class = types[type_name].sink_class
        try:
            return sink_class(name=name, **options)
        except TypeError as exc:
            raise ConfigurationError(
                f"sink {name!r} (type {type_name!r}): {exc}; "
                f"valid options: {', '.join(option_names(sink_class))}"
            ) from exc


def _check_sink_class(info: PluginInfo, type_name: str, sink_class: Any) -> None:
    if not (isinstance(sink_class, type) and issubclass(sink_class, Sink)):
        raise PluginError(
            f"plugin {info.describe()}: sink type {type_name!r} is {sink_class!r}, "
            "not a subclass of fanout.Sink"
        )
    if not isinstance(inspect.getattr_static(sink_class, "guarantee"), property):
        raise PluginError(
            f"plugin {info.describe()}: sink type {type_name!r} sets 'guarantee' as a class "
            "attribute; declare what the type can give as 'guarantees = (...)' (and override "
            "the 'guarantee' property when an option decides)"
        )
    declared: object = sink_class.guarantees
    bad: list[object] = [declared]
    if isinstance(declared, tuple) and declared:
        bad = [g for g in declared if g not in GUARANTEES]
    if bad:
        raise PluginError(
            f"plugin {info.describe()}: sink type {type_name!r} declares guarantee "
            f"{bad[0]!r}; expected a tuple of {', '.join(GUARANTEES)}"
        )
    if problems := declaration_problems(sink_class):
        raise PluginError(
            f"plugin {info.describe()}: sink type {type_name!r}: its `options` declaration "
            f"does not match its constructor: {'; '.join(problems)}"
        )


def new_plugin_manager() -> pluggy.PluginManager:
    """A fresh plugin manager with fanout's hook specifications."""
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    return manager


def load_registry(
    extra_plugins: Iterable[object] = (),
    *,
    entry_points_: Iterable[EntryPointLike] | None = None,
    fallback_modules: Iterable[str] = BUILTIN_PLUGIN_MODULES,
) -> Registry:
    """Discover plugins and return a registry; never raises for a broken plugin.

    :param extra_plugins: plugin objects registered directly (``FanOut(plugins=...)``).
    :param entry_points_: the entry points to load; default: the installed ``fanout`` group.
    :param fallback_modules: built-in plugin modules imported when no entry point
        provides them.
    Import errors are collected in :attr:`Registry.load_errors`, each naming its plugin.
    """
    registry = Registry(new_plugin_manager())
    registry.manager.register(CoreDeadLetterKinds(), name="fanout.core")  # not a plugin
    eps = list(
        entry_points(group=hookspecs.PROJECT_NAME) if entry_points_ is None else entry_points_
    )
    loaded_modules = set()
    for ep in eps:
        dist = getattr(ep, "dist", None)
        info = PluginInfo(
            name=ep.name,
            module=ep.value,
            distribution=getattr(dist, "name", None) or (dist.metadata["Name"] if dist else None),
            version=getattr(dist, "version", None),
        )
        loaded_modules.add(ep.value)
        if registry.manager.has_plugin(ep.name):
            log.debug("plugin %s already registered; skipping %s", ep.name, info.describe())
            continue
        try:
            plugin = ep.load()
        except Exception as exc:
            registry.load_errors.append(_load_error(ep.name, info.distribution, exc))
            continue
        _register(registry, plugin, info)
    for module_name in fallback_modules:
        if module_name in loaded_modules:
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue  # that built-in is simply not shipped here
            registry.load_errors.append(_load_error(module_name, None, exc))
            continue
        except Exception as exc:
            registry.load_errors.append(_load_error(module_name, None, exc))
            continue
        _register(registry, module, PluginInfo(module_name, module_name))
    for plugin in extra_plugins:
        name = getattr(plugin, "__name__", None) or f"{type(plugin).__name__}@{id(plugin):x}"
        origin = name if inspect.ismodule(plugin) else type(plugin).__module__
        _register(registry, plugin, PluginInfo(name, origin))
    _check_hook_names(registry)
    return registry


def _check_hook_names(registry: Registry) -> None:
    """Report implementations of hooks fanout does not define (a misspelt
    ``fanout_sink_type`` would otherwise register silently and provide nothing)."""
    for hook_name, hook in vars(registry.manager.hook).items():
        if getattr(hook, "spec", None) is not None:
            continue
        for impl in hook.get_hookimpls():
            if impl.optionalhook:
                continue
            info = registry.plugins.get(impl.plugin_name)
            cause = pluggy.PluginValidationError(
                impl.plugin,
                f"unknown hook {hook_name!r}; fanout's hooks are "
                + ", ".join(sorted(n for n in dir(hookspecs) if n.startswith("fanout_"))),
            )
            registry.load_errors.append(
                _load_error(impl.plugin_name, info.distribution if info else None, cause)
            )


class CoreDeadLetterKinds:
    """The core's own plugin: the ``delta`` dead-letter kind every sink can use."""

    @hookspecs.hookimpl
    def fanout_dead_letter_kinds(self) -> Mapping[str, DeadLetterKind]:
        """``{"delta": ...}`` (:mod:`fanout.deadletters.delta`)."""
        return {DELTA: delta_target}


def _register(registry: Registry, plugin: object, info: PluginInfo) -> None:
    try:
        registry.manager.register(plugin, name=info.name)
    except (ValueError, pluggy.PluginValidationError) as exc:
        registry.load_errors.append(_load_error(info.name, info.distribution, exc))
        return
    registry.plugins[info.name] = info


def _load_error(name: str, distribution: str | None, cause: BaseException) -> PluginLoadError:
    """A load error chained to its cause, as ``raise ... from cause`` would (it is raised
    later, by :meth:`Registry.raise_load_errors`, outside the ``except`` block)."""
    error = PluginLoadError(name, distribution, cause)
    error.__cause__ = cause
    return error
