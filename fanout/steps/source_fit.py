"""The checks of a sink against the source's DataFrame, before its stream starts: its
route (``where`` / ``select``) resolves, its target takes the routed schema
(:meth:`fanout.Sink.check_schema`), and the columns it needs stable are not computed with
``rand()``, ``uuid()``... in the source's plan. One copy, which three callers make:
``fanout validate`` (:mod:`fanout.app.validate`, one checklist line each),
:meth:`fanout.FanOut.check_source` (a library user's, before ``start()``), and
``fanout run``, which calls that method. Without them a misspelt column in ``where``,
``select`` or ``keys`` failed its sink at batch 0, after the query had started, made its
checkpoint and the other sinks had written the batch.

They read the DataFrame's schema and analyzed plan only (under Spark Connect: the client
asks the server to analyze the plan, nothing runs), and write nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fanout.contract.sink import Sink
from fanout.delta_tables.io import one_line
from fanout.errors import ConfigurationError, FanoutError, SinkUnreachableError


@dataclass(frozen=True)
class Check:
    """One line of the checklist: what was checked, and the problem (``None``: OK).

    ``kind`` ``"skipped"``: not checked, ``problem`` saying why (not a failure);
    ``"info"``: what a run would create or change (``what``), not a check;
    ``"warned"``: failed in a way the run goes on with (a sink with ``on_failure = "lag"``
    whose target cannot be reached starts behind), ``problem`` saying what the run does.
    ``unreachable``: the check failed because a target could not be reached
    (:class:`fanout.SinkUnreachableError`), not because of the file. ``sink``: the sink
    the check is about (``None``: the pipeline's, such as the ledger's), or for an
    unreachable failure of such a check, the sink its error names.
    """

    what: str
    problem: str | None = None
    kind: Literal["check", "skipped", "info", "warned"] = "check"
    unreachable: bool = False
    sink: str | None = None

    @property
    def failed(self) -> bool:
        """Whether this check failed."""
        return self.kind == "check" and self.problem is not None

    def line(self) -> str:
        """``  OK    what``, ``  FAIL  what: problem``, ``  SKIP  what: why``,
        ``  WARN  what: problem`` or ``  INFO  what``."""
        if self.kind == "info":
            return f"  INFO  {self.what}"
        if self.kind == "warned":
            return f"  WARN  {self.what}: {self.problem}"
        if self.kind == "skipped":
            return f"  SKIP  {self.what}: {self.problem}"
        return (
            f"  OK    {self.what}"
            if self.problem is None
            else f"  FAIL  {self.what}: {self.problem}"
        )


def run_check(
    checks: list[Check], what: str, step: Callable[[], Any], *, sink: str | None = None
) -> Any:
    """Run ``step``, the check ``what`` of ``sink`` (``None``: of the pipeline); record
    OK or its error's first line; return its result (None on failure)."""
    try:
        result = step()
    except Exception as exc:
        text = str(exc).strip()
        problem = one_line(text) if text else type(exc).__name__
        unreachable = isinstance(exc, SinkUnreachableError)
        if isinstance(exc, SinkUnreachableError) and sink is None:
            sink = exc.sink or None  # a pipeline's check (backfill_from) reached a sink
        checks.append(Check(what, problem, unreachable=unreachable, sink=sink))
        return None
    checks.append(Check(what, sink=sink))
    return result


def fit_checks(checks: list[Check], name: str, spec: Any, source: Any, spark: Any) -> None:
    """The checks of an opened sink against the source's DataFrame ``source``, appended to
    ``checks``: its route (``where`` / ``select``) resolves, its target takes the routed
    schema (:meth:`fanout.Sink.check_schema`), and the columns it needs stable
    (:meth:`fanout.Sink.deterministic_columns`) are not computed with ``uuid()``,
    ``rand()``... in the source's plan
    (:func:`fanout.partitioned.determinism.check_source_plan`). ``fanout validate`` makes them, and
    :func:`refuse_unfit` (``FanOut.check_source``, ``fanout run``) before the stream starts.

    :param spec: the sink's :class:`fanout.sink_spec.SinkSpec`.
    :param spark: the session to check that the route is stable where the sink needs it
        stable (:func:`fanout.partitioned.determinism.check_route`); ``None`` leaves that
        out (``FanOut(...)`` made it).
    """
    from fanout.observe.spark_errors import quiet_spark_errors
    from fanout.partitioned.determinism import check_route, check_source_plan

    sink, route = spec.sink, spec.route
    routed = source
    if not route.is_identity:

        def resolve() -> Any:
            with quiet_spark_errors():  # its error is the check's: no trace on the console
                resolved = route.resolve(source, sink=name, batch_id=None, analyze=True)
            check_route(name, route, sink.deterministic_columns(), spark)
            return resolved

        routed = run_check(checks, f"sink {name}: route resolves against the source schema",
                           resolve, sink=name)  # fmt: skip
    if routed is None:
        return
    what = f"sink {name}: target takes the routed schema"
    if type(sink).check_schema is Sink.check_schema:  # an OK here would have checked nothing
        # still a FAIL, as before, for a column Arrow cannot take (an interval of months):
        # batch.arrow() fails on it, and so does every schema check that does run
        if run_check(checks, what, lambda: arrow_schema(routed.schema), sink=name) is None:
            return
        checks[-1] = Check(what, kind="skipped", sink=name, problem=(
            f"{type(sink).__name__} does not implement check_schema, so its first write is "
            "what finds a column its target cannot take"
        ))  # fmt: skip
    else:

        def takes() -> bool:
            sink.check_schema(arrow_schema(routed.schema))
            return True

        if not run_check(checks, what, takes, sink=name):
            return
    stable = sink.deterministic_columns()
    if stable is None:
        return
    try:  # listed only when it fails (a plan it cannot read passes: batch 0 checks it)
        check_source_plan(routed, stable, sink=name)
    except FanoutError as exc:
        what = f"sink {name}: the columns it needs stable are deterministic in the source"
        checks.append(Check(what, one_line(str(exc)), sink=name))


def arrow_schema(schema: Any) -> Any:
    """The Arrow schema of a Spark schema, as a batch hands it to ``Sink.check_schema``."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def refuse_unfit(
    specs: Mapping[str, Any],
    df: Any,
    *,
    unopened: Collection[str] = (),
    pipeline_file: str | None = None,
) -> None:
    """Raise :class:`fanout.ConfigurationError` listing every sink of ``specs`` (by name,
    each a :class:`fanout.sink_spec.SinkSpec`, opened) that cannot take the rows of ``df``,
    the source's DataFrame (streaming or static): the :func:`fit_checks` of each, but for
    the ``unopened`` sinks (``on_failure="lag"`` ones whose target could not be reached:
    they start behind and are checked when they open). The route's stability
    (:func:`fanout.partitioned.determinism.check_route`) is ``FanOut(...)``'s, made before.

    :param pipeline_file: the pipeline file, as commands name it: the message then says
        ``fanout validate FILE`` runs every check.
    """
    problems = []
    for name, spec in specs.items():
        if name in unopened:
            continue
        checks: list[Check] = []
        fit_checks(checks, name, spec, df, None)
        for check in checks:
            text = check.problem
            if check.failed and text is not None:
                problems.append(f"  - {text}" if repr(name) in text else f"  - sink {name}: {text}")
    if problems:
        every = ""
        if pipeline_file is not None:
            every = f" (`fanout validate {pipeline_file}` runs every check)"
        raise ConfigurationError(
            f"{len(problems)} sink(s) cannot take the source's rows; nothing started{every}:\n"
            + "\n".join(problems)
        )
