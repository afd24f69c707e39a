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
from fanout.contract.sink import Sink, SinkContext
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
    for options in config.sinks:
        _sink_checks(checks, registry, types, context, options, source)
    return checks


def _sink_checks(
    checks: list[Check],
    registry: Any,
    types: Any,
    context: SinkContext,
    options: dict[str, Any],
    source: Any,
) -> None:
    """The checks of one sink: options, target, route, schema."""
    from fanout.retry import RetryPolicy
    from fanout.sink_spec import split_core_options

    name = str(options.get("name"))
    own, route, _, _ = split_core_options(name, options, RetryPolicy())
    sink: Sink | None = _check(checks, f"sink {name}: options",
                               lambda: registry.build_sink(own, types))  # fmt: skip
    if sink is None:
        return
    _check(checks, f"sink {name}: opens its target", lambda: sink.open(context))
    if source is not None:
        routed = source
        if not route.is_identity:
            routed = _check(checks, f"sink {name}: route resolves against the source schema",
                            lambda: route.resolve(source, sink=name, batch_id=None))  # fmt: skip
        if routed is not None:
            _check(checks, f"sink {name}: target takes the routed schema",
                   lambda: sink.check_schema(_arrow_schema(routed.schema)))  # fmt: skip
    sink.close()


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
