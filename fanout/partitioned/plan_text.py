"""The determinism walk of :mod:`fanout.partitioned.determinism` over a plan's *text*,
for Spark Connect, where Python holds no Catalyst objects: only the server's explain
strings (``DataFrame._explain_string(extended=True)``, a streaming query's explain).

An analyzed plan prints one operator a line, as a tree (``+- `` and ``:- `` before
children, two characters of indent per level); expressions name attributes as
``name#id`` and project them as ``expr AS name#id``. The walk is the same as on Catalyst
trees: projections and aggregations followed column by column, any other operator counted
with all its expressions (a filter decides which rows exist). A volatile expression is one
of Spark's non-deterministic functions or a clock it evaluates per execution
(:data:`VOLATILE_FUNCTIONS`); a non-deterministic UDF cannot be told from its name, which
is the one thing this walk misses compared with the JVM's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

VOLATILE_FUNCTIONS = (
    "rand", "randn", "random", "uuid", "shuffle", "monotonically_increasing_id",
    "spark_partition_id", "input_file_name", "input_file_block_start",
    "input_file_block_length", "randstr", "uniform", "current_timestamp", "now",
    "current_date", "localtimestamp", "current_time", "curdate",
)  # fmt: skip
"""Functions whose value differs between two executions of the same plan, as Spark
prints them in plans."""

_VOLATILE = re.compile(r"(?<![\w.])(" + "|".join(VOLATILE_FUNCTIONS) + r")\(", re.IGNORECASE)
_REFERENCE = re.compile(r"(?<![\w])([A-Za-z_][\w]*|`[^`]+`)#(\d+)")
_ALIAS = re.compile(r"\s+AS\s+(`[^`]+`|[\w]+)#(\d+)L?\s*$")
_MIXING = ("Union", "Expand", "Window", "Generate")


@dataclass
class Node:
    """One operator of a printed plan: its name, its text after the name, its children."""

    kind: str
    text: str
    children: list[Node] = field(default_factory=list)


def analyzed_section(explain: str) -> str:
    """The analyzed logical plan of an extended explain string (without its schema
    line), or the whole text when it has no such section."""
    marker = "== Analyzed Logical Plan =="
    if marker not in explain:
        return explain
    body = explain.split(marker, 1)[1].split("\n== ", 1)[0]
    lines = [line for line in body.strip("\n").splitlines() if line.strip()]
    if lines and ": " in lines[0] and not lines[0].lstrip().startswith(("+-", ":-")):
        first_word = lines[0].split(" ", 1)[0]
        if first_word.endswith(":") or ":" in first_word:  # "k: bigint, v: string"
            lines = lines[1:]
    return "\n".join(lines)


def parse_tree(text: str) -> Node | None:
    """The operator tree of a printed plan (``None`` for an empty text); a sink node on
    top (``WriteTo...``, as a streaming query prints) is left out."""
    root: Node | None = None
    stack: list[tuple[int, Node]] = []
    for raw in text.splitlines():
        body = raw.lstrip(" :|+-")
        if not body.strip():
            continue
        depth = len(raw) - len(body)
        kind, _, rest = body.lstrip("'").partition(" ")
        node = Node(kind, rest)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if stack:
            stack[-1][1].children.append(node)
        elif root is None:
            root = node
        stack.append((depth, node))
    while root is not None and root.kind.startswith("WriteTo") and root.children:
        root = root.children[0]
    return root


def split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets, parentheses and quotes."""
    parts: list[str] = []
    current: list[str] = []
    depth, quote = 0, ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"`":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    if "".join(current).strip():
        parts.append("".join(current).strip())
    return parts


def _lists(text: str) -> list[str]:
    """The top-level ``[...]`` lists of an operator's text, e.g. a Project's one."""
    found, depth, start = [], 0, -1
    for i, char in enumerate(text):
        if char == "[":
            if depth == 0:
                start = i + 1
            depth += 1
        elif char == "]":
            depth -= 1
            if depth == 0:
                found.append(text[start:i])
    return found


def _ids(expression: str) -> set[int]:
    return {int(m.group(2)) for m in _REFERENCE.finditer(expression)}


def _produced(item: str) -> int | None:
    alias = _ALIAS.search(item)
    if alias is not None:
        return int(alias.group(2))
    ids = _ids(item)
    return next(iter(ids)) if len(ids) == 1 else None


def volatile_parts(expression: str) -> list[str]:
    """The volatile function calls of one printed expression."""
    return [f"{m.group(1)}()" for m in _VOLATILE.finditer(expression)]


def volatile_in_text(plan: str, needed: set[str] | None = None) -> tuple[list[str], set[str]]:
    """The volatile expressions a printed plan's outputs named ``needed`` (all when
    ``None``) and its filters depend on, and the names of the leaf columns they read."""
    root = parse_tree(plan)
    if root is None:
        return [], set()
    found: list[str] = []
    leaves: set[str] = set()
    start: set[int] | None = None
    if needed is not None:
        items = split_top(_lists(root.text)[0]) if root.kind in ("Project",) else []
        start = {i for item in items if (i := _produced(item)) is not None
                 and _name(item) in needed} or None  # fmt: skip
    stack: list[tuple[Node, set[int] | None]] = [(root, start)]
    while stack:
        node, wanted = stack.pop()
        if not node.children:
            for match in _REFERENCE.finditer(node.text):
                if wanted is None or int(match.group(2)) in wanted:
                    leaves.add(match.group(1).strip("`"))
            continue
        if node.kind in ("Project", "Aggregate"):
            lists = _lists(node.text)
            items = split_top(lists[-1]) if lists else []
            always = split_top(lists[0]) if node.kind == "Aggregate" and len(lists) > 1 else []
            chosen = [i for i in items if wanted is None or _produced(i) in wanted]
            below: set[int] = set()
            for item in [*always, *chosen]:
                found += volatile_parts(item)
                below |= _ids(item)
            stack.append((node.children[0], below))
            continue
        found += volatile_parts(node.text)  # filters, join conditions: they decide the rows
        if (
            wanted is None
            or node.kind in _MIXING
            or (len(node.children) > 1 and not node.kind.startswith("Join"))
        ):
            stack.extend((child, None) for child in node.children)
        else:
            used = wanted | _ids(node.text)
            stack.extend((child, used) for child in node.children)
    return list(dict.fromkeys(found)), leaves


def _name(item: str) -> str:
    alias = _ALIAS.search(item)
    if alias is not None:
        return alias.group(1).strip("`")
    match = _REFERENCE.search(item)
    return match.group(1).strip("`") if match else item
