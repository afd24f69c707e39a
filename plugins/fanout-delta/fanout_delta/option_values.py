"""The Delta sink's options as given: their normal form (one column as a list, numbers and
booleans as the text delta-rs takes) and the values :meth:`~fanout_delta.DeltaSink.open`
refuses, each refusal naming the option."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

from fanout.delta_tables import io as deltaio
from fanout.errors import ConfigurationError

Mode = Literal["append", "merge"]
Engine = Literal["rs", "spark", "auto"]
WriteFrom = Literal["auto", "executors", "driver"]
MODES: tuple[str, ...] = get_args(Mode)
ENGINES: tuple[str, ...] = get_args(Engine)
WRITE_FROM: tuple[str, ...] = get_args(WriteFrom)


def config_error(sink: str, message: str) -> ConfigurationError:
    """A refusal of Delta sink ``sink``'s configuration, saying ``message``."""
    return ConfigurationError(f"Delta sink {sink!r}: {message}")


def refuse_non_mappings(sink: str, options: Mapping[str, Any]) -> None:
    """Refuse an option of ``options`` (``storage_options``, ``configuration``) given
    as anything but a mapping of names to values (``None``: not given)."""
    for option, value in options.items():
        if value is not None and not isinstance(value, Mapping):
            raise ConfigurationError(
                f"Delta sink {sink!r}: option {option!r} must be a mapping of names to "
                f"values, got {type(value).__name__}"
            )


def as_text(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with each number or boolean as the text delta-rs takes (it takes only
    text): ``true``/``false`` (as object_store and Delta properties spell them), a number
    as ``str`` gives it. Other values as given (``None``: a property left unset)."""
    return {k: _text(v) for k, v in values.items()}


def _text(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value


def as_list(value: Any) -> Any:
    """Accept a single column name where a list is expected (``keys: id`` in YAML).

    Anything that is not a string, list or tuple is kept as given, for :func:`check_options` to
    reject with a message naming the option.
    """
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return list(value)
    return value


def check_options(
    sink: str,
    *,
    path: str | None,
    storage_options: Mapping[str, str] | None,
    mode: str,
    engine: str,
    columns: Mapping[str, Any],
    compact_every: Any,
    min_txn_retention_hours: Any,
    write_from: str,
    max_merge_rows: Any,
    merge_schema: Any,
) -> None:
    """Refuse an option value the sink cannot work with (the first found, in this order):
    no ``path`` or one delta-rs cannot use, an unknown ``mode`` or ``engine``, a column
    option (``columns``: ``keys``, ``order_by``, ``partition_by`` by name) that is not a
    non-empty list of names, ``keys`` missing from a merge or given to an append, and a
    count, a number of hours or a switch of the wrong type."""
    if not path:
        raise config_error(sink, "option 'path' is required: set it to the table location")
    unusable = deltaio.unusable_location(path, storage_options)
    if unusable is not None:
        raise config_error(sink, f"option 'path': {unusable}")
    if mode not in MODES:
        raise config_error(sink, f"unknown mode {mode!r}; valid modes: {', '.join(MODES)}")
    if engine not in ENGINES:
        raise config_error(sink, f"unknown engine {engine!r}; valid engines: {', '.join(ENGINES)}")
    for option, value in columns.items():
        if value is not None and (
            not isinstance(value, list)
            or not value
            or not all(isinstance(c, str) and c for c in value)
        ):
            raise config_error(
                sink, f"option {option!r} must be a non-empty list of column names, got {value!r}"
            )
    if mode == "merge" and not columns["keys"]:
        raise config_error(sink, "mode 'merge' needs option 'keys': the columns to upsert on")
    if mode != "merge" and (columns["keys"] or columns["order_by"]):
        raise config_error(
            sink,
            "options 'keys' and 'order_by' only apply to mode 'merge'; remove them or "
            "set mode='merge'",
        )
    every = compact_every
    if every is not None and (isinstance(every, bool) or not isinstance(every, int)
                              or every < 1):  # fmt: skip
        raise config_error(
            sink, f"option 'compact_every' must be a positive integer (batches), got {every!r}"
        )
    floor = min_txn_retention_hours
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) or floor < 0:
        raise config_error(
            sink, f"option 'min_txn_retention_hours' must be a number of hours >= 0, got {floor!r}"
        )
    if write_from not in WRITE_FROM:
        raise config_error(
            sink,
            f"option 'write_from' must be one of {', '.join(WRITE_FROM)}, got {write_from!r}",
        )
    bound = max_merge_rows
    if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int)
                              or bound < 1):  # fmt: skip
        raise config_error(
            sink,
            f"option 'max_merge_rows' must be a positive integer (rows) or null, got {bound!r}",
        )
    if not isinstance(merge_schema, bool):
        raise config_error(sink, f"option 'merge_schema' must be true or false, got "
                                 f"{merge_schema!r}")  # fmt: skip


def refuse_unquotable_keys(
    sink: str, engine: str | None, mode: str, keys: Sequence[str] | None
) -> None:
    """Refuse a merge key holding a backtick with engine ``rs``: delta-rs' parser of the
    MERGE condition takes no quoting of one (neither doubled nor escaped), so the first
    batch would create the table and every later one fail on a parse error."""
    if engine != "rs" or mode != "merge":
        return
    unquotable = [k for k in keys or [] if "`" in k]
    if unquotable:
        raise config_error(
            sink,
            f"merge key column(s) {', '.join(map(repr, unquotable))} hold a backtick, "
            "which delta-rs cannot quote in the MERGE condition; rename the column in "
            "the stream (withColumnRenamed) or use engine='spark'",
        )
