"""Plugin discovery and the sink-type registry, with fake entry points and a fresh
registry (and plugin manager) per test; nothing is registered globally."""

from __future__ import annotations

import sys
import tomllib
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pluggy
import pytest

import fanout
from fanout import Sink
from fanout.contract.sink import implemented_hooks
from fanout.errors import (
    ConfigurationError,
    DuplicatePluginError,
    DuplicateSinkTypeError,
    PluginError,
    PluginLoadError,
    SinkTypeError,
    UnknownSinkTypeError,
)
from fanout.hooks.registry import (
    PluginInfo,
    load_registry,
    option_names,
)

REPO = Path(__file__).resolve().parents[2]


def refused_type(registry: Any, type_name: str) -> SinkTypeError:
    """The error of a type its plugin declares wrong: listed by ``sink_types()`` (the
    plugin's other types load), refused when its class is read, a configuration error."""
    types_ = registry.sink_types()
    with pytest.raises(SinkTypeError) as info:
        types_[type_name].sink_class  # noqa: B018
    assert isinstance(info.value, PluginError) and isinstance(info.value, ConfigurationError)
    return info.value


# -- fakes ----------------------------------------------------------------------------


@dataclass(frozen=True)
class FakeDist:
    name: str
    version: str


@dataclass
class FakeEntryPoint:
    """What ``importlib.metadata.EntryPoint`` offers the registry."""

    name: str
    value: str
    dist: FakeDist | None
    plugin: object = None
    error: BaseException | None = None
    loads: int = field(default=0)

    def load(self) -> object:
        self.loads += 1
        if self.error is not None:
            raise self.error
        return self.plugin


def plugin_module(module_name: str, sink_types: dict[str, Any]) -> types.ModuleType:
    """A module-like plugin object implementing ``fanout_sink_types``."""
    module = types.ModuleType(module_name)

    @fanout.hookimpl
    def fanout_sink_types() -> dict[str, Any]:
        return dict(sink_types)

    module.fanout_sink_types = fanout_sink_types  # type: ignore[attr-defined]
    return module


def entry_point(
    name: str, sink_types: dict[str, Any], dist: tuple[str, str] | None = ("fanout-x", "1.0")
) -> FakeEntryPoint:
    value = f"fake_{name.replace('-', '_')}.plugin"
    return FakeEntryPoint(
        name=name,
        value=value,
        dist=FakeDist(*dist) if dist else None,
        plugin=plugin_module(value, sink_types),
    )


class JsonlSink(Sink):
    guarantees: ClassVar = ("idempotent",)

    def __init__(self, name: str, *, directory: str, indent: int = 0) -> None:
        super().__init__(name)
        self.directory = directory
        self.indent = indent

    def write(self, batch: Any) -> int:
        return 0


class OtherSink(Sink):
    guarantees: ClassVar = ("transactional",)

    def __init__(self, name: str) -> None:
        super().__init__(name)


@pytest.fixture
def restore_modules() -> Iterator[None]:
    """Forget modules a test imported from a temporary directory."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


# -- discovery ------------------------------------------------------------------------


def test_discovers_a_sink_type_with_its_distribution() -> None:
    ep = entry_point("jsonl", {"jsonl": JsonlSink}, dist=("fanout-jsonl", "2.3.1"))
    registry = load_registry(entry_points_=[ep])

    assert registry.load_errors == []
    assert registry.plugins == {
        "jsonl": PluginInfo("jsonl", "fake_jsonl.plugin", "fanout-jsonl", "2.3.1")
    }
    types_ = registry.sink_types()
    assert list(types_) == ["jsonl"]
    assert types_["jsonl"].sink_class is JsonlSink
    assert types_["jsonl"].guarantees == ("idempotent",)
    assert types_["jsonl"].plugin.describe() == "fanout-jsonl 2.3.1"
    assert ep.loads == 1


def test_one_plugin_several_types_and_extra_plugins() -> None:
    ep = entry_point("multi", {"jsonl": JsonlSink, "other": OtherSink})
    extra = plugin_module("my_extra_plugin", {"extra": OtherSink})
    registry = load_registry([extra], entry_points_=[ep])

    types_ = registry.sink_types()
    assert sorted(types_) == ["extra", "jsonl", "other"]
    assert types_["extra"].plugin == PluginInfo("my_extra_plugin", "my_extra_plugin")
    assert types_["extra"].plugin.describe() == "module my_extra_plugin"


def test_no_plugins_no_types() -> None:
    registry = load_registry(entry_points_=[])
    assert registry.sink_types() == {}
    assert registry.plugins == {}


def test_unknown_sink_type_lists_known_types() -> None:
    registry = load_registry(
        entry_points_=[entry_point("a", {"jsonl": JsonlSink, "other": OtherSink})],
    )
    types_ = registry.sink_types()
    with pytest.raises(UnknownSinkTypeError) as info:
        registry.build_sink({"type": "parquet", "name": "out"}, types_)
    assert isinstance(info.value, ConfigurationError)
    assert info.value.known == ["jsonl", "other"]
    assert str(info.value) == (
        "sink 'out': unknown sink type 'parquet'; known types: jsonl, other. A sink type "
        "comes from a plugin distribution registered under the 'fanout' entry-point group; "
        "`fanout plugins` lists what is installed. Install the distribution providing it "
        "(`pip install -e .` in its directory), or name a module of your own that is not "
        "installed (the module or its name) in `FanOut(plugins=[...])`, or in a pipeline "
        "file's `plugins = [...]`."
    )


def test_unknown_sink_type_with_no_plugin_says_so() -> None:
    registry = load_registry(entry_points_=[])
    with pytest.raises(
        UnknownSinkTypeError, match=r"known types: none \(is any fanout plugin installed\?\)"
    ):
        registry.build_sink({"type": "delta", "name": "out"}, registry.sink_types())


def test_two_plugins_claiming_one_type_name_both_distributions() -> None:
    registry = load_registry(
        entry_points_=[
            entry_point("first", {"jsonl": JsonlSink}, dist=("fanout-jsonl", "1.0.0")),
            entry_point("second", {"jsonl": OtherSink}, dist=("acme-fanout-jsonl", "0.4")),
        ],
    )
    assert registry.load_errors == []
    with pytest.raises(DuplicateSinkTypeError) as info:
        registry.sink_types()
    assert isinstance(info.value, PluginError)
    assert info.value.providers == ("fanout-jsonl 1.0.0", "acme-fanout-jsonl 0.4")
    assert str(info.value) == (
        "sink type 'jsonl' is provided by two plugins: fanout-jsonl 1.0.0 and "
        "acme-fanout-jsonl 0.4; uninstall one of them (pip uninstall ...) or rename the "
        "type in one plugin"
    )


def test_plugin_raising_on_import_is_a_named_chained_error() -> None:
    cause = ImportError("No module named 'psycopg2'")
    broken = FakeEntryPoint(
        name="postgres",
        value="fanout_postgres.plugin",
        dist=FakeDist("fanout-postgres", "0.1.0"),
        error=cause,
    )
    good = entry_point("jsonl", {"jsonl": JsonlSink})
    registry = load_registry(entry_points_=[broken, good])

    # the good plugin still loads; the error waits to be raised
    assert sorted(registry.sink_types()) == ["jsonl"]
    [error] = registry.load_errors
    assert isinstance(error, PluginLoadError)
    assert error.plugin_name == "postgres"
    assert error.distribution == "fanout-postgres"
    assert str(error) == (
        'Error importing plugin "postgres" (distribution fanout-postgres): '
        "ImportError: No module named 'psycopg2'; fanout loads every installed plugin, also "
        "one no sink uses: install what it imports, fix it, or uninstall it "
        "(`pip uninstall fanout-postgres`)"
    )
    with pytest.raises(PluginLoadError) as info:
        registry.raise_load_errors()
    assert info.value is error
    assert info.value.__cause__ is cause
    assert error.cause is cause


def test_plugin_hook_raising_is_a_plugin_load_error() -> None:
    module = types.ModuleType("fake_explodes.plugin")

    @fanout.hookimpl
    def fanout_sink_types() -> dict[str, Any]:
        raise RuntimeError("kaboom")

    module.fanout_sink_types = fanout_sink_types  # type: ignore[attr-defined]
    ep = FakeEntryPoint(
        "explodes", "fake_explodes.plugin", FakeDist("fanout-explodes", "3"), module
    )
    registry = load_registry(entry_points_=[ep])
    with pytest.raises(PluginLoadError) as info:
        registry.sink_types()
    assert str(info.value) == (
        'Error importing plugin "explodes" (distribution fanout-explodes): RuntimeError: kaboom'
    )
    assert isinstance(info.value.__cause__, RuntimeError)


def test_class_not_subclassing_sink_is_a_plugin_error() -> None:
    class NotASink:
        guarantees = ("idempotent",)

    registry = load_registry(
        entry_points_=[entry_point("bad", {"bad": NotASink}, dist=("fanout-bad", "0.1"))],
    )
    assert str(refused_type(registry, "bad")) == (
        f"plugin fanout-bad 0.1: sink type 'bad' is {NotASink!r}, not a subclass of fanout.Sink: "
        "return the class itself, declared as `class YourSink(fanout.Sink)`, or a "
        '"package.module:ClassName" reference to it'
    )


def test_instance_instead_of_class_is_a_plugin_error() -> None:
    registry = load_registry(
        entry_points_=[
            entry_point("bad", {"bad": JsonlSink("x", directory="/")}, ("fanout-bad", "0.1"))
        ],
    )
    assert "not a subclass of fanout.Sink" in str(refused_type(registry, "bad"))


def test_bad_guarantee_is_a_plugin_error() -> None:
    class ExactlyOnceSink(Sink):
        guarantees = ("exactly_once",)  # type: ignore[assignment]

    registry = load_registry(
        entry_points_=[entry_point("eo", {"eo": ExactlyOnceSink}, dist=("fanout-eo", "9.9"))],
    )
    assert str(refused_type(registry, "eo")) == (
        "plugin fanout-eo 9.9: sink type 'eo' declares guarantee 'exactly_once', not one "
        "fanout knows: write a tuple of transactional, idempotent, at_least_once, the "
        'default\'s first, such as guarantees = ("idempotent",)'
    )


@pytest.mark.parametrize(
    ("declared", "problem"),
    [
        ("idempotent", "declares guarantees = 'idempotent', a str, not a tuple: write "
         'guarantees = ("idempotent",) (the trailing comma makes it a tuple)'),
        (["idempotent"], "declares guarantees = ['idempotent'], not a tuple: write a tuple "
         "of transactional, idempotent, at_least_once, the default's first, such as "
         'guarantees = ("idempotent",)'),
        (("idempotent", "exactly-once"), "declares guarantee 'exactly-once', not one fanout "
         "knows: write a tuple of transactional, idempotent, at_least_once, the default's "
         'first, such as guarantees = ("idempotent",)'),
    ],
)  # fmt: skip
def test_a_guarantees_mistake_says_what_to_write(declared: object, problem: str) -> None:
    """``guarantees = "idempotent"`` (no trailing comma) was refused as 'declares guarantee
    'idempotent'; expected a tuple of ...', naming a guarantee fanout knows."""
    bad = type("BadSink", (Sink,), {"guarantees": declared})
    registry = load_registry(entry_points_=[entry_point("b", {"b": bad}, ("fanout-b", "1"))])
    assert str(refused_type(registry, "b")) == f"plugin fanout-b 1: sink type 'b' {problem}"


def test_an_empty_guarantees_tuple_is_accepted_as_declaring_none() -> None:
    """It was refused: 'declares guarantee (); expected a tuple of ...'."""

    class EmptySink(Sink):
        guarantees: ClassVar = ()

    registry = load_registry(entry_points_=[entry_point("e", {"e": EmptySink})])
    empty = registry.sink_types()["e"]
    assert (empty.guarantees, empty.declared) == (("at_least_once",), False)
    assert empty.guarantees_text() == "at_least_once (not declared)"
    assert registry.build_sink({"type": "e", "name": "x"}, {"e": empty}).guarantee == (
        "at_least_once"
    )


def test_one_bad_sink_type_leaves_the_other_types_of_its_plugin_and_of_others(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bad class made ``sink_types()`` raise: every type of every plugin was lost (`fanout
    plugins` listed none, a pipeline using another type of the plugin did not start)."""
    import fanout.hooks.registry as registry_module

    class NoCommaSink(Sink):
        guarantees = "idempotent"  # type: ignore[assignment]

    monkeypatch.setattr(registry_module, "_warned_refused", set())
    caplog.set_level("WARNING", logger="fanout")
    eps = [
        entry_point("mixed", {"good": JsonlSink, "bad": NoCommaSink}, ("fanout-mixed", "1")),
        entry_point("other", {"other": OtherSink}, ("fanout-other", "2")),
    ]
    registry = load_registry(entry_points_=eps)
    types_ = registry.sink_types()
    assert sorted(types_) == ["bad", "good", "other"]
    assert registry.build_sink({"type": "good", "name": "g", "directory": "/d"}, types_)
    assert registry.build_sink({"type": "other", "name": "o"}, types_)
    said = (
        "plugin fanout-mixed 1: sink type 'bad' declares guarantees = 'idempotent', a str, "
        'not a tuple: write guarantees = ("idempotent",) (the trailing comma makes it a tuple)'
    )
    with pytest.raises(SinkTypeError) as refused:  # a configuration error: exit 2
        registry.build_sink({"type": "bad", "name": "b"}, types_)
    assert str(refused.value) == said
    load_registry(entry_points_=eps).sink_types()  # a command loads more than one registry
    assert [r.getMessage() for r in caplog.records] == [
        f"{said}; a sink of that type is refused, the plugin's other types load"
    ]
    assert sorted(registry.listed_sink_types()) == ["good", "other"]  # `fanout plugins`
    assert [str(e) for e in registry.load_errors] == [said]


def test_a_fan_out_given_a_sink_of_a_bad_type_raises_without_the_unused_types_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``FanOut(...)`` given a sink of a type its plugin declares wrong logged the warning
    meant for a type no sink uses ('...; a sink of that type is refused, the plugin's other
    types load'), then raised the same text: a used type is only raised."""
    import fanout.hooks.registry as registry_module
    from fanout.ledger.memory import MemoryLedger

    class NoCommaSink(Sink):
        guarantees = "idempotent"  # type: ignore[assignment]

    plugin = plugin_module("fake_mixed", {"good": JsonlSink, "bad": NoCommaSink})
    monkeypatch.setattr(registry_module, "_warned_refused", set())
    caplog.set_level("WARNING", logger="fanout")
    said = (
        "plugin module fake_mixed: sink type 'bad' declares guarantees = 'idempotent', a str, "
        'not a tuple: write guarantees = ("idempotent",) (the trailing comma makes it a tuple)'
    )
    with pytest.raises(SinkTypeError) as refused:
        fanout.FanOut("p", MemoryLedger(), [{"type": "bad", "name": "b"}], plugins=[plugin])
    assert str(refused.value) == said
    assert caplog.records == []

    sinks = [{"type": "good", "name": "g", "directory": "/d"}]
    fanout.FanOut("p", MemoryLedger(), sinks, plugins=[plugin]).close()  # not used: warned
    assert [r.getMessage() for r in caplog.records] == [
        f"{said}; a sink of that type is refused, the plugin's other types load"
    ]


def test_a_types_refusal_is_answered_without_raising() -> None:
    """What a pipeline file's check asks once per sink type (``PerSinkType.refusal``): the
    error of a type its plugin declares wrong, ``None`` for one that loads or is unknown."""
    from fanout.hooks.registry import PerSinkType

    class NoCommaSink(Sink):
        guarantees = "idempotent"  # type: ignore[assignment]

    ep = entry_point("mixed", {"good": JsonlSink, "bad": NoCommaSink}, ("fanout-mixed", "1"))
    options = PerSinkType(load_registry(entry_points_=[ep]).sink_types(), option_names)
    refusal = options.refusal("bad")
    assert isinstance(refusal, SinkTypeError)
    assert str(refusal).startswith("plugin fanout-mixed 1: sink type 'bad' declares guarantees")
    assert (options.refusal("good"), options.refusal("mongodb")) == (None, None)
    with pytest.raises(SinkTypeError):  # asked as a mapping, it raises
        options["bad"]


def test_guarantee_as_a_class_attribute_is_a_plugin_error() -> None:
    class OldStyleSink(Sink):
        guarantee = "idempotent"  # type: ignore[assignment]

    registry = load_registry(
        entry_points_=[entry_point("old", {"old": OldStyleSink}, dist=("fanout-old", "1.0"))],
    )
    assert "sets 'guarantee' as a class attribute; declare" in str(refused_type(registry, "old"))


def test_sink_types_returned_as_a_list_names_the_plugin_and_what_to_return() -> None:
    """A hook returning ``[YourSink]`` was an AttributeError traceback from the registry."""
    module = types.ModuleType("fake_listy.plugin")

    @fanout.hookimpl
    def fanout_sink_types() -> list[type[Sink]]:
        return [JsonlSink]

    module.fanout_sink_types = fanout_sink_types  # type: ignore[attr-defined]
    ep = FakeEntryPoint("listy", "fake_listy.plugin", FakeDist("fanout-listy", "0.1"), module)
    with pytest.raises(PluginError) as raised:
        load_registry(entry_points_=[ep]).sink_types()
    assert str(raised.value) == (
        f"plugin fanout-listy 0.1: fanout_sink_types returned list [{JsonlSink!r}], not a "
        'dict: return {"<type name>": YourSink} (a fanout.Sink subclass, or a '
        '"package.module:ClassName" reference), {} for no type'
    )


def test_sink_types_returning_none_registers_nothing_with_a_warning_naming_the_plugin(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``None`` is pluggy's "no answer": a plugin registering nothing when its optional
    driver is missing must not stop every other plugin's types from loading (a refusal
    broke every ``fanout`` command). A hook without its ``return`` is still named, once."""
    module = types.ModuleType("fake_noreturn.plugin")

    @fanout.hookimpl
    def fanout_sink_types() -> None:
        {"jsonl": JsonlSink}  # noqa: B018 - the missing return under test

    module.fanout_sink_types = fanout_sink_types  # type: ignore[attr-defined]
    ep = FakeEntryPoint("noreturn", "fake_noreturn.plugin", FakeDist("fanout-nr", "2"), module)
    registry = load_registry(entry_points_=[ep, entry_point("jsonl", {"jsonl": JsonlSink})])
    with caplog.at_level("WARNING", logger="fanout.hooks.registry"):
        assert list(registry.sink_types()) == ["jsonl"]
        assert list(registry.sink_types()) == ["jsonl"]
    assert [r.getMessage() for r in caplog.records] == [
        "plugin fanout-nr 2: fanout_sink_types returned None, so it registers nothing (no "
        "return statement?): return what it registers, or {} to register nothing without "
        "this warning"
    ]


def test_hook_with_wrong_arguments_is_a_load_error() -> None:
    """pluggy rejects an implementation asking for arguments the hook does not pass."""
    module = types.ModuleType("fake_wrongargs.plugin")

    @fanout.hookimpl
    def fanout_sink_types(config: Any) -> dict[str, Any]:
        return {}

    module.fanout_sink_types = fanout_sink_types  # type: ignore[attr-defined]
    ep = FakeEntryPoint("wrongargs", "fake_wrongargs.plugin", FakeDist("fanout-wa", "1"), module)
    registry = load_registry(entry_points_=[ep])
    [error] = registry.load_errors
    assert str(error).startswith(
        'Error importing plugin "wrongargs" (distribution fanout-wa): PluginValidationError: '
    )
    assert "config" in str(error)
    assert isinstance(error.__cause__, pluggy.PluginValidationError)
    assert "wrongargs" not in registry.plugins
    assert registry.sink_types() == {}


# -- building sinks -------------------------------------------------------------------


@pytest.fixture
def registry_and_types() -> tuple[Any, dict[str, Any]]:
    registry = load_registry(entry_points_=[entry_point("jsonl", {"jsonl": JsonlSink})])
    return registry, registry.sink_types()


def test_build_from_dict_passes_options(registry_and_types: tuple[Any, dict[str, Any]]) -> None:
    registry, types_ = registry_and_types
    spec = {"type": "jsonl", "name": "out", "directory": "/data/out", "indent": 2}
    sink = registry.build_sink(spec, types_)
    assert type(sink) is JsonlSink
    assert (sink.name, sink.directory, sink.indent) == ("out", "/data/out", 2)
    assert spec == {"type": "jsonl", "name": "out", "directory": "/data/out", "indent": 2}


def test_build_passes_sink_instances_through(
    registry_and_types: tuple[Any, dict[str, Any]],
) -> None:
    registry, types_ = registry_and_types
    sink = OtherSink("mine")
    assert registry.build_sink(sink, types_) is sink


def test_unknown_option_names_sink_and_valid_options(
    registry_and_types: tuple[Any, dict[str, Any]],
) -> None:
    registry, types_ = registry_and_types
    with pytest.raises(ConfigurationError) as info:
        registry.build_sink(
            {"type": "jsonl", "name": "out", "directory": "/d", "colour": "red"}, types_
        )
    message = str(info.value)
    assert message.startswith("sink 'out' (type 'jsonl'): ")
    assert "unexpected keyword argument 'colour'" in message
    assert message.endswith("; valid options: directory, indent")
    assert isinstance(info.value.__cause__, TypeError)
    assert option_names(JsonlSink) == ["directory", "indent"]


def test_a_misspelt_option_gets_the_nearest_valid_one(
    registry_and_types: tuple[Any, dict[str, Any]],
) -> None:
    registry, types_ = registry_and_types
    with pytest.raises(ConfigurationError) as info:
        registry.build_sink({"type": "jsonl", "name": "out", "directroy": "/d"}, types_)
    assert str(info.value) == (
        "sink 'out' (type 'jsonl'): JsonlSink.__init__() got an unexpected keyword argument "
        "'directroy', did you mean 'directory'?; valid options: directory, indent"
    )


def test_a_misspelt_option_of_fanouts_own_gets_the_nearest_one(
    registry_and_types: tuple[Any, dict[str, Any]],
) -> None:
    """`on_falure` in a FanOut sink dict got no hint (a pipeline file's got one): the
    nearest option was looked for among the sink's only."""
    registry, types_ = registry_and_types
    with pytest.raises(ConfigurationError) as info:
        registry.build_sink({"type": "jsonl", "name": "out", "on_falure": "lag"}, types_)
    assert str(info.value) == (
        "sink 'out' (type 'jsonl'): JsonlSink.__init__() got an unexpected keyword argument "
        "'on_falure', did you mean 'on_failure'?; valid options: directory, indent"
    )


class _NoSuperSink(Sink):
    """Forgets ``super().__init__(name)``."""

    def __init__(self, name: str, *, directory: str = "") -> None:
        self.directory = directory

    def write(self, batch: Any) -> int:
        return 0


def test_a_sink_class_not_calling_super_init_is_told_so() -> None:
    registry = load_registry(entry_points_=[entry_point("nosuper", {"nosuper": _NoSuperSink})])
    types_ = registry.sink_types()
    expected = "the sink has no name; its class's __init__ must call super().__init__(name)"
    with pytest.raises(ConfigurationError) as info:
        registry.build_sink({"type": "nosuper", "name": "out"}, types_)
    assert str(info.value) == f"sink 'out' (type 'nosuper'): {expected}"
    with pytest.raises(ConfigurationError) as info:
        registry.build_sink(_NoSuperSink("out"), types_)
    assert str(info.value) == f"sink _NoSuperSink: {expected}"


class _NamelessSink(Sink):
    """Takes its options but not the sink's name."""

    def __init__(self, *, directory: str = "") -> None:
        super().__init__("fixed")
        self.directory = directory


def test_a_sink_class_whose_init_takes_no_name_fails_its_plugins_load() -> None:
    """It loaded, and every sink of the type then failed to build with Python's
    ``unexpected keyword argument 'name'``, which did not say what fanout passes."""
    registry = load_registry(
        entry_points_=[entry_point("nameless", {"nameless": _NamelessSink}, ("fanout-nl", "1"))]
    )
    assert str(refused_type(registry, "nameless")) == (
        "plugin fanout-nl 1: sink type 'nameless': _NamelessSink.__init__ takes no 'name'; "
        "fanout builds a sink from its configuration as _NamelessSink(name=<the sink's name>, "
        "**options): declare `def __init__(self, name: str, *, <options>)` and call "
        "super().__init__(name)"
    )


OWN_MODULE = """
from fanout import Sink, SinkResult, hookimpl


class TinySink(Sink):
    guarantees = ("idempotent",)

    def write(self, batch):
        return SinkResult(rows=0)


@hookimpl
def fanout_sink_types():
    return {"tiny": TinySink}
"""


@pytest.fixture
def own_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """A plugin module of the test's own, not installed, importable as ``own_tiny_plugin``."""
    (tmp_path / "own_tiny_plugin.py").write_text(OWN_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    try:
        yield importlib.import_module("own_tiny_plugin")
    finally:
        sys.modules.pop("own_tiny_plugin", None)


@pytest.mark.parametrize("form", ["module", "name"])
def test_fanout_and_sink_under_test_take_a_plugin_module_or_its_name(
    own_plugin: types.ModuleType, form: str
) -> None:
    """``FanOut(plugins=...)`` took modules only (a name was refused), while
    ``SinkUnderTest(plugins=...)`` took names only (a module failed in ``import_module``):
    each now takes either, resolved by one function."""
    from fanout.ledger.memory import MemoryLedger
    from fanout.testing.conformance import SinkConformance, SinkUnderTest

    given: Any = own_plugin if form == "module" else "own_tiny_plugin"
    fan = fanout.FanOut("p", MemoryLedger(), [{"type": "tiny", "name": "raw"}], plugins=[given])
    try:
        assert type(fan.sinks["raw"]) is own_plugin.TinySink
    finally:
        fan.close()
    case = SinkUnderTest(config={"type": "tiny"}, read=list, plugins=[given])
    fan = SinkConformance()._fan(case, MemoryLedger())
    try:
        assert type(fan.sinks["under_test"]) is own_plugin.TinySink
    finally:
        fan.close()
    from fanout.testing.conformance.replay import _module_names

    assert _module_names(case.plugins) == ["own_tiny_plugin"]  # the kill check's driver's


def test_a_plugin_name_that_does_not_import_is_refused_naming_it() -> None:
    """``FanOut(plugins=["pkg.plugin"])`` registered the text itself, which implements no
    hook (its sink types were unknown); then was refused as a text; now it is imported, and
    one that does not import is refused naming it and its import error."""
    from fanout.ledger.memory import MemoryLedger

    with pytest.raises(PluginLoadError) as info:
        fanout.FanOut(
            "p", MemoryLedger(), [{"type": "jsonl", "name": "raw"}], plugins=["fake_jsonl.plugin"]
        )
    assert str(info.value) == (
        'Error importing plugin "fake_jsonl.plugin": ModuleNotFoundError: No module named '
        f"'fake_jsonl'; fanout imports it from the working directory ({Path.cwd()}) and "
        "PYTHONPATH: run from the directory holding it, add its directory to PYTHONPATH, or "
        "install its distribution"
    )


class _ExactlyOnceSink(Sink):
    guarantees = ("exactly_once",)  # type: ignore[assignment]

    def write(self, batch: Any) -> int:
        return 0


def test_a_sink_instance_with_an_unknown_guarantee_is_refused(
    registry_and_types: tuple[Any, dict[str, Any]],
) -> None:
    registry, types_ = registry_and_types
    with pytest.raises(ConfigurationError) as info:
        registry.build_sink(_ExactlyOnceSink("out"), types_)
    assert str(info.value) == (
        "sink _ExactlyOnceSink: guarantee 'exactly_once' is not one of transactional, "
        "idempotent, at_least_once; declare the class's 'guarantees = (...)' with those "
        "(docs: README, Semantics)"
    )


def test_missing_required_option(registry_and_types: tuple[Any, dict[str, Any]]) -> None:
    registry, types_ = registry_and_types
    with pytest.raises(ConfigurationError) as info:
        registry.build_sink({"type": "jsonl", "name": "out"}, types_)
    assert "missing 1 required keyword-only argument: 'directory'" in str(info.value)
    assert str(info.value).endswith("valid options: directory, indent")


def test_missing_type(registry_and_types: tuple[Any, dict[str, Any]]) -> None:
    registry, types_ = registry_and_types
    with pytest.raises(ConfigurationError) as info:
        registry.build_sink({"name": "out", "directory": "/d"}, types_)
    assert str(info.value) == "sink 'out': missing 'type' (one of ['jsonl'])"


def test_spec_of_wrong_kind(registry_and_types: tuple[Any, dict[str, Any]]) -> None:
    registry, types_ = registry_and_types
    with pytest.raises(ConfigurationError) as info:
        registry.build_sink("jsonl", types_)  # type: ignore[arg-type]
    assert str(info.value) == (
        "a sink must be a dict with 'type' and 'name' or a fanout.Sink instance, got str"
    )


@pytest.mark.parametrize(
    "name",
    [None, "", "a/b", "-lead", ".hidden", "has space", "x" * 129, 7, "ü", "sink\n"],
)
def test_bad_sink_names(registry_and_types: tuple[Any, dict[str, Any]], name: Any) -> None:
    registry, types_ = registry_and_types
    spec = {"type": "jsonl", "directory": "/d"}
    if name is not None:
        spec["name"] = name
    with pytest.raises(ConfigurationError) as info:
        registry.build_sink(spec, types_)
    assert f": name {name!r} is not valid; use 1-128 letters, digits, '_', '.' or '-', " in str(
        info.value
    )
    with pytest.raises(ConfigurationError, match="name .* is not valid"):
        registry.build_sink(OtherSink(name), types_)


def test_a_bad_sink_name_error_names_the_type_not_the_options(
    registry_and_types: tuple[Any, dict[str, Any]],
) -> None:
    registry, types_ = registry_and_types
    spec = {"type": "jsonl", "name": "", "directory": "/d", "password": "S3cret-Opt"}
    with pytest.raises(ConfigurationError) as info:
        registry.build_sink(spec, types_)
    assert str(info.value).startswith("a sink of type 'jsonl': name '' is not valid;")
    assert "S3cret-Opt" not in str(info.value) and "/d" not in str(info.value)


@pytest.mark.parametrize("name", ["a", "orders_pg", "v1.2-x", "9lives", "x" * 128])
def test_good_sink_names(registry_and_types: tuple[Any, dict[str, Any]], name: str) -> None:
    registry, types_ = registry_and_types
    assert (
        registry.build_sink({"type": "jsonl", "name": name, "directory": "/d"}, types_).name == name
    )


# -- built-ins are entry points like any plugin ----------------------------------------


def test_every_builtin_plugin_registers_through_its_entry_point() -> None:
    """Each plugins/* distribution declares a ``fanout`` entry point to its plugin module,
    and the installed ones are found that way (the core names none of them)."""
    pyprojects = sorted((REPO / "plugins").glob("*/pyproject.toml"))
    assert pyprojects, "no plugins/*/pyproject.toml found"
    declared: dict[str, str] = {}
    for pyproject in pyprojects:
        project = tomllib.loads(pyproject.read_text())["project"]
        group = project.get("entry-points", {}).get("fanout", {})
        assert group, f"{pyproject} declares no 'fanout' entry point"
        for name, value in group.items():
            module = REPO / pyproject.parent / (value.replace(".", "/") + ".py")
            assert module.is_file(), f"{pyproject}: entry point {name} = {value}: no {module}"
            declared[name] = project["name"]
    registry = load_registry()
    assert registry.load_errors == []
    for type_name, sink_type in registry.sink_types().items():
        if type_name in declared:
            assert sink_type.plugin.distribution == declared[type_name]
    assert "delta" in registry.sink_types()


PROBE = """
import fanout
from fanout import Sink

class ProbeSink(Sink):
    guarantees = ("transactional",)

@fanout.hookimpl
def fanout_sink_types():
    return {"probe": ProbeSink}
"""


def test_a_plugin_shipped_in_a_py_files_zip_is_found_by_its_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_modules: None
) -> None:
    """What ``pip install --target DIR`` + ``zip`` gives ``spark-submit --py-files``: the
    module and its ``*.dist-info`` (so the entry point) in one zip on ``sys.path``."""
    import zipfile

    deps = tmp_path / "deps.zip"
    with zipfile.ZipFile(deps, "w") as zf:
        zf.writestr("fanout_probe_plugin.py", PROBE)
        info = "fanout_probe-1.0.dist-info"
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: fanout-probe\nVersion: 1.0\n")
        zf.writestr(f"{info}/entry_points.txt", "[fanout]\nprobe = fanout_probe_plugin\n")
    monkeypatch.syspath_prepend(str(deps))

    registry = load_registry()
    assert registry.load_errors == []
    assert registry.plugins["probe"] == PluginInfo(
        "probe", "fanout_probe_plugin", "fanout-probe", "1.0"
    )
    assert registry.sink_types()["probe"].plugin.describe() == "fanout-probe 1.0"
    assert sys.modules["fanout_probe_plugin"].__file__.startswith(str(deps))


def test_misspelt_hook_is_reported_with_the_plugin_name() -> None:
    import types

    from fanout import hookimpl
    from fanout.hooks.registry import load_registry

    plugin = types.ModuleType("typo_plugin")

    @hookimpl
    def fanout_sink_type() -> dict[str, type]:  # missing "s": not a fanout hook
        return {}

    plugin.fanout_sink_type = fanout_sink_type  # type: ignore[attr-defined]
    registry = load_registry([plugin], entry_points_=[])
    assert len(registry.load_errors) == 1
    message = str(registry.load_errors[0])
    assert 'plugin "typo_plugin"' in message
    assert "unknown hook 'fanout_sink_type'" in message
    assert "did you mean 'fanout_sink_types'? fanout's hooks are fanout_batch_end" in message


def test_a_hook_function_without_hookimpl_is_reported_and_its_plugin_left_out() -> None:
    """pluggy ignores it silently: its sink type was then 'unknown'."""
    plugin = types.ModuleType("undecorated_plugin")

    def fanout_sink_types() -> dict[str, type]:
        return {"jsonl": JsonlSink}

    plugin.fanout_sink_types = fanout_sink_types  # type: ignore[attr-defined]
    registry = load_registry([plugin], entry_points_=[])
    assert [str(e) for e in registry.load_errors] == [
        'Error importing plugin "undecorated_plugin": PluginValidationError: fanout_sink_types '
        "not marked with @fanout.hookimpl, so fanout would ignore it (a sink type it registers "
        "would be unknown): decorate each hook function with @hookimpl (from fanout import "
        "hookimpl)"
    ]
    assert not registry.manager.is_registered(plugin)
    assert registry.plugins == {}


def test_every_misspelt_hook_is_reported_and_its_plugin_left_out() -> None:
    """pluggy's ``check_pending()`` finds them, one plugin at a time."""
    from fanout import hookimpl

    def typo_plugin(name: str, hook: str) -> types.ModuleType:
        plugin = types.ModuleType(name)

        @hookimpl
        def misspelt() -> None: ...

        setattr(plugin, hook, misspelt)
        return plugin

    first = typo_plugin("typo_one", "fanout_batch_begin")
    second = typo_plugin("typo_two", "fanout_sink_type")
    good = plugin_module("good_plugin", {"jsonl": JsonlSink})
    registry = load_registry([first, good, second], entry_points_=[])
    messages = sorted(str(e) for e in registry.load_errors)
    assert len(messages) == 2
    assert 'plugin "typo_one"' in messages[0] and "'fanout_batch_begin'" in messages[0]
    assert 'plugin "typo_two"' in messages[1] and "'fanout_sink_type'" in messages[1]
    assert all(isinstance(e.cause, pluggy.PluginValidationError) for e in registry.load_errors)
    assert not registry.manager.is_registered(first)
    assert not registry.manager.is_registered(second)
    assert set(registry.plugins) == {"good_plugin"}
    assert list(registry.sink_types()) == ["jsonl"]


def test_an_optional_hook_of_another_project_is_not_an_error() -> None:
    from fanout import hookimpl

    plugin = types.ModuleType("optional_plugin")

    @hookimpl(optionalhook=True)
    def fanout_future_hook() -> None: ...

    plugin.fanout_future_hook = fanout_future_hook  # type: ignore[attr-defined]
    registry = load_registry([plugin], entry_points_=[])
    assert registry.load_errors == []
    assert "optional_plugin" in registry.plugins


# -- one entry-point name, two registrations ---------------------------------------------


def test_two_distributions_registering_one_entry_point_name_is_a_load_error() -> None:
    first = entry_point("jsonl", {"jsonl": JsonlSink}, dist=("fanout-jsonl", "1.0.0"))
    fork = entry_point("jsonl", {"jsonl": OtherSink}, dist=("acme-fanout-jsonl", "0.4"))
    registry = load_registry(entry_points_=[first, fork])

    [error] = registry.load_errors
    assert isinstance(error, DuplicatePluginError) and isinstance(error, PluginLoadError)
    assert error.providers == (
        "fanout-jsonl 1.0.0 (fake_jsonl.plugin)",
        "acme-fanout-jsonl 0.4 (fake_jsonl.plugin)",
    )
    assert str(error) == (
        "plugin 'jsonl' (an entry point of the 'fanout' group) is registered by two "
        "distributions: fanout-jsonl 1.0.0 (fake_jsonl.plugin) and acme-fanout-jsonl 0.4 "
        "(fake_jsonl.plugin); fanout will not pick one by install order: uninstall one of "
        "them (`pip uninstall fanout-jsonl` or `pip uninstall acme-fanout-jsonl`), or rename "
        "the entry point in one"
    )
    assert (first.loads, fork.loads) == (1, 0)  # the second is never imported
    assert registry.plugins == {
        "jsonl": PluginInfo("jsonl", "fake_jsonl.plugin", "fanout-jsonl", "1.0.0")
    }
    with pytest.raises(DuplicatePluginError):
        registry.raise_load_errors()


def test_one_distribution_registering_one_name_for_two_modules_is_a_load_error() -> None:
    first = entry_point("jsonl", {"jsonl": JsonlSink}, dist=("fanout-jsonl", "1.0.0"))
    other = FakeEntryPoint(
        "jsonl", "fanout_jsonl.other", FakeDist("fanout-jsonl", "1.0.0"), first.plugin
    )
    registry = load_registry(entry_points_=[first, other])

    [error] = registry.load_errors
    assert isinstance(error, DuplicatePluginError)
    assert error.providers == (
        "fanout-jsonl 1.0.0 (fake_jsonl.plugin)",
        "fanout-jsonl 1.0.0 (fanout_jsonl.other)",
    )


def test_an_entry_point_without_distribution_sharing_a_name_is_a_load_error() -> None:
    first = entry_point("jsonl", {"jsonl": JsonlSink}, dist=("fanout-jsonl", "1.0.0"))
    loose = entry_point("jsonl", {"jsonl": OtherSink}, dist=None)
    loose.value = "my_jsonl"
    registry = load_registry(entry_points_=[first, loose])

    [error] = registry.load_errors
    assert str(error) == (
        "plugin 'jsonl' (an entry point of the 'fanout' group) is registered by two "
        "distributions: fanout-jsonl 1.0.0 (fake_jsonl.plugin) and module my_jsonl; fanout "
        "will not pick one by install order: uninstall one of them (`pip uninstall "
        "fanout-jsonl`), or rename the entry point in one"
    )


@pytest.mark.parametrize(
    "twin", [("fanout-jsonl", "1.0.0"), ("Fanout_JSONL", "1.0.0"), ("fanout.jsonl", "1.1")]
)
def test_one_distributions_entry_point_listed_twice_is_loaded_once(
    twin: tuple[str, str],
) -> None:
    """A caller's list may hold a distribution twice (its metadata in two ``sys.path``
    entries): the same distribution (as PEP 503 compares names) and module is one plugin."""
    first = entry_point("jsonl", {"jsonl": JsonlSink}, dist=("fanout-jsonl", "1.0.0"))
    again = entry_point("jsonl", {"jsonl": JsonlSink}, dist=twin)
    registry = load_registry(entry_points_=[first, again])

    assert registry.load_errors == []
    assert (first.loads, again.loads) == (1, 0)
    assert list(registry.sink_types()) == ["jsonl"]
    assert registry.sink_types()["jsonl"].plugin.describe() == "fanout-jsonl 1.0.0"


def _distribution(root: Path, name: str, version: str, module: str, type_name: str) -> None:
    """An installed distribution as pip leaves it: its module and its ``*.dist-info``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(PROBE.replace('"probe"', repr(type_name)))
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[fanout]\njsonl = {module}\n")


def test_a_distribution_installed_on_two_paths_is_one_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_modules: None
) -> None:
    """The same distribution found twice (an editable install and a regular one, a
    ``--target`` directory next to site-packages): Python's ``entry_points()`` lists it once,
    from the first path, so fanout neither reports it nor loads it twice."""
    for where in ("editable", "site"):
        _distribution(tmp_path / where, "fanout-jsonl", "1.0", "fanout_jsonl_probe", "jsonl")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.syspath_prepend(str(tmp_path / "editable"))

    registry = load_registry()
    assert registry.load_errors == []
    assert registry.plugins["jsonl"] == PluginInfo(
        "jsonl", "fanout_jsonl_probe", "fanout-jsonl", "1.0"
    )
    module = sys.modules["fanout_jsonl_probe"].__file__ or ""
    assert module == str(tmp_path / "editable" / "fanout_jsonl_probe.py")


def test_two_installed_distributions_with_one_entry_point_name_fail_fanout_plugins(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    restore_modules: None,
) -> None:
    from fanout.app.cli import main
    from fanout.ledger.memory import MemoryLedger

    _distribution(tmp_path / "a", "fanout-jsonl", "1.0", "fanout_jsonl_a", "jsonl")
    _distribution(tmp_path / "b", "acme-fanout-jsonl", "0.4", "acme_jsonl_b", "jsonl")
    monkeypatch.syspath_prepend(str(tmp_path / "b"))
    monkeypatch.syspath_prepend(str(tmp_path / "a"))

    assert main(["plugins"]) == 1
    err = capsys.readouterr().err
    assert (
        "fanout: plugin 'jsonl' (an entry point of the 'fanout' group) is registered by two "
        "distributions: fanout-jsonl 1.0 (fanout_jsonl_a) and acme-fanout-jsonl 0.4 "
        "(acme_jsonl_b); fanout will not pick one by install order"
    ) in err
    assert "acme_jsonl_b" not in sys.modules
    with pytest.raises(DuplicatePluginError, match="acme-fanout-jsonl 0.4"):
        fanout.FanOut("p", MemoryLedger(), [{"type": "jsonl", "name": "raw"}])


def test_hook_conditions_for_a_hook_the_type_does_not_implement_is_a_plugin_error() -> None:
    """A misspelt or stale ``hook_conditions`` key was ignored without a word: ``fanout
    plugins`` printed the hook bare, as answering whatever the options."""

    class MisspeltSink(Sink):
        guarantees = ("idempotent",)
        hook_conditions = {"harmless_rewrites": "mode=upsert", "holds_batch": "always"}

        def harmless_rewrite(self) -> str | None:
            return None

    registry = load_registry(
        entry_points_=[entry_point("ms", {"ms": MisspeltSink}, dist=("fanout-ms", "1.0"))],
    )
    assert str(refused_type(registry, "ms")) == (
        "plugin fanout-ms 1.0: sink type 'ms' gives hook_conditions for 'harmless_rewrites', "
        "'holds_batch', which it does not implement; its optional hooks: harmless_rewrite "
        "(a key names one of these, with the options under which it answers)"
    )


def test_standing_problems_is_an_optional_hook_listed_with_its_conditions() -> None:
    """``Sink.standing_problems`` (what ``fanout status --config`` shows to fix by hand) was
    not among the optional hooks: ``fanout plugins`` did not list a type implementing it,
    and a ``hook_conditions`` key naming it failed the plugin's load as a hook the type
    does not implement."""

    class CheckedSink(Sink):
        guarantees = ("idempotent",)
        hook_conditions = {"standing_problems": "compact_every set"}

        def standing_problems(self) -> tuple[str, ...]:
            return ()

    registry = load_registry(
        entry_points_=[entry_point("cs", {"cs": CheckedSink}, dist=("fanout-cs", "1.0"))],
    )
    assert registry.sink_types()["cs"].sink_class is CheckedSink
    assert implemented_hooks(CheckedSink, conditions=True) == [
        "standing_problems (compact_every set)"
    ]


def test_lift_epoch_fence_and_secret_values_are_optional_hooks_listed_with_conditions() -> None:
    """``Sink.lift_epoch_fence`` (a refused new epoch's start undoes the fence with it) and
    ``Sink.secret_values`` (what fanout masks) were not among the optional hooks:
    ``fanout plugins`` did not list a type implementing them, and a ``hook_conditions``
    key naming one failed the plugin's load as a hook the type does not implement."""

    class FencingSink(Sink):
        guarantees = ("transactional",)
        hook_conditions = {"lift_epoch_fence": "mode=append", "secret_values": "url set"}

        def fence_earlier_epochs(self, pipeline: str, epoch: int) -> None:
            return None

        def lift_epoch_fence(self, pipeline: str, epoch: int) -> bool | None:
            return False

        def secret_values(self) -> list[str]:
            return []

    registry = load_registry(
        entry_points_=[entry_point("fs", {"fs": FencingSink}, dist=("fanout-fs", "1.0"))],
    )
    assert registry.load_errors == []
    assert registry.sink_types()["fs"].sink_class is FencingSink
    assert implemented_hooks(FencingSink, conditions=True) == [
        "fence_earlier_epochs",
        "lift_epoch_fence (mode=append)",
        "secret_values (url set)",
    ]


# -- lazy references: a sink type's class imported only when the type is used -------------


def test_a_lazy_reference_is_imported_only_when_its_type_is_used() -> None:
    """``fanout_sink_types`` may map a type to ``"module:Class"``: the registry lists the
    type without importing it, builds and checks it on first use, and a module that does
    not import is the plugin's load error, raised then (on the old registry a text was
    refused at once as 'not a subclass of fanout.Sink')."""
    ep = entry_point(
        "lazy",
        {"jsonl": f"{__name__}:JsonlSink", "broken": "fanout_missing_driver_probe:BrokenSink"},
        dist=("fanout-lazy", "2.0"),
    )
    registry = load_registry(entry_points_=[ep])
    types_ = registry.sink_types()
    assert sorted(types_) == ["broken", "jsonl"]
    assert registry.load_errors == []
    assert "fanout_missing_driver_probe" not in sys.modules
    assert types_["broken"].reference == "fanout_missing_driver_probe:BrokenSink"

    sink = registry.build_sink({"type": "jsonl", "name": "raw", "directory": "/d"}, types_)
    assert (type(sink), sink.name, sink.directory) == (JsonlSink, "raw", "/d")
    assert types_["jsonl"].sink_class is JsonlSink
    assert types_["jsonl"].guarantees == ("idempotent",)

    with pytest.raises(PluginLoadError) as info:
        registry.build_sink({"type": "broken", "name": "b"}, types_)
    assert (info.value.plugin_name, info.value.distribution) == ("lazy", "fanout-lazy")
    assert isinstance(info.value.__cause__, ModuleNotFoundError)
    assert str(info.value) == (
        'Error importing plugin "lazy" (distribution fanout-lazy): ModuleNotFoundError: '
        "No module named 'fanout_missing_driver_probe'; fanout imports sink type 'broken' "
        "(fanout_missing_driver_probe:BrokenSink) when a sink of it is built or checked, or "
        "`fanout plugins` lists it: install what it imports, fix it, or uninstall it "
        "(`pip uninstall fanout-lazy`)"
    )

    # listed with details (`fanout plugins`): the broken type is left out, its error kept
    assert sorted(registry.listed_sink_types()) == ["jsonl"]
    [error] = registry.load_errors
    assert str(error) == str(info.value)


def test_a_lazy_reference_checks_its_text_at_once_and_its_class_when_imported() -> None:
    """A reference that is no ``module:Class`` text, a module without the class, or a class
    fanout refuses: the type is refused when used (its text checked without importing)."""
    bad_text = entry_point("bad", {"bad": "fanout_x.sink.BadSink"}, dist=("fanout-bad", "1"))
    assert str(refused_type(load_registry(entry_points_=[bad_text]), "bad")) == (
        "plugin fanout-bad 1: sink type 'bad' is 'fanout_x.sink.BadSink', neither a subclass "
        "of fanout.Sink nor a reference to one as 'package.module:ClassName'"
    )

    ep = entry_point(
        "odd",
        {"missing": f"{__name__}:NoSuchSink", "notasink": f"{__name__}:FakeDist"},
        dist=("fanout-odd", "1"),
    )
    types_ = load_registry(entry_points_=[ep]).sink_types()
    with pytest.raises(PluginError) as info:
        types_["missing"].sink_class  # noqa: B018
    assert str(info.value) == (
        f"plugin fanout-odd 1: sink type 'missing' is '{__name__}:NoSuchSink', but module "
        f"{__name__} has no NoSuchSink: fix the reference its fanout_sink_types returns"
    )
    with pytest.raises(PluginError, match="sink type 'notasink' is <class .*FakeDist'>, not a"):
        types_["notasink"].sink_class  # noqa: B018


def test_fanout_plugins_lists_a_lazy_type_whose_module_does_not_import_as_an_error(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    restore_modules: None,
) -> None:
    from fanout.app.cli import main

    (tmp_path / "lazy_probe_plugin.py").write_text(
        "import fanout\n\n\n@fanout.hookimpl\ndef fanout_sink_types():\n"
        f"    return {{'lazyjsonl': '{__name__}:JsonlSink',"
        " 'lazybroken': 'fanout_missing_driver_probe:BrokenSink'}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["plugins", "--plugin", "lazy_probe_plugin"]) == 1
    out, err = capsys.readouterr()
    assert "lazyjsonl" in out
    assert f"{__name__}.JsonlSink" in out
    assert "lazybroken" not in out
    assert (
        'fanout: Error importing plugin "lazy_probe_plugin": ModuleNotFoundError: No module '
        "named 'fanout_missing_driver_probe'; fanout imports sink type 'lazybroken'"
    ) in err


@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_lazy_type_of_an_installed_plugin_a_file_uses_that_does_not_import_exits_2(
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It exited 1 (``fanout: PluginLoadError: ...``), where the same module of a plugin
    the file names in ``plugins = [...]`` exits 2: either way the file uses a sink type
    that cannot load, a configuration error found before Spark starts, with the plugin's
    error naming the plugin, the type and what to do."""
    import fanout.hooks.registry as registry_module
    from fanout.app.cli import main

    ep = entry_point(
        "lazy", {"lazy": "fanout_missing_driver_probe:LazySink"}, dist=("fanout-lazy", "2.0")
    )
    monkeypatch.setattr(registry_module, "entry_points", lambda group: [ep])
    file = tmp_path / "p.toml"
    file.write_text(
        f'[pipeline]\nname = "p"\nledger = "{tmp_path}/ledger"\n'
        f'checkpoint = "{tmp_path}/checkpoint"\n[source]\nformat = "rate"\n'
        '[[sinks]]\ntype = "lazy"\nname = "raw"\n'
    )
    assert main([command, str(file)]) == 2
    assert capsys.readouterr().err == (
        f'fanout: configuration error: {file}: Error importing plugin "lazy" (distribution '
        "fanout-lazy): ModuleNotFoundError: No module named 'fanout_missing_driver_probe'; "
        "fanout imports sink type 'lazy' (fanout_missing_driver_probe:LazySink) when a sink "
        "of it is built or checked, or `fanout plugins` lists it: install what it imports, "
        "fix it, or uninstall it (`pip uninstall fanout-lazy`)\n"
    )
    assert not (tmp_path / "ledger").exists()


LAZY_IMPORTS = """
import sys
from fanout.app.cli import build_parser, installed_plugins
import fanout.app.status, fanout.app.recover, fanout.ledger.delta

registry = installed_plugins()
build_parser(registry)  # what every command does first (`fanout status`, `--help`)
assert sorted(registry.sink_types())[:3] == ["delta", "kafka", "postgres"], registry.sink_types()
assert registry.load_errors == [], registry.load_errors
heavy = ("pandas", "sqlalchemy", "confluent_kafka", "deltalake", "fanout_delta.sink",
         "fanout_postgres.sink", "fanout_kafka.sink")
print(sorted(m for m in heavy if m in sys.modules))

from fanout.app.runner import load_pipeline
load_pipeline(sys.argv[1])  # a PostgreSQL sink's options checked: its class imported
print(sorted(m for m in heavy if m in sys.modules))
"""


def test_a_command_imports_only_the_sink_code_it_uses(tmp_path: Path) -> None:
    """``fanout status`` (and every command) loads the installed plugins; their sink modules
    pulled in pandas and confluent-kafka, ~80% of the command's start (old code: the first
    line was ['confluent_kafka', 'fanout_delta.sink', 'fanout_kafka.sink',
    'fanout_postgres.sink', 'pandas']). A file with a PostgreSQL sink imports that sink's
    code (SQLAlchemy waits for a connection), and no other sink's."""
    import subprocess

    pipeline = tmp_path / "pg.toml"
    pipeline.write_text(
        '[pipeline]\nname = "orders"\nledger = "/tmp/l"\ncheckpoint = "/tmp/c"\n'
        '[source]\nformat = "rate"\n'
        '[[sinks]]\ntype = "postgres"\nname = "pg"\nurl = "postgresql://u@h:1/d"\ntable = "t"\n'
    )
    done = subprocess.run(
        [sys.executable, "-c", LAZY_IMPORTS, str(pipeline)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "[]",
        "['fanout_postgres.sink', 'pandas']",
    ]
