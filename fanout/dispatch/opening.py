"""Building a :class:`fanout.fan_out.FanOut`'s sinks and opening them at its start."""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from fanout.contract.dead_letters import DeadLetterTarget
from fanout.contract.sessions import is_connect
from fanout.contract.sink import (
    Sink,
    SinkContext,
    at_least_once_risk,
)
from fanout.deadletters.moved import checked
from fanout.deadletters.target import resolve_target
from fanout.dispatch.secrets import gathered, same_kind
from fanout.errors import ConfigurationError, FanoutError, SinkUnreachableError
from fanout.hooks.registry import warn_of_refused_types
from fanout.ledger.entry import Ledger, ledger_location
from fanout.observe.logs import batch_fields, register_secrets
from fanout.observe.secrets import masked_error
from fanout.partitioned.determinism import check_route as check_route_membership
from fanout.retry import RetryPolicy
from fanout.sink_spec import SinkSpec, check_write_timeout, split_core_options, write_timeout
from fanout.steps.cores import check_cores
from fanout.steps.lag_reopen import unreachable_masked
from fanout.steps.lag_state import Opening

log = logging.getLogger("fanout")


def build_specs(
    pipeline: str,
    registry: Any,
    configs: Sequence[Mapping[str, Any] | Sink | SinkSpec],
    retry: RetryPolicy,
) -> dict[str, SinkSpec]:
    """Each sink of ``configs`` built by the plugin ``registry``, with its route, retries
    (``retry`` unless its own) and lag policy, by name; refuses one sink given alone, no
    sink, and two sinks of one name."""
    if isinstance(configs, (Mapping, str, Sink, SinkSpec)):  # one sink, not a list
        raise ConfigurationError(
            f"pipeline {pipeline!r}: sinks must be a list of sinks (dicts or Sink "
            f"instances), got one {type(configs).__name__}: write sinks=[...]"
        )
    if not configs:
        raise ConfigurationError(f"pipeline {pipeline!r}: no sinks configured")
    # a refused type a sink uses raises its SinkTypeError when built: only those no sink
    # uses are warned of, once every sink is built
    any_dict = any(isinstance(c, Mapping) for c in configs)
    types = registry.sink_types(warn_refused=False) if any_dict else {}
    specs: dict[str, SinkSpec] = {}
    for config in configs:
        if isinstance(config, SinkSpec):
            check_write_timeout(config.name, config.lag)
            spec = SinkSpec(
                registry.build_sink(config.sink, types), config.route, config.retry, config.lag
            )
        elif isinstance(config, Mapping):
            name = str(config.get("name"))
            own, route, retry_of, lag = split_core_options(name, config, retry)
            spec = SinkSpec(registry.build_sink(own, types), route, retry_of, lag)
        else:
            spec = SinkSpec(registry.build_sink(config, types))
        if spec.name in specs:
            raise ConfigurationError(
                f"pipeline {pipeline!r}: two sinks are named {spec.name!r}; "
                "sink names must be unique (they key the ledger)"
            )
        specs[spec.name] = spec
    warn_of_refused_types(types)
    return specs


def resolve_dead_letters(
    sinks: Mapping[str, Sink], kinds: Mapping[str, Any], secrets: Sequence[str]
) -> dict[str, DeadLetterTarget | None]:
    """Each sink's dead-letter target (:func:`fanout.deadletters.target.resolve_target`).
    What refuses one (an unknown kind, a location no target can keep) quotes the
    ``dead_letter`` as written: raised with the passwords of its locations (``secrets``)
    masked and its chain cut, as the pipeline's other errors are."""
    targets: dict[str, DeadLetterTarget | None] = {}
    for name, sink in sinks.items():
        try:
            targets[name] = resolve_target(sink, kinds)
        except FanoutError as exc:
            masked = masked_error(exc, secrets, same_kind(exc, secrets, ()), str(exc))
            if masked is not None:
                raise masked from None
            raise
    return targets


def active_spark() -> Any:
    """The active ``SparkSession`` (``None``: none, or no pyspark)."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        return None
    return SparkSession.getActiveSession()


class SinkOpener:
    """Opens the ledger and every sink at a ``FanOut``'s start, in order, and keeps what
    it found for the lag state and for the close of a start that fails: the sinks opened
    (:attr:`opened`), those that could not be reached (:attr:`unopened`, lag sinks, which
    start behind) and the first ``open()`` calls still running past their
    ``write_timeout_s`` (:attr:`opening`).

    :attr:`secrets` is gathered again after each sink's ``open`` (which may fetch a
    credential), for the next sink's context and open error; it serves the start only:
    the FanOut's own ``secrets``, gathered again later, are the run's."""

    def __init__(
        self,
        pipeline: str,
        specs: Mapping[str, SinkSpec],
        dead_letters: Mapping[str, DeadLetterTarget | None],
        ledger: Ledger,
        plugins: tuple[object, ...],
        *,
        checkpoint_location: str | None,
        accept_lost: Collection[str],
        location_secrets: Sequence[str],
        secrets: tuple[str, ...],
    ) -> None:
        self.pipeline = pipeline
        self.specs = specs
        self.dead_letters = dead_letters
        self.ledger = ledger
        self.plugins = plugins
        self.checkpoint_location = checkpoint_location
        self.accept_lost = accept_lost
        self.location_secrets = location_secrets
        self.secrets = secrets
        self.unopened: dict[str, tuple[SinkContext, BaseException]] = {}
        self.opening: dict[str, Opening] = {}  # first open()s past write_timeout_s
        self.opened: list[str] = []  # in order: what a failed start closes

    def open(self, spark: Any) -> Any:
        """Open the ledger, then each sink, and check its route and the cores for the
        writes; returns the session the sinks were given (``spark``, or the active one)."""
        if spark is None:
            spark = active_spark()
        if spark is not None and is_connect(spark) and self.checkpoint_location is None:
            raise ConfigurationError(
                f"pipeline {self.pipeline!r}: under Spark Connect fanout cannot ask Spark for "
                "the query's checkpoint: pass FanOut(checkpoint_location=...) the same path as "
                "the query's checkpointLocation option"
            )
        self.ledger.open()
        for spec in self.specs.values():
            context = SinkContext(
                self.pipeline,
                spark,
                checked(self.dead_letters[spec.name]),  # its write filtered as write_letters
                self.plugins,
                ledger=ledger_location(self.ledger),
                secrets=self.secrets,
                sinks=tuple(self.specs),
                accept_lost=spec.name in self.accept_lost,
            )
            spec.route.validate(spec.name, spark)
            sink = spec.sink
            register_secrets(sink.secret_values())  # masked in every redacting log handler
            try:
                self.open_sink(spec, context)
            except SinkUnreachableError as exc:
                error = unreachable_masked(spec.name, exc, sink.secret_values(), self.secrets)
                if not spec.lag.lags:
                    if error is exc:
                        raise
                    raise error from None
                self.unopened[spec.name] = (context, error)  # starts behind: Lagging
                log.warning(
                    "pipeline %s: sink %r cannot be reached (%s); with on_failure='lag' the "
                    "pipeline starts without it and it catches up once it can be opened",
                    self.pipeline, sink.name, error,
                    extra=batch_fields(self.pipeline, sink=sink.name),
                )  # fmt: skip
            except FanoutError as exc:
                # the ConfigurationError the contract asks open() for may quote a secret too
                secrets = sink.secret_values()
                rebuild = same_kind(exc, secrets, self.secrets)
                masked = masked_error(exc, secrets, rebuild, str(exc), others=self.secrets)
                if masked is not None:
                    raise masked from None
                raise
            except Exception as exc:
                said = (
                    f"sink {sink.name!r}: cannot open: {type(exc).__name__}: {exc} (raised by "
                    f"{type(sink).__name__}.open(): check the sink's options, which "
                    "`fanout plugins --options TYPE` lists, and its target)"
                )
                masked = masked_error(
                    exc, sink.secret_values(), ConfigurationError, said, others=self.secrets
                )
                if masked is not None:  # no traceback may show the secret: the chain is cut
                    raise masked from None
                raise ConfigurationError(said) from exc
            else:
                self.opened.append(spec.name)
            # for the next sink's open error, context
            self.secrets = gathered(self.location_secrets, (s.sink for s in self.specs.values()))
            check_route_membership(sink.name, spec.route, sink.deterministic_columns(), spark)
            if (risk := at_least_once_risk(sink)) is not None:
                log.warning(
                    "pipeline %s: %s",
                    self.pipeline,
                    risk,
                    extra=batch_fields(self.pipeline, sink=sink.name),
                )
        check_cores(self.pipeline, self.specs, spark)
        return spark

    def open_sink(self, spec: SinkSpec, context: SinkContext) -> None:
        """Open ``spec``'s sink; that of a sink with ``write_timeout_s`` in a daemon thread
        of its own, waited for that long (a server that accepts connections and never
        answers would hang the start): past it the sink starts unopened and lags, as one
        that cannot be reached, and the open running on is taken up by its reopen."""
        timeout = write_timeout(spec)
        if timeout is None:
            spec.sink.open(context)
            return
        opening = Opening.start(spec.sink, context, self.pipeline)
        if not opening.done.wait(timeout):
            self.opening[spec.name] = opening
            raise SinkUnreachableError(
                f"open() did not return within its write_timeout_s={timeout:g} s (still "
                "running: the sink is not opened again while it runs); find what holds the "
                "sink's target (a stalled connection, a server that does not answer)",
                sink=spec.name,
            )
        if opening.error is not None:
            raise opening.error
