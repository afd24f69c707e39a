"""Whether a type holds a given type somewhere in it: one walk over an Arrow type
(:func:`holds_arrow_type`) and one over a Spark ``DataType`` (:func:`holds_spark_type`),
for the questions several modules ask of a column ("does it hold a map", "a timestamp
without a time zone", "a string") before they handle it. pyarrow and pyspark are imported
by the caller only: these functions take the types as they are given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa


def holds_arrow_type(kind: pa.DataType, test: Callable[[pa.DataType], bool]) -> bool:
    """Whether the Arrow type ``kind``, or a type in it at any depth, passes ``test``.

    ``kind`` itself is tested first (a caller asking only about what is *inside* a nested
    type tests ``kind`` apart). Inside, the walk goes into a struct's fields, a map's keys
    and values (both), the values of every list type (``list``, ``large_list``,
    ``fixed_size_list``, ``list_view``, ``large_list_view``) and the values of a
    dictionary; a union and a run-end encoded type (neither comes from Spark nor goes to
    Delta) are not entered.
    """
    if test(kind):
        return True
    return any(holds_arrow_type(child, test) for child in _arrow_children(kind))


def _arrow_children(kind: pa.DataType) -> Iterator[pa.DataType]:
    import pyarrow.types as pat

    if pat.is_struct(kind):
        yield from (kind.field(i).type for i in range(kind.num_fields))
    elif pat.is_map(kind):
        yield kind.key_type
        yield kind.item_type
    elif (pat.is_list(kind) or pat.is_large_list(kind) or pat.is_fixed_size_list(kind)
            or pat.is_list_view(kind) or pat.is_large_list_view(kind)):  # fmt: skip
        yield kind.value_type
    elif pat.is_dictionary(kind):
        yield kind.value_type


def holds_spark_type(data_type: Any, test: Callable[[Any], bool]) -> bool:
    """Whether the Spark ``DataType`` ``data_type``, or a type in it at any depth, passes
    ``test``.

    ``data_type`` itself is tested first. Inside, the walk goes into a struct's fields, an
    array's elements and a map's keys and values (both). A user-defined type is a leaf:
    ``test`` sees the UDT, not its ``sqlType()``.
    """
    if test(data_type):
        return True
    return any(holds_spark_type(child, test) for child in _spark_children(data_type))


def _spark_children(data_type: Any) -> Iterator[Any]:
    from pyspark.sql import types as T

    if isinstance(data_type, T.StructType):
        yield from (f.dataType for f in data_type.fields)
    elif isinstance(data_type, T.ArrayType):
        yield data_type.elementType
    elif isinstance(data_type, T.MapType):
        yield data_type.keyType
        yield data_type.valueType
