"""Spark's text of a number: what ``CAST(x AS STRING)`` gives for a ``double``, a
``float`` and a ``decimal``, column by column with Arrow (an Arrow array in, an Arrow
string array out), for every sink that writes such a value as text, so that the same
value is the same text in every sink and a replay writes the same bytes.

- A ``double`` or ``float`` is Java's ``Double.toString``/``Float.toString``: ``1.0`` (not
  ``1``), plain in [10^-3, 10^7) (``0.001``, ``9999999.0``), else ``1.0E20``, ``1.0E-4``,
  ``1.23456789E8``; ``Infinity``, ``-Infinity``, ``NaN``, ``-0.0``. The digits are the
  shortest that read back as the value, of the value's own width (a ``float`` 0.1 is
  ``0.1``, not its double's ``0.10000000149011612``), at least two (``4.9E-324``, the
  two closest to the exact value).
- Java 17 (which Spark runs on here) prints some values with more digits than needed
  (the JDK's bug 4511638, fixed in Java 19): ``2.0E23`` as ``1.9999999999999998E23``,
  ``4.548729299799994E17`` as ``4.5487292997999942E17``, a float ``4.2655478E9`` as
  ``4.26554778E9`` (31 of 2000 random doubles, 209 of 2000 random floats in
  ``tests/integration/test_spark_text.py``). fanout writes the shortest digits, as Java
  19+ does: both texts read back as the same value; this is the only difference from the
  running Spark, and deliberate: the text does not depend on the JVM a query runs on.
- A ``decimal`` is plain, with its scale, as Spark prints it (``0.0000001000``,
  ``0E-18`` as ``0.000000000000000000``), where Arrow and Python write exponent form below
  10^-6.

pyarrow is imported inside the functions: the core does not need it to be imported.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

_JAVA_SPECIAL = {"inf": "Infinity", "-inf": "-Infinity", "nan": "NaN"}
_PLAIN_LOW, _PLAIN_HIGH = 1e-3, 1e7
"""Java prints a float or double of magnitude in [10^-3, 10^7) plain, others in E form."""


def number_text(column: Any) -> Any:
    """``CAST(x AS STRING)`` of each value of an Arrow ``float64``, ``float32`` or
    ``decimal`` array (nulls stay null), as a ``string`` array: :func:`floating_text`
    or :func:`decimal_text` by the array's type."""
    import pyarrow as pa

    if pa.types.is_decimal(column.type):
        return decimal_text(column)
    return floating_text(column)


def floating_text(column: Any) -> Any:
    """``CAST(x AS STRING)`` of each value of an Arrow ``float64`` or ``float32`` array
    (Java's ``Double.toString``/``Float.toString``, see the module's notes), as a
    ``string`` array. Values in [10^-3, 10^7) and zeros are done by Arrow alone (its
    shortest digits, ``.0`` appended to an integral one); the others by Python, one by one."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = _whole(column)
    text = column.cast(pa.string())
    magnitude = pc.abs(column)
    far = pc.or_(
        pc.or_(pc.greater_equal(magnitude, _PLAIN_HIGH), pc.invert(pc.is_finite(column))),
        pc.and_(pc.less(magnitude, _PLAIN_LOW), pc.not_equal(magnitude, 0)),
    )
    pointed = pc.fill_null(pc.match_substring(text, "."), True)
    text = pc.if_else(pointed, text, pc.binary_join_element_wise(text, ".0", ""))
    far = pc.fill_null(far, False)
    if not pc.any(far).as_py():
        return text
    values = column.filter(far).to_pylist()
    shown = text.filter(far).to_pylist()
    java = [_java_scientific(t, v) for t, v in zip(shown, values, strict=True)]
    return pc.replace_with_mask(text, far, pa.array(java, pa.string()))


def double_text(value: float) -> str:
    """``CAST(x AS STRING)`` of one double (Java's ``Double.toString``, as
    :func:`floating_text` spells a ``float64`` value), for values met one by one (a
    Python float from ``to_pylist``). Python's ``repr`` has the same shortest digits as
    Arrow's text; a ``float`` (32-bit) value must first be the double of its own shortest
    text, or this spells the widened double's digits."""
    if not math.isfinite(value) or not _PLAIN_LOW <= abs(value) < _PLAIN_HIGH:
        if value == 0:
            return repr(value)  # 0.0, -0.0
        return _java_scientific(repr(value), value)
    return repr(value)  # plain, with a point (1.0): as Java in this range


def _java_scientific(text: str, value: float) -> str:
    """Arrow's text of a float ``value`` outside [10^-3, 10^7), ``.0`` appended when it had
    no point (``1e+20.0``, ``0.00001``, ``inf.0``), as Java prints it: ``1.0E20``,
    ``1.0E-5``, ``Infinity``. Java takes at least two digits, the two closest to the exact
    value when one would do: ``4.9E-324`` for the smallest double (Arrow: ``5e-324``),
    ``1.4E-45`` for the smallest float."""
    text = text.removesuffix(".0")
    if text in _JAVA_SPECIAL:
        return _JAVA_SPECIAL[text]
    shortest = Decimal(text).normalize()
    if len(shortest.as_tuple().digits) == 1:  # the closest of two digits (exact: no loss)
        exact = Decimal(value)
        shortest = exact.quantize(Decimal(1).scaleb(exact.adjusted() - 1)).normalize()
    sign, digits, exponent = shortest.as_tuple()
    assert isinstance(exponent, int)
    shown = "".join(map(str, digits))
    mantissa = shown[0] + "." + (shown[1:] or "0")
    return ("-" if sign else "") + f"{mantissa}E{exponent + len(digits) - 1}"


def decimal_text(column: Any) -> Any:
    """``CAST(d AS STRING)`` of each value of an Arrow ``decimal`` array: plain, with its
    scale (``0.0000001000``), as a ``string`` array. Arrow prints a value below 10^-6, or a
    zero of a scale above 6, in exponent form (``1.000E-7``, ``0E-18``): those values
    are redone by :func:`plain_decimal`, one by one."""
    import pyarrow as pa
    import pyarrow.compute as pc

    text = _whole(column).cast(pa.string())
    scientific = pc.fill_null(pc.match_substring(text, "E"), False)
    if not pc.any(scientific).as_py():
        return text
    plain = [plain_decimal(Decimal(t)) for t in text.filter(scientific).to_pylist()]
    return pc.replace_with_mask(text, scientific, pa.array(plain, pa.string()))


def plain_decimal(value: Decimal) -> str:
    """``CAST(d AS STRING)`` of one decimal (as Arrow's ``to_pylist`` gives it, its exponent
    the column's scale): plain, with its scale (``0.0000001000``, not ``1.000E-7``)."""
    return format(value, "f")


def _whole(column: Any) -> Any:
    import pyarrow as pa

    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


__all__ = ["decimal_text", "double_text", "floating_text", "number_text", "plain_decimal"]
