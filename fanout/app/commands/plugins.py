"""``fanout plugins``: the installed sink types, their plugins and options."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fanout.app.commands.output import print_json

if TYPE_CHECKING:
    from fanout.contract.sink import Sink
    from fanout.hooks.registry import Registry


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fanout plugins`` to ``commands``."""
    plugins = commands.add_parser("plugins", help="list installed sink types and their plugins")
    plugins.add_argument("--json", action="store_true", help="print JSON")
    plugins.add_argument(
        "--options", metavar="TYPE", help="the options of one sink type: default and meaning"
    )
    plugins.add_argument(
        "--plugin",
        action="append",
        metavar="MODULE",
        help="also a module of your own, not installed, as a pipeline file's plugins = [...] "
        "names it (imported from the working directory and PYTHONPATH); repeatable",
    )
    plugins.set_defaults(func=cmd_plugins)


def cmd_plugins(args: argparse.Namespace) -> int:
    """List the sink types of every installed plugin, and of the modules ``--plugin`` names
    (a pipeline file's ``plugins``)."""
    from fanout.app.status import format_table
    from fanout.contract.sink import implemented_hooks
    from fanout.hooks.registry import load_registry

    registry = load_registry(args.plugin or ())
    if args.options is not None:  # imports that type's class only
        code = _print_options(registry.sink_types(), args.options, as_json=args.json)
        failed = _print_load_errors(registry)  # said either way: the type may be its
        return code or failed  # an unknown type stays exit 2
    types = registry.listed_sink_types()  # every class imported: its guarantees, hooks
    rows = [
        [
            t.name,
            t.guarantees_text(),
            t.plugin.distribution or "-",
            t.plugin.version or "-",
            f"{t.sink_class.__module__}.{t.sink_class.__qualname__}",
        ]
        for t in sorted(types.values(), key=lambda t: t.name)
    ]
    if args.json:
        print_json(
            [
                {
                    "type": t.name,
                    "guarantees": list(t.guarantees),
                    "guarantees_declared": t.declared,
                    "distribution": t.plugin.distribution,
                    "version": t.plugin.version,
                    "class": f"{t.sink_class.__module__}.{t.sink_class.__qualname__}",
                    "implements": implemented_hooks(t.sink_class),
                    "conditions": _conditions(t.sink_class),
                }
                for t in sorted(types.values(), key=lambda t: t.name)
            ]
        )
    elif rows:
        print(format_table(["type", "guarantees", "distribution", "version", "class"], rows))
        print()  # then each type's optional hooks: too long for a column
        for t in sorted(types.values(), key=lambda t: t.name):
            print(f"{t.name} {_implements(t.sink_class)}")
    else:
        print("no sink types installed")
    return _print_load_errors(registry)


def _print_options(types: Mapping[str, Any], type_name: str, *, as_json: bool) -> int:
    """``fanout plugins --options TYPE``: the options a sink type declares."""
    from fanout.contract.options import declared_options, option_type_texts, text_table

    if type_name not in types:
        import difflib

        known = ", ".join(sorted(types)) or "none"
        close = difflib.get_close_matches(type_name, list(types), n=1)
        hint = f", did you mean {close[0]}?" if close else ""
        print(f"fanout: no sink type {type_name!r}{hint}; installed: {known}", file=sys.stderr)
        return 2
    sink_class = types[type_name].sink_class
    options = declared_options(sink_class)
    kinds = option_type_texts(sink_class)
    if as_json:
        listed = [{**vars(o), "type": kinds.get(o.name) or None} for o in options]
        print_json(listed)
    else:
        print(f"options of sink type {type_name!r}:\n")
        print(text_table(options, kinds))
        print(f"\n{_implements(sink_class)}")
    return 0


def _implements(sink_class: type[Sink]) -> str:
    """``implements: holds_batch, ...``: the optional hooks a sink type implements (what a
    reset, a replay or ``fanout validate`` can ask it), each answering only under some
    options followed by them (``harmless_rewrite (mode=upsert, no dead_letter)``), or
    ``none``."""
    from fanout.contract.sink import implemented_hooks

    return f"implements: {', '.join(implemented_hooks(sink_class, conditions=True)) or 'none'}"


def _conditions(sink_class: type[Sink]) -> dict[str, str]:
    """The implemented hooks that answer only under some options, with those options."""
    from fanout.contract.sink import implemented_hooks

    implemented = implemented_hooks(sink_class)
    return {h: c for h, c in sink_class.hook_conditions.items() if h in implemented}


def _print_load_errors(registry: Registry) -> int:
    """Each plugin that did not load, on stderr (its text says what failed: no second
    "error" before it); 1 when there is one, else 0."""
    for error in registry.load_errors:
        print(f"fanout: {error}", file=sys.stderr)
    return 1 if registry.load_errors else 0
