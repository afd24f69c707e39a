"""Pipelines described in a TOML file, for ``fanout run`` and ``fanout validate``.

Every string value may reference environment variables as ``${NAME}``,
``${NAME:-default}`` (unset or empty) or ``${NAME-default}`` (unset only), as the shell
reads them (:func:`fanout.observe.secrets.expand_env`). Unknown keys are errors naming the
key's path and the closest known key (``sinks[2].tabel: unknown option, did you mean
table?``). See ``examples/pipeline.toml`` for a commented example.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fanout.app.interval import interval_ms
from fanout.contract.locations import (
    local_path,
    shown_location,
    uncreatable_directory,
    unwritable_directory,
)
from fanout.contract.names import check_name
from fanout.contract.options import SinkClass, coerce_option_text, coerce_text
from fanout.errors import ConfigurationError, SinkTypeError, shell_word
from fanout.hooks.registry import PerSinkType, is_module_name
from fanout.observe.logs import register_secrets
from fanout.observe.option_values import HIDDEN_STRING, option_type_problems, value_problem
from fanout.observe.secrets import expand_env, location_secrets
from fanout.retry import RetryPolicy
from fanout.sink_spec import CORE_OPTIONS, split_core_options

SECTIONS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "pipeline": {
        "name": str,
        "ledger": str,
        "checkpoint": str,
        "trigger": dict,
        "parallelism": int,
        "retries": int,
        "backoff_s": (int, float),
        "stop_timeout_s": (int, float),
        "spool": str,
        "probe_interval_s": (int, float),
        "share_tasks": bool,
    },
    "spark": {"master": str, "app_name": str, "conf": dict},
    "source": {"format": str, "options": dict, "schema": str, "transform": str, "path": str},
    "metrics": {"port": int, "host": str},
}
TRIGGER_KEYS = {"processing_time": str, "available_now": bool, "once": bool}
REQUIRED = {"pipeline": ("name", "ledger", "checkpoint"), "source": ("format",)}
# The least value each number may take, and whether that value itself is allowed: what
# FanOut, RetryPolicy and the stop take, checked here so that `fanout validate` refuses it
# too, before a Spark session starts.
MINIMUMS: dict[str, tuple[float, bool]] = {
    "pipeline.parallelism": (1, True),
    "pipeline.retries": (0, True),
    "pipeline.backoff_s": (0, True),
    "pipeline.stop_timeout_s": (0, True),
    "pipeline.probe_interval_s": (0, False),
    "metrics.port": (0, True),  # 0: any free port (the dev loop, tests)
}
MAXIMUMS: dict[str, float] = {"metrics.port": 65535}
NON_EMPTY = ("pipeline.ledger", "pipeline.checkpoint", "pipeline.spool")
CORE_NUMBERS: dict[str, type] = {
    "retries": int,
    "backoff_s": float,
    "write_timeout_s": float,
    "max_lag": int,
    "max_lag.batches": int,
    "max_lag.age_s": float,
}
"""The numbers among fanout's own options of a ``[[sinks]]`` entry (``max_lag``: when
not a table), as their values must be after a number written as text is read."""


@dataclass(frozen=True)
class PipelineConfig:
    """A validated pipeline description (environment references already resolved)."""

    name: str
    ledger: str
    checkpoint: str
    source: Mapping[str, Any]
    sinks: list[dict[str, Any]]
    trigger: Mapping[str, Any] = field(default_factory=dict)
    spark: Mapping[str, Any] = field(default_factory=dict)
    metrics: Mapping[str, Any] | None = None
    parallelism: int | None = None
    retries: int = 2
    backoff_s: float = 1.0
    stop_timeout_s: float = 60.0
    spool: str | None = None
    probe_interval_s: float = 10.0
    share_tasks: bool = True
    path: Path | None = None
    plugins: tuple[str, ...] = ()
    """The top-level ``plugins``: modules of the user's own, by name, registering sink types
    (or observers) through fanout's hooks as ``FanOut(plugins=...)`` does
    (:func:`plugin_names`)."""


class _Mistakes:
    """The independent mistakes of one pipeline file, collected so that one run reports
    every one of them (a data engineer fixing the file sees them all, not the first).

    Each check that can fail on its own runs under :meth:`each`; a check that depends on
    an earlier one (a sink's options, on its known type) runs only when that one passed.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.errors: list[ConfigurationError] = []

    @contextmanager
    def each(self) -> Iterator[None]:
        """Run the block; a :class:`fanout.ConfigurationError` it raises is collected."""
        try:
            yield
        except ConfigurationError as exc:
            self.errors.append(exc)

    def add(self, error: ConfigurationError) -> None:
        self.errors.append(error)

    def raise_any(self) -> None:
        """Raise the one mistake as it is, or one error listing each, in file order."""
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            file = self.path if self.path is not None else "the pipeline file"
            raise ConfigurationError(
                f"{len(self.errors)} mistakes in {file}:\n"
                + "\n".join(f"  - {error}" for error in self.errors)
            )


def _unknown(path: str, key: str, known: list[str], what: str = "key") -> ConfigurationError:
    hint = _did_you_mean(key, known) or f"; known: {', '.join(sorted(known))}"
    return ConfigurationError(f"{path}{key}: unknown {what}{hint}")


def _expand(value: Any, where: str, mistakes: _Mistakes) -> Any:
    """Resolve ``${VAR}`` in every string of a nested value; a string that cannot be
    resolved (an unset variable) is collected in ``mistakes`` and kept as written."""
    if isinstance(value, str):
        with mistakes.each():
            return expand_env(value, what=where)
        return value
    if isinstance(value, list):
        return [_expand(v, f"{where}[{i}]", mistakes) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _expand(v, f"{where}.{k}" if where else k, mistakes) for k, v in value.items()}
    return value


def _expand_sinks(
    sinks: Any,
    sink_options: Mapping[str, list[str]],
    self_expanded: Mapping[str, list[str]],
    mistakes: _Mistakes,
) -> tuple[Any, dict[str, SinkTypeError]]:
    """``[[sinks]]`` with ``${VAR}`` resolved, except in the options their sink type
    expands itself (a PostgreSQL URL is parsed first, so a password needs no escaping);
    and the sink types they use that their plugins declare wrong, each with its error,
    asked here, where each type's name is first known (:func:`_refusal`): every option of
    such a type is expanded, and :func:`_check_sink` says the refusal."""
    refused: dict[str, SinkTypeError] = {}
    if not isinstance(sinks, list):
        return _expand(sinks, "sinks", mistakes), refused
    expanded = []
    for index, sink in enumerate(sinks):
        where = f"sinks[{index}]"
        if not isinstance(sink, dict):
            expanded.append(_expand(sink, where, mistakes))
            continue
        kind = _expand(sink.get("type"), f"{where}.type", mistakes)
        refusal = _refusal(sink_options, kind) if isinstance(kind, str) else None
        if refusal is not None:
            refused[kind] = refusal
        kept = set() if refusal is not None else set(self_expanded.get(str(kind), ()))
        expanded.append({
            k: kind if k == "type" else v if k in kept else _expand(v, f"{where}.{k}", mistakes)
            for k, v in sink.items()
        })  # fmt: skip
    return expanded, refused


def _refusal(sink_options: Mapping[str, list[str]], type_name: str) -> SinkTypeError | None:
    """The error of sink type ``type_name`` when its plugin declares it wrong
    (:meth:`fanout.hooks.registry.PerSinkType.refusal`), without raising; ``None`` for a
    type that loads, an unknown one, and every type of a mapping built beforehand (such
    as :func:`fanout.app.runner.sink_option_names`'s, which leaves refused types out)."""
    return sink_options.refusal(type_name) if isinstance(sink_options, PerSinkType) else None


def _check_section(name: str, data: Any, mistakes: _Mistakes) -> dict[str, Any]:
    """The section's keys checked (unknown, of the wrong type, missing, out of range),
    each mistake collected in ``mistakes``; the section with numbers given as text made
    numbers, holding only its keys that passed."""
    if not isinstance(data, dict):
        mistakes.add(ConfigurationError(f"{name}: must be a table ([{name}])"))
        return {}
    spec = SECTIONS[name]
    data = {key: _coerce(value, spec.get(key)) for key, value in data.items()}
    good: dict[str, Any] = {}
    for key, value in data.items():
        if key == "plugins" and key not in spec:  # TOML: a key after [name] is name's
            mistakes.add(
                ConfigurationError(
                    f"{name}.plugins: plugins is a top-level key: write plugins = [...] at the "
                    f"top of the file, before [{name}] (TOML puts a key written after a "
                    "[section] into that section)"
                )
            )
        elif key not in spec:
            mistakes.add(_unknown(f"{name}.", key, list(spec)))
        elif not isinstance(value, spec[key]) or (isinstance(value, bool) and spec[key] is int):
            expected = spec[key]
            names = (
                " or ".join(t.__name__ for t in expected)
                if isinstance(expected, tuple)
                else expected.__name__
            )
            given = _given(value, expected, f"{name}.{key}")
            mistakes.add(ConfigurationError(f"{name}.{key}: expected {names}, got {given}"))
        else:
            good[key] = value
    for key in REQUIRED.get(name, ()):
        if key not in data and key not in _suggested(data, list(spec)):
            mistakes.add(ConfigurationError(f"{name}.{key}: missing required option"))
    for key, value in list(good.items()):
        try:
            _check_value(f"{name}.{key}", value)
        except ConfigurationError as exc:
            mistakes.add(exc)
            del good[key]
    return good


def _given(value: Any, expected: type | tuple[type, ...], path: str) -> str:
    """How a wrongly typed value is named: as written, but a table's (``source.options``,
    ``spark.conf``) given otherwise, whose text may hold a password, by its type only."""
    if dict in (expected if isinstance(expected, tuple) else (expected,)):
        kind = (
            HIDDEN_STRING
            if isinstance(value, str)
            else f"a {type(value).__name__} (its value not shown: it may hold a secret)"
        )
        return f"{kind}; write it as a table, [{path}]"
    return repr(value)


def _check_value(path: str, value: Any) -> None:
    """Refuse a number out of its range, an infinite or NaN float, an empty path."""
    if path in NON_EMPTY and not value.strip():
        raise ConfigurationError(f"{path}: must not be empty")
    if path == "pipeline.checkpoint":
        _check_checkpoint(value)
    if path not in MINIMUMS:
        return
    least, allowed = MINIMUMS[path]
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigurationError(f"{path}: must be a finite number, got {value!r}")
    if value < least or (value == least and not allowed):
        bound = f">= {least:g}" if allowed else f"> {least:g}"
        raise ConfigurationError(f"{path}: must be {bound}, got {value!r}")
    if path in MAXIMUMS and value > MAXIMUMS[path]:
        raise ConfigurationError(f"{path}: must be <= {MAXIMUMS[path]:g}, got {value!r}")


_OTHER_SCHEME = re.compile(r"(?!file:)[A-Za-z][A-Za-z0-9+.-]+:")
"""A URI of another filesystem without ``//`` (``dbfs:/checkpoints``, ``s3a:/b/x``): Hadoop
reads a colon before the first slash as a scheme's, so no local path is named."""


def _check_checkpoint(location: str) -> None:
    """Refuse a local checkpoint location that is a file or lies under one: Spark failed
    to start the query there, after the sinks were opened, with a Java traceback."""
    local = local_path(location)
    if local is None or _OTHER_SCHEME.match(location):
        return
    if os.path.exists(local) and not os.path.isdir(local):
        problem = (
            "it is a file, not a directory: Spark keeps the query's checkpoint in a "
            "directory; give a directory, or a path where nothing is yet (Spark creates it)"
        )
    else:
        problem = uncreatable_directory(local) or ""
    if problem:
        raise ConfigurationError(f"pipeline.checkpoint: {shown_location(location)!r}: {problem}")


def check_checkpoint_writable(config: PipelineConfig) -> None:
    """Refuse (:class:`fanout.ConfigurationError`) a local ``pipeline.checkpoint`` this
    user may not create or write: permission denied on it or on its nearest existing
    ancestor. Spark failed there at the query's start, after the sinks were opened, with a
    Hadoop traceback. Checked by ``fanout run`` and ``fanout validate`` only: the
    operator's commands reading the file (``status --config``...) may run as a user that
    never writes the checkpoint."""
    location = config.checkpoint
    local = local_path(location)
    if local is None or _OTHER_SCHEME.match(location):
        return
    problem = unwritable_directory(local)
    if problem:
        raise ConfigurationError(f"pipeline.checkpoint: {shown_location(location)!r}: {problem}")


def _coerce(value: Any, expected: type | tuple[type, ...] | None) -> Any:
    """Numbers given as strings (typically from ``${VAR}``) become numbers."""
    if not isinstance(value, str) or expected is None:
        return value
    wanted = expected if isinstance(expected, tuple) else (expected,)
    for kind in (int, float):
        if kind in wanted:
            try:
                return kind(value)
            except ValueError:
                continue
    return value


def _check_trigger(trigger: dict[str, Any], mistakes: _Mistakes) -> dict[str, Any]:
    """``pipeline.trigger`` checked, each key's mistake collected in ``mistakes``."""
    for key, value in trigger.items():
        with mistakes.each():
            _check_trigger_key(key, value)
    if len(trigger) > 1:
        mistakes.add(
            ConfigurationError("pipeline.trigger: give one of processing_time, available_now, once")
        )
    return trigger


def _check_trigger_key(key: str, value: Any) -> None:
    """One key of ``pipeline.trigger``: known, of its type, a trigger Spark runs."""
    if key not in TRIGGER_KEYS:
        raise _unknown("pipeline.trigger.", key, list(TRIGGER_KEYS))
    if not isinstance(value, TRIGGER_KEYS[key]):
        example = "true" if TRIGGER_KEYS[key] is bool else '"10 seconds"'
        raise ConfigurationError(
            f"pipeline.trigger.{key}: expected {TRIGGER_KEYS[key].__name__}, got {value!r}; "
            f"write trigger = {{ {key} = {example} }}"
        )
    if key in ("available_now", "once") and value is False:
        raise ConfigurationError(
            f"pipeline.trigger.{key}: false is not a trigger (Spark would run its default "
            "trigger, continuously, which the file does not say); to drain what the "
            f"source holds and stop, write trigger = {{ {key} = true }}; to run "
            "continuously, leave trigger out (the next batch as soon as the last one is "
            'done) or write trigger = { processing_time = "10 seconds" }'
        )
    if key == "processing_time" and interval_ms(str(value)) is None:
        raise ConfigurationError(
            f"pipeline.trigger.processing_time: Spark cannot read {value!r} as an "
            "interval; write it as '10 seconds', '1 minute 30 seconds' or "
            "'500 milliseconds' (units week, day, hour, minute, second, millisecond, "
            "microsecond; no abbreviations; not negative)"
        )


def check_sinks(
    sinks: Any,
    sink_options: Mapping[str, list[str]],
    sink_classes: Mapping[str, SinkClass] | None = None,
    *,
    mistakes: _Mistakes | None = None,
    refused: Mapping[str, SinkTypeError] | None = None,
) -> list[dict[str, Any]]:
    """Check each ``[[sinks]]`` entry's type and option names against the installed plugins,
    and, given the sink classes, each option's value against its constructor's annotation
    (a number written as text, as ``${VAR}`` gives it, is made a number first).

    Every entry is checked, and every unknown option of an entry named: one
    :class:`fanout.ConfigurationError` lists each mistake (the values of an entry are
    checked once its type, name and option names are right).

    :param sink_options: each known sink type and its constructor's option names.
    :param sink_classes: each known sink type's class (``None``: values not checked).
    :param mistakes: where :func:`parse` collects the file's mistakes (then nothing is
        raised here).
    :param refused: the sink types the entries use that their plugins declare wrong, each
        with its error (as :func:`parse` found them): said for each entry of such a type.
    """
    own = mistakes is None
    found = _Mistakes(None) if mistakes is None else mistakes
    if isinstance(sinks, dict):  # `[sinks]`, one bracket: a table, read as one
        found.add(
            ConfigurationError(
                "sinks: a single table ([sinks]); each sink is an entry of an array of "
                "tables: write its header with two brackets, [[sinks]], once per sink"
            )
        )
    elif not isinstance(sinks, list) or not sinks:
        found.add(ConfigurationError("sinks: at least one [[sinks]] entry is required"))
    else:
        for index, sink in enumerate(sinks):
            typed = _check_sink(
                f"sinks[{index}]", sink, sink_options, sink_classes, refused or {}, found
            )
            if typed is not None:
                sinks[index] = typed
    if own:
        found.raise_any()
    return sinks if isinstance(sinks, list) else []


def _check_sink(
    path: str,
    sink: Any,
    sink_options: Mapping[str, list[str]],
    sink_classes: Mapping[str, SinkClass] | None,
    refused: Mapping[str, SinkTypeError],
    mistakes: _Mistakes,
) -> dict[str, Any] | None:
    """One ``[[sinks]]`` entry checked (see :func:`check_sinks`), each mistake collected in
    ``mistakes``: the entry with numbers given as text made numbers, or ``None`` when it
    has a mistake. Its option names are checked once its type is known, the values of its
    known options once its name is valid too (their messages name the sink)."""
    if not isinstance(sink, dict):
        mistakes.add(ConfigurationError(f"{path}: must be a table"))
        return None
    before = len(mistakes.errors)
    type_name: Any = sink.get("type")
    if isinstance(type_name, str) and type_name in refused:  # its plugin declares it wrong
        named = f" (sink {sink['name']!r})" if isinstance(sink.get("name"), str) else ""
        mistakes.add(ConfigurationError(f"{path}.type{named}: {refused[type_name]}"))
        return None
    type_options = sink_options.get(type_name, ())
    known = ["type", "name", *CORE_OPTIONS, *type_options]
    # a misspelt name is reported below as the unknown option it is, once the type is known
    taken = _suggested(sink, known) if type_name in sink_options else set()
    for required in ("type", "name"):
        if required not in sink and required not in taken:
            mistakes.add(ConfigurationError(f"{path}.{required}: missing required option"))
    if "type" in sink and type_name not in sink_options:
        suggestion = _did_you_mean(str(type_name), list(sink_options))
        mistakes.add(
            ConfigurationError(
                f"{path}.type: unknown sink type {type_name!r}"
                + suggestion
                + f"; installed: {', '.join(sorted(sink_options)) or 'none'}"
                + (
                    ""
                    if suggestion
                    else "; a pipeline file uses the installed plugins and the modules its "
                    f"top-level plugins = [...] names: install the distribution providing "
                    f"{type_name!r} (`pip install -e .` in its directory), then `fanout "
                    "plugins` lists it, or name the module of your own registering it "
                    '(plugins = ["my_sinks"] for my_sinks.py in the working directory)'
                )
            )
        )
    if "name" in sink:
        with mistakes.each():
            check_name(sink["name"], path)
    if type_name not in sink_options:
        return None
    unknown = [key for key in sink if key not in known]
    for key in unknown:
        mistakes.add(_unknown(f"{path}.", key, known, "option"))
    if "name" not in sink or len(mistakes.errors) > before + len(unknown):
        return None  # a name not there or not valid: the values' messages say it
    typed = _typed_core_options(path, {k: v for k, v in sink.items() if k not in unknown}, mistakes)
    if len(mistakes.errors) == before + len(unknown):
        with mistakes.each():
            _check_core_options(path, typed)
    if sink_classes is not None and type_name in sink_classes:
        typed = _typed_options(path, typed, sink_classes[type_name], mistakes)
    return None if len(mistakes.errors) > before else typed


def _check_core_options(path: str, sink: Mapping[str, Any]) -> None:
    """fanout's own options of a sink entry (``where``, ``retries``, ``on_failure``,
    ``write_timeout_s``...) checked as ``FanOut`` checks them, but before a Spark session
    starts (``write_timeout_s = "8s"`` failed ``fanout run`` 20 s in), naming the entry."""
    try:
        split_core_options(str(sink["name"]), sink, RetryPolicy())
    except ConfigurationError as exc:
        raise ConfigurationError(f"{path}: {exc}") from None


def _typed_core_options(path: str, sink: dict[str, Any], mistakes: _Mistakes) -> dict[str, Any]:
    """The entry with fanout's own numeric options (:data:`CORE_NUMBERS`) written as text
    made numbers, as the sink's own options are (``write_timeout_s = "${TIMEOUT}"``);
    refused, naming the entry, the option, its value and the type it takes, when one is
    not a number (``retries = true`` and ``retries = 2.5`` too: ``int()`` read them as 1
    and 2), each such option collected in ``mistakes``."""
    typed = dict(sink)

    def number(key: str, value: Any) -> Any:
        with mistakes.each():
            return _core_number(path, sink, key, value)
        return value

    for key in ("retries", "backoff_s", "write_timeout_s"):
        if key in sink:
            typed[key] = number(key, sink[key])
    lag = sink.get("max_lag")
    if isinstance(lag, dict):
        typed["max_lag"] = {
            k: number(f"max_lag.{k}", v) if f"max_lag.{k}" in CORE_NUMBERS else v
            for k, v in lag.items()
        }
    elif lag is not None:
        typed["max_lag"] = number("max_lag", lag)
    return typed


def _core_number(path: str, sink: Mapping[str, Any], key: str, value: Any) -> Any:
    """``value`` of fanout's own option ``key``, a number written as text made a number;
    a :class:`fanout.ConfigurationError` when it is no number of the option's type."""
    hint = CORE_NUMBERS[key]
    number = coerce_text(value, hint)
    table = "int, or a table of batches (int) and age_s (float)"
    problem = value_problem(key, number, hint, table if key == "max_lag" else None)
    if problem is None:
        return number
    raise ConfigurationError(
        f"{path} (sink {sink['name']!r}, type {sink['type']!r}): {problem}; one of "
        "fanout's own options of a sink (README: Running from a config file)"
    )


def _typed_options(
    path: str, sink: dict[str, Any], sink_class: SinkClass, mistakes: _Mistakes
) -> dict[str, Any]:
    """The sink's entry with numbers given as text made numbers; each option whose value
    is not of its annotated type collected in ``mistakes``, naming it."""
    own = {k: v for k, v in sink.items() if k not in ("type", "name", *CORE_OPTIONS)}
    coerced = coerce_option_text(sink_class, own)
    for problem in option_type_problems(sink_class, coerced):
        mistakes.add(
            ConfigurationError(
                f"{path} (sink {sink['name']!r}, type {sink['type']!r}): {problem}; "
                f"`fanout plugins --options {shell_word(str(sink['type']))}` describes each option"
            )
        )
    return {**sink, **coerced}


def _suggested(data: Mapping[str, Any], known: list[str]) -> set[str]:
    """The known keys an unknown key of ``data`` is taken for (its did-you-mean): a
    required key misspelt is one mistake, not also a missing key."""
    return {
        close
        for key in data
        if key not in known
        for close in difflib.get_close_matches(key, known, n=1)
    }


def _did_you_mean(word: str, known: list[str]) -> str:
    close = difflib.get_close_matches(word, known, n=1)
    return f", did you mean {close[0]}?" if close else ""


def parse(
    data: Mapping[str, Any], sink_options: Mapping[str, list[str]], path: Path | None = None,
    self_expanded: Mapping[str, list[str]] | None = None,
    sink_classes: Mapping[str, SinkClass] | None = None,
) -> PipelineConfig:  # fmt: skip
    """Validate a loaded TOML document into a :class:`PipelineConfig`.

    :param self_expanded: each sink type's options it expands ``${VAR}`` in itself
        (:attr:`fanout.contract.options.SinkOption.expands_env`): left as written.
    :param sink_classes: each sink type's class, whose constructor's annotations each
        option's value must fit (see :func:`check_sinks`).

    Every independent mistake of the file is reported in one run: an unknown section or
    key (with its did-you-mean), a value of the wrong type or out of range, a missing
    required key, per section and per sink; one :class:`fanout.ConfigurationError` lists
    them in file order (a single mistake is raised as it is). Every unset ``${VAR}`` of
    the file is reported in one run too, with the unknown sections; the checks of the
    values stop there (a value still holding its ``${VAR}`` would be refused again for
    its type). The options a sink type expands itself (``self_expanded``) are not
    expanded here: their unset variables are named when the sink opens."""
    mistakes = _Mistakes(path)
    for key in data:
        if key not in (*SECTIONS, "sinks", "plugins"):
            mistakes.add(_unknown("", key, [*SECTIONS, "sinks", "plugins"], "section"))
    plugins: tuple[str, ...] = ()
    with mistakes.each():
        plugins = plugin_names(data)
    data = {k: v for k, v in data.items() if k != "plugins"}
    sinks = data.get("sinks")
    before = len(mistakes.errors)
    expanded: dict[str, Any] = _expand(
        {k: v for k, v in data.items() if k != "sinks"}, "", mistakes
    )
    refused: dict[str, SinkTypeError] = {}
    if sinks is not None:
        expanded["sinks"], refused = _expand_sinks(
            sinks, sink_options, self_expanded or {}, mistakes
        )
    if len(mistakes.errors) > before:
        mistakes.raise_any()
    data = expanded
    # a password in a location (checkpoint, spool, ledger, a table's path) is masked wherever
    # the location shows, though no sink declares it
    register_secrets(location_secrets(data))
    for required in ("pipeline", "source", "sinks"):
        if required not in data and required not in _suggested(data, [*SECTIONS, "sinks"]):
            mistakes.add(ConfigurationError(f"{required}: missing required section"))
    pipeline = _check_section("pipeline", data["pipeline"], mistakes) if "pipeline" in data else {}
    if "name" in pipeline:
        with mistakes.each():
            check_name(pipeline["name"], "pipeline.name")
    source = _check_section("source", data["source"], mistakes) if "source" in data else {}
    spark = _check_section("spark", data.get("spark", {}), mistakes)
    metrics = _check_section("metrics", data["metrics"], mistakes) if "metrics" in data else None
    trigger = _check_trigger(dict(pipeline.get("trigger", {})), mistakes)
    sinks = (
        check_sinks(data["sinks"], sink_options, sink_classes, mistakes=mistakes, refused=refused)
        if "sinks" in data
        else []
    )
    mistakes.raise_any()
    return PipelineConfig(
        name=pipeline["name"],
        ledger=pipeline["ledger"],
        checkpoint=pipeline["checkpoint"],
        source=source,
        sinks=[dict(s) for s in sinks],
        trigger=trigger,
        spark=spark,
        metrics=metrics,
        parallelism=pipeline.get("parallelism"),
        retries=pipeline.get("retries", 2),
        backoff_s=float(pipeline.get("backoff_s", 1.0)),
        stop_timeout_s=float(pipeline.get("stop_timeout_s", 60.0)),
        spool=pipeline.get("spool"),
        probe_interval_s=float(pipeline.get("probe_interval_s", 10.0)),
        share_tasks=pipeline.get("share_tasks", True),
        path=path,
        plugins=plugins,
    )


def plugin_names(data: Mapping[str, Any]) -> tuple[str, ...]:
    """The document's top-level ``plugins = ["my_sinks", ...]``: modules of the user's own,
    by the names Python imports them by, each registering sink types (or observers) through
    fanout's hooks as ``FanOut(plugins=[module])`` does; imported, from the working
    directory and ``PYTHONPATH``, before the sinks are checked
    (:func:`fanout.hooks.registry.plugin_object`). ``()`` when the key is absent. Raises
    :class:`fanout.ConfigurationError` for a value that is not a list of module names
    (``${VAR}`` is not expanded in it)."""
    names = data.get("plugins", [])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ConfigurationError(
            f'plugins: must be a list of module names (plugins = ["my_sinks"]), not {names!r}'
        )
    bad = [n for n in names if not is_module_name(n)]
    if bad:
        raise ConfigurationError(
            f"plugins: {bad[0]!r} is not a module name: give the name Python imports it by "
            "(my_sinks for my_sinks.py beside where fanout runs, acme.plugin for "
            "acme/plugin.py)"
        )
    return tuple(dict.fromkeys(names))


def read(path: str | Path) -> dict[str, Any]:
    """The TOML document of the pipeline file at ``path``, not checked yet; raises
    :class:`fanout.ConfigurationError` naming the file when it cannot be read as TOML."""
    file = Path(path)
    try:
        return tomllib.loads(file.read_text())
    except FileNotFoundError:
        raise ConfigurationError(f"{file}: no such pipeline file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"{file}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigurationError(f"{file}: not UTF-8 text (TOML is): {exc.reason}") from None
    except OSError as exc:  # a directory, no permission...
        raise ConfigurationError(f"{file}: cannot be read: {exc.strerror or exc}") from None


def load(
    path: str | Path, sink_options: Mapping[str, list[str]],
    self_expanded: Mapping[str, list[str]] | None = None,
    sink_classes: Mapping[str, SinkClass] | None = None,
) -> PipelineConfig:  # fmt: skip
    """Read and validate the pipeline file at ``path`` (``self_expanded``, ``sink_classes``:
    see :func:`parse`)."""
    file = Path(path)
    return parse(read(file), sink_options, file, self_expanded, sink_classes)
