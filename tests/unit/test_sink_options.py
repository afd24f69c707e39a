"""One declaration of a sink type's options: the CLI, the checks and the README agree."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest

import fanout
from fanout import Sink
from fanout.contract.options import (
    SinkOption,
    declaration_problems,
    markdown_table,
    option_names,
    option_type_texts,
)
from fanout.errors import SinkTypeError
from fanout.hooks.registry import load_registry
from tests.cli_process import fanout_process

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
BUILT_IN = ("delta", "postgres", "kafka")


def built_in_types() -> dict[str, Any]:
    types_ = load_registry().sink_types()
    return {name: types_[name].sink_class for name in BUILT_IN}


@pytest.mark.parametrize("type_name", BUILT_IN)
def test_readme_table_is_the_declaration(type_name: str) -> None:
    sink_class = built_in_types()[type_name]
    assert declaration_problems(sink_class) == []
    assert markdown_table(sink_class.options, option_type_texts(sink_class)) in README


@pytest.mark.parametrize("type_name", BUILT_IN)
def test_every_constructor_option_is_declared_with_a_meaning(type_name: str) -> None:
    sink_class = built_in_types()[type_name]
    assert sink_class.options, type_name
    assert all(option.meaning and option.default for option in sink_class.options)
    assert option_names(sink_class)[0] in ("path", "url", "bootstrap_servers")


class Declared(Sink):
    """A sink whose declaration names an option its constructor does not take."""

    options = (SinkOption("directory", "required", "where"), SinkOption("colour", "none", "?"))

    def __init__(self, name: str, *, directory: str) -> None:
        super().__init__(name)
        self.directory = directory

    def write(self, batch: Any) -> int:
        return 0


def test_a_declaration_that_disagrees_with_the_constructor_is_a_plugin_error() -> None:
    module = types.ModuleType("fake_declared")

    @fanout.hookimpl
    def fanout_sink_types() -> dict[str, Any]:
        return {"declared": Declared}

    module.fanout_sink_types = fanout_sink_types  # type: ignore[attr-defined]
    registry = load_registry([module], entry_points_=[])
    with pytest.raises(SinkTypeError) as info:  # only this type refused, when read
        registry.sink_types()["declared"].sink_class  # noqa: B018
    assert str(info.value) == (
        "plugin module fake_declared: sink type 'declared': its `options` declaration is "
        "wrong: declared but not taken by __init__: colour (add each as a keyword of "
        "__init__, or drop its SinkOption)"
    )


class Undeclared(Sink):
    """A sink whose constructor takes an option its declaration lacks."""

    options = (SinkOption("directory", "required", "where"),)

    def __init__(self, name: str, *, directory: str, size: int = 1) -> None:
        super().__init__(name)
        self.directory, self.size = directory, size

    def write(self, batch: Any) -> int:
        return 0


def test_an_option_missing_from_the_declaration_is_refused_saying_what_to_add() -> None:
    from fanout.contract.options import declaration_problems

    assert declaration_problems(Undeclared) == [
        "options not declared: size (add a SinkOption for each keyword of __init__, or drop "
        "it from __init__)"
    ]


class DefaultAsValue(Sink):
    """A sink declaring its default as the value, not the text users read."""

    options = (SinkOption("timeout_s", 30.0, "how long to wait"),)  # type: ignore[arg-type]

    def __init__(self, name: str, *, timeout_s: float = 30.0) -> None:
        super().__init__(name)
        self.timeout_s = timeout_s

    def write(self, batch: Any) -> int:
        return 0


def test_a_default_that_is_not_a_text_is_a_plugin_error() -> None:
    """It failed later, in `fanout plugins --options` (AttributeError: 'float' object has
    no attribute 'replace')."""
    module = types.ModuleType("fake_default_as_value")

    @fanout.hookimpl
    def fanout_sink_types() -> dict[str, Any]:
        return {"default_as_value": DefaultAsValue}

    module.fanout_sink_types = fanout_sink_types  # type: ignore[attr-defined]
    registry = load_registry([module], entry_points_=[])
    with pytest.raises(SinkTypeError) as info:  # only this type refused, when read
        registry.sink_types()["default_as_value"].sink_class  # noqa: B018
    assert str(info.value).endswith(
        "sink type 'default_as_value': its `options` declaration is wrong: option "
        "'timeout_s': default 30.0 is a float; give it as the text users read (\"required\", "
        '"none", "`30.0`")'
    )


def test_an_entry_that_is_not_a_sink_option_is_named() -> None:
    class Bare(DefaultAsValue):
        options = ("timeout_s",)  # type: ignore[assignment]

    assert declaration_problems(Bare) == [
        "'timeout_s' is not a fanout.contract.options.SinkOption(name, default, meaning)"
    ]


def test_plugins_options_lists_names_defaults_and_meanings() -> None:
    done = fanout_process("plugins", "--options", "postgres")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "options of sink type 'postgres':"
    assert "partitions: int  (default: 4)" in lines
    assert "mode: one of 'upsert', 'append'  (default: upsert)" in lines
    assert any("Write partitions per batch = transactions, each on" in x for x in lines)


def test_plugins_options_shows_the_type_option_type_errors_expect() -> None:
    """An option type error points to `fanout plugins --options TYPE`, which showed no
    type: the user learnt the default and the meaning, never what to write."""
    done = fanout_process("plugins", "--options", "delta")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "compact_every: int or none  (default: none)" in lines
    assert "merge_schema: bool  (default: false)" in lines
    assert "keys: a list of str or none  (default: none)" in lines
    postgres = fanout_process("plugins", "--options", "postgres").stdout.splitlines()
    assert "url  (default: required)" in postgres  # not checked: no type shown


def test_plugins_options_json_is_the_declaration() -> None:
    done = fanout_process("plugins", "--options", "kafka", "--json")
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert [o["name"] for o in listed] == option_names(built_in_types()["kafka"])
    assert listed[1] == {
        "name": "topic", "default": "required",
        "meaning": "the target topic. Change it between batches only: a batch half written "
        "to another topic is refused (`KafkaMarkerError`, naming both) until it is set back "
        "and the batch completes",
        "expands_env": False,
        "type": "str or none",
    }  # fmt: skip
    assert listed[0]["type"] == "str or a list of str or none"


def test_plugins_options_of_an_unknown_type_names_the_installed_ones() -> None:
    done = fanout_process("plugins", "--options", "postgress")
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == (
        "fanout: no sink type 'postgress', did you mean postgres?; installed: delta, kafka, "
        "postgres"
    )
    far = fanout_process("plugins", "--options", "mongodb")
    assert (far.returncode, far.stderr.splitlines()[-1]) == (
        2, "fanout: no sink type 'mongodb'; installed: delta, kafka, postgres"
    )  # fmt: skip
