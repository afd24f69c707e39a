"""What options a sink type takes: one declaration per sink class, read by everything else.

A sink class lists its options in :attr:`fanout.Sink.options` as :class:`SinkOption`s. That
one declaration feeds ``fanout plugins --options TYPE``, the "unknown option, did you mean"
checks of pipeline files and ``FanOut(sinks=[...])``, and the option tables of the README
(a test renders them with :func:`markdown_table` and finds them there verbatim). Plugins
loaded by fanout must declare exactly the keyword options their constructor takes; a class
that declares nothing is described from its constructor's signature.
"""

from __future__ import annotations

import inspect
import textwrap
from dataclasses import dataclass
from typing import Any

SinkClass = type[Any]
"""A :class:`fanout.Sink` subclass (typed loosely: the sink contract imports this module)."""


@dataclass(frozen=True)
class SinkOption:
    """One option of a sink type.

    :param name: the keyword its constructor takes (and the key in a pipeline file).
    :param default: the default as users read it: ``"required"``, ``"none"``, ``"`4`"``...
    :param meaning: what it does, in a sentence or a few (Markdown).
    :param expands_env: the sink expands ``${VAR}`` in this option itself (e.g. in each part
        of a URL, after parsing it), so a pipeline file hands it over unexpanded.
    """

    name: str
    default: str
    meaning: str
    expands_env: bool = False


def constructor_options(sink_class: SinkClass) -> list[str]:
    """The keyword options the class's constructor takes (besides ``name``)."""
    params = inspect.signature(sink_class.__init__).parameters.values()
    return [
        p.name
        for p in params
        if p.name not in ("self", "name") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


def declared_options(sink_class: SinkClass) -> tuple[SinkOption, ...]:
    """The class's declared options, or, when it declares none, its constructor's keywords
    with their defaults and no meaning."""
    declared: tuple[SinkOption, ...] = tuple(getattr(sink_class, "options", ()) or ())
    if declared:
        return declared
    params = inspect.signature(sink_class.__init__).parameters
    found = []
    for name in constructor_options(sink_class):
        default = params[name].default
        shown = "required" if default is inspect.Parameter.empty else f"`{default!r}`"
        found.append(SinkOption(name, shown, "(not documented by the sink)"))
    return tuple(found)


def self_expanded_options(sink_class: SinkClass) -> list[str]:
    """The options whose ``${VAR}`` the sink class expands itself
    (:attr:`SinkOption.expands_env`)."""
    return [option.name for option in declared_options(sink_class) if option.expands_env]


def option_names(sink_class: SinkClass) -> list[str]:
    """The option names of a sink class, in declaration order."""
    return [option.name for option in declared_options(sink_class)]


def declaration_problems(sink_class: SinkClass) -> list[str]:
    """How the class's declaration and its constructor disagree, or which entries of it
    are not a :class:`SinkOption` of texts (empty when all is well)."""
    entries = tuple(getattr(sink_class, "options", ()) or ())
    if not entries:
        return []
    problems = [problem for entry in entries if (problem := _entry_problem(entry))]
    if problems:
        return problems
    declared = [option.name for option in entries]
    taken = constructor_options(sink_class)
    if missing := [n for n in taken if n not in declared]:
        problems.append(f"options not declared: {', '.join(missing)}")
    if unknown := [n for n in declared if n not in taken]:
        problems.append(f"declared but not taken by __init__: {', '.join(unknown)}")
    if len(set(declared)) != len(declared):
        problems.append("an option is declared twice")
    return problems


def _entry_problem(entry: object) -> str | None:
    """What is wrong with one entry of an ``options`` declaration, or ``None``."""
    if not isinstance(entry, SinkOption):
        return f"{entry!r} is not a fanout.contract.options.SinkOption(name, default, meaning)"
    for field in ("name", "default", "meaning"):
        value = getattr(entry, field)
        if not isinstance(value, str):
            example = ' ("required", "none", "`30.0`")' if field == "default" else ""
            return (
                f"option {entry.name!r}: {field} {value!r} is a {type(value).__name__}; "
                f"give it as the text users read{example}"
            )
    return None


def markdown_table(options: tuple[SinkOption, ...]) -> str:
    """The options as the README's Markdown table (``option | default | meaning``)."""
    lines = ["| option | default | meaning |", "|---|---|---|"]
    lines += [f"| `{o.name}` | {o.default} | {o.meaning} |" for o in options]
    return "\n".join(lines)


def text_table(options: tuple[SinkOption, ...], width: int = 100) -> str:
    """The options for a terminal: name and default on one line, the meaning wrapped and
    indented below it."""
    blocks = []
    for option in options:
        meaning = textwrap.fill(
            option.meaning.replace("`", ""),
            width=width,
            initial_indent="    ",
            subsequent_indent="    ",
        )
        blocks.append(f"{option.name}  (default: {option.default.replace('`', '')})\n{meaning}")
    return "\n".join(blocks)
