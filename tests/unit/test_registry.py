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
from fanout.errors import (
    ConfigurationError,
    DuplicateSinkTypeError,
    PluginError,
    PluginLoadError,
    UnknownSinkTypeError,
)
from fanout.hooks.registry import (
    BUILTIN_PLUGIN_MODULES,
    PluginInfo,
    load_registry,
    option_names,
)

REPO = Path(__file__).resolve().parents[2]


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
    registry = load_registry(entry_points_=[ep], fallback_modules=())

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
    registry = load_registry([extra], entry_points_=[ep], fallback_modules=())

    types_ = registry.sink_types()
    assert sorted(types_) == ["extra", "jsonl", "other"]
    assert types_["extra"].plugin == PluginInfo("my_extra_plugin", "my_extra_plugin")
    assert types_["extra"].plugin.describe() == "module my_extra_plugin"


def test_no_plugins_no_types() -> None:
    registry = load_registry(entry_points_=[], fallback_modules=())
    assert registry.sink_types() == {}
    assert registry.plugins == {}


def test_unknown_sink_type_lists_known_types() -> None:
    registry = load_registry(
        entry_points_=[entry_point("a", {"jsonl": JsonlSink, "other": OtherSink})],
        fallback_modules=(),
    )
    types_ = registry.sink_types()
    with pytest.raises(UnknownSinkTypeError) as info:
        registry.build_sink({"type": "parquet", "name": "out"}, types_)
    assert isinstance(info.value, ConfigurationError)
    assert info.value.known == ["jsonl", "other"]
    assert str(info.value) == (
        "sink 'out': unknown sink type 'parquet'; known types: jsonl, other. A sink type "
        "comes from a plugin distribution registered under the 'fanout' entry-point group; "
        "`fanout plugins` lists what is installed."
    )


def test_unknown_sink_type_with_no_plugin_says_so() -> None:
    registry = load_registry(entry_points_=[], fallback_modules=())
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
        fallback_modules=(),
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
    registry = load_registry(entry_points_=[broken, good], fallback_modules=())

    # the good plugin still loads; the error waits to be raised
    assert sorted(registry.sink_types()) == ["jsonl"]
    [error] = registry.load_errors
    assert isinstance(error, PluginLoadError)
    assert error.plugin_name == "postgres"
    assert error.distribution == "fanout-postgres"
    assert str(error) == (
        'Error importing plugin "postgres" (distribution fanout-postgres): '
        "ImportError: No module named 'psycopg2'"
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
    registry = load_registry(entry_points_=[ep], fallback_modules=())
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
        fallback_modules=(),
    )
    with pytest.raises(PluginError) as info:
        registry.sink_types()
    assert str(info.value) == (
        f"plugin fanout-bad 0.1: sink type 'bad' is {NotASink!r}, not a subclass of fanout.Sink"
    )


def test_instance_instead_of_class_is_a_plugin_error() -> None:
    registry = load_registry(
        entry_points_=[
            entry_point("bad", {"bad": JsonlSink("x", directory="/")}, ("fanout-bad", "0.1"))
        ],
        fallback_modules=(),
    )
    with pytest.raises(PluginError, match="not a subclass of fanout.Sink"):
        registry.sink_types()


def test_bad_guarantee_is_a_plugin_error() -> None:
    class ExactlyOnceSink(Sink):
        guarantees = ("exactly_once",)  # type: ignore[assignment]

    registry = load_registry(
        entry_points_=[entry_point("eo", {"eo": ExactlyOnceSink}, dist=("fanout-eo", "9.9"))],
        fallback_modules=(),
    )
    with pytest.raises(PluginError) as info:
        registry.sink_types()
    assert str(info.value) == (
        "plugin fanout-eo 9.9: sink type 'eo' declares guarantee 'exactly_once'; expected a "
        "tuple of transactional, idempotent, at_least_once"
    )


def test_guarantee_as_a_class_attribute_is_a_plugin_error() -> None:
    class OldStyleSink(Sink):
        guarantee = "idempotent"  # type: ignore[assignment]

    registry = load_registry(
        entry_points_=[entry_point("old", {"old": OldStyleSink}, dist=("fanout-old", "1.0"))],
        fallback_modules=(),
    )
    with pytest.raises(PluginError, match=r"sets 'guarantee' as a class attribute; declare"):
        registry.sink_types()


def test_hook_with_wrong_arguments_is_a_load_error() -> None:
    """pluggy rejects an implementation asking for arguments the hook does not pass."""
    module = types.ModuleType("fake_wrongargs.plugin")

    @fanout.hookimpl
    def fanout_sink_types(config: Any) -> dict[str, Any]:
        return {}

    module.fanout_sink_types = fanout_sink_types  # type: ignore[attr-defined]
    ep = FakeEntryPoint("wrongargs", "fake_wrongargs.plugin", FakeDist("fanout-wa", "1"), module)
    registry = load_registry(entry_points_=[ep], fallback_modules=())
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
    registry = load_registry(
        entry_points_=[entry_point("jsonl", {"jsonl": JsonlSink})], fallback_modules=()
    )
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
    [None, "", "a/b", "-lead", ".hidden", "has space", "x" * 129, 7, "ü"],
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


@pytest.mark.parametrize("name", ["a", "orders_pg", "v1.2-x", "9lives", "x" * 128])
def test_good_sink_names(registry_and_types: tuple[Any, dict[str, Any]], name: str) -> None:
    registry, types_ = registry_and_types
    assert (
        registry.build_sink({"type": "jsonl", "name": name, "directory": "/d"}, types_).name == name
    )


# -- fallback modules -----------------------------------------------------------------


def test_builtin_plugin_modules_match_plugins_dirs() -> None:
    """Every built-in plugin's entry point is in the fallback list, and every listed module
    whose plugin directory exists is declared by that directory's pyproject."""
    pyprojects = sorted((REPO / "plugins").glob("*/pyproject.toml"))
    assert pyprojects, "no plugins/*/pyproject.toml found"
    assert len(set(BUILTIN_PLUGIN_MODULES)) == len(BUILTIN_PLUGIN_MODULES)

    declared: dict[str, set[str]] = {}
    for pyproject in pyprojects:
        project = tomllib.loads(pyproject.read_text())["project"]
        values = set(project.get("entry-points", {}).get("fanout", {}).values())
        assert values, f"{pyproject} declares no 'fanout' entry point"
        declared[pyproject.parent.name] = values
        for value in values:
            assert value in BUILTIN_PLUGIN_MODULES, (
                f"{value} ({pyproject.relative_to(REPO)}) is missing from "
                "fanout.hooks.registry.BUILTIN_PLUGIN_MODULES"
            )

    for module in BUILTIN_PLUGIN_MODULES:
        plugin_dir = module.split(".")[0].replace("_", "-")
        if (REPO / "plugins" / plugin_dir).is_dir():
            assert module in declared.get(plugin_dir, set()), (
                f"{module} is in BUILTIN_PLUGIN_MODULES but plugins/{plugin_dir}/pyproject.toml "
                "does not declare it"
            )
    assert "fanout_delta.plugin" in BUILTIN_PLUGIN_MODULES


def write_module(root: Path, name: str, body: str) -> None:
    (root / f"{name}.py").write_text(body)


PROBE = """
import fanout
from fanout import Sink

class ProbeSink(Sink):
    guarantees = ("transactional",)

@fanout.hookimpl
def fanout_sink_types():
    return {"probe": ProbeSink}
"""


def test_fallback_module_imported_when_no_entry_point_provides_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_modules: None
) -> None:
    write_module(tmp_path, "fanout_probe_plugin", PROBE)
    monkeypatch.syspath_prepend(str(tmp_path))

    registry = load_registry(
        entry_points_=[entry_point("jsonl", {"jsonl": JsonlSink})],
        fallback_modules=("fanout_probe_plugin", "fanout_not_shipped_here.plugin"),
    )
    assert registry.load_errors == []  # an absent built-in is simply skipped
    assert registry.plugins["fanout_probe_plugin"] == PluginInfo(
        "fanout_probe_plugin", "fanout_probe_plugin"
    )
    types_ = registry.sink_types()
    assert sorted(types_) == ["jsonl", "probe"]
    assert types_["probe"].plugin.describe() == "module fanout_probe_plugin"
    assert "fanout_probe_plugin" in sys.modules


def test_fallback_module_skipped_when_an_entry_point_provides_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_modules: None
) -> None:
    write_module(tmp_path, "fanout_probe_plugin", PROBE)
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = FakeEntryPoint(
        "probe",
        "fanout_probe_plugin",
        FakeDist("fanout-probe", "1.0"),
        plugin_module("fanout_probe_plugin", {"probe": OtherSink}),
    )
    registry = load_registry(entry_points_=[ep], fallback_modules=("fanout_probe_plugin",))
    assert registry.load_errors == []
    assert list(registry.plugins) == ["probe"]
    assert registry.sink_types()["probe"].plugin.describe() == "fanout-probe 1.0"
    assert "fanout_probe_plugin" not in sys.modules  # never imported


def test_fallback_module_failing_to_import_is_a_load_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_modules: None
) -> None:
    write_module(tmp_path, "fanout_broken_plugin", "import fanout_dependency_not_installed\n")
    write_module(tmp_path, "fanout_raising_plugin", "raise RuntimeError('bad config')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = load_registry(
        entry_points_=[], fallback_modules=("fanout_broken_plugin", "fanout_raising_plugin")
    )
    assert [str(e) for e in registry.load_errors] == [
        'Error importing plugin "fanout_broken_plugin": ModuleNotFoundError: '
        "No module named 'fanout_dependency_not_installed'",
        'Error importing plugin "fanout_raising_plugin": RuntimeError: bad config',
    ]
    assert all(isinstance(e.__cause__, Exception) for e in registry.load_errors)
    assert registry.plugins == {}


def test_misspelt_hook_is_reported_with_the_plugin_name() -> None:
    import types

    from fanout import hookimpl
    from fanout.hooks.registry import load_registry

    plugin = types.ModuleType("typo_plugin")

    @hookimpl
    def fanout_sink_type() -> dict[str, type]:  # missing "s": not a fanout hook
        return {}

    plugin.fanout_sink_type = fanout_sink_type  # type: ignore[attr-defined]
    registry = load_registry([plugin], entry_points_=[], fallback_modules=())
    assert len(registry.load_errors) == 1
    message = str(registry.load_errors[0])
    assert 'plugin "typo_plugin"' in message
    assert "unknown hook 'fanout_sink_type'" in message
    assert "fanout_sink_types" in message
