"""``fanout validate``: every check a pipeline file allows before its stream starts, each
reported OK or failed in one run (like ``dbt debug``), not only the first that fails.

The checks: the source builds (its declared schema, its transform); the ledger opens; and
for each sink: it builds from its options, it opens its target, its route (``where`` /
``select``) resolves against the source's schema, and its target can take the routed
batch's schema (:meth:`fanout.Sink.check_schema`). A route or schema problem found here
would otherwise fail at the first batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from fanout.app.config import PipelineConfig
from fanout.contract.sink import SinkContext
from fanout.errors import ConfigurationError


@dataclass(frozen=True)
class Check:
    """One line of the checklist: what was checked, and the problem (``None``: OK)."""

    what: str
    problem: str | None = None

    def line(self) -> str:
        """``  OK    what`` or ``  FAIL  what: problem``."""
        return (
            f"  OK    {self.what}"
            if self.problem is None
            else f"  FAIL  {self.what}: {self.problem}"
        )


def _check(checks: list[Check], what: str, step: Callable[[], Any]) -> Any:
    """Run ``step``; record OK or its error's first line; return its result (None on
    failure)."""
    try:
        result = step()
    except Exception as exc:
        text = str(exc).strip()
        checks.append(Check(what, text.splitlines()[0] if text else type(exc).__name__))
        return None
    checks.append(Check(what))
    return result


def run_checks(spark: Any, config: PipelineConfig, build_source: Callable[..., Any]) -> list[Check]:
    """Every check of the pipeline ``config``, in order."""
    from fanout.hooks.registry import load_registry
    from fanout.ledger.delta import DeltaLedger

    checks: list[Check] = []
    source = _check(checks, "source: builds with its schema and transform",
                    lambda: build_source(spark, config))  # fmt: skip
    _check(checks, f"ledger {config.ledger}: opens", lambda: DeltaLedger(config.ledger).open())
    registry = load_registry()
    types = registry.sink_types()
    context = SinkContext(config.name, spark)
    specs = {}
    for options in config.sinks:
        spec = _sink_checks(checks, registry, types, context, options, source)
        if spec is not None:
            specs[spec.name] = spec
    if any(spec.lag.uses_spool for spec in specs.values()):
        _lag_checks(checks, config, specs)
    return checks


def _lag_checks(checks: list[Check], config: PipelineConfig, specs: dict[str, Any]) -> None:
    """Sinks that lag or backfill: the spool is set, and each ``backfill_from`` names a
    sink that can give back its batches."""
    from fanout.steps.lag_steps import backfill_sources, check_spool

    _check(checks, f"spool {config.spool}: set for the sinks that lag or backfill",
           lambda: check_spool(config.name, specs, config.spool))  # fmt: skip
    if any(spec.lag.backfill_from for spec in specs.values()):
        _check(checks, "backfill_from: names a sink that holds its batches",
               lambda: backfill_sources(config.name, specs))  # fmt: skip


def _sink_checks(
    checks: list[Check],
    registry: Any,
    types: Any,
    context: SinkContext,
    options: dict[str, Any],
    source: Any,
) -> Any:
    """The checks of one sink: options, target, route, schema; returns its
    :class:`fanout.sink_spec.SinkSpec` (``None`` when its options are wrong)."""
    from fanout.retry import RetryPolicy
    from fanout.sink_spec import SinkSpec, split_core_options

    name = str(options.get("name"))

    def build() -> SinkSpec:
        own, route, _, lag = split_core_options(name, options, RetryPolicy())
        return SinkSpec(registry.build_sink(own, types), route, None, lag)

    spec: SinkSpec | None = _check(checks, f"sink {name}: options", build)
    if spec is None:
        return None
    sink, route = spec.sink, spec.route

    def open_target() -> bool:
        sink.open(context)
        return True

    opened = _check(checks, f"sink {name}: opens its target", open_target)
    if source is not None and opened:  # a target that did not open has no schema to check
        routed = source
        if not route.is_identity:
            routed = _check(checks, f"sink {name}: route resolves against the source schema",
                            lambda: route.resolve(source, sink=name, batch_id=None))  # fmt: skip
        if routed is not None:
            _check(checks, f"sink {name}: target takes the routed schema",
                   lambda: sink.check_schema(_arrow_schema(routed.schema)))  # fmt: skip
    sink.close()
    return spec


def _arrow_schema(schema: Any) -> Any:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def report(checks: list[Check], out: TextIO) -> None:
    """Print the checklist; raise :class:`ConfigurationError` listing every failure."""
    for check in checks:
        out.write(check.line() + "\n")
    failed = [c for c in checks if c.problem is not None]
    if failed:
        raise ConfigurationError(
            f"{len(failed)} of {len(checks)} checks failed:\n"
            + "\n".join(f"  - {c.what}: {c.problem}" for c in failed)
        )
