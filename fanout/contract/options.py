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
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

SinkClass = type[Any]
"""A :class:`fanout.Sink` subclass (typed loosely: the sink contract imports this module)."""


CORE_OPTIONS = (
    "where",
    "select",
    "retries",
    "backoff_s",
    "on_failure",
    "max_lag",
    "backfill_from",
    "write_timeout_s",
)
"""Keys of a sink's dict configuration that fanout consumes itself."""


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
        problems.append(
            f"options not declared: {', '.join(missing)} (add a SinkOption for each keyword "
            "of __init__, or drop it from __init__)"
        )
    if unknown := [n for n in declared if n not in taken]:
        problems.append(
            f"declared but not taken by __init__: {', '.join(unknown)} (add each as a keyword "
            "of __init__, or drop its SinkOption)"
        )
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


def markdown_table(options: tuple[SinkOption, ...], types: Mapping[str, str]) -> str:
    """The options as the README's Markdown table (``option | type | default | meaning``);
    ``types`` as :func:`option_type_texts` gives them (``-``: not checked)."""
    lines = ["| option | type | default | meaning |", "|---|---|---|---|"]
    lines += [
        f"| `{o.name}` | {types.get(o.name) or '-'} | {o.default} | {o.meaning} |" for o in options
    ]
    return "\n".join(lines)


def text_table(options: tuple[SinkOption, ...], types: Mapping[str, str], width: int = 100) -> str:
    """The options for a terminal: name, expected type (as option type errors say it) and
    default on one line, the meaning wrapped and indented below it."""
    blocks = []
    for option in options:
        meaning = textwrap.fill(
            option.meaning.replace("`", ""),
            width=width,
            initial_indent="    ",
            subsequent_indent="    ",
        )
        kind = f": {types[option.name]}" if types.get(option.name) else ""
        default = option.default.replace("`", "")
        blocks.append(f"{option.name}{kind}  (default: {default})\n{meaning}")
    return "\n".join(blocks)


# -- option types -------------------------------------------------------------------------
#
# The expected type of each option is read from the constructor's annotations, so a plugin
# author declares it once (the signature), and a wrong value is refused where the sink is
# configured, before the stream starts, instead of failing late inside the sink.


def option_types(sink_class: SinkClass) -> dict[str, Any]:
    """Each keyword option's annotated type (``Any`` where it is unannotated or its
    annotation cannot be resolved, e.g. a name imported only under ``TYPE_CHECKING``)."""
    init = sink_class.__init__
    try:
        hints = typing.get_type_hints(init)
    except Exception:
        hints = _hints_one_by_one(init)
    return {name: hints.get(name, Any) for name in constructor_options(sink_class)}


def option_type_texts(sink_class: SinkClass) -> dict[str, str]:
    """Each option's expected type as option type errors name it (``int or none``); an
    empty text for an option that is not checked (unannotated, or not resolvable)."""
    return {
        name: "" if hint is Any else type_text(hint)
        for name, hint in option_types(sink_class).items()
    }


def _hints_one_by_one(function: Any) -> dict[str, Any]:
    """The annotations of ``function`` that resolve, each evaluated on its own."""
    hints: dict[str, Any] = {}
    scope = getattr(function, "__globals__", {})
    for name, annotation in getattr(function, "__annotations__", {}).items():
        try:
            hints[name] = eval(annotation, scope) if isinstance(annotation, str) else annotation
        except Exception:
            continue
    return hints


def value_fits(value: object, hint: Any) -> bool:
    """Whether ``value`` is of the annotated type ``hint``. ``bool`` is not an ``int`` here
    (``True`` is one in Python, never a count); an ``int`` is a ``float``; ``str`` is a
    ``Sequence[str]`` (sinks take one column name for a list); a hint not understood (a
    ``TypeVar``, a ``Callable``...) takes anything."""
    if hint is Any or isinstance(hint, typing.TypeVar):
        return True
    if hint is None or hint is type(None):
        return value is None
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Annotated:
        return value_fits(value, args[0])
    if origin is typing.Union or origin is types.UnionType:
        return any(value_fits(value, arm) for arm in args)
    if origin is typing.Literal:
        return any(value == arg and type(value) is type(arg) for arg in args)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return _container_fits(value, hint, origin, args)


def _container_fits(value: object, hint: Any, origin: Any, args: tuple[Any, ...]) -> bool:
    """:func:`value_fits` for sequences, mappings and plain classes."""
    kind = origin if origin is not None else hint
    if not isinstance(kind, type):
        return True  # Callable[...], a Protocol alias...: not checked
    if kind in (list, tuple):  # a pipeline file has arrays only: a list is a tuple too
        if not isinstance(value, list | tuple):
            return False
        if kind is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(
                value_fits(v, a) for v, a in zip(value, args, strict=True)
            )
        return not args or all(value_fits(item, args[0]) for item in value)
    try:
        if not isinstance(value, kind):
            return False
    except TypeError:  # a class isinstance refuses (a Protocol without runtime_checkable)
        return True
    if not args:
        return True
    if isinstance(value, Mapping) and len(args) == 2:
        return all(value_fits(k, args[0]) and value_fits(v, args[1]) for k, v in value.items())
    if isinstance(value, str):
        return True
    if isinstance(value, Iterable) and not isinstance(value, Mapping):
        return all(value_fits(item, args[0]) for item in value)
    return True


def type_text(hint: Any) -> str:
    """The type as a user reads it in an error: ``int``, ``int or none``,
    ``one of 'append', 'merge'``, ``a list of str``."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is None or hint is type(None):
        return "none"
    if hint is Any:
        return "anything"
    if origin is typing.Annotated:
        return type_text(args[0])
    if origin is typing.Union or origin is types.UnionType:
        return " or ".join(type_text(arm) for arm in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(arg) for arg in args)
    kind = origin if origin is not None else hint
    if isinstance(kind, type) and args:
        if issubclass(kind, Mapping) and len(args) == 2:
            return f"a mapping of {_inner_text(args[0])} to {_inner_text(args[1])}"
        if issubclass(kind, Iterable) and not issubclass(kind, str):
            return f"a list of {_inner_text(args[0])}"
    if isinstance(kind, type):
        return "a mapping" if issubclass(kind, Mapping) else kind.__name__
    return str(hint)


def _inner_text(hint: Any) -> str:
    """:func:`type_text` of a type inside another, in parentheses when it is a union."""
    text = type_text(hint)
    return f"({text})" if " or " in text else text


def coerce_option_text(sink_class: SinkClass, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with a number given as text (typically from ``${VAR}`` in a pipeline
    file) made a number, where the option takes a number and no text; other values as given."""
    hints = option_types(sink_class)
    return {key: coerce_text(value, hints.get(key, Any)) for key, value in options.items()}


def coerce_text(value: Any, hint: Any) -> Any:
    """``value``, or the number it writes as text when ``hint`` takes that number and no
    text (``"4"`` for an ``int``, ``"2.5"`` or ``"2"`` for a ``float``); any other value as
    given (:func:`value_fits` then judges it)."""
    if not isinstance(value, str) or value_fits(value, hint):
        return value
    for kind in (int, float):
        try:
            number = kind(value.strip())
        except ValueError:
            continue
        if value_fits(number, hint):
            return number
    return value
