"""A pipeline file's top-level ``plugins = ["my_sinks"]``: a sink of your own, not installed,
named by its module beside where ``fanout`` runs (before, a pipeline file loaded installed
entry points only, and ``plugins`` was an unknown section)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fanout.app.cli import main
from fanout.app.runner import load_pipeline
from fanout.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[2]
MODULE = "my_sinks"

PIPELINE = """plugins = ["my_sinks"]

[pipeline]
name = "mine"
ledger = "{root}/ledger"
checkpoint = "{root}/checkpoint"

[source]
format = "rate"

[[sinks]]
type = "jsonl"
name = "raw"
directory = "{root}/out"
"""


@pytest.fixture
def own_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The README's sink of your own (examples/jsonl_sink.py) as ``my_sinks.py`` in the
    working directory, not installed; ``sys.path`` and ``sys.modules`` put back after."""
    shutil.copy(ROOT / "examples" / "jsonl_sink.py", tmp_path / f"{MODULE}.py")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])
    try:
        yield tmp_path
    finally:
        sys.modules.pop(MODULE, None)


def test_a_pipeline_file_names_a_sink_module_of_its_own(own_module: Path) -> None:
    file = own_module / "pipeline.toml"
    file.write_text(PIPELINE.format(root=own_module))
    config = load_pipeline(str(file))
    assert config.plugins == ("my_sinks",)
    assert config.sinks == [{"type": "jsonl", "name": "raw", "directory": f"{own_module}/out"}]
    assert sys.modules[MODULE].__file__ == str(own_module / "my_sinks.py")


def test_a_plugin_module_that_does_not_import_is_a_configuration_error(
    own_module: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = own_module / "pipeline.toml"
    file.write_text(PIPELINE.format(root=own_module).replace('["my_sinks"]', '["my_sinkz"]'))
    with pytest.raises(ConfigurationError) as caught:
        load_pipeline(str(file))
    assert str(caught.value) == (
        f'{file}: plugins: Error importing plugin "my_sinkz": ModuleNotFoundError: No module '
        f"named 'my_sinkz'; fanout imports it from the working directory ({own_module}) and "
        "PYTHONPATH: run from the directory holding it, add its directory to PYTHONPATH, or "
        "install its distribution"
    )
    assert main(["validate", str(file)]) == 2  # before any Spark session
    assert "No module named 'my_sinkz'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("head", "message"),
    [
        ('plugins = "my_sinks"', "plugins: must be a list of module names "
         "(plugins = [\"my_sinks\"]), not 'my_sinks'"),
        ('plugins = ["my_sinks.py"]', "plugins: 'my_sinks.py' is not a module name: give the "
         "name Python imports it by (my_sinks for my_sinks.py beside where fanout runs, "
         "acme.plugin for acme/plugin.py)"),
    ],
)  # fmt: skip
def test_a_plugins_value_that_names_no_module_is_refused(
    own_module: Path, head: str, message: str
) -> None:
    file = own_module / "pipeline.toml"
    file.write_text(PIPELINE.format(root=own_module).replace('plugins = ["my_sinks"]', head))
    with pytest.raises(ConfigurationError) as caught:
        load_pipeline(str(file))
    assert str(caught.value) == message


def test_plugins_written_under_a_section_says_it_is_top_level(own_module: Path) -> None:
    """TOML puts a key written after ``[pipeline]`` into that table."""
    text = PIPELINE.format(root=own_module).replace('plugins = ["my_sinks"]\n', "")
    text = text.replace('name = "mine"', 'name = "mine"\nplugins = ["my_sinks"]')
    file = own_module / "pipeline.toml"
    file.write_text(text)
    with pytest.raises(ConfigurationError) as caught:
        load_pipeline(str(file))
    assert str(caught.value).startswith(
        f"2 mistakes in {file}:\n"
        "  - pipeline.plugins: plugins is a top-level key: write plugins = [...] at the top "
        "of the file, before [pipeline] (TOML puts a key written after a [section] into that "
        "section)\n"
        "  - sinks[0].type: unknown sink type 'jsonl'"
    ), str(caught.value)


def test_fanout_plugins_lists_the_types_of_a_module_given_with_plugin(
    own_module: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plugins", "--plugin", MODULE, "--json"]) == 0
    import json

    found = {t["type"]: t for t in json.loads(capsys.readouterr().out)}
    assert found["jsonl"]["class"] == "my_sinks.JsonLinesSink"
    assert found["jsonl"]["guarantees"] == ["idempotent"]
    assert found["jsonl"]["distribution"] is None


@pytest.mark.parametrize("options", [[], ["--options", "delta"]])
def test_fanout_plugins_says_once_that_a_module_given_with_plugin_is_missing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    options: list[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["plugins", "--plugin", "no_such_sinks", *options]) == 1
    assert capsys.readouterr().err == (
        'fanout: Error importing plugin "no_such_sinks": ModuleNotFoundError: No module '
        f"named 'no_such_sinks'; fanout imports it from the working directory ({tmp_path}) "
        "and PYTHONPATH: run from the directory holding it, add its directory to "
        "PYTHONPATH, or install its distribution\n"
    )


def test_an_unknown_type_asked_beside_a_plugin_that_does_not_load_exits_2_saying_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The type asked may be the failed plugin's: both said; the exit code is the unknown
    type's (2), as without the failed plugin (it was 1, the load error's)."""
    monkeypatch.chdir(tmp_path)
    assert main(["plugins", "--plugin", "no_such_sinks", "--options", "mongodb"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "fanout: no sink type 'mongodb'; installed: delta, kafka, postgres",
        'fanout: Error importing plugin "no_such_sinks": ModuleNotFoundError: No module '
        f"named 'no_such_sinks'; fanout imports it from the working directory ({tmp_path}) "
        "and PYTHONPATH: run from the directory holding it, add its directory to "
        "PYTHONPATH, or install its distribution",
    ]


BAD_TYPE = """

class NoCommaSink(JsonLinesSink):
    guarantees = "idempotent"


@hookimpl
def fanout_sink_types():
    return {"jsonl": JsonLinesSink, "nocomma": NoCommaSink}
"""

NO_COMMA = (
    "plugin module my_sinks: sink type 'nocomma' declares guarantees = 'idempotent', a str, "
    'not a tuple: write guarantees = ("idempotent",) (the trailing comma makes it a tuple)'
)


@pytest.fixture
def with_a_bad_type(own_module: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``my_sinks`` registering ``jsonl`` and ``nocomma``, whose class is declared wrong."""
    import fanout.hooks.registry as registry_module

    module = own_module / f"{MODULE}.py"
    module.write_text(module.read_text() + BAD_TYPE)
    monkeypatch.setattr(registry_module, "_warned_refused", set())
    return own_module


@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_bad_type_the_file_uses_is_a_configuration_error_before_spark(
    with_a_bad_type: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """It exited 1 (a PluginError), where a plugin module of the file that does not import
    exits 2: both are the file's configuration, found before Spark starts; said for the
    sink using the type, by its key, as the file's other mistakes are."""
    file = with_a_bad_type / "pipeline.toml"
    file.write_text(PIPELINE.format(root=with_a_bad_type).replace('"jsonl"', '"nocomma"'))
    assert main([command, str(file)]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"fanout: configuration error: sinks[0].type (sink 'raw'): {NO_COMMA}"
    )


def test_a_bad_type_the_file_does_not_use_is_a_warning(
    with_a_bad_type: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It failed the file as well: one bad type took every type of its plugin with it."""
    caplog.set_level("WARNING", logger="fanout")
    file = with_a_bad_type / "pipeline.toml"
    file.write_text(PIPELINE.format(root=with_a_bad_type))
    assert load_pipeline(str(file)).sinks[0]["type"] == "jsonl"
    assert [r.getMessage() for r in caplog.records] == [
        f"{NO_COMMA}; a sink of that type is refused, the plugin's other types load"
    ]


def test_fanout_plugins_lists_the_good_types_of_a_module_with_a_bad_one(
    with_a_bad_type: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plugins", "--plugin", MODULE]) == 1
    out, err = capsys.readouterr()
    assert "my_sinks.JsonLinesSink" in out
    assert "nocomma" not in out
    assert err == f"fanout: {NO_COMMA}\n"


def test_a_sink_module_of_the_files_plugin_that_does_not_import_is_a_configuration_error(
    own_module: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plugin module naming its class as ``"module:Class"`` (as the built-in sinks and
    the README's checklist do) imports it when the file uses its type: a mistake there
    exited 1, a mistake in the plugin module itself 2."""
    (own_module / "my_lazy_sinks.py").write_text(
        "from fanout import hookimpl\n\n\n@hookimpl\ndef fanout_sink_types():\n"
        '    return {"lazy": "my_lazy_sink_module:LazySink"}\n'
    )
    (own_module / "my_lazy_sink_module.py").write_text("import no_such_driver_xyz\n")
    file = own_module / "pipeline.toml"
    text = PIPELINE.format(root=own_module).replace('"my_sinks"', '"my_lazy_sinks"')
    file.write_text(text.replace('type = "jsonl"', 'type = "lazy"'))
    try:
        assert main(["validate", str(file)]) == 2
    finally:
        sys.modules.pop("my_lazy_sinks", None)
    assert capsys.readouterr().err == (
        f'fanout: configuration error: {file}: plugins: Error importing plugin "my_lazy_sinks": '
        "ModuleNotFoundError: No module named 'no_such_driver_xyz'; fanout imports sink type "
        "'lazy' (my_lazy_sink_module:LazySink) when a sink of it is built or checked, or "
        "`fanout plugins` lists it: install what it imports, fix it, or uninstall it (remove "
        "it)\n"
    )
