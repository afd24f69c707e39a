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

- ``a / 2`` divides whole numbers as whole numbers, truncating toward zero (``3 / 2`` is
  1, ``-3 / 2`` is -1); Spark's ``/`` is fractional (1.5). DataFusion folds the literals of
  a constraint it stores, so ``a / 2.0 > 1`` is stored, and evaluated, as ``a / 2 > 1``.

:func:`spark_expression` rewrites those, so Spark refuses the rows delta-rs refuses: a
division of two whole numbers becomes Spark's ``DIV`` (which truncates toward zero too),
which needs the operands' types, resolved by :func:`integer_divisions` with Spark on the
table's columns. What it does not know it leaves as it is (Spark then refuses the
constraint when the sink opens, naming it); a division whose operands' types it cannot
resolve refuses it too (:class:`Untranslatable`). A constraint delta-spark wrote is Spark
SQL already: engine ``spark`` reads it as it is.

Text compared with a number needs nothing: DataFusion folds a literal into the other
side's type when it stores the constraint (``s > 5``, ``s`` a string, is stored ``s >
'5'``: a comparison of strings in both engines; ``a > '5'``, ``a`` a number, is stored ``a
> 5``), and both engines cast a string column compared with a number column to the
number's type, failing the row (and the batch) on a string that is no number.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_STRING = r"'(?:[^'\\]|\\.)*'"
"""A Spark string literal, as :func:`_tokens` writes them."""

_NAME = r"(?:`(?:[^`]|``)*`|[A-Za-z_][A-Za-z0-9_]*)"
_PATH = rf"{_NAME}(?:\s*\.\s*{_NAME})*"

_GET_FIELD = re.compile(rf"\bget_field\(\s*({_PATH})((?:\s*,\s*{_STRING})+)\s*\)", re.IGNORECASE)
_QUOTED = re.compile(rf"{_STRING}|`(?:[^`]|``)*`")
_ARROW_CAST = re.compile(rf"{_QUOTED.pattern}|\barrow_cast\(", re.IGNORECASE)
"""A call of ``arrow_cast``, or a quoted token (which may hold such text)."""
_CAST_TYPE = re.compile(r",\s*'([^'\\]*)'\s*$")
"""The last argument of ``arrow_cast``: the Arrow type's name."""

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
    while True:  # innermost first: a match's argument holds no call left to rewrite
        rewritten = _GET_FIELD.sub(_field, spark)
        if rewritten == spark:
            break
        spark = rewritten
    return _casts(spark)


def _casts(spark: str) -> str:
    """``spark`` with each ``arrow_cast(operand, 'Type')`` of a type Spark has as a
    ``CAST``, the operand any expression (DataFusion folds ``a / 2 * 1.0`` into
    ``arrow_cast(a / 2, 'Float64')``), its own casts rewritten first."""
    out: list[str] = []
    i = 0
    while (match := _ARROW_CAST.search(spark, i)) is not None:
        if match.group(0)[0] in "'`":
            out.append(spark[i : match.end()])
            i = match.end()
            continue
        end = _closing(spark, match.end())
        if end is None:  # unbalanced: left as it is, for Spark to refuse
            break
        out.append(spark[i : match.start()])
        arguments = spark[match.end() : end]
        kind = _CAST_TYPE.search(arguments)
        if kind is None:
            out.append(match.group(0) + _casts(arguments) + ")")
        else:
            operand = _casts(arguments[: kind.start()])
            out.append(_cast(operand, kind.group(1), match.group(0), kind.group(0)))
        i = end + 1
    return "".join(out) + spark[i:]


def _closing(spark: str, start: int) -> int | None:
    """The index of the ``)`` closing the call whose arguments begin at ``start`` (string
    literals and quoted names skipped), or ``None``."""
    depth, i = 0, start
    while i < len(spark):
        quoted = _QUOTED.match(spark, i)
        if quoted is not None:
            i = quoted.end()
            continue
        if spark[i] == "(":
            depth += 1
        elif spark[i] == ")":
            if depth == 0:
                return i
            depth -= 1
        i += 1
    return None


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


def _cast(value: str, arrow: str, call: str, kind: str) -> str:
    """``arrow_cast(value, 'arrow')`` in Spark SQL (``call`` and ``kind``: its opening and
    its type argument as written, to leave it as it is when Spark has no such type)."""
    kept, value = f"{call}{value}{kind})", value.strip()
    spark = _SPARK_TYPES.get(arrow)
    if spark is not None:
        return f"CAST({value} AS {spark})"
    timestamp = _TIMESTAMP.fullmatch(arrow)
    if timestamp is None:
        return kept
    if timestamp.group(1) == "None":
        return f"CAST({value} AS TIMESTAMP_NTZ)"
    if re.fullmatch(_STRING, value) is None:  # Spark would read it in the session's zone
        return kept
    return f"CAST({value[:-1]}Z' AS TIMESTAMP)"  # the literal is UTC, as delta-rs reads it


def _literal(token: str) -> str:
    """The value of a Spark string literal :func:`_tokens` wrote."""
    return re.sub(r"\\(.)", r"\1", token[1:-1])


class Untranslatable(ValueError):
    """A CHECK expression :func:`integer_divisions` cannot read as Spark SQL with certainty
    (the message says why)."""


_TOKEN = re.compile(
    r"\s+|'(?:[^'\\]|\\.)*'|`(?:[^`]|``)*`|[A-Za-z_][A-Za-z0-9_]*"
    r"|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?[A-Za-z]*|\.\d+(?:[eE][+-]?\d+)?[A-Za-z]*"
    r"|<=>|<=|>=|<>|!=|==|\|\||::|->|."
)
"""A token of Spark SQL as :func:`spark_expression` writes it."""

_INTEGRAL = frozenset({"tinyint", "smallint", "int", "bigint"})
"""Spark's whole-number types, as ``DataType.simpleString()`` names them."""

_OPENING = {"(": ")", "[": "]"}

_KEYWORDS = frozenset(
    "AND OR NOT IS IN BETWEEN LIKE ILIKE RLIKE REGEXP SIMILAR ESCAPE CASE WHEN THEN ELSE END "
    "DISTINCT FROM AS".split()
)
"""Words that end an operand of a product (they bind less tightly than ``/``)."""


def integer_divisions(spark: str, type_of: Callable[[str], str]) -> str:
    """``spark`` (Spark SQL from :func:`spark_expression`) with each ``/`` between two whole
    numbers written as Spark's ``DIV``, as DataFusion divides them (truncating toward
    zero). ``type_of`` gives the Spark type (``DataType.simpleString()``) of a Spark SQL
    expression on the table's columns, and raises when it cannot; an operand whose type
    it cannot give raises :class:`Untranslatable`. Without a ``/`` ``spark`` is returned
    as it is (``type_of`` is not called)."""
    tokens = _TOKEN.findall(spark)
    if "/" not in tokens:
        return spark
    text, end = _level(tokens, 0, type_of, None)
    if end != len(tokens):
        raise Untranslatable(f"unbalanced {tokens[end]!r}")
    return text


def _level(
    tokens: list[str], i: int, type_of: Callable[[str], str], closing: str | None
) -> tuple[str, int]:
    """The text of ``tokens`` from ``i`` up to ``closing`` (not included; the end for
    ``None``), its divisions rewritten, and the index of ``closing``."""
    out: list[str] = []
    chain: list[str] = []  # operands and operators of one chain of * / % DIV
    unit: list[str] = []  # the operand being read
    while i < len(tokens) and tokens[i] != closing:
        token = tokens[i]
        if token in _OPENING:
            inner, i = _level(tokens, i + 1, type_of, _OPENING[token])
            if i >= len(tokens):
                raise Untranslatable(f"unbalanced {token!r}")
            unit.append(token + inner + _OPENING[token])
        elif token in ("*", "/", "%") or token.upper() == "DIV":
            if not "".join(unit).strip():
                raise Untranslatable(f"an operator {token!r} without a left operand")
            chain += ["".join(unit), token]
            unit = []
        elif _ends_operand(token, unit):
            out.append(_fold([*chain, "".join(unit)], type_of) if chain else "".join(unit))
            chain, unit = [], []
            if token.upper() in _KEYWORDS or not (token[0].isalpha() or token[0] == "_"):
                out.append(token)
            else:  # a name after an operand: the next operand's start
                unit.append(token)
        else:
            unit.append(token)
        i += 1
    out.append(_fold([*chain, "".join(unit)], type_of) if chain else "".join(unit))
    return "".join(out), i


def _ends_operand(token: str, unit: list[str]) -> bool:
    """Whether ``token`` ends the operand ``unit`` of a product (a lower-precedence
    operator, a separator, a keyword), rather than continuing it (a name, a field access,
    whitespace, a sign before the operand)."""
    if token.isspace():
        return False
    if token.upper() in _KEYWORDS:
        return True
    started = bool("".join(unit).strip().lstrip("-+~! "))
    if token in ("-", "+", "~", "!"):
        return started  # a sign before the operand is part of it
    if token in (".", "::") or token[0] in "`'" or token[0].isdigit():
        return False  # ``x::decimal(10, 2)``: DataFusion's cast binds as tightly as a field
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", token):
        return started and not "".join(unit).rstrip().endswith((".", "::"))
    return True


def _fold(chain: list[str], type_of: Callable[[str], str]) -> str:
    """A chain ``x1 op1 x2 op2 x3 ...`` of * / % DIV (left-associative), each ``/``
    between whole numbers as ``DIV``; the chain's leading and trailing spaces kept."""
    if "/" not in chain[1::2]:
        return "".join(chain)
    lead = chain[0][: len(chain[0]) - len(chain[0].lstrip())]
    trail = chain[-1][len(chain[-1].rstrip()) :]
    operands = [c.strip() for c in chain[0::2]]
    acc = operands[0]
    for op, operand in zip(chain[1::2], operands[1:], strict=True):
        if not operand:
            raise Untranslatable(f"an operator {op!r} without a right operand")
        if op == "/" and _integral(acc, type_of) and _integral(operand, type_of):
            op = "DIV"
        acc = f"({acc} {op} {operand})"
    return lead + acc + trail


def _integral(operand: str, type_of: Callable[[str], str]) -> bool:
    try:
        kind = type_of(operand)
    except Exception as exc:
        raise Untranslatable(
            f"the type of {operand!r}, an operand of a division, cannot be resolved on the "
            f"table's columns ({_first_line(exc)}): DataFusion divides whole numbers as whole "
            "numbers, Spark does not, so the sink cannot tell which rows the constraint refuses"
        ) from exc
    return kind in _INTEGRAL


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
