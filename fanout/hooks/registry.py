"""Plugin discovery and the sink-type registry.

Plugins are modules registered under the entry-point group ``fanout``; the built-in sinks
are found exactly that way, and the core names none of them. (Code shipped to a cluster as a
``--py-files`` zip keeps its entry points when the zip holds the distributions'
``*.dist-info`` directories, as ``pip install --target DIR`` writes them.)
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Protocol, TypeVar, cast

import pluggy

from fanout.contract.dead_letters import DELTA
from fanout.contract.names import check_name
from fanout.contract.options import (
    CORE_OPTIONS,
    declaration_problems,
    option_names,
)
from fanout.contract.sink import (
    GUARANTEES,
    Sink,
    declared_guarantees,
    declares_guarantees,
    declaring_class,
    implemented_hooks,
)
from fanout.deadletters.delta import delta_target
from fanout.deadletters.target import DeadLetterKind
from fanout.errors import (
    ConfigurationError,
    DuplicatePluginError,
    DuplicateSinkTypeError,
    PluginError,
    PluginLoadError,
    SinkTypeError,
    UnknownSinkTypeError,
    shell_word,
)
from fanout.hooks import specs as hookspecs
from fanout.hooks.commands import CliCommand
from fanout.hooks.services import EmbeddedService
from fanout.observe.option_values import option_type_problems

log = logging.getLogger(__name__)

_T = TypeVar("_T")


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
    """A sink type name, its class (or the lazy ``"module:Class"`` reference its plugin gave)
    and the plugin providing it.

    A reference is imported, and its class checked, the first time :attr:`sink_class` is
    read (a sink of the type built, its options checked, the type listed with details), so
    a command using no sink of the type never imports the type's driver libraries.

    ``refused``: why the class its plugin returned is no valid sink type (its
    :class:`SinkTypeError`'s text), raised when the class is read: a bad type is refused
    alone, its plugin's other types still load."""

    name: str
    source: type[Sink] | str
    plugin: PluginInfo
    refused: str | None = None

    @functools.cached_property
    def sink_class(self) -> type[Sink]:
        """The class: the plugin's, or its reference imported and checked.

        :raises PluginLoadError: the reference's module does not import (named with the
            plugin and what to do, as a plugin that does not import is).
        :raises SinkTypeError: the reference names no such class, or the class is no valid
            sink type (as a class returned directly is refused).
        """
        if self.refused is not None:
            raise SinkTypeError(self.refused)
        if not isinstance(self.source, str):
            return self.source
        sink_class = _import_reference(self.plugin, self.name, self.source)
        _check_sink_class(self.plugin, self.name, sink_class)
        return cast("type[Sink]", sink_class)

    @property
    def reference(self) -> str:
        """``module:Class``: the reference given, or the class's (no import either way)."""
        if isinstance(self.source, str):
            return self.source
        return f"{self.source.__module__}:{self.source.__qualname__}"

    @property
    def guarantees(self) -> tuple[str, ...]:
        """The guarantees the class declares it can give (``at_least_once`` when it declares
        none: :attr:`declared` is then false)."""
        return declared_guarantees(self.sink_class)

    @property
    def declared(self) -> bool:
        """Whether the class declares its guarantees (:func:`declares_guarantees`)."""
        return declares_guarantees(self.sink_class)

    def guarantees_text(self) -> str:
        """The guarantees for ``fanout plugins``: ``idempotent or transactional``, or
        ``at_least_once (not declared)`` for a class declaring none."""
        text = " or ".join(self.guarantees)
        return text if self.declared else f"{text} (not declared)"


class PerSinkType(Mapping[str, _T]):
    """Something of each sink type's class (its option names, say), computed the first time
    that type is asked for: membership and the type names need no class, so checking a
    pipeline file imports only the sink types the file uses."""

    def __init__(self, types: Mapping[str, SinkType], of: Callable[[type[Sink]], _T]) -> None:
        """
        :param types: the sink types (:meth:`Registry.sink_types`).
        :param of: what to compute from a type's class.
        """
        self._types = types
        self._of = of
        self._computed: dict[str, _T] = {}

    def __getitem__(self, name: str) -> _T:
        if name not in self._computed:
            self._computed[name] = self._of(self._types[name].sink_class)
        return self._computed[name]

    def __contains__(self, name: object) -> bool:
        return name in self._types

    def __iter__(self) -> Iterator[str]:
        return iter(self._types)

    def __len__(self) -> int:
        return len(self._types)

    def refusal(self, name: str) -> SinkTypeError | None:
        """Why sink type ``name`` is refused: the :class:`SinkTypeError` its class raises when
        read (its plugin declares it wrong), answered without raising; ``None`` for a type
        that loads and for a name no plugin registers. A lazy reference is imported here,
        so a module of it that does not import raises its :class:`PluginLoadError`."""
        if name not in self._types:
            return None
        try:
            self._types[name].sink_class  # noqa: B018 - imports a lazy reference
        except SinkTypeError as exc:
            return exc
        return None


@dataclass
class Registry:
    """The plugin manager plus what was learnt while loading plugins."""

    manager: pluggy.PluginManager
    plugins: dict[str, PluginInfo] = field(default_factory=dict)
    load_errors: list[PluginError] = field(default_factory=list)
    _warned_none: set[tuple[str, str]] = field(default_factory=set, init=False, repr=False)

    def raise_load_errors(self) -> None:
        """Raise the first plugin import error, if any (others are logged)."""
        for error in self.load_errors[1:]:
            log.error("%s", error)
        if self.load_errors:
            raise self.load_errors[0]

    def sink_types(self, *, warn_refused: bool = True) -> dict[str, SinkType]:
        """Every sink type of every plugin; two plugins claiming one name is an error. A
        type whose class is no valid sink type is listed, refused when its class is read
        (:attr:`SinkType.refused`) and, with ``warn_refused``, logged as a warning
        (:func:`warn_of_refused_type`): one bad type does not take its plugin's other types, or
        other plugins', with it."""
        types: dict[str, SinkType] = {}
        for info, provided in self._provided("fanout_sink_types", warn_none=True):
            if not isinstance(provided, Mapping):
                raise PluginError(
                    f"plugin {info.describe()}: fanout_sink_types returned "
                    f"{type(provided).__name__} {_short(provided)}, not a dict: return "
                    '{"<type name>": YourSink} (a fanout.Sink subclass, or a '
                    '"package.module:ClassName" reference), {} for no type'
                )
            for type_name, sink_class in provided.items():
                refused = None
                try:
                    if isinstance(sink_class, str):
                        _check_reference(info, type_name, sink_class)  # imported when used
                    else:
                        _check_sink_class(info, type_name, sink_class)
                except SinkTypeError as exc:
                    refused = str(exc)
                    if warn_refused:
                        warn_of_refused_type(refused)
                if type_name in types:
                    raise DuplicateSinkTypeError(
                        type_name, types[type_name].plugin.describe(), info.describe()
                    )
                types[type_name] = SinkType(type_name, sink_class, info, refused)
        return types

    def listed_sink_types(self) -> dict[str, SinkType]:
        """Every sink type with its class imported (``fanout plugins``): a type whose lazy
        reference does not import, or whose class is refused, is left out, its
        :class:`PluginLoadError` or :class:`SinkTypeError` added to :attr:`load_errors`, as
        a plugin that does not import is."""
        listed: dict[str, SinkType] = {}
        for name, sink_type in self.sink_types(warn_refused=False).items():  # errors here
            try:
                sink_type.sink_class  # noqa: B018 - imports a lazy reference
            except (PluginLoadError, SinkTypeError) as exc:
                self.load_errors.append(exc)
                continue
            listed[name] = sink_type
        return listed

    def dead_letter_kinds(self) -> dict[str, DeadLetterKind]:
        """Every dead-letter kind of every plugin (the core's ``delta`` included); two
        plugins claiming one kind is an error naming both."""
        provided = self._named("fanout_dead_letter_kinds", "dead-letter kind", mapping=True)
        return {kind: factory for kind, (factory, _) in provided.items()}

    def cli_commands(self, taken: Iterable[str] = ()) -> list[CliCommand]:
        """Every plugin's ``fanout`` sub-commands, in the order plugins were registered.

        :param taken: the core's own command names, which no plugin may reuse.
        :raises PluginError: when two plugins, or a plugin and the core, claim one name.
        """
        reserved = set(taken)
        commands = self._named("fanout_cli_commands", "fanout command")
        for name, (command, info) in commands.items():
            if name in reserved:
                raise PluginError(
                    f"plugin {info.describe()}: fanout command {name!r} is one of the core's"
                )
            if not isinstance(command, CliCommand):
                raise PluginError(
                    f"plugin {info.describe()}: fanout command {name!r} is {command!r}, "
                    "not a fanout.hooks.commands.CliCommand"
                )
        return [command for command, _ in commands.values()]

    def embedded_services(self) -> dict[str, EmbeddedService]:
        """Every plugin's embedded servers, by name (the sink type each serves)."""
        services = self._named("fanout_embedded_services", "embedded service")
        for name, (service, info) in services.items():
            if not isinstance(service, EmbeddedService):
                raise PluginError(
                    f"plugin {info.describe()}: embedded service {name!r} is {service!r}, "
                    "not a fanout.hooks.services.EmbeddedService"
                )
        return {name: service for name, (service, _) in services.items()}

    def _provided(
        self, hook_name: str, *, warn_none: bool = False
    ) -> Iterator[tuple[PluginInfo, Any]]:
        """Each plugin's answer to a registration hook, with the plugin that gave it, in
        registration order. Registration hooks are asked plugin by plugin (not through one
        pluggy call) so that a raising plugin and two plugins claiming one name are named;
        wrappers of these hooks are therefore not called. An answer of ``None`` is no answer,
        as in pluggy (a plugin registering nothing when its optional driver is missing);
        with ``warn_none`` it is logged once per registry, naming the plugin, since a hook
        function without its ``return`` otherwise leaves only a later ``unknown sink
        type``."""
        for impl in getattr(self.manager.hook, hook_name).get_hookimpls():
            if impl.wrapper or impl.hookwrapper:
                continue  # wraps a pluggy call, which registration hooks do not make
            info = self.plugins.get(impl.plugin_name) or PluginInfo(
                impl.plugin_name, getattr(impl.plugin, "__name__", impl.plugin_name)
            )
            try:
                provided = impl.function()
            except Exception as exc:
                raise PluginLoadError(info.name, info.distribution, exc) from exc
            if provided is None and warn_none and (info.name, hook_name) not in self._warned_none:
                self._warned_none.add((info.name, hook_name))
                log.warning(
                    "plugin %s: %s returned None, so it registers nothing (no return "
                    "statement?): return what it registers, or {} to register nothing "
                    "without this warning",
                    info.describe(),
                    hook_name,
                )
            if provided:
                yield info, provided

    def _named(
        self, hook_name: str, what: str, *, mapping: bool = False
    ) -> dict[str, tuple[Any, PluginInfo]]:
        """A registration hook's answers by name (a mapping's keys, or each object's
        ``name``), each with its plugin; one name from two plugins is a :class:`PluginError`."""
        found: dict[str, tuple[Any, PluginInfo]] = {}
        for info, provided in self._provided(hook_name):
            items: Iterable[tuple[str, Any]] = (
                cast("Mapping[str, Any]", provided).items()
                if mapping
                else ((getattr(item, "name", repr(item)), item) for item in provided)
            )
            for name, item in items:
                if name in found:
                    raise PluginError(
                        f"{what} {name!r} is provided by both "
                        f"{found[name][1].describe()} and {info.describe()}"
                    )
                found[name] = (item, info)
        return found

    def build_sink(self, spec: Mapping[str, Any] | Sink, types: Mapping[str, SinkType]) -> Sink:
        """A sink from its configuration dict (``type``, ``name``, options) or as given."""
        if isinstance(spec, Sink):
            return _checked(spec, f"sink {type(spec).__name__}")
        if isinstance(spec, type) and issubclass(spec, Sink):
            raise ConfigurationError(
                f"a sink must be a dict with 'type' and 'name' or a fanout.Sink instance, "
                f"got the class {spec.__name__} itself: build one, "
                f"{spec.__name__}(name=..., <its options>)"
            )
        if not isinstance(spec, Mapping):
            raise ConfigurationError(
                f"a sink must be a dict with 'type' and 'name' or a fanout.Sink instance, "
                f"got {type(spec).__name__}"  # not its value: a URL with a password, perhaps
            )
        options = dict(spec)
        name = options.pop("name", None)
        type_name = options.pop("type", None)
        check_name(name, f"a sink of type {type_name!r}")
        if not type_name:
            raise ConfigurationError(f"sink {name!r}: missing 'type' (one of {sorted(types)})")
        if type_name not in types:
            raise UnknownSinkTypeError(name, type_name, list(types))
        sink_class = types[type_name].sink_class
        if problems := option_type_problems(sink_class, options):
            raise ConfigurationError(
                f"sink {name!r} (type {type_name!r}): {'; '.join(problems)}; fix the value "
                f"in the sink's configuration (`fanout plugins --options {shell_word(type_name)}` "
                "describes each option)"
            )
        try:
            sink = sink_class(name=name, **options)
        except TypeError as exc:
            valid = option_names(sink_class)  # a misspelt option of fanout's ends here too
            text = _without_pythons_hint(str(exc))
            hint = _did_you_mean(text, [*valid, *CORE_OPTIONS])
            raise ConfigurationError(
                f"sink {name!r} (type {type_name!r}): {text}{hint}; "
                f"valid options: {', '.join(valid)}"
            ) from exc
        return _checked(sink, f"sink {name!r} (type {type_name!r})")


def _without_pythons_hint(type_error: str) -> str:
    """``type_error`` without the ``. Did you mean 'x'?`` CPython 3.13 ends an unexpected
    keyword argument's error with (among the constructor's parameters only):
    :func:`_did_you_mean` gives fanout's own, among the core's options too, the one message
    on every Python. Any other ``TypeError`` a constructor raises is kept whole."""
    return re.sub(
        r"(unexpected keyword argument '[^']+')\. Did you mean '[^']*'\?$", r"\1", type_error
    )


def _did_you_mean(type_error: str, valid: list[str]) -> str:
    """``, did you mean 'database'?`` for a constructor's unexpected keyword argument."""
    found = re.search(r"unexpected keyword argument '([^']+)'", type_error)
    close = difflib.get_close_matches(found.group(1), valid, n=1) if found else []
    return f", did you mean {close[0]!r}?" if close else ""


def _checked(sink: Sink, what: str) -> Sink:
    """``sink`` once its name and guarantee are valid: a subclass whose ``__init__`` does
    not call ``super().__init__(name)`` has none, a guarantee fanout does not know would
    skip the warning an at-least-once sink gets, and one its type does not declare (an
    option making its ``guarantee`` property say more than the type promises) is refused,
    naming the sink, the guarantee and the type's guarantees."""
    if not hasattr(sink, "name"):
        raise ConfigurationError(
            f"{what}: the sink has no name; its class's __init__ must call super().__init__(name)"
        )
    check_name(sink.name, what)
    if sink.guarantee not in GUARANTEES:
        raise ConfigurationError(
            f"{what}: guarantee {sink.guarantee!r} is not one of {', '.join(GUARANTEES)}; "
            "declare the class's 'guarantees = (...)' with those (docs: README, Semantics)"
        )
    declaring = declaring_class(sink)
    if sink.guarantee not in declared_guarantees(declaring):
        declared = ", ".join(declared_guarantees(declaring))
        raise ConfigurationError(
            f"sink {sink.name!r}: guarantee {sink.guarantee!r} (as its options make it) is "
            f"not one its type {declaring.__name__} declares ({declared}): configure it for one of "
            f"those, or, if the type gives {sink.guarantee!r} too, add it to the class's "
            "'guarantees = (...)' (what `fanout plugins` shows and the conformance kit checks)"
        )
    return sink


_REFERENCE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def _check_reference(info: PluginInfo, type_name: str, reference: str) -> None:
    """A lazy reference reads ``package.module:ClassName`` (checked without importing)."""
    if not _REFERENCE.fullmatch(reference):
        raise SinkTypeError(
            f"plugin {info.describe()}: sink type {type_name!r} is {reference!r}, neither a "
            "subclass of fanout.Sink nor a reference to one as 'package.module:ClassName'"
        )


def _import_reference(info: PluginInfo, type_name: str, reference: str) -> Any:
    """The object a lazy ``module:Class`` reference names, imported now. A module that does
    not import is the plugin's :class:`PluginLoadError`, as an entry point that does not
    import is; a module without the class is a :class:`SinkTypeError`."""
    module_name, _, qualname = reference.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
    except Exception as exc:
        remove = f"`pip uninstall {info.distribution}`" if info.distribution else "remove it"
        raise _load_error(
            info.name,
            info.distribution,
            exc,
            what_to_do=f"fanout imports sink type {type_name!r} ({reference}) when a sink of "
            f"it is built or checked, or `fanout plugins` lists it: install what it imports, "
            f"fix it, or uninstall it ({remove})",
        ) from exc
    try:
        for part in qualname.split("."):
            found = getattr(found, part)
    except AttributeError:
        raise SinkTypeError(
            f"plugin {info.describe()}: sink type {type_name!r} is {reference!r}, but module "
            f"{module_name} has no {qualname}: fix the reference its fanout_sink_types returns"
        ) from None
    return found


def _short(value: object) -> str:
    """A value as an error quotes it: its repr, cut to a line."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _check_sink_class(info: PluginInfo, type_name: str, sink_class: Any) -> None:
    if not (isinstance(sink_class, type) and issubclass(sink_class, Sink)):
        raise SinkTypeError(
            f"plugin {info.describe()}: sink type {type_name!r} is {sink_class!r}, "
            "not a subclass of fanout.Sink: return the class itself, declared as `class "
            'YourSink(fanout.Sink)`, or a "package.module:ClassName" reference to it'
        )
    if not isinstance(inspect.getattr_static(sink_class, "guarantee"), property):
        raise SinkTypeError(
            f"plugin {info.describe()}: sink type {type_name!r} sets 'guarantee' as a class "
            "attribute; declare what the type can give as 'guarantees = (...)' (and override "
            "the 'guarantee' property when an option decides)"
        )
    if problem := _guarantees_problem(sink_class.guarantees):
        raise SinkTypeError(f"plugin {info.describe()}: sink type {type_name!r} {problem}")
    if not _takes_name(sink_class):
        raise SinkTypeError(
            f"plugin {info.describe()}: sink type {type_name!r}: {sink_class.__name__}."
            "__init__ takes no 'name'; fanout builds a sink from its configuration as "
            f"{sink_class.__name__}(name=<the sink's name>, **options): declare "
            "`def __init__(self, name: str, *, <options>)` and call super().__init__(name)"
        )
    implemented = implemented_hooks(sink_class)
    if stray := [h for h in sink_class.hook_conditions if h not in implemented]:
        raise SinkTypeError(
            f"plugin {info.describe()}: sink type {type_name!r} gives hook_conditions for "
            f"{', '.join(repr(h) for h in stray)}, which it does not implement; its optional "
            f"hooks: {', '.join(implemented) or 'none'} (a key names one of these, with the "
            "options under which it answers)"
        )
    if problems := declaration_problems(sink_class):
        raise SinkTypeError(
            f"plugin {info.describe()}: sink type {type_name!r}: its `options` declaration "
            f"is wrong: {'; '.join(problems)}"
        )


def _guarantees_problem(declared: object) -> str | None:
    """What is wrong with a class's ``guarantees``, and what to write (``None``: a tuple of
    guarantees fanout knows, or ``()``, which declares none, as leaving it out does)."""
    known = ", ".join(GUARANTEES)
    if isinstance(declared, str) and declared in GUARANTEES:
        return (
            f"declares guarantees = {declared!r}, a str, not a tuple: write "
            f'guarantees = ("{declared}",) (the trailing comma makes it a tuple)'
        )
    if not isinstance(declared, tuple):
        return (
            f"declares guarantees = {_short(declared)}, not a tuple: write a tuple of "
            f'{known}, the default\'s first, such as guarantees = ("idempotent",)'
        )
    if unknown := [g for g in declared if g not in GUARANTEES]:
        return (
            f"declares guarantee {_short(unknown[0])}, not one fanout knows: write a tuple of "
            f'{known}, the default\'s first, such as guarantees = ("idempotent",)'
        )
    return None


_warned_refused: set[str] = set()


def warn_of_refused_type(refused: str) -> None:
    """Log a refused sink type's error (:attr:`SinkType.refused`) as a warning, once per
    process (a command loads the registry more than once): a configuration using none of
    the type runs."""
    if refused not in _warned_refused:
        _warned_refused.add(refused)
        log.warning("%s; a sink of that type is refused, the plugin's other types load", refused)


def warn_of_refused_types(types: Mapping[str, SinkType]) -> None:
    """Warn of each refused type of ``types`` (:func:`warn_of_refused_type`), once the
    sinks were built or checked from those ``types`` listed with ``warn_refused=False``:
    a type a sink uses raised its :class:`SinkTypeError` then, so those left are the ones
    no sink uses, which are only warned of."""
    for sink_type in types.values():
        if sink_type.refused is not None:
            warn_of_refused_type(sink_type.refused)


def _takes_name(sink_class: type[Sink]) -> bool:
    """Whether the constructor takes ``name=`` (a signature it cannot read: assume so)."""
    try:
        parameters = inspect.signature(sink_class).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(
        (p.name == "name" and p.kind is not p.POSITIONAL_ONLY) or p.kind is p.VAR_KEYWORD
        for p in parameters
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
) -> Registry:
    """Discover plugins and return a registry; never raises for a broken plugin.

    :param extra_plugins: plugins registered directly (``FanOut(plugins=...)``, a pipeline
        file's ``plugins``): objects, modules, or modules' names (:func:`plugin_object`).
    :param entry_points_: the entry points to load; default: the installed ``fanout`` group
        (the built-in sinks' included).
    Import errors, and implementations of hooks fanout does not define, are collected in
    :attr:`Registry.load_errors`, each naming its plugin (such a plugin is not registered).
    """
    registry = Registry(new_plugin_manager())
    registry.manager.register(CoreDeadLetterKinds(), name="fanout.core")  # not a plugin
    eps = list(
        entry_points(group=hookspecs.PROJECT_NAME) if entry_points_ is None else entry_points_
    )
    seen: dict[str, PluginInfo] = {}
    for ep in eps:
        info = _entry_point_info(ep)
        if (first := seen.get(ep.name)) is not None:
            _duplicate(registry, first, info)
            continue
        seen[ep.name] = info
        try:
            plugin = ep.load()
        except Exception as exc:
            remove = f"`pip uninstall {info.distribution}`" if info.distribution else "remove it"
            registry.load_errors.append(
                _load_error(
                    ep.name,
                    info.distribution,
                    exc,
                    what_to_do="fanout loads every installed plugin, also one no sink uses: "
                    f"install what it imports, fix it, or uninstall it ({remove})",
                )
            )
            continue
        _register(registry, plugin, info)
    for given in extra_plugins:
        try:
            plugin = plugin_object(given)
        except PluginLoadError as exc:
            registry.load_errors.append(exc)
            continue
        if registry.manager.is_registered(plugin):  # named too by an installed entry point
            continue
        name = getattr(plugin, "__name__", None) or f"{type(plugin).__name__}@{id(plugin):x}"
        origin = name if inspect.ismodule(plugin) else type(plugin).__module__
        _register(registry, plugin, PluginInfo(name, origin))
    _check_pending(registry)
    return registry


def _entry_point_info(ep: EntryPointLike) -> PluginInfo:
    dist = getattr(ep, "dist", None)
    return PluginInfo(
        name=ep.name,
        module=ep.value,
        distribution=getattr(dist, "name", None) or (dist.metadata["Name"] if dist else None),
        version=getattr(dist, "version", None),
    )


def _duplicate(registry: Registry, first: PluginInfo, second: PluginInfo) -> None:
    """A second entry point with an already seen name. The same distribution's entry point
    listed twice (its metadata found on two ``sys.path`` entries; ``importlib.metadata``
    lists each distribution once, a caller's list may not) is skipped; another
    distribution's is a :class:`DuplicatePluginError`, whichever was installed first."""
    if (_normalized(first.distribution), first.module) == (
        _normalized(second.distribution),
        second.module,
    ):
        log.debug("plugin %s listed twice by %s; loaded once", first.name, first.describe())
        return
    registry.load_errors.append(
        DuplicatePluginError(
            first.name,
            _provider(first),
            _provider(second),
            (first.distribution, second.distribution),
        )
    )


def _provider(info: PluginInfo) -> str:
    return f"{info.describe()} ({info.module})" if info.distribution else info.describe()


def _normalized(distribution: str | None) -> str | None:
    """A distribution's name as PyPI compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", distribution).lower() if distribution else None


def _check_pending(registry: Registry) -> None:
    """Report, and unregister, each plugin implementing a hook fanout does not define (a
    misspelt ``fanout_sink_type`` would otherwise register silently and provide nothing).

    pluggy's ``check_pending()`` raises for the first such implementation; the loop finds
    them all, one plugin at a time."""
    known = ", ".join(sorted(n for n in dir(hookspecs) if n.startswith("fanout_")))
    while True:
        try:
            registry.manager.check_pending()
            return
        except pluggy.PluginValidationError as exc:
            name = registry.manager.get_name(exc.plugin) or repr(exc.plugin)
            info = registry.plugins.pop(name, None)
            registry.manager.unregister(exc.plugin)
            cause = pluggy.PluginValidationError(
                exc.plugin, f"{exc}{_nearest_hook(str(exc)) or ';'} fanout's hooks are {known}"
            )
            cause.__cause__ = exc
            registry.load_errors.append(
                _load_error(name, info.distribution if info else None, cause)
            )


def _nearest_hook(message: str) -> str:
    """``: did you mean 'fanout_sink_types'?`` for pluggy's ``unknown hook '...'``."""
    found = re.search(r"unknown hook '([^']+)'", message)
    hooks = [n for n in dir(hookspecs) if n.startswith("fanout_")]
    close = difflib.get_close_matches(found.group(1), hooks, n=1) if found else []
    return f": did you mean {close[0]!r}?" if close else ""


class CoreDeadLetterKinds:
    """The core's own plugin: the ``delta`` dead-letter kind every sink can use."""

    @hookspecs.hookimpl
    def fanout_dead_letter_kinds(self) -> Mapping[str, DeadLetterKind]:
        """``{"delta": ...}`` (:mod:`fanout.deadletters.delta`)."""
        return {DELTA: delta_target}


def _register(registry: Registry, plugin: object, info: PluginInfo) -> None:
    if unmarked := _unmarked_hooks(registry.manager, plugin):
        said = (
            f"{', '.join(unmarked)} not marked with @fanout.hookimpl, so fanout would ignore "
            f"{'it' if len(unmarked) == 1 else 'them'} (a sink type it registers would be "
            "unknown): decorate each hook function with @hookimpl (from fanout import hookimpl)"
        )
        cause = pluggy.PluginValidationError(plugin, said)
        registry.load_errors.append(_load_error(info.name, info.distribution, cause))
        return
    try:
        registry.manager.register(plugin, name=info.name)
    except (ValueError, pluggy.PluginValidationError) as exc:
        registry.load_errors.append(_load_error(info.name, info.distribution, exc))
        return
    registry.plugins[info.name] = info


def _unmarked_hooks(manager: pluggy.PluginManager, plugin: object) -> list[str]:
    """The functions of ``plugin`` named as a fanout hook but not marked as its
    implementation: pluggy skips them without a word."""
    hooks = sorted(n for n in dir(hookspecs) if n.startswith("fanout_"))
    return [
        name
        for name in hooks
        if callable(getattr(plugin, name, None))
        and manager.parse_hookimpl_opts(plugin, name) is None
    ]


def _load_error(
    name: str, distribution: str | None, cause: BaseException, *, what_to_do: str = ""
) -> PluginLoadError:
    """A load error chained to its cause, as ``raise ... from cause`` would (it is raised
    later, by :meth:`Registry.raise_load_errors`, outside the ``except`` block)."""
    error = PluginLoadError(name, distribution, cause, what_to_do=what_to_do)
    error.__cause__ = cause
    return error


_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def is_module_name(text: str) -> bool:
    """Whether ``text`` reads as a module's importable name (``my_sinks``,
    ``acme.fanout_plugin``), not a file's (``my_sinks.py``) or a path."""
    return bool(_MODULE_NAME.fullmatch(text)) and not text.endswith(".py")


def plugin_object(plugin: object) -> object:
    """A plugin as ``FanOut(plugins=...)``, ``SinkUnderTest(plugins=...)`` and a pipeline
    file's ``plugins`` key take it: a module (or any object implementing fanout's hooks)
    as given, or a module's importable name (``"my_sinks"``, ``"acme.fanout_plugin"``)
    imported. A name is imported from ``sys.path``, with the working directory added at its
    end when missing (the ``fanout`` command's path starts at its own script's directory,
    not the directory it runs in), so a module beside the pipeline file needs no install.

    Raises :class:`fanout.errors.PluginLoadError` naming the module and its import error
    (also for a text that is no module name)."""
    if not isinstance(plugin, str):
        return plugin
    name = plugin.strip()
    if not is_module_name(name):
        cause = ValueError(
            f"{plugin!r} is not a module name: give the name Python imports it by "
            "(my_sinks for my_sinks.py, acme.plugin for acme/plugin.py), or the module itself"
        )
        raise _load_error(plugin, None, cause)
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.append(here)
    try:
        return importlib.import_module(name)
    except Exception as exc:
        raise _load_error(
            name,
            None,
            exc,
            what_to_do=f"fanout imports it from the working directory ({here}) and "
            "PYTHONPATH: run from the directory holding it, add its directory to "
            "PYTHONPATH, or install its distribution",
        ) from exc


def resolve_plugins(plugins: Iterable[object]) -> tuple[object, ...]:
    """Each of ``plugins`` as :func:`plugin_object` makes it (a name imported); raises the
    first :class:`fanout.errors.PluginLoadError`."""
    return tuple(plugin_object(plugin) for plugin in plugins)
