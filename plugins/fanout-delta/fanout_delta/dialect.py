"""A CHECK constraint as delta-rs stores it, read as Spark SQL.

delta-rs (``DeltaTable.alter.add_constraint``) does not store the expression it is given: it
stores DataFusion's rendering of it, and evaluates that at each write. DataFusion's SQL
differs from Spark's where it matters for a constraint:

- ``"Amount"`` is an identifier (a column whose name is not all lower case, or holds a
  space); Spark reads a string literal, so ``"Amount" > 0`` failed every batch (ANSI mode)
  or refused every row;
- ``'it''s'`` is one string; Spark reads two adjacent literals, ``its``, and takes a
  backslash as an escape where DataFusion keeps it;
- a struct field is ``get_field(s, 'a')`` (``get_field(s, 't', 'a')`` deeper), a cast
  ``arrow_cast(x, 'Int64')`` (a timestamp literal too, in UTC): functions Spark does not
  know.

:func:`spark_expression` rewrites those, so Spark refuses the rows delta-rs refuses. What
it does not know it leaves as it is (Spark then refuses the constraint when the sink opens,
naming it). A constraint delta-spark wrote is Spark SQL already: engine ``spark`` reads it
as it is.
"""

from __future__ import annotations

import re

_STRING = r"'(?:[^'\\]|\\.)*'"
"""A Spark string literal, as :func:`_tokens` writes them."""

_NAME = r"(?:`(?:[^`]|``)*`|[A-Za-z_][A-Za-z0-9_]*)"
_PATH = rf"{_NAME}(?:\s*\.\s*{_NAME})*"

_GET_FIELD = re.compile(rf"\bget_field\(\s*({_PATH})((?:\s*,\s*{_STRING})+)\s*\)", re.IGNORECASE)
_ARROW_CAST = re.compile(
    rf"\barrow_cast\(\s*({_PATH}|{_STRING})\s*,\s*'([^'\\]*)'\s*\)", re.IGNORECASE
)

_SPARK_TYPES = {
    "Boolean": "BOOLEAN",
    "Int8": "TINYINT",
    "Int16": "SMALLINT",
    "Int32": "INT",
    "Int64": "BIGINT",
    "Float32": "FLOAT",
    "Float64": "DOUBLE",
    "Utf8": "STRING",
    "LargeUtf8": "STRING",
    "Utf8View": "STRING",
    "Date32": "DATE",
}
"""Arrow type names ``arrow_cast`` takes, as Spark SQL types (the others are left alone)."""

_TIMESTAMP = re.compile(
    r"Timestamp\((?:Second|Millisecond|Microsecond|Nanosecond), "
    r"(None|Some\(\"(?:UTC|\+00:00)\"\))\)"
)
"""An Arrow timestamp type without a zone, or in UTC."""


def spark_expression(text: str) -> str:
    """``text``, a CHECK expression in delta-rs' (DataFusion's) SQL, in Spark SQL."""
    spark = "".join(_tokens(text))
    for pattern, rewrite in ((_GET_FIELD, _field), (_ARROW_CAST, _cast)):
        while True:  # innermost first: a match's argument holds no call left to rewrite
            rewritten = pattern.sub(rewrite, spark)
            if rewritten == spark:
                break
            spark = rewritten
    return spark


def _tokens(text: str) -> list[str]:
    """``text`` with its string literals and quoted identifiers in Spark's quoting, the rest
    as it is."""
    out: list[str] = []
    i = 0
    while i < len(text):
        quote = text[i]
        if quote not in "'\"":
            out.append(quote)
            i += 1
            continue
        body, i = _quoted(text, i)
        if quote == "'":
            out.append("'" + body.replace("\\", "\\\\").replace("'", "\\'") + "'")
        else:
            out.append("`" + body.replace("`", "``") + "`")
    return out


def _quoted(text: str, start: int) -> tuple[str, int]:
    """The body of the quoted token at ``start`` (a doubled quote is one quote), and the
    index after it (an unterminated token runs to the end)."""
    quote, body, i = text[start], [], start + 1
    while i < len(text):
        if text[i] == quote:
            if text[i + 1 : i + 2] == quote:
                body.append(quote)
                i += 2
                continue
            return "".join(body), i + 1
        body.append(text[i])
        i += 1
    return "".join(body), i


def _field(match: re.Match[str]) -> str:
    names = re.findall(_STRING, match.group(2))
    return match.group(1) + "".join(f".`{_literal(n).replace('`', '``')}`" for n in names)


def _cast(match: re.Match[str]) -> str:
    value, arrow = match.group(1), match.group(2)
    spark = _SPARK_TYPES.get(arrow)
    if spark is not None:
        return f"CAST({value} AS {spark})"
    timestamp = _TIMESTAMP.fullmatch(arrow)
    if timestamp is None:
        return match.group(0)
    if timestamp.group(1) == "None":
        return f"CAST({value} AS TIMESTAMP_NTZ)"
    if not value.startswith("'"):  # a column: Spark would read it in the session's zone
        return match.group(0)
    return f"CAST({value[:-1]}Z' AS TIMESTAMP)"  # the literal is UTC, as delta-rs reads it


def _literal(token: str) -> str:
    """The value of a Spark string literal :func:`_tokens` wrote."""
    return re.sub(r"\\(.)", r"\1", token[1:-1])
