"""Refusing non-deterministic partitioning columns (see :mod:`fanout.partitioned.membership`).

A sink that commits per partition (:meth:`fanout.Sink.partitioned_by` is not ``None``)
needs every attempt of a batch to build the same partitions, so the columns it partitions
by, and every filter deciding which rows exist, must be deterministic; a sink upserting by
keys needs the same of its keys (a replay computing other keys writes every row again).
Which columns, and why, is :meth:`fanout.Sink.deterministic_columns`. "Volatile" here is
what Spark calls non-deterministic (``uuid()``, ``rand()``, ``shuffle()``, a
non-deterministic UDF) plus the clock functions Spark folds into a constant once per
query execution (``current_timestamp()``, ``now()``, ``current_date()``...): a retry of
the batch executes the query again and sees another instant. (In the streaming query
itself Spark replaces them with the batch's timestamp from the offset log, stable on
replay: there they are fine.)

Checked on Spark's *analyzed* plans (the optimized ones have folded the clock functions
and substituted cached data), following only the expressions the partitioning columns
and filters depend on, so a keyed sink may carry ``uuid()`` in its other columns:

- :func:`check_route` at ``FanOut(...)``, on each ``where``/``select`` expression bound to
  NULL columns (the source's schema is not known yet);
- :func:`check_source_plan` before the stream starts (``FanOut.check_source``, ``fanout
  run``, ``fanout validate``), on the routed source DataFrame's plan;
- :func:`check_batch` on the first batch of each query: the routed batch, then the
  streaming query's own plan, since foreachBatch hands over a batch whose source is opaque.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from typing import Any, Literal

from fanout.contract.partitions import StableColumns
from fanout.contract.sessions import is_connect
from fanout.errors import PartitioningError
from fanout.observe.spark_errors import quiet_spark_errors
from fanout.partitioned.membership import WHOLE_ROW, quoted
from fanout.partitioned.plan_text import analyzed_section, volatile_in_text

log = logging.getLogger("fanout")

PER_EXECUTION_CLOCKS = frozenset(
    {"CurrentTimestamp", "Now", "CurrentDate", "LocalTimestamp", "CurrentTime"}
)
"""Catalyst expressions Spark calls deterministic but evaluates anew per execution."""

MIXING = frozenset({"Union", "Expand", "Window", "Generate"})
"""Operators whose output columns are not their child's under the same ids: every column
below them counts."""

By = Sequence[str] | Literal["*"]


def advice_for(by: By, role: str = "partitions by") -> str:
    """What to do about a volatile partitioning (or key) column."""
    if by == WHOLE_ROW:
        return (
            "This sink has no key, so it partitions by the whole row: give it key columns "
            "that are deterministic (Kafka 'key', PostgreSQL 'keys'), or compute the column "
            "deterministically from the input (e.g. a hash of input columns instead of "
            "uuid(), an input timestamp instead of current_timestamp())"
        )
    return (
        f"This sink {role} {', '.join(by)}: derive those columns deterministically "
        "from the input (its other columns may be non-deterministic)"
    )


def stable_columns(by: By | StableColumns) -> StableColumns:
    """``by`` as :class:`StableColumns` (partitioning columns when only columns)."""
    return by if isinstance(by, StableColumns) else StableColumns(by)


def refusal(
    what: str, by: By | StableColumns, sink: str, batch_id: int | None
) -> PartitioningError:
    """The error naming the sink, the batch (if any) and the volatile expression."""
    stable = stable_columns(by)
    return PartitioningError(
        f"{what} is not deterministic: {stable.why}. {advice_for(stable.columns, stable.role)}",
        sink=sink, batch_id=batch_id,
    )  # fmt: skip


# -- walking Catalyst trees through py4j ---------------------------------------------------


def _seq(scala_seq: Any) -> list[Any]:
    return [scala_seq.apply(i) for i in range(scala_seq.size())]


def volatile_parts(expression: Any) -> list[str]:
    """SQL of the outermost volatile sub-expressions of a Catalyst expression."""
    name = expression.getClass().getSimpleName()
    if not expression.deterministic() or name in PER_EXECUTION_CLOCKS:
        try:
            return [str(expression.sql())]
        except Exception:
            return [str(expression.toString())]
    return [part for child in _seq(expression.children()) for part in volatile_parts(child)]


def _ids(expression: Any) -> set[int]:
    return {int(a.exprId().id()) for a in _seq(expression.references().toSeq())}


def volatile_in_plan(plan: Any, needed: set[int] | None = None) -> tuple[list[str], set[str]]:
    """The volatile expressions a logical plan's ``needed`` outputs (all when ``None``)
    and its filters depend on, and the names of the leaf columns they read.

    Projections and aggregations are followed column by column (grouping always counts);
    any other operator counts with all its expressions (a filter or a join condition
    decides which rows exist) and passes the columns it needs down."""
    found: list[str] = []
    leaves: set[str] = set()
    stack: list[tuple[Any, set[int] | None]] = [(plan, needed)]
    while stack:
        node, wanted = stack.pop()
        kind = node.getClass().getSimpleName()
        children = _seq(node.children())
        if not children:
            leaves.update(
                a.name() for a in _seq(node.output()) if wanted is None or a.exprId().id() in wanted
            )
            continue
        if kind in ("Project", "Aggregate"):
            items = node.projectList() if kind == "Project" else node.aggregateExpressions()
            always = [] if kind == "Project" else _seq(node.groupingExpressions())
            below: set[int] = set()
            for item in [*always, *(
                i for i in _seq(items) if wanted is None or int(i.exprId().id()) in wanted
            )]:  # fmt: skip
                found += volatile_parts(item)
                below |= _ids(item)
            stack.append((children[0], below))
            continue
        expressions = _seq(node.expressions())
        for expression in expressions:  # filters, join conditions...: they decide the rows
            found += volatile_parts(expression)
        if wanted is None or kind in MIXING or (len(children) > 1 and kind != "Join"):
            stack.extend((child, None) for child in children)
        else:  # the node passes its child's columns through under the same ids
            used = wanted.union(*(_ids(e) for e in expressions))
            stack.extend((child, used) for child in children)
    return list(dict.fromkeys(found)), leaves


# -- the checks ----------------------------------------------------------------------------


_passed: set[tuple[str, str, str]] = set()
_passed_lock = threading.Lock()


def _run_id(query_id: str | None) -> str:
    """The run id of the active streaming query ``query_id`` (``""`` when not found):
    Spark gives a foreachBatch call the query's id, which a restart on the same checkpoint
    keeps, but not its run's."""
    if query_id is None:
        return ""
    try:
        from pyspark.sql import SparkSession

        session = SparkSession.getActiveSession()  # the batch's own session is a clone
        query = None if session is None else session.streams.get(query_id)
        return "" if query is None else str(query.runId)
    except Exception as exc:  # no such session (Spark Connect, a stand-in frame)
        log.debug("query %s: its run id not found: %s", query_id, exc)
        return ""


def check_batch(
    df: Any, by: By | StableColumns, *, sink: str, batch_id: int, query_id: str | None
) -> None:
    """Refuse a batch whose partitioning (or key) columns or filters are volatile, in the
    routed DataFrame or in the streaming query that produced it. A pass is remembered per
    (sink, query id, run id): the plans do not change while a query runs, but a query
    started again on its checkpoint in the same process (a notebook's cell run again)
    keeps its id and may compute the columns otherwise.

    :raises PartitioningError: naming the sink, the batch, the columns and the expression.
    """
    key = (sink, query_id or "", _run_id(query_id))
    if query_id is not None and key in _passed:
        return
    stable = stable_columns(by)
    columns = list(df.columns) if stable.columns == WHOLE_ROW else list(stable.columns)
    connect = is_connect(df)
    try:
        selected = df.select(*[quoted(c) for c in columns])
        if connect:  # no Catalyst objects in Python: the server's explain text
            found, leaves = volatile_in_text(analyzed_section(selected._explain_string(True)))
        else:
            found, leaves = volatile_in_plan(selected._jdf.queryExecution().analyzed())
    except Exception as exc:  # not a Spark DataFrame: nothing to inspect
        log.debug("sink %r: cannot inspect the batch plan: %s", sink, exc)
        return
    if found:
        raise refusal(f"the batch's {_cols(columns)} ({'; '.join(found)})", stable, sink, batch_id)
    if connect:
        found = _volatile_in_connect_source(df, leaves, query_id)
    else:
        found = _volatile_in_source(df, leaves, query_id)
    if found:
        raise refusal(
            f"the source query's {_cols(sorted(leaves))} ({'; '.join(found)})",
            stable,
            sink,
            batch_id,
        )
    if query_id is not None:
        with _passed_lock:
            _passed.add(key)


_CLOCK_CALL = re.compile(
    r"(?:current_timestamp|now|current_date|localtimestamp|current_time|curdate)\(\)",
    re.IGNORECASE,
)


def check_source_plan(df: Any, by: By | StableColumns, *, sink: str) -> None:
    """Before the stream starts: refuse a source DataFrame ``df`` (routed as the sink's
    route routes it) whose partitioning (or key) columns, or a filter deciding which rows
    exist, are volatile in its plan: what :func:`check_batch` finds in the streaming
    query's plan at batch 0 (a key computed with ``uuid()`` in the source's transform),
    found before the query starts, its checkpoint made and the other sinks written.
    A clock (``current_timestamp()``...) is refused as batch 0 refuses it: in the
    streaming query Spark replaces it with ``current_batch_timestamp()``, which Catalyst
    calls non-deterministic, so :func:`check_batch` refuses it; under Spark Connect its
    text walk does not know that name and passes it, so a clock is left out there. Reads
    the analyzed plan only (under Spark Connect, the server's explain text).

    :raises PartitioningError: naming the sink, the columns and the expression.
    """
    stable = stable_columns(by)
    columns = list(df.columns) if stable.columns == WHOLE_ROW else list(stable.columns)
    connect = is_connect(df)
    try:
        selected = df.select(*[quoted(c) for c in columns])
        if connect:
            found = volatile_in_text(analyzed_section(selected._explain_string(True)))[0]
        else:
            found = volatile_in_plan(selected._jdf.queryExecution().analyzed())[0]
    except Exception as exc:  # not a Spark DataFrame, or not analyzable: batch 0 checks it
        log.debug("sink %r: cannot inspect the source's plan: %s", sink, exc)
        return
    if connect:  # batch 0 passes the query's current_batch_timestamp() there
        found = [part for part in found if not _CLOCK_CALL.fullmatch(part.strip())]
    if found:
        raise refusal(f"the source's {_cols(columns)} ({'; '.join(found)})", stable, sink, None)


def _volatile_in_source(df: Any, names: set[str], query_id: str | None) -> list[str]:
    """The volatile expressions the streaming query's columns ``names`` and filters
    depend on in its current batch plan; ``[]`` when there is no such query."""
    if query_id is None or not names:
        return []
    try:
        query = _running_query(df, query_id)
        execution = None if query is None else query.streamingQuery().lastExecution()
        if execution is None:
            return []
        plan = execution.analyzed()
        while plan.getClass().getSimpleName().startswith("WriteTo"):  # the sink node
            plan = plan.children().apply(0)
        wanted = {int(a.exprId().id()) for a in _seq(plan.output()) if a.name() in names}
        return volatile_in_plan(plan, wanted)[0]
    except Exception as exc:
        log.debug("cannot inspect the streaming query's plan: %s", exc)
        return []


def _volatile_in_connect_source(df: Any, names: set[str], query_id: str | None) -> list[str]:
    """:func:`_volatile_in_source` under Spark Connect, on the text of the streaming
    query's last execution (its extended explain)."""
    if query_id is None or not names:
        return []
    try:
        query = df.sparkSession.streams.get(query_id)
        if query is None:
            return []
        from pyspark.sql.connect.proto import StreamingQueryCommand

        command = StreamingQueryCommand()
        command.explain.extended = True
        text = query._execute_streaming_query_cmd(command).explain.result
        return volatile_in_text(analyzed_section(text), names)[0]
    except Exception as exc:
        log.debug("cannot inspect the streaming query's plan: %s", exc)
        return []


def _running_query(df: Any, query_id: str) -> Any:
    """The JVM query ``query_id``: foreachBatch hands a batch whose session is a clone
    with a query manager of its own, so the default session is asked too."""
    session = df.sparkSession
    candidates = [session._jsparkSession]
    default = session._jvm.org.apache.spark.sql.SparkSession.getDefaultSession()
    if default.isDefined():
        candidates.append(default.get())
    for candidate in candidates:
        query = candidate.streams().get(query_id)
        if query is not None:
            return query
    return None


def check_route(sink: str, route: Any, by: By | StableColumns | None, spark: Any) -> None:
    """At ``FanOut(...)``: refuse a route whose ``where``, or whose ``select`` expression
    producing a partitioning (or key) column, is volatile. Best effort: an expression
    Spark cannot analyze without the source's schema is left to :func:`check_batch`.

    :raises PartitioningError: naming the sink and the expression (no batch yet).
    """
    if by is None or spark is None or route.is_identity:
        return
    stable = stable_columns(by)
    if route.where is not None and _volatile_expression(spark, route.where, "where"):
        raise refusal(f"route where {route.where!r}", stable, sink, None)
    for expression in route.select or ():
        produced = _volatile_expression(spark, expression, "select")
        if produced and (stable.columns == WHOLE_ROW or set(produced) & set(stable.columns)):
            raise refusal(f"route select expression {expression!r}", stable, sink, None)


def _volatile_expression(spark: Any, expression: str, kind: str) -> list[str]:
    """The columns ``expression`` produces (``["<where>"]`` for a predicate) when it is
    volatile, else ``[]``. Its column references are bound to NULL columns of an empty
    relation (any type coerces from NULL), added as Spark names them missing."""
    with quiet_spark_errors():  # each unresolved column would log a stack trace
        return _probe(spark, expression, kind)


def _probe(spark: Any, expression: str, kind: str) -> list[str]:
    from pyspark.sql import functions as F

    names: list[str] = []
    for _ in range(64):
        probe = spark.range(0).select(*[F.lit(None).alias(n) for n in names] or [F.lit(0)])
        try:
            df = probe.where(expression) if kind == "where" else probe.selectExpr(expression)
            if is_connect(df):
                found = volatile_in_text(analyzed_section(df._explain_string(True)))[0]
            else:
                found = volatile_in_plan(df._jdf.queryExecution().analyzed())[0]
        except Exception as exc:
            missing = _unresolved_column(exc)
            if missing is None or missing in names:
                log.debug("cannot analyze %s %r without the batch: %s", kind, expression, exc)
                return []
            names.append(missing)
            continue
        if not found:
            return []
        return ["<where>"] if kind == "where" else list(df.columns)
    return []


def _unresolved_column(error: BaseException) -> str | None:
    getter = getattr(error, "getCondition", None) or getattr(error, "getErrorClass", None)
    condition = getter() if getter is not None else None
    if not condition or not str(condition).startswith("UNRESOLVED_COLUMN"):
        return None
    parameters: dict[str, Any] = getattr(error, "getMessageParameters", dict)() or {}
    name = str(parameters.get("objectName", ""))
    parts = [p.strip("`") for p in name.split("`.`")] if name else []
    return parts[-1] if parts else None


def _cols(columns: Sequence[str]) -> str:
    return ("column " if len(columns) == 1 else "columns ") + ", ".join(map(repr, columns))
