"""``fanout validate``: every check a pipeline file allows before its stream starts, each
reported OK or failed in one run (like ``dbt debug``), not only the first that fails.

The checks: the source builds (its declared schema, its transform); the ledger opens; and
for each sink: it builds from its options, it opens its target, its route (``where`` /
``select``) resolves against the source's schema, and its target can take the routed
batch's schema (:meth:`fanout.Sink.check_schema`); then the pipeline's: no two sinks claim
one exclusive resource, no table holds two roles (the ledger, the spool, a sink's table,
dead letters). A route or schema problem found here
would otherwise fail at the first batch; those checks against the source
(:func:`fanout.steps.source_fit.fit_checks`) are the ones ``fanout run`` and
:meth:`fanout.FanOut.check_source` make before the stream starts.

Nothing is written: the ledger is checked, not created; each sink is opened with
``SinkContext(checking=True)`` and says what a run would create or migrate, printed as
``INFO`` lines; a sink type that does not declare :attr:`fanout.Sink.read_only_check` is
not opened (``SKIP``), since its ``open()`` might create things. A sink with
``on_failure = "lag"`` whose target cannot be reached is a ``WARN``, not a failure: the run
starts without it, as ``fanout run`` does. A sink may also warn about what a run would go on
with (:meth:`fanout.SinkContext.warn`: the Kafka sink's marker groups of the current epoch
gone while the ledger marks batches written): a ``WARN`` line, exit 0. So is an
at-least-once sink, in the words ``fanout run`` warns with at start
(:func:`fanout.contract.sink.at_least_once_risk`: for a type declaring no guarantees, how
to declare them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, TextIO

from fanout.app.config import PipelineConfig
from fanout.contract.locations import command_location
from fanout.contract.sink import SinkContext, at_least_once_risk
from fanout.errors import ConfigurationError, SinkUnreachableError, error_with_text
from fanout.observe.logs import register_secrets
from fanout.observe.secrets import masked_error
from fanout.steps.source_fit import Check, arrow_schema, fit_checks
from fanout.steps.source_fit import run_check as _check

__all__ = ["Check", "Checklist", "arrow_schema", "fit_checks", "report", "run_checks"]


@dataclass(frozen=True)
class Checklist:
    """The checks of a pipeline file, and the sinks built from it (by name)."""

    checks: list[Check]
    specs: dict[str, Any]


def _would(
    checks: list[Check], who: str, changes: Sequence[str], *, sink: str | None = None
) -> None:
    checks.extend(Check(f"{who}: would {change}", kind="info", sink=sink) for change in changes)


def run_checks(spark: Any, config: PipelineConfig, build_source: Callable[..., Any]) -> Checklist:
    """Every check of the pipeline ``config``, in order; writes nothing."""
    from fanout.hooks.registry import load_registry
    from fanout.ledger.delta import DeltaLedger
    from fanout.sink_spec import check_exclusive_resources

    checks: list[Check] = []
    source = _check(checks, "source: builds with its schema and transform",
                    lambda: build_source(spark, config))  # fmt: skip
    ledger = f"ledger {config.ledger}"
    changes = _check(checks, f"{ledger}: opens", DeltaLedger(config.ledger).check)
    _would(checks, ledger, changes or ())
    registry = load_registry(config.plugins)  # the file's modules already imported
    if registry.load_errors:
        _check(checks, "plugins: load", registry.raise_load_errors)
    types = registry.sink_types()
    kinds = registry.dead_letter_kinds()
    specs: dict[str, Any] = {}
    marks = _last_marks(config) if changes is not None else {}
    for options in config.sinks:
        spec = _sink_checks(checks, registry, types, kinds, config.name, spark, options,
                            source, specs, ledger=command_location(str(config.ledger)),
                            marks=marks)  # fmt: skip
        if spec is not None:
            specs[spec.name] = spec
    try:  # listed only when it fails: two sinks claiming what one must have to itself
        check_exclusive_resources(config.name, (spec.sink for spec in specs.values()))
    except ConfigurationError as exc:
        checks.append(Check("sinks: exclusive resources", str(exc)))
    _shared_tables_check(checks, config, specs, kinds)
    if any(spec.lag.uses_spool for spec in specs.values()):
        _lag_checks(checks, config, specs)
    if config.spool is not None:
        _spooled_check(checks, config, specs)
    return Checklist(checks, specs)


def _last_marks(config: PipelineConfig) -> dict[str, tuple[int, int]]:
    """Each sink's last mark in the pipeline's current epoch, ``(epoch, batch_id)``, read
    from the ledger (none when it has none yet, or cannot be read: its own check says so),
    for the sinks' readiness checks (:attr:`fanout.SinkContext.last_mark`)."""
    from fanout.errors import FanoutError
    from fanout.ledger.delta import DeltaLedger

    names = [str(options.get("name")) for options in config.sinks]
    ledger = DeltaLedger(config.ledger)
    try:
        if not ledger.exists():
            return {}
        epoch = ledger.current_epoch(config.name)
        found = ledger.last_committed(config.name, names, epoch)
    except FanoutError:
        return {}
    return {name: (epoch, mark) for name, mark in found.items() if mark is not None}


def _shared_tables_check(
    checks: list[Check], config: PipelineConfig, specs: dict[str, Any], kinds: Any
) -> None:
    """Listed only when it fails: one table in roles of two kinds (the ledger, the spool,
    a sink's table, dead letters), which ``FanOut(...)`` refuses
    (:func:`fanout.deadletters.delta.refuse_shared_tables`)."""
    from fanout.deadletters.delta import refuse_shared_tables, table_roles
    from fanout.deadletters.target import resolve_target

    dead_letters: dict[str, Any] = {}
    for name, spec in specs.items():
        try:
            dead_letters[name] = resolve_target(spec.sink, kinds)
        except Exception:  # the sink's own check reports it (`fanout run` refuses it)
            continue
    sinks = {name: spec.sink for name, spec in specs.items()}
    spool = None if config.spool is None else str(config.spool)
    roles = table_roles(str(config.ledger), spool, sinks, dead_letters)
    try:
        refuse_shared_tables(config.name, roles)
    except ConfigurationError as exc:
        checks.append(Check("tables: each in one role", str(exc)))


def _spooled_check(checks: list[Check], config: PipelineConfig, specs: dict[str, Any]) -> None:
    """A spool that exists holds no batch for a sink that no longer lags (it would skip
    them): read only; a spool not made yet has nothing to check."""
    from fanout.errors import LedgerError, SpoolError
    from fanout.ledger.delta import DeltaLedger
    from fanout.spool.index import BatchKey, open_index
    from fanout.spool.table import Spool
    from fanout.steps.lag_steps import check_spooled_sinks

    spool = Spool(str(config.spool), config.name)
    try:
        if open_index(spool.path, spool.storage_options) is None:
            return
    except SpoolError:
        return  # said by the lag checks, which run first

    ledger = DeltaLedger(config.ledger)

    def needs(sink: str, key: BatchKey) -> bool:  # its mark is older (read, never created)
        try:
            done = ledger.last_committed(config.name, [sink], key[0]).get(sink)
        except LedgerError:
            return True  # no ledger: no mark
        return done is None or done < key[1]

    def held() -> None:
        spool.open()  # reads the index: it exists, so nothing is created
        check_spooled_sinks(config.name, specs, spool, needs, command_location(str(config.ledger)))

    _check(checks, f"spool {config.spool}: holds no batch for a sink that no longer lags", held)


def _lag_checks(checks: list[Check], config: PipelineConfig, specs: dict[str, Any]) -> None:
    """Sinks that lag or backfill: the spool is set, and each ``backfill_from`` names a
    sink that can give back its batches."""
    from fanout.contract.locations import shown_location
    from fanout.errors import SpoolError
    from fanout.spool.index import open_index
    from fanout.steps.lag_steps import backfill_sources, check_spool

    spool = _check(checks, f"spool {config.spool}: set for the sinks that lag or backfill",
                   lambda: check_spool(config.name, specs, config.spool))  # fmt: skip
    if spool is not None:
        try:
            index = open_index(spool.path, spool.storage_options)
        except SpoolError as exc:
            checks.append(Check(f"spool {shown_location(spool.path)}: can be read", str(exc)))
        else:
            if index is None:
                where = f"spool {config.spool}"
                _would(checks, where, [f"create the spool index at {spool.index_path}"])
    if any(spec.lag.backfill_from for spec in specs.values()):
        _check(checks, "backfill_from: names a sink that holds its batches",
               lambda: backfill_sources(config.name, specs))  # fmt: skip


def _sink_checks(
    checks: list[Check],
    registry: Any,
    types: Any,
    kinds: Any,
    pipeline: str,
    spark: Any,
    options: dict[str, Any],
    source: Any,
    built: dict[str, Any],
    *,
    ledger: str | None = None,
    marks: dict[str, tuple[int, int]] | None = None,
) -> Any:
    """The checks of one sink: options, target, route, schema; returns its
    :class:`fanout.sink_spec.SinkSpec` (``None`` when its options are wrong). ``ledger``:
    the pipeline's ledger as commands name it, handed to the sink as a run hands it;
    ``marks``: each sink's last mark in the current epoch (:func:`_last_marks`), whose
    own records the sink may check (a problem it finds is a ``WARN`` line)."""
    from fanout.deadletters.target import resolve_target
    from fanout.retry import RetryPolicy
    from fanout.sink_spec import SinkSpec, split_core_options

    name = str(options.get("name"))

    def build() -> SinkSpec:
        if name in built:
            raise ConfigurationError(
                f"two sinks are named {name!r}; sink names must be unique (they key the ledger)"
            )
        own, route, _, lag = split_core_options(name, options, RetryPolicy())
        return SinkSpec(registry.build_sink(own, types), route, None, lag)

    spec: SinkSpec | None = _check(checks, f"sink {name}: options", build, sink=name)
    if spec is None:
        return None
    sink = spec.sink
    secrets = list(sink.secret_values())
    register_secrets(secrets)  # masked in the log and in what the command prints
    if (risk := at_least_once_risk(sink)) is not None:  # what `fanout run` warns at start
        checks.append(Check(f"sink {name}: guarantee", risk, kind="warned", sink=name))
    if not type(sink).read_only_check:
        checks.append(Check(f"sink {name}: opens its target", kind="skipped", sink=name, problem=(
            f"{type(sink).__name__} does not declare read_only_check, so its open() might "
            "create or change things; `fanout run` opens it"
        )))  # fmt: skip
        return spec
    changes: list[str] = []
    warnings: list[tuple[str, str]] = []

    def open_target() -> bool:
        dead_letters = resolve_target(sink, kinds)
        try:
            sink.open(SinkContext(pipeline, spark, dead_letters, ledger=ledger, checking=True,
                                  readiness=True, changes=changes, warnings=warnings,
                                  last_mark=(marks or {}).get(name)))  # fmt: skip
        except Exception as exc:  # the checklist is printed and returned: masked here already
            unreachable = isinstance(exc, SinkUnreachableError)
            rebuild = (
                partial(error_with_text, SinkUnreachableError, sink=name, batch_id=None)
                if unreachable
                else ConfigurationError
            )
            masked = masked_error(exc, secrets, rebuild, str(exc))
            if masked is not None:
                raise masked from None
            raise
        return True

    opened = _check(checks, f"sink {name}: opens its target", open_target, sink=name)
    if not opened and checks[-1].unreachable and spec.lag.lags:
        checks[-1] = _starts_behind(checks[-1])
    checks.extend(Check(f"sink {name}: {what}", problem, kind="warned", sink=name)
                  for what, problem in warnings)  # fmt: skip
    _would(checks, f"sink {name}", changes, sink=name)
    if source is not None and opened:  # a target that did not open has no schema to check
        fit_checks(checks, name, spec, source, spark)
    sink.close()
    return spec


def _starts_behind(failed: Check) -> Check:
    """``failed``, the unreachable target of a sink with ``on_failure = "lag"``, as the
    warning it is: ``fanout run`` starts without the sink, which catches up once it opens
    (exit 0 here, as the run does not fail for it either)."""
    return replace(failed, kind="warned", unreachable=False, problem=(
        f"{failed.problem}; with on_failure = \"lag\" `fanout run` starts without it, "
        "spools its batches and writes them once it opens (a run that stops with it still "
        "behind exits 3)"
    ))  # fmt: skip


def report(checks: list[Check], out: TextIO) -> None:
    """Print the checklist; raise :class:`ConfigurationError` listing every failure, or
    :class:`SinkUnreachableError` when every failure is a target that could not be reached
    (exit 1, as ``fanout run`` exits for it: the file may be right)."""
    for check in checks:
        out.write(check.line() + "\n")
    counted = [c for c in checks if c.kind != "info"]
    failed = [c for c in counted if c.failed]
    if failed:
        text = f"{len(failed)} of {len(counted)} checks failed:\n" + "\n".join(
            f"  - {c.what}: {c.problem}" for c in failed
        )
        if all(c.unreachable for c in failed):
            sinks = ", ".join(dict.fromkeys(c.sink for c in failed if c.sink is not None))
            # the text names its sinks already: the class's own constructor would prefix one more
            raise error_with_text(SinkUnreachableError, text, sink=sinks, batch_id=None)
        raise ConfigurationError(text)
