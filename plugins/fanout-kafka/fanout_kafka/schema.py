"""Whether batches of a schema can be written as a Kafka sink's options say: checked at each
batch (:meth:`fanout_kafka.sink.KafkaSink.partition_input`) and by ``fanout validate``
(:meth:`fanout_kafka.sink.KafkaSink.check_schema`), with the same errors."""

from __future__ import annotations

from typing import Any

from fanout.errors import SchemaMismatchError
from fanout.partitioned.membership import check_hashable
from fanout_kafka.json_types import unwritable
from fanout_kafka.options import columns


def check_columns(
    schema: Any,
    batch_id: int | None,
    *,
    sink: str,
    key: tuple[str, ...] | None,
    value: str,
    headers: Any,
    order_by: Any,
) -> None:
    """Batches of ``schema`` (a Spark ``StructType``) can be encoded as sink ``sink``'s
    options say (``key``: its key columns; ``value``, ``headers``, ``order_by``: the
    options as given): every column they name is there, the partitioning columns (the
    key, or every column when keyless) hold no map or variant Spark cannot hash, a
    ``value`` column is a string or binary, and every column written as JSON is of a type
    JSON holds faithfully (:mod:`fanout_kafka.json_types`). ``batch_id`` is ``None`` before
    the stream starts.

    :raises fanout.SchemaMismatchError: naming the columns and the options."""
    names = list(schema.fieldNames())
    types = {f.name: f.dataType.simpleString() for f in schema.fields}
    wanted = {
        "key": key or (),
        "order_by": columns(sink, "order_by", order_by) or (),
        "headers": () if isinstance(headers, bool) else columns(sink, "headers", headers) or (),
        "value": () if value == "json" else (value,),
    }
    missing = sorted({c for cols in wanted.values() for c in cols if c not in names})
    if missing:
        options = [o for o, cols in wanted.items() if any(c in missing for c in cols)]
        option = "option" if len(options) == 1 else "options"
        raise SchemaMismatchError(
            f"column(s) {', '.join(map(repr, missing))} named by {option} "
            f"{', '.join(map(repr, options))} are not in the batch (columns: "
            f"{', '.join(names)}); add them in the query or the sink's select, or change "
            f"the {option}",
            sink=sink, batch_id=batch_id, columns=missing,
        )  # fmt: skip
    if value != "json" and types.get(value) not in ("string", "binary"):
        raise SchemaMismatchError(
            f"option 'value' names column {value!r} of type {types.get(value)}; "
            "it must be a string or binary column (or use value='json')",
            sink=sink, batch_id=batch_id, columns=[value],
        )  # fmt: skip
    # the JSON of the row (value='json'), of a multi-column key, and the text of a key
    # or header that is not a string: a value it cannot hold fails here, not per record
    encoded = None if value == "json" else [*wanted["key"], *wanted["headers"]]
    problems = unwritable(schema, encoded)
    if problems:
        bad = list(dict.fromkeys(p.column for p in problems))
        raise SchemaMismatchError(
            "batch column(s) cannot be written as JSON faithfully: "
            + "; ".join(p.describe() for p in problems),
            sink=sink, batch_id=batch_id, columns=bad,
        )  # fmt: skip
    # keyless: every column is hashed into the partition membership digest
    keys = wanted["key"]
    check_hashable(schema, keys or names, keyed=bool(keys), sink=sink,
                   batch_id=batch_id)  # fmt: skip


__all__ = ["check_columns"]
